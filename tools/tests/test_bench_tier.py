"""tools/gpu/bench_tier.py without a GPU: its manifest verifies and sizes the pool it needs."""

from __future__ import annotations

import json

import bench_tier

import kern_pool
from kern_manifest import parse_manifest, verify
from kern_runtime.sequences import pool_config_for


def test_the_bench_manifest_holds_a_6_gib_checkpoint_and_its_wake() -> None:
    m = parse_manifest(json.dumps(bench_tier._manifest("ab" * 32)))  # pyright: ignore[reportPrivateUsage]
    verify(m)  # Runtime.load verifies too: a rejected manifest would fail only on the GPU host
    tokens = bench_tier.PAGES * bench_tier.UNIT
    config = pool_config_for(m, kern_pool.Capacity(tokens=2 * tokens + 64 * bench_tier.UNIT, seqs=1))
    assert config is not None and config.unit == 16 and config.row_pages >= bench_tier.PAGES
    assert config.pages_max >= 2 * bench_tier.PAGES
    gib = bench_tier.PAGES * bench_tier.UNIT * bench_tier.TOKEN / (1 << 30)
    assert 5.9 < gib < 6.1
