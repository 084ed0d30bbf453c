"""What the GPU scripts that open a Qwen3-4B manifest on kern_runtime share: the arguments naming
the manifest, the kernels and the GPU, and the inputs they load (the manifest, its kernels built
where a pinned hash is missing, the seeded random Qwen3-4B checkpoint written once to the cache).

tools/gpu/bench_batch.py, bench_engine.py, tools/lab/time_prefill.py and time_rows_step.py use it
(the lab's with tools/gpu on PYTHONPATH).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kern_manifest import Manifest

ROOT = Path(__file__).resolve().parents[2]

__all__ = ["ROOT", "add_engine_args", "load_inputs"]


def add_engine_args(ap: argparse.ArgumentParser, manifest: str) -> None:
    """`out` (a directory), `--manifest` (default examples/`manifest`.json), `--kernels`,
    `--kernel-sources` and `--gpu`."""
    ap.add_argument("out", type=Path)
    ap.add_argument("--manifest", type=Path, default=ROOT / "examples" / f"{manifest}.json")
    ap.add_argument("--kernels", type=Path, default=ROOT / "kernels")
    ap.add_argument("--kernel-sources", type=Path, default=ROOT / "tools" / "kernels-src")
    ap.add_argument("--gpu", type=int, default=0)


def load_inputs(args: argparse.Namespace, log: Callable[[str], None]) -> tuple[Manifest, list[Path]]:
    """The manifest of `args.manifest` (`kern_runtime.read_manifest`'s model) and the weight files of
    the seeded random Qwen3-4B checkpoint; the manifest's missing cubins are built into
    `args.kernels` first."""
    import kern_runtime as kr
    from kern_qwen3 import QWEN3_4B_CONFIG, random_checkpoint
    from kern_runtime.loading import ensure_kernels

    manifest = kr.read_manifest(args.manifest)
    ensure_kernels(manifest, args.kernels, args.kernel_sources, log)
    ckpt, _ = random_checkpoint(QWEN3_4B_CONFIG, seed=0, name="qwen3-4b")
    return manifest, kr.weight_files([ckpt])
