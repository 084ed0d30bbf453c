"""cuBLASLt's candidate algorithms for the Qwen3-4B GEMMs, timed at many m against the one its
heuristic ranks first at each m (the one kern_runtime.Blas takes when no algo is pinned), and the
pins by m range that would beat it:

    python3 tools/lab/sweep_gemm.py DIR [--bounds 1,2,3,5,...,2048] [--top 2048] [--reps 10] [--ranges 6]

For every GEMM C[m, n] = A[m, k] @ W[n, k]^T (bf16, f32 accumulation, beta 0, as the prefill and
batched-step programs call them) the m samples are both ends of every segment between two
`--bounds` (1..`--top`; lm_head to 64, the batched step's rows), and the candidates the union of
the heuristic's first 8 at every sample (kern_runtime.blas's descriptors, the runtime's
workspace). Each candidate is timed at every sample: 3 warm-up runs, then `--reps` runs back to back between two CUDA events, each on the next
of enough copies of W (random, on the local GPU through torch) that they never sit in L2 together,
as in a program, where a GEMM's weights are read once per step. A candidate that refuses an m
counts as infinitely slow there.

Then, per GEMM, the segments are cut into at most `--ranges` runs, each run either left to the
heuristic or pinned to one candidate for all its m (the runtime checks a pin at both ends of its
range), minimizing the summed time relative to the fastest candidate at each sample. Writes
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
BOUNDS = "1,2,3,5,9,13,17,25,33,49,65,97,129,193,257,385,513,769,1025,1537,2048"
"""Where a run may start; each segment between two is sampled at both ends (m and the next m - 1)."""
TOPS = {"lm_head": 64}
"""The largest m a GEMM is called at, when not the chunk's 2048 (lm_head: the batched step's rows)."""
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


def segments(bounds: list[int], top: int) -> list[tuple[int, int]]:
    """[first, last] m of each segment: from one bound to the next's m - 1, the last to `top`."""
    b = sorted(x for x in set(bounds) if x <= top)
    return [(lo, (b[i + 1] - 1) if i + 1 < len(b) else top) for i, lo in enumerate(b)]


def runs(times: np.ndarray, first: np.ndarray, ms: list[int], segs: list[tuple[int, int]],
         most: int) -> list[dict[str, Any]]:
    """The cut of the segments into at most `most` runs (each the heuristic's, candidate -1, or
    one candidate's for all its m) of least summed time relative to the fastest candidate at each
    sampled m; both ends of every segment are sampled, so a pin is timed where its range starts and
    ends (a tile that m outgrows inside a run shows at the run's end). A pin must beat the
    heuristic by 0.5 % to be taken."""
    best = times.min(axis=0)
    rel = times / best  # [candidates, m]
    heur = first / best
    cols = [[x for x, m in enumerate(ms) if lo <= m <= hi] for lo, hi in segs]
    n = len(segs)

    def run_cost(i: int, j: int) -> tuple[float, int]:
        xs = [x for s in cols[i:j] for x in s]
        h = float(heur[xs].sum())
        pinned = rel[:, xs].sum(axis=1) * 1.005
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
        xs = [x for s in cols[i:j] for x in s]
        out.append({"m_min": segs[i][0], "m_max": segs[j - 1][1], "candidate": cand,
                    "ms": [ms[x] for x in xs], "heuristic_ms": [float(first[x]) for x in xs],
                    "pinned_ms": [float(times[cand, x]) for x in xs] if cand >= 0 else None})
    # NOTE: neighbouring runs on the same choice are one run
    merged: list[dict[str, Any]] = []
    for r in out:
        if merged and merged[-1]["candidate"] == r["candidate"]:
            last = merged[-1]
            last["m_max"] = r["m_max"]
            for key in ("ms", "heuristic_ms"):
                last[key] += r[key]
            if last["pinned_ms"] is not None:
                last["pinned_ms"] += r["pinned_ms"]
        else:
            merged.append(r)
    return merged


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
    ap.add_argument("--bounds", default=BOUNDS)
    ap.add_argument("--top", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--ranges", type=int, default=6)
    ap.add_argument("--gemms", default=",".join(GEMMS))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    bounds = [int(x) for x in args.bounds.split(",")]

    import torch

    from kern_runtime.blas import WORKSPACE_BYTES, Blas

    torch.manual_seed(0)
    stream = torch.cuda.current_stream().cuda_stream
    workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
    report: dict[str, Any] = {"bounds": bounds, "gemms": {}}
    lines: list[str] = []
    with ExitStack() as stack:
        blas = Blas(stack, int(workspace.data_ptr()))
        for name in args.gemms.split(","):
            n, k = GEMMS[name]
            segs = segments(bounds, TOPS.get(name, args.top))
            ms = sorted({m for seg in segs for m in seg})
            s = sweep(blas, name, n, k, ms, args.reps, stream)
            cut = runs(s["times"], s["first"], ms, segs, args.ranges)
            for r in cut:
                if r["candidate"] >= 0:
                    r["algo"] = blas.describe(_Algo(s["algos"][s["keys"][r["candidate"]]]))
            report["gemms"][name] = {
                "n": n, "k": k, "candidates": len(s["keys"]), "ms": ms,
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
