"""An `Engine` over the numpy interpreter of a Qwen3 manifest, for the serving tests on the CPU."""

from __future__ import annotations

import numpy as np

import kern_runtime as kr
from kern_interp.backend import InterpBackend
from kern_manifest import Manifest

__all__ = ["interp_engine"]


def interp_engine(manifest: Manifest, weights: dict[str, np.ndarray], pages: int = 64,
                  host: int = 0) -> kr.Engine:
    """The engine of `manifest` (`read_manifest`'s model) over `pages` KV pages (8-page pool chunks,
    chunks of 64 prompt rows) and `host` pages of host tier (parking on when there are any)."""
    be = InterpBackend(manifest, weights, pages=pages, chunk_pages=8, host_pages=host)
    return kr.Engine(be, kr.serving_roles(manifest), kr.EngineConfig(chunk=64, park=host > 0))
