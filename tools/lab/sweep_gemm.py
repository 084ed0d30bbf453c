"""cuBLASLt's candidate algorithms for the Qwen3-4B GEMMs, timed at many m against the one its
heuristic ranks first at each m (the one kern_runtime.Blas takes when no algo is pinned), and the
pins by m range that would beat it:

    python3 tools/lab/sweep_gemm.py DIR [--ms 2,4,8,...,2048] [--reps 10] [--ranges 6]

For every GEMM C[m, n] = A[m, k] @ W[n, k]^T (bf16, f32 accumulation, beta 0, as the prefill and
batched-step programs call them) the candidates are the union of the heuristic's first 8 at every
m of `--ms` (kern_runtime.blas's descriptors, the runtime's workspace). Each candidate is timed at
every m: 3 warm-up runs, then `--reps` runs back to back between two CUDA events, each on the next
of enough copies of W (random, on the local GPU through torch) that they never sit in L2 together,
as in a program, where a GEMM's weights are read once per step. A candidate that refuses an m
counts as infinitely slow there.

Then, per GEMM, the m samples are cut into at most `--ranges` runs, each run either left to the
heuristic or pinned to one candidate for all its m (the runtime checks a pin at both ends of its
range), minimizing the summed time relative to the fastest candidate at each m. Writes
DIR/sweep_gemm.json (every time, the heuristic's rank-0 per m, the chosen runs with their algo
fields as the manifest spells them: Blas.describe) and DIR/sweep_gemm.md, and prints the runs.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

GEMMS = {  # name: (n, k), Qwen3-4B
    "qkv": (6144, 2560), "o": (2560, 4096), "gate_up": (19456, 2560), "down": (2560, 9728),
    "lm_head": (151936, 2560),
}  # fmt: skip
MS = "1,2,4,8,12,16,24,32,48,64,96,128,200,256,384,512,709,1024,1536,2048"
L2_BYTES = 256 << 20  # NOTE: W copies rotated through at least this many bytes (the H200's L2 is 50 MiB)


def heuristic(blas: Any, plan: Any, count: int) -> list[np.ndarray]:
    """The heuristic's first `count` algos for the plan's shape (the runtime's workspace)."""
    from kern_runtime.blas import WORKSPACE_BYTES

    lt = blas._lt
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
    return [np.array(results[i]["algo"]["data_"], dtype=np.uint64) for i in range(int(got[0]))]


def time_algo(blas: Any, plan: Any, algo: np.ndarray, a: int, ws: list[int], c: int, stream: int, reps: int) -> float:
    """Mean ms of one matmul with `algo` over rotating weights (inf when it refuses the problem)."""
    import torch

    from kern_runtime.blas import WORKSPACE_BYTES

    lt = blas._lt
    ptr = int(algo.ctypes.data)

    def call(w: int) -> None:
        lt.matmul(blas.handle, plan.desc, blas._alpha_ptr, w, plan.a, a, plan.b, plan.beta_ptr, c, plan.c, c,
                  plan.c, ptr, blas.workspace, WORKSPACE_BYTES, stream)

    try:
        for i in range(3):
            call(ws[i % len(ws)])
    except Exception:
        return math.inf
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(reps):
        call(ws[(i + 3) % len(ws)])
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


class _Algo:
    def __init__(self, algo: np.ndarray) -> None:
        self.algo = algo


def runs(times: np.ndarray, first: np.ndarray, ms: list[int], most: int) -> list[dict[str, Any]]:
    """The cut of the m samples into at most `most` runs (each the heuristic's, candidate -1, or one
    candidate's) of least summed time relative to the fastest at each m; a pin costs 0.5 % more
    than the heuristic at equal time, so a run is pinned only where a candidate wins."""
    best = times.min(axis=0)
    rel = times / best  # [candidates, m]
    heur = first / best
    n = len(ms)

    def run_cost(i: int, j: int) -> tuple[float, int]:
        h = float(heur[i:j].sum())
        pinned = rel[:, i:j].sum(axis=1) * 1.005
        c = int(np.argmin(pinned))
        return (float(pinned[c]), c) if pinned[c] < h else (h, -1)

    inf = (math.inf, [])
    dp: list[list[tuple[float, list[tuple[int, int, int]]]]] = [[inf] * (n + 1) for _ in range(most + 1)]
    dp[0][0] = (0.0, [])
    for r in range(1, most + 1):
        for j in range(1, n + 1):
            for i in range(j):
                prev = dp[r - 1][i]
                if math.isinf(prev[0]):
                    continue
                cost, cand = run_cost(i, j)
                total = prev[0] + cost
                if total < dp[r][j][0] - 1e-9:
                    dp[r][j] = (total, [*prev[1], (i, j, cand)])
    _, cut = min((dp[r][n] for r in range(1, most + 1)), key=lambda x: (x[0], len(x[1])))
    out = []
    for i, j, cand in cut:
        out.append({"m_min": ms[i], "m_max": ms[j - 1], "candidate": cand,
                    "heuristic_ms": [float(first[x]) for x in range(i, j)],
                    "pinned_ms": [float(times[cand, x]) for x in range(i, j)] if cand >= 0 else None})
    return out


def sweep(blas: Any, name: str, n: int, k: int, ms: list[int], reps: int, stream: int) -> dict[str, Any]:
    import torch

    from kern_runtime.blas import GemmShape

    copies = max(2, min(16, -(-L2_BYTES // (n * k * 2))))
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.05 for _ in range(copies)]
    a = torch.randn(max(ms), k, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(max(ms), n, device="cuda", dtype=torch.bfloat16)
    plans = {m: blas.plan(GemmShape(m=m, n=n, k=k, ldc=n, lda=k, out_f32=False, accumulate=False), None) for m in ms}
    algos: dict[bytes, np.ndarray] = {}
    firsts: dict[int, bytes] = {}
    for m in ms:
        cands = heuristic(blas, plans[m], 8)
        firsts[m] = cands[0].tobytes()
        for al in cands:
            algos.setdefault(al.tobytes(), al)
    keys = list(algos)
    wp = [int(w.data_ptr()) for w in ws]
    times = np.full((len(keys), len(ms)), math.inf)
    for x, m in enumerate(ms):
        for y, key in enumerate(keys):
            times[y, x] = time_algo(blas, plans[m], algos[key], int(a.data_ptr()), wp, int(c.data_ptr()), stream, reps)
    first = np.array([times[keys.index(firsts[m]), x] for x, m in enumerate(ms)])
    del ws, a, c
    torch.cuda.empty_cache()
    return {"keys": keys, "algos": algos, "times": times, "first": first,
            "first_rank": [keys.index(firsts[m]) for m in ms]}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("out", type=Path)
    ap.add_argument("--ms", default=MS)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--ranges", type=int, default=6)
    ap.add_argument("--gemms", default=",".join(GEMMS))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    ms = sorted({int(x) for x in args.ms.split(",")})

    import torch

    from kern_runtime.blas import WORKSPACE_BYTES, Blas

    torch.manual_seed(0)
    stream = torch.cuda.current_stream().cuda_stream
    workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
    report: dict[str, Any] = {"ms": ms, "gemms": {}}
    lines: list[str] = []
    with ExitStack() as stack:
        blas = Blas(stack, int(workspace.data_ptr()))
        for name in args.gemms.split(","):
            n, k = GEMMS[name]
            s = sweep(blas, name, n, k, ms, args.reps, stream)
            cut = runs(s["times"], s["first"], ms, args.ranges)
            for r in cut:
                if r["candidate"] >= 0:
                    r["algo"] = blas.describe(_Algo(s["algos"][s["keys"][r["candidate"]]]))
            report["gemms"][name] = {
                "n": n, "k": k, "candidates": len(s["keys"]),
                "heuristic_us": [round(t * 1e3, 2) for t in s["first"]],
                "best_us": [round(t * 1e3, 2) for t in s["times"].min(axis=0)],
                "runs": cut,
            }  # fmt: skip
            lines.append(f"## {name} (n {n}, k {k}): {len(s['keys'])} candidates")
            lines.append("| m | " + " | ".join(str(m) for m in ms) + " |")
            lines.append("|---|" + "---|" * len(ms))
            lines.append("| heuristic us | " + " | ".join(f"{t * 1e3:.1f}" for t in s["first"]) + " |")
            lines.append("| best us | " + " | ".join(f"{t * 1e3:.1f}" for t in s["times"].min(axis=0)) + " |")
            for r in cut:
                if r["candidate"] < 0:
                    lines.append(f"- m {r['m_min']}..{r['m_max']}: heuristic")
                else:
                    h, p = sum(r["heuristic_ms"]), sum(r["pinned_ms"])
                    lines.append(f"- m {r['m_min']}..{r['m_max']}: pin {r['algo']} ({(h / p - 1) * 100:.1f} % faster summed)")
            lines.append("")
            print("\n".join(lines[-(len(cut) + 5):]), flush=True)
    (args.out / "sweep_gemm.json").write_text(json.dumps(report, indent=1))
    (args.out / "sweep_gemm.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
