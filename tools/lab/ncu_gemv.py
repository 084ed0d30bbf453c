"""Launches the decode GEMV entries once each at the Qwen3-4B shapes, for Nsight Compute to read
their hardware counters (memory workload, warp stall reasons, occupancy). Run under ncu on a GPU
host whose runtime exposes the counters (`--clock-control none` leaves the clocks alone):

    ncu --clock-control none -k "regex:^kern_gemv_bf16_" --section SpeedOfLight \
        --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats \
        --section LaunchStats --csv --page details python3 tools/lab/ncu_gemv.py > ncu.csv

(tools/lab/perf-pass's `ncu` stage, which puts tools/tests on PYTHONPATH). Each case is launched twice, the grid, block and dynamic
shared memory of kern_qwen3.gemv_launch over kern_lab's table, on random bf16 x and W (never zeros); ncu flushes the caches
before each of its replay passes, so W comes from DRAM as in a decode step. This script prints to
stderr only: stdout is ncu's CSV.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CASES: tuple[tuple[str, str, int, int], ...] = (
    ("qkv", "kern_gemv_bf16_b4_d", 6144, 2560),
    ("qkv", "kern_gemv_bf16_b4", 6144, 2560),
    ("qkv", "kern_gemv_bf16_p4", 6144, 2560),
    ("o", "kern_gemv_bf16_s4", 2560, 4096),
    ("gate_up", "kern_gemv_bf16_b4_silu_d", 9728, 2560),
    ("gate_up", "kern_gemv_bf16_b4_silu", 9728, 2560),
    ("gate_up", "kern_gemv_bf16_p4_silu", 9728, 2560),
    ("down", "kern_gemv_bf16_b4", 2560, 9728),
    ("down", "kern_gemv_bf16_p4", 2560, 9728),
    ("lm_head", "kern_gemv_bf16_p4", 151936, 2560),
)
"""(GEMM, GEMV entry, n, k): the fast step's picks (qkv and gate_up on the deferred-norm band `_d`,
o one column per block, down and lm_head prefetched), the unfolded band and the `_p4` alternatives
they are compared with (docs/perf.md: 3.1-3.5 TB/s against 4.2-4.5)."""


def main() -> int:
    import torch
    from helpers import kernel_harness as h

    import kern_qwen3 as gen
    from kern_lab import LAB_GEMV_ENTRIES

    out = Path(os.environ.get("KERN_TEST_KERNELS") or tempfile.mkdtemp(prefix="kern-ncu-"))
    k = h.Kernels(out, lab=True)
    g = torch.Generator(device="cuda")
    g.manual_seed(7)
    for gemm, entry, n, kk in CASES:
        deferred = entry.endswith("_d")
        rows = 2 * n if "_silu" in entry else n
        grid, threads, smem = gen.defer_launch(n) if deferred else gen.gemv_launch(entry, n, kk, table=LAB_GEMV_ENTRIES)
        x = torch.randn(1, kk, generator=g, device="cuda").to(torch.bfloat16)
        w = (torch.randn(rows, kk, generator=g, device="cuda") * 0.05).to(torch.bfloat16)
        y = torch.empty(1, n, device="cuda", dtype=torch.bfloat16)
        # The deferred-norm form takes (res_in, y_add, w_norm, res_out, w, y, rows, n, k, y_stride, eps).
        norm_args = [torch.randn_like(x), torch.rand_like(x) + 0.5, torch.empty_like(x)]  # y_add, w_norm, res_out
        head = (h.ptr(x), *map(h.ptr, norm_args), h.ptr(w)) if deferred else (h.ptr(x), h.ptr(w))
        tail = (h.f32(1e-6),) if deferred else ()
        for _ in range(2):
            k.launch(entry, (grid, 1, 1), (threads, 1, 1), *head, h.ptr(y), h.i32(1), h.i32(n), h.i32(kk), h.i32(n),
                     *tail, shared_mem=smem)
        torch.cuda.synchronize()
        print(f"{gemm}: {entry} {n}x{kk}, grid {grid} x {threads}, {smem} B shared, W {rows * kk * 2 / 1e6:.1f} MB",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
