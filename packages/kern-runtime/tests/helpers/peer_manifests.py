"""Manifests of the peer and collective GPU tests (plain JSON), and the collectives' numpy
definitions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

Json = dict[str, Any]
VERBS = ("allreduce", "allgather", "reducescatter", "alltoall")
DTYPES = ("f32", "bf16")
COUNT = 96
"""Elements per rank of every collective call (count)."""


def collectives(ranks: int) -> Json:
    """One program per (verb, dtype): send -> recv through extern:nccl_{verb}_{dtype}, `COUNT` per
    rank, over group tp of `ranks`."""
    n = ranks * COUNT
    buffers: Json = {}
    ops: Json = {}
    programs: Json = {}
    for dt in DTYPES:
        buffers[f"send_{dt}"] = {"dtype": dt, "shape": [n], "kind": "input"}
        buffers[f"recv_{dt}"] = {"dtype": dt, "shape": [n], "kind": "output"}
        for verb in VERBS:
            ops[f"{verb}_{dt}"] = {"params": [f"in buffer<{dt}>", f"out buffer<{dt}>", "i64"], "impl": {"launches": [
                {"entry": f"extern:nccl_{verb}_{dt}",
                 "args": [{"param": 0}, {"param": 1}, {"param": 2}, {"rank": "tp"}]}]}}
            programs[f"{verb}_{dt}"] = {"calls": [
                {"label": verb, "op": f"{verb}_{dt}",
                 "args": [{"buf": f"send_{dt}"}, {"buf": f"recv_{dt}"}, {"i64": COUNT}]}]}
    return {"schema_version": 5, "model": "nccl-test", "topology": {"groups": {"tp": ranks}},
            "buffers": buffers, "modules": {}, "ops": ops, "programs": programs}


def peer_gather(sha: str, ranks: int) -> Json:
    """`fill` writes x into the exported carry `flags` (rt_axpb); `gather` copies every rank's
    `flags` through the peer buffer into `out` (the kernel `entry`, rt_peer_gather's ABI)."""
    return {
        "schema_version": 5, "model": "peer-test",
        "topology": {"groups": {"tp": ranks}},
        "buffers": {
            "x": {"dtype": "f32", "shape": [COUNT], "kind": "input"},
            "flags": {"dtype": "f32", "shape": [COUNT], "kind": "carry", "export": True},
            "peers": {"dtype": "u64", "shape": [ranks], "kind": "peer", "of": "flags", "group": "tp"},
            "out": {"dtype": "f32", "shape": [ranks * COUNT], "kind": "output"},
        },
        "modules": {"t": {"source": "rt_test.cubin", "sha256": sha}},
        "ops": {
            "fill": {"params": ["in buffer<f32>", "out buffer<f32>", "f32", "f32", "i32"], "impl": {"launches": [
                {"module": "t", "entry": "rt_axpb", "block": [128, 1, 1], "grid": [1, 1, 1]}]}},
            "gather": {"params": ["in buffer<u64>", "out buffer<f32>", "i32", "i32"], "impl": {"launches": [
                {"module": "t", "entry": "rt_peer_gather", "block": [128, 1, 1], "grid": [1, 1, 1]}]}},
        },
        "programs": {
            "fill": {"calls": [{"op": "fill", "args": [{"buf": "x"}, {"buf": "flags"}, {"f32": 1.0}, {"f32": 0.0},
                                                       {"i32": COUNT}]}]},
            "gather": {"calls": [{"op": "gather", "args": [{"buf": "peers"}, {"buf": "out"}, {"i32": ranks},
                                                           {"i32": COUNT}]}]},
        },
    }


def multicast_gather(sha: str, mc_sha: str) -> Json:
    """`peer_gather` whose gather kernel is the multicast fixture's mc_sum (refused at load; never
    launched)."""
    m = peer_gather(sha, 1)
    m["modules"]["mc"] = {"source": "multicast.cubin", "sha256": mc_sha}
    m["ops"]["gather"] = {"params": ["in buffer<u64>", "out buffer<f32>"], "impl": {"launches": [
        {"module": "mc", "entry": "mc_sum", "block": [32, 1, 1], "grid": [1, 1, 1]}]}}
    m["programs"]["gather"]["calls"][0]["args"] = [{"buf": "peers"}, {"buf": "out"}]
    return m


def inputs(ranks: int, seed: int) -> list[npt.NDArray[np.float32]]:
    """Each rank's send values: quarters in [-8, 8], exact in bf16 and in sums of a few ranks."""
    rng = np.random.default_rng(seed)
    return [(rng.integers(-32, 33, ranks * COUNT) / 4).astype(np.float32) for _ in range(ranks)]


def expected(verb: str, sends: Sequence[npt.NDArray[np.float32]], rank: int) -> npt.NDArray[np.float32]:
    """What rank `rank` receives (the elements the collective writes)."""
    n, c = len(sends), COUNT
    if verb == "allreduce":
        return np.sum([s[:c] for s in sends], axis=0, dtype=np.float32)
    if verb == "allgather":
        return np.concatenate([s[:c] for s in sends])
    if verb == "reducescatter":
        return np.sum([s[rank * c:(rank + 1) * c] for s in sends], axis=0, dtype=np.float32)
    return np.concatenate([sends[p][rank * c:(rank + 1) * c] for p in range(n)])


def to_bf16(x: npt.NDArray[np.float32]) -> npt.NDArray[np.uint16]:
    """bf16 bits of values exact in bf16."""
    return (np.ascontiguousarray(x, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)


def from_bf16(bits: npt.NDArray[Any]) -> npt.NDArray[np.float32]:
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
