"""A tensor-parallel manifest's ranks on the interpreter: each rank's weight windows
(`rank_tensors`), and one `InterpBackend` per rank whose collectives meet the others' across
threads (`rank_backends`), what `kern_runtime.Ranks` drives as it drives the GPUs' runtimes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from kern_interp.backend import InterpBackend
from kern_interp.collectives import Group

__all__ = ["rank_backends", "rank_tensors"]


def _window(t: np.ndarray, seg: Mapping[str, Any], rank: int) -> np.ndarray:
    view = t.reshape(t.shape[0], -1)

    def pick(key: str) -> slice:
        v = seg.get(key)
        if v is None:
            return slice(None)
        lo, hi = v["ranges"][rank] if isinstance(v, dict) else v
        return slice(lo, hi)

    return np.ascontiguousarray(view[pick("rows"), pick("cols")])


def rank_tensors(manifest: Mapping[str, Any], tensors: Mapping[str, np.ndarray],
                 rank: int) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The manifest with every weight segment bound to a tensor of its own (`buffer#i`), and those
    tensors cut to `rank`'s windows: what Interp (which binds whole tensors) loads for that rank."""
    m = {**manifest, "buffers": dict(manifest["buffers"])}
    out: dict[str, np.ndarray] = {}
    for name, b in manifest["buffers"].items():
        if b["kind"] != "weight" or "bind" not in b:
            continue
        segs = []
        for i, seg in enumerate(b["bind"]):
            key = f"{name}#{i}"
            out[key] = _window(tensors[seg["tensor"]], seg, rank)
            segs.append({"tensor": key})
        m["buffers"][name] = {**b, "bind": segs}
    return m, out


def rank_backends(manifest: Mapping[str, Any], tensors: Mapping[str, np.ndarray], **kw: Any) -> tuple[list[InterpBackend], Group]:
    """One backend per rank of the TP manifest `manifest` (plain JSON) with its weight windows,
    their collectives met in one `Group` (returned too, for its count); `kw` sizes each
    backend's pool as `InterpBackend` takes them."""
    n = int(manifest["topology"]["groups"]["tp"])
    group = Group(n)
    return [InterpBackend(*rank_tensors(manifest, tensors, r), collective=group.member(r), **kw)
            for r in range(n)], group
