"""The lab's warp-specialized kern_pf_ws (tools/lab/kernels-src/prefill_ws.cu) against the shipped
kern_prefill_attn, each with its combine, on the local GPU:

    PYTHONPATH=tools/tests:tools/gpu python3 tools/lab/time_prefill_ws.py DIR [--reps 20]

1. Checks: kern_pf_ws on chunks of several GQA shapes at head_dim 128 (those of
   tools/tests/test_prefill_gpu.py's kinds: from position 0, short chunks over long prefixes,
   group 1 to 8) against the f32 reference over the gathered pages, with test_prefill_gpu's bound
   (|out - ref| <= 1e-2 + 1e-2 |ref|); every row written.
2. Timings (Qwen3-4B heads: 32 q, 8 kv, head_dim 128, the chunks of time_prefill.py, and 4,096 rows
   after 12,288): both pairs between CUDA events, median of --reps after a warm-up; ms and TFLOP/s.

Writes DIR/prefill_ws.json and DIR/prefill_ws.md; exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from helpers import kernel_harness as h
from helpers.prefill_cases import PAGE, Chunk, attention_ref, new_case, prefill_grid
from time_prefill import CHUNKS, NKV, NQ, D, causal_flops, event_ms

WS_SMEM = 1024 + 2 * 16384 + 6 * 32768
CHECKS = [(32, 8, 0, 1), (32, 8, 0, 97), (32, 8, 0, 709), (32, 8, 0, 2048), (32, 8, 3000, 5), (32, 8, 14000, 200),
          (32, 8, 511, 1), (8, 8, 0, 300), (8, 1, 0, 97), (16, 2, 700, 300), (40, 8, 100, 1000), (32, 8, 30000, 512)]
TIMES = [*CHUNKS, (12288, 4096), (2048, 2048)]


def launch_ws(k: h.Kernels, c: Chunk) -> None:
    """kern_pf_ws then kern_pf_ws_combine over chunk `c` (kern_prefill_attn's grid in y and z)."""
    case = c.case
    _, y, z = prefill_grid(c.rows, case.nq, case.nkv)
    grid = (-(-c.rows * (case.nq // case.nkv) // 128), y, z)
    k.launch("kern_pf_ws", grid, (384,), h.ptr(c.qkv), h.ptr(case.state), h.ptr(case.table), h.ptr(c.seq),
             h.ptr(c.out), h.ptr(c.part_o), h.ptr(c.part_lse), h.i32(c.rows), h.i32(case.nq), h.i32(case.nkv),
             h.i32(case.d), h.i32(PAGE), h.i64(case.page_stride), h.f32(case.d**-0.5), shared_mem=WS_SMEM)
    k.launch("kern_pf_ws_combine", (c.rows,), (128,), h.ptr(c.part_o), h.ptr(c.part_lse), h.ptr(c.seq),
             h.ptr(c.out), h.i32(c.rows), h.i32(case.nq), h.i32(case.nkv), h.i32(case.d))


def check(k: h.Kernels, gen: torch.Generator) -> list[dict[str, object]]:
    out = []
    for nq, nkv, start, rows in CHECKS:
        case = new_case(nq, nkv, D, start + rows, gen)
        c = Chunk(case, start, rows)
        launch_ws(k, c)
        torch.cuda.synchronize()
        ref = attention_ref(case, start, rows)
        err = (c.out.float() - ref).abs().nan_to_num(float("inf"))
        bad = int((err > 1e-2 + 1e-2 * ref.abs()).sum())
        out.append({"nq": nq, "nkv": nkv, "start": start, "rows": rows, "bad": bad, "max_err": float(err.max())})
        print(f"check nq {nq} nkv {nkv} start {start} rows {rows}: {bad} elements out of bound, "
              f"largest error {float(err.max()):.3g}", flush=True)
        del c, case
        torch.cuda.empty_cache()
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("out", type=Path)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    k = h.Kernels(args.out / "kernels", lab=True)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(7)
    checks = check(k, gen)
    times = []
    for start, n in TIMES:
        c = Chunk(new_case(NQ, NKV, D, start + n, gen), start, n)
        shipped = event_ms(lambda c=c: c.launch_new(k), args.reps)
        ws = event_ms(lambda c=c: launch_ws(k, c), args.reps)
        fl = causal_flops(start, n)
        times.append({"start": start, "rows": n, "shipped_ms": shipped, "ws_ms": ws,
                      "shipped_tflops": fl / shipped / 1e9, "ws_tflops": fl / ws / 1e9})
        print(f"start {start} rows {n}: shipped {shipped:.4f} ms ({fl / shipped / 1e9:.1f} TFLOP/s), "
              f"ws {ws:.4f} ms ({fl / ws / 1e9:.1f})", flush=True)
        del c
        torch.cuda.empty_cache()
    lines = ["| start | rows | shipped ms | TFLOP/s | ws ms | TFLOP/s | ws / shipped |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {t['start']} | {t['rows']} | {t['shipped_ms']:.4f} | {t['shipped_tflops']:.1f} | {t['ws_ms']:.4f} | "
              f"{t['ws_tflops']:.1f} | {t['ws_ms'] / t['shipped_ms']:.3f} |" for t in times]
    text = "\n".join(lines)
    print(text)
    (args.out / "prefill_ws.md").write_text(text + "\n")
    (args.out / "prefill_ws.json").write_text(json.dumps({"checks": checks, "times": times}, indent=1) + "\n")
    return 0 if all(ch["bad"] == 0 for ch in checks) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
