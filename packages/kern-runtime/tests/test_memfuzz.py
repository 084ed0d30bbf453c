"""The memory fuzz (helpers/memfuzz.py) on the CPU: the real `Sequences` over a simulated device
whose streams run in a seeded random order, on a manifest with two paged states (8 and 4 slices
a page) and a per-seq state, and on the same without the per-seq state (restores and wakes at
whole pages below a checkpoint's length). The GPU run is test_memfuzz_gpu.py."""

from __future__ import annotations

import copy
from typing import Any

import pytest

import kern_pool

from .helpers import manifests, memfuzz

OPS = 250
SEEDS = (1, 2, 3)


def fuzz_manifest(sha: str, stateful: bool) -> dict[str, Any]:
    """`two_paged` with slices (8 layers of kv, 4 of kv2), a 64 KiB per-seq state (or none)."""
    doc = copy.deepcopy(manifests.two_paged(sha))
    doc["states"]["kv"]["slices"] = 8
    doc["states"]["kv2"]["slices"] = 4
    if stateful:
        doc["states"]["ssm"]["bytes_per_seq"] = 1 << 16
        for call in doc["programs"]["stamp"]["calls"]:
            if call["args"][0].get("state") == "ssm":
                call["args"][0]["offset"] = 1 << 15
    else:
        del doc["states"]["ssm"]
        doc["programs"]["stamp"]["calls"] = [c for c in doc["programs"]["stamp"]["calls"]
                                             if c["args"][0].get("state") != "ssm"]
    return doc


CAPACITY = kern_pool.Capacity(tokens=1024, seqs=6)
HOST = (40, 8)
"""Host tier: parked pages and slots (fewer than the pool holds: HostFull happens)."""


@pytest.mark.parametrize("stateful", [True, False], ids=["per-seq", "paged-only"])
@pytest.mark.parametrize("seed", SEEDS)
def test_memory_fuzz_on_the_simulated_device(seed: int, stateful: bool) -> None:
    doc = fuzz_manifest("ab" * 32, stateful)
    with memfuzz.sim_runtime(doc, CAPACITY, seed) as rt:
        rt.reserve_host(*HOST)
        stats = memfuzz.MemoryFuzz(rt, memfuzz.layout_of(doc), seed).run(OPS, check_rate=0.3)
    for op in ("restore", "fork-in-page", "park-room", "park-compute", "park-now", "wake", "wake_now", "pressure"):
        assert stats.ops.get(op, 0) > 0, f"seed {seed}: no {op} in {OPS} operations: {stats.ops}"
