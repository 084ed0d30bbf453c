"""cuBLASLt's candidate algorithms for the Qwen3-4B GEMMs, each timed, against the one its
heuristic ranks first (the one kern_runtime.Blas takes):

    python3 tools/lab/sweep_gemm.py DIR [--ms 32,64,200,709,2048] [--candidates 32] [--reps 20]

For every (m, GEMM) pair: C[m, n] = A[m, k] @ W[n, k]^T in bf16 with f32 accumulation, the
operands random (torch on the local GPU; kern_runtime.blas's descriptors and layouts), the
heuristic asked for `--candidates` algorithms within the runtime's workspace, each run `--reps`
times back to back between two CUDA events after 3 warm-up runs. Reports the heuristic's first,
the fastest and its manifest `algo` fields (Blas.describe), as TFLOP/s and the weight read in
TB/s. Writes DIR/sweep_gemm.json and DIR/sweep_gemm.md and prints the table.
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

GEMMS = {  # name: (n, k), Qwen3-4B
    "qkv": (6144, 2560), "o": (2560, 4096), "gate_up": (19456, 2560), "down": (2560, 9728),
    "lm_head": (151936, 2560),
}  # fmt: skip


def candidates(blas: Any, shape: Any, count: int) -> tuple[Any, list[np.ndarray]]:
    """The plan of `shape` (the heuristic's first algo) and the heuristic's `count` candidates."""
    from kern_runtime.blas import WORKSPACE_BYTES

    lt = blas._lt
    plan = blas.plan(shape, None)
    pref = lt.matmul_preference_create()
    try:
        ws = np.array([WORKSPACE_BYTES], dtype=np.uint64)
        lt.matmul_preference_set_attribute(pref, lt.MatmulPreferenceAttribute.MAX_WORKSPACE_BYTES, ws.ctypes.data, 8)
        results = np.zeros(count, dtype=lt.matmul_heuristic_result_dtype)
        got = np.zeros(1, dtype=np.int32)
        lt.matmul_algo_get_heuristic(blas.handle, plan.desc, plan.a, plan.b, plan.c, plan.c, pref, count,
                                     results.ctypes.data, got.ctypes.data)
    finally:
        lt.matmul_preference_destroy(pref)
    return plan, [np.array(results[i]["algo"]["data_"], dtype=np.uint64) for i in range(int(got[0]))]


def time_algo(blas: Any, plan: Any, algo: np.ndarray, ptrs: tuple[int, int, int], stream: int, reps: int) -> float:
    """Mean ms of one matmul with `algo` (inf when it refuses the problem)."""
    import torch

    from kern_runtime.blas import WORKSPACE_BYTES

    lt = blas._lt
    a, w, c = ptrs

    def call() -> None:
        lt.matmul(blas.handle, plan.desc, blas._alpha_ptr, w, plan.a, a, plan.b, plan.beta_ptr, c, plan.c, c,
                  plan.c, int(algo.ctypes.data), blas.workspace, WORKSPACE_BYTES, stream)

    try:
        for _ in range(3):
            call()
    except Exception:
        return float("inf")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def describe(blas: Any, algo: np.ndarray) -> dict[str, int]:
    class _P:
        pass

    p = _P()
    p.algo = algo  # type: ignore[attr-defined]
    return blas.describe(p)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("out", type=Path)
    ap.add_argument("--ms", default="32,64,200,709,2048")
    ap.add_argument("--candidates", type=int, default=32)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    import torch

    from kern_runtime.blas import WORKSPACE_BYTES, Blas, GemmShape

    torch.manual_seed(0)
    stream = torch.cuda.current_stream().cuda_stream
    workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
    rows: list[dict[str, Any]] = []
    with ExitStack() as stack:
        blas = Blas(stack, int(workspace.data_ptr()))
        for m in (int(x) for x in args.ms.split(",")):
            for name, (n, k) in GEMMS.items():
                a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.05
                c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
                shape = GemmShape(m=m, n=n, k=k, ldc=n, lda=k, out_f32=False, accumulate=False)
                plan, algos = candidates(blas, shape, args.candidates)
                ptrs = (int(a.data_ptr()), int(w.data_ptr()), int(c.data_ptr()))
                times = [time_algo(blas, plan, al, ptrs, stream, args.reps) for al in algos]
                ref = (a.float() @ w.float().T).to(torch.bfloat16)
                first = times[0]
                best = int(np.argmin(times))
                time_algo(blas, plan, algos[best], ptrs, stream, 1)
                err = float((c.float() - ref.float()).abs().max())
                flop = 2.0 * m * n * k
                row = {
                    "m": m, "gemm": name, "n": n, "k": k, "candidates": len(algos),
                    "first_ms": first, "best_ms": times[best], "best_rank": best,
                    "first_tflops": flop / first / 1e9, "best_tflops": flop / times[best] / 1e9,
                    "best_weight_tbs": n * k * 2 / times[best] / 1e9, "gain": first / times[best] - 1,
                    "best_algo": describe(blas, algos[best]), "first_algo": describe(blas, algos[0]),
                    "best_max_err": err, "all_ms": times,
                }  # fmt: skip
                rows.append(row)
                print(f"m {m:5d} {name:8s} first {first * 1e3:9.1f} us ({row['first_tflops']:6.1f} TFLOP/s) "
                      f"best #{best} {times[best] * 1e3:9.1f} us ({row['best_tflops']:6.1f}), gain {row['gain'] * 100:5.1f} %",
                      flush=True)
                del a, w, c, ref
    (args.out / "sweep_gemm.json").write_text(json.dumps(rows, indent=1))
    lines = ["| m | GEMM | candidates | first us | best us | best rank | gain | best TFLOP/s | weight TB/s | best algo |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['m']} | {r['gemm']} | {r['candidates']} | {r['first_ms'] * 1e3:.1f} | {r['best_ms'] * 1e3:.1f} "
                     f"| {r['best_rank']} | {r['gain'] * 100:.1f} % | {r['best_tflops']:.1f} | {r['best_weight_tbs']:.2f} "
                     f"| {r['best_algo']} |")
    (args.out / "sweep_gemm.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
