"""kern bench's library on the GPU (the tiny Qwen3): its driver's tokens are an engine turn's (the
rows time what a turn computes), and one bench run gives every row it promises, finite and
positive, with the floors measured in the same run."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from helpers.tiny_build import build_tiny

STEPS = 48


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return build_tiny(tmp_path_factory.mktemp("bench"))


def _prompt(n: int) -> list[int]:
    return [(5 * i * i + 7 * i + 3) % 4000 for i in range(n)]


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 37, 300])
def test_the_drivers_tokens_are_an_engine_turns(tiny: dict[str, Any], n: int) -> None:
    import kern_runtime as kr
    from kern_runtime.bench.driver import Driver

    roles = kr.serving_roles(kr.read_manifest(tiny["manifest"]))
    rt = kr.Runtime.open(
        tiny["manifest"],
        tiny["kernels"],
        kr.weight_files([tiny["ckpt"]]),
        gpu=0,
        capacity=kr.Capacity(tokens=1024, seqs=1),
    )
    try:
        d = Driver(rt, roles, 1024)
        d.prefill(_prompt(n), 128)
        driven = [d.step() for _ in range(STEPS)]
        d.rewind()
        assert [d.step() for _ in range(STEPS)] == driven
        with kr.Engine(rt, roles, kr.EngineConfig(chunk=128)) as eng:
            seq = eng.sequence()
            eng.prefill(seq, _prompt(n), STEPS)
            assert [eng.step(seq) for _ in range(STEPS)] == driven
    finally:
        rt.close()


@pytest.mark.gpu
def test_a_bench_run_gives_every_row(tiny: dict[str, Any], tmp_path: Path) -> None:
    from kern_runtime.bench import BenchOptions, bench_session
    from kern_runtime.loading import LoadOptions

    load = LoadOptions(
        manifest=tiny["manifest"],
        kernels=tiny["kernels"],
        kernel_sources=None,
        weights=(tiny["ckpt"],),
        gpu=0,
        capacity=None,
    )
    options = BenchOptions(
        contexts=(64, 700), steps=200, prefill=(37, 300), prefill_reps=2, chunk=128, breakdown=(64,)
    )
    report = bench_session(load, options)
    by = {r["name"]: r["value"] for r in report.rows}
    want = ["weight_bytes_per_step", "gemm_floor_ms_per_step"]
    for c in (64, 700):
        want += [
            f"decode_{k}@ctx{c}"
            for k in (
                "ms_per_token",
                "fixed_ms_per_token",
                "gpu_ms_per_step",
                "gpu_fixed_ms_per_step",
            )
        ]
        want.append(f"bandwidth_floor_ms_per_step@ctx{c}")
    want += [f"{k}@{n}" for n in (37, 300) for k in ("prefill_ms", "ttft_ms", "compute_floor_ms")]
    missing = [w for w in want if w not in by]
    assert not missing, (missing, sorted(by))
    bad = {w: by[w] for w in want if not (math.isfinite(by[w]) and by[w] > 0)}
    assert not bad
    assert by["ttft_ms@300"] > by["prefill_ms@300"]
    assert 64 in report.breakdown and len(report.breakdown[64]) > 0
