"""tools/lab/ncu_gemv.py's cases (the decode GEMVs Nsight Compute profiles) on the CPU: each is a GEMV
entry the generator can launch at that GEMM's shape, and tools/lab/perf-pass runs the script under
ncu with the clocks left alone."""

from __future__ import annotations

from pathlib import Path

import ncu_gemv

import kern_qwen3 as gen
from kern_lab import LAB_GEMV_ENTRIES

SHAPES = {"qkv": (6144, 2560), "o": (2560, 4096), "gate_up": (9728, 2560), "down": (2560, 9728),
          "lm_head": (151936, 2560)}


def test_cases_are_launchable_gemv_entries_at_their_gemm_shapes() -> None:
    assert {gemm for gemm, *_ in ncu_gemv.CASES} == set(gen.GEMV_GEMMS)
    deferred = set(gen.DEFER_ENTRIES.values())
    for gemm, entry, n, k in ncu_gemv.CASES:
        assert (n, k) == SHAPES[gemm] and (entry in LAB_GEMV_ENTRIES or gen.DEFER_ENTRIES.get(gemm) == entry)
        assert ("_silu" in entry) == (gemm == "gate_up")
        grid, threads, smem = gen.defer_launch(n) if entry in deferred else gen.gemv_launch(entry, n, k, table=LAB_GEMV_ENTRIES)
        assert grid >= 1 and threads == 128 and smem <= gen.GEMV_P4_MAX_ROW
    # The fast step's picks are among them (GEMV_PICK, with the deferred-norm bands for qkv and
    # gate_up), and the band they replaced.
    picks = {**gen.GEMV_PICK, **gen.DEFER_ENTRIES}
    assert {(g, e) for g, e, *_ in ncu_gemv.CASES} >= set(picks.items()) | {("gate_up", "kern_gemv_bf16_b4_silu")}


def test_perf_pass_runs_it_under_ncu_with_the_clocks_left_alone() -> None:
    text = (Path(ncu_gemv.ROOT) / "tools" / "lab" / "perf-pass").read_text()
    lines = text[text.index("stage ncu"):].splitlines()
    stage = " ".join(lines[: next(i for i, line in enumerate(lines) if not line.endswith("\\")) + 1])
    assert "--clock-control none" in stage and "tools/lab/ncu_gemv.py" in stage and "--csv" in stage
