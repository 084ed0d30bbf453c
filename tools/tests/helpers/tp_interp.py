"""A TP-N manifest on the float32 numpy interpreter (`kern_interp.qwen3.Interp`): one interpreter per
rank with that rank's weight windows, run call by call in lock step, the NCCL collectives done
across the ranks' buffers by their definitions. Shaped like an `Interp` (`m`, `capacity`,
`write_input`, `read_output`, `run`), so `kern_interp.qwen3.greedy` drives it unchanged."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kern_interp import qwen3 as interp
from kern_manifest.expr import parse_expr

__all__ = ["World", "rank_tensors"]


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


def _allreduce(sends: Sequence[np.ndarray], n: int, c: int) -> list[np.ndarray]:
    total = np.sum([s[:c] for s in sends], axis=0, dtype=np.float32)
    return [total for _ in range(n)]


def _allgather(sends: Sequence[np.ndarray], n: int, c: int) -> list[np.ndarray]:
    whole = np.concatenate([s[:c] for s in sends])
    return [whole for _ in range(n)]


def _reducescatter(sends: Sequence[np.ndarray], n: int, c: int) -> list[np.ndarray]:
    return [np.sum([s[r * c:(r + 1) * c] for s in sends], axis=0, dtype=np.float32) for r in range(n)]


def _alltoall(sends: Sequence[np.ndarray], n: int, c: int) -> list[np.ndarray]:
    return [np.concatenate([sends[p][r * c:(r + 1) * c] for p in range(n)]) for r in range(n)]


_COLLECTIVES = {"allreduce": _allreduce, "allgather": _allgather, "reducescatter": _reducescatter,
                "alltoall": _alltoall}


class World:
    """The ranks of a TP-N manifest on interpreters, run in lock step."""

    def __init__(self, manifest: Mapping[str, Any], tensors: Mapping[str, np.ndarray], capacity: int) -> None:
        self.n = int(manifest["topology"]["groups"]["tp"])
        self.m = manifest
        self.model = interp.model_of(manifest)
        self.capacity = capacity
        self.ranks = [interp.Interp(*rank_tensors(manifest, tensors, r), capacity=capacity) for r in range(self.n)]
        self.collectives = 0

    def write_input(self, name: str, values: Sequence[int] | np.ndarray) -> None:
        for r in self.ranks:
            r.write_input(name, values)

    def read_output(self, name: str) -> np.ndarray:
        got = [r.read_output(name) for r in self.ranks]
        for r, g in enumerate(got[1:], 1):
            assert np.array_equal(g, got[0]), f"rank {r} output {name} differs from rank 0's"
        return got[0]

    def run(self, program: str, vars: Mapping[str, int]) -> None:
        env = {v: vars.get(v, 1) for v in self.m["vars"]}
        for call in self.m["programs"][program]["calls"]:
            op = self.m["ops"][call["op"]]
            per_rank = [[r._arg(a, env) for a in call["args"]] for r in self.ranks]  # pyright: ignore[reportPrivateUsage]
            for launch in op["impl"]["launches"]:
                args = [vals if "args" not in launch else
                        [r._launch_arg(call["op"], la, vals) for la in launch["args"]]  # pyright: ignore[reportPrivateUsage]
                        for r, vals in zip(self.ranks, per_rank, strict=True)]
                self._launch(launch["entry"], args, env)

    def _launch(self, entry: str, args: Sequence[Sequence[Any]], env: Mapping[str, int]) -> None:
        tokens = env.get("tokens", 1)
        if not entry.startswith("extern:nccl_"):
            for a in args:
                if entry == "extern:cublaslt_bf16_tn":
                    interp.k_linear(tokens, *a)
                else:
                    interp.KERNELS[entry](tokens, *a)
            return
        self.collectives += 1
        verb = entry.removeprefix("extern:nccl_").rsplit("_", 1)[0]
        raw = args[0][2]
        count = parse_expr(json.loads(json.dumps(raw))).eval(env) if isinstance(raw, dict) else int(raw)
        sends = [np.array(s[0][s[1]:], copy=True) for s, *_ in args]
        for (_, (recv, off), *_), value in zip(args, _COLLECTIVES[verb](sends, self.n, count), strict=True):
            recv[off:off + value.size] = value
