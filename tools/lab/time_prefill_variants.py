"""The prefill attention variants of tools/lab/kernels-src/prefill_lab.cu against the shipped
kern_prefill_attn, and kern_qk_norm_rope_kv_rows against kern_qk_norm_rope_kv, on the local GPU.

    PYTHONPATH=tools/tests:tools/gpu python3 tools/lab/time_prefill_variants.py DIR [--reps 30] [--variants a,b]

`--variants` picks among kern_lab.PREFILL_VARIANTS (default: all of them).

0. Each entry's registers, local memory and blocks per SM at its dynamic shared memory (head_dim 128).
1. Checks: every variant (attention + its combine) on chunks of several GQA shapes against the f32
   reference over the gathered pages (|out - ref| <= 1e-2 + 1e-2 |ref|, as
   tools/tests/test_prefill_gpu.py) and against the shipped pair (largest difference); every row
   must be written.
2. Timings (Qwen3-4B heads: 32 q, 8 kv, head_dim 128): the shipped pair and each variant's on the
   chunks (start, rows) below, between CUDA events, median of --reps after a warm-up; ms and TFLOP/s
   (4 * head_dim * nq * the causal (query, key) pairs).
3. q/k norm + rope + KV write at 1..4096 rows: both entries, bit for bit, ms and GB/s (qkv read,
   q/k written back, k/v written to the pages).

Writes DIR/prefill_variants.json and DIR/prefill_variants.md and prints the tables. Exit status 1
when a check fails (the timings are still written).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cupy as cp
import torch
from helpers import kernel_harness as h
from helpers.kernel_cases import EPS, LAYER, LAYERS, block_table, qkv_case, rope_tables
from helpers.prefill_cases import PAGE, Chunk, attention_ref, new_case
from time_prefill import causal_flops, event_ms

from kern_lab import PREFILL_VARIANTS, PrefillVariant, build_lab_kernels
from kern_qwen3 import PREFILL_THREADS, prefill_smem

ROOT = Path(__file__).resolve().parents[2]
NQ, NKV, D = 32, 8, 128
CHECKS = [  # (nq, nkv, head_dim, start, rows)
    (32, 8, 128, 0, 1), (32, 8, 128, 0, 17), (32, 8, 128, 0, 709), (32, 8, 128, 2048, 2048),
    (32, 8, 128, 14000, 37), (32, 8, 128, 14000, 200), (32, 8, 128, 3000, 5), (40, 8, 128, 100, 200),
    (8, 8, 128, 0, 300), (4, 2, 128, 700, 300), (16, 8, 64, 700, 300), (8, 1, 64, 0, 97), (8, 1, 64, 3000, 5),
]
TIMES = [(0, 4096), (0, 2048), (2048, 2048), (0, 709), (14000, 37), (14000, 200), (30000, 512)]
NORM_ROWS = (1, 709, 2048, 4096)
TOL = 1e-2


ENTRIES = tuple(PREFILL_VARIANTS)
"""Every entry the script can check and time."""


def load_kernels(out: Path) -> h.Kernels:
    """The product's modules and prefill_lab.cu (the lab builder: the product's headers and the
    lab's), built into `out` or, as the harness does, into KERN_TEST_KERNELS."""
    k = h.Kernels(out)
    nvcc = shutil.which("nvcc") or "/usr/local/bin/nvcc"
    out = Path(os.environ.get("KERN_TEST_KERNELS", out))
    built = build_lab_kernels(out, lab_src=ROOT / "tools" / "lab" / "kernels-src",
                              product_src=ROOT / "tools" / "kernels-src", compiler=(nvcc,),
                              modules={"prefill_lab"})
    k.modules.update({m: cp.RawModule(path=str(p)) for m, (p, _sha) in built.items()})
    return k


def blocks_per_sm(k: h.Kernels, name: str, threads: int, smem: int) -> int:
    """The driver's count of resident blocks per SM for the entry at `smem` bytes of dynamic
    shared memory (the opt-in attribute raised first, as a launch does)."""
    fn = k.fn(name)
    if fn.max_dynamic_shared_size_bytes < smem:
        fn.max_dynamic_shared_size_bytes = smem
    return int(cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.kernel.ptr, threads, smem))


def resources(k: h.Kernels, names: list[str]) -> list[dict[str, Any]]:
    """Registers, local memory and blocks per SM (head_dim 128) of the shipped entry and `names`;
    a driver error in the count is recorded in its place (the checks and timings still run)."""
    shapes = {"kern_prefill_attn": (PREFILL_THREADS, prefill_smem(D))}
    for name in names:
        v = PREFILL_VARIANTS[name]
        shapes[name] = (v.threads, v.smem(D))
    out = []
    for name, (threads, smem) in shapes.items():
        fn = k.fn(name)
        try:
            per_sm: int | str = blocks_per_sm(k, name, threads, smem)
        except cp.cuda.driver.CUDADriverError as exc:
            per_sm = f"error: {exc}"
        out.append({"entry": name, "threads": threads, "dynamic_smem": smem, "registers": int(fn.num_regs),
                    "local_bytes": int(fn.local_size_bytes), "blocks_per_sm": per_sm})
    return out


def launch_variant(k: h.Kernels, name: str, v: PrefillVariant, c: Chunk) -> None:
    """The variant's attention entry then its combine, on the chunk's buffers."""
    case = c.case
    k.launch(name, v.grid(c.rows, case.nq, case.nkv), (v.threads,), h.ptr(c.qkv), h.ptr(case.state),
             h.ptr(case.table), h.ptr(c.seq), h.ptr(c.out), h.ptr(c.part_o), h.ptr(c.part_lse), h.i32(c.rows),
             h.i32(case.nq), h.i32(case.nkv), h.i32(case.d), h.i32(PAGE), h.i64(case.page_stride),
             h.f32(case.d**-0.5), shared_mem=v.smem(case.d))
    k.launch(f"{name}_combine", (c.rows, case.nq), (case.d,), h.ptr(c.part_o), h.ptr(c.part_lse), h.ptr(c.seq),
             h.ptr(c.out), h.i32(c.rows), h.i32(case.nq), h.i32(case.nkv), h.i32(case.d))


def _fresh(c: Chunk) -> None:
    c.out.fill_(float("nan"))
    c.part_o.fill_(float("nan"))
    c.part_lse.fill_(float("nan"))


def _errors(out: torch.Tensor, ref: torch.Tensor, shipped: torch.Tensor) -> dict[str, Any]:
    o = out.float()
    bad = (o - ref).abs() > TOL + TOL * ref.abs()
    return {"unwritten": int(out.isnan().sum()), "max_err": float((o - ref).abs().nan_to_num(math.inf).max()),
            "bad": int(bad.sum()), "max_vs_shipped": float((o - shipped.float()).abs().nan_to_num(math.inf).max())}


def check_rows(k: h.Kernels, names: list[str]) -> list[dict[str, Any]]:
    gen = torch.Generator(device="cuda")
    gen.manual_seed(11)
    rows = []
    for nq, nkv, d, start, n in CHECKS:
        case = new_case(nq, nkv, d, start + n, gen)
        ref = attention_ref(case, start, n)
        c = Chunk(case, start, n)
        c.launch_new(k)
        torch.cuda.synchronize()
        shipped = c.out.clone()
        rows.append({"shape": [nq, nkv, d, start, n], "entry": "shipped", **_errors(shipped, ref, shipped)})
        for name in names:
            _fresh(c)
            launch_variant(k, name, PREFILL_VARIANTS[name], c)
            torch.cuda.synchronize()
            rows.append({"shape": [nq, nkv, d, start, n], "entry": name, **_errors(c.out, ref, shipped)})
        del case, c, ref
        torch.cuda.empty_cache()
    for r in rows:
        r["ok"] = r["unwritten"] == 0 and r["bad"] == 0
    return rows


def time_rows(k: h.Kernels, names: list[str], reps: int) -> list[dict[str, Any]]:
    gen = torch.Generator(device="cuda")
    gen.manual_seed(7)
    rows = []
    for start, n in TIMES:
        c = Chunk(new_case(NQ, NKV, D, start + n, gen), start, n)
        row: dict[str, Any] = {"start": start, "rows": n, "ms": {}, "tflops": {}}
        runs: dict[str, Callable[[], None]] = {"shipped": lambda c=c: c.launch_new(k)}
        for name in names:
            runs[name] = lambda c=c, name=name: launch_variant(k, name, PREFILL_VARIANTS[name], c)
        for name, run in runs.items():
            ms = event_ms(run, reps)
            row["ms"][name] = ms
            row["tflops"][name] = causal_flops(start, n) / ms / 1e9
        rows.append(row)
        del c
        torch.cuda.empty_cache()
    return rows


def norm_rows(k: h.Kernels, reps: int) -> list[dict[str, Any]]:
    gen = torch.Generator(device="cuda")
    gen.manual_seed(5)
    out = []
    for rows in NORM_ROWS:
        maxpos, pages = 8192, -(-rows // PAGE) + 2
        qkv, wq, wk, pos = qkv_case(gen, rows, NQ, NKV, D, maxpos)
        cos, sin = rope_tables(maxpos, D, 1e6)
        kv = h.new_paged(LAYERS, pages, PAGE, NKV, D, gen)
        table = block_table(pages, gen)
        positions = torch.arange(rows, device="cuda")
        slots = (table.long()[positions // PAGE] * PAGE + positions % PAGE).contiguous()
        results = {}
        ms = {}
        for entry, grid, block in (("kern_qk_norm_rope_kv", (rows, NQ + 2 * NKV), (D // 2,)),
                                   ("kern_qk_norm_rope_kv_rows", (rows, -(-(NQ + 2 * NKV) // 8)), (256,))):
            q = qkv.clone()
            state = kv.state.clone()
            paged = h.Paged(state, LAYERS, pages, PAGE, NKV, D)

            run = functools.partial(
                k.launch, entry, grid, block, h.ptr(q), h.ptr(wq), h.ptr(wk), h.ptr(pos), h.ptr(cos), h.ptr(sin),
                h.ptr(paged.state, paged.layer_offset(LAYER)), h.ptr(slots), h.i32(NQ), h.i32(NKV), h.i32(D),
                h.f32(EPS), h.i32(PAGE), h.i64(paged.page_stride))
            q.copy_(qkv)
            run()
            torch.cuda.synchronize()
            results[entry] = (q.clone(), state.clone())
            q.copy_(qkv)
            ms[entry] = event_ms(run, reps)  # NOTE: re-normalizes in place: the bytes are the same
        (qa, sa), (qb, sb) = results.values()
        same = bool(torch.equal(qa.view(torch.int16), qb.view(torch.int16))
                    and torch.equal(sa.view(torch.int16), sb.view(torch.int16)))
        moved = rows * 2 * D * ((NQ + 2 * NKV) + (NQ + NKV) + 2 * NKV)
        out.append({"rows": rows, "bit_identical": same, "ms": ms,
                    "gbps": {e: moved / t / 1e6 for e, t in ms.items()}})
        del qkv, kv, state
        torch.cuda.empty_cache()
    return out


def tables(checks: list[dict[str, Any]], times: list[dict[str, Any]], norms: list[dict[str, Any]],
           names: list[str], res: list[dict[str, Any]]) -> str:
    lines = ["## Resources (head_dim 128)", "", "| entry | threads | dynamic smem | registers | local bytes | blocks/SM |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['entry']} | {r['threads']} | {r['dynamic_smem']} | {r['registers']} | {r['local_bytes']} | "
              f"{r['blocks_per_sm']} |" for r in res]
    lines += ["", "## Checks (f32 reference; tolerance 1e-2 + 1e-2 |ref|)", "",
             "| entry | shapes ok | worst max err | worst vs shipped |", "|---|---|---|---|"]
    for name in ["shipped", *names]:
        rs = [r for r in checks if r["entry"] == name]
        failed = [tuple(r["shape"]) for r in rs if not r["ok"]]
        lines.append(f"| {name} | {len(rs) - len(failed)}/{len(rs)}{' FAILED ' + str(failed) if failed else ''} | "
                     f"{max(r['max_err'] for r in rs):.2e} | {max(r['max_vs_shipped'] for r in rs):.2e} |")
    cols = ["shipped", *names]
    lines += ["", "## Attention ms (TFLOP/s), Qwen3-4B heads", "",
              "| start, rows | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for r in times:
        cells = [f"{r['ms'][c]:.4f} ({r['tflops'][c]:.0f})" for c in cols]
        lines.append(f"| {r['start']}, {r['rows']} | " + " | ".join(cells) + " |")
    lines += ["", "## q/k norm + rope + KV write", "",
              "| rows | bit-identical | block per head ms (GB/s) | warp per head ms (GB/s) |", "|---|---|---|---|"]
    for r in norms:
        a, b = "kern_qk_norm_rope_kv", "kern_qk_norm_rope_kv_rows"
        lines.append(f"| {r['rows']} | {r['bit_identical']} | {r['ms'][a]:.4f} ({r['gbps'][a]:.0f}) | "
                     f"{r['ms'][b]:.4f} ({r['gbps'][b]:.0f}) |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--variants", default=",".join(ENTRIES))
    args = ap.parse_args()
    names = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(names) - set(ENTRIES))
    if unknown:
        print(f"time_prefill_variants: unknown variants {unknown}; choose from {', '.join(ENTRIES)}",
              file=sys.stderr)
        return 2
    args.dir.mkdir(parents=True, exist_ok=True)
    k = load_kernels(args.dir / "kernels")
    res = resources(k, names)
    print(json.dumps(res), flush=True)
    checks = check_rows(k, names)
    print("checks done", flush=True)
    norms = norm_rows(k, args.reps)
    times = time_rows(k, names, args.reps)
    text = tables(checks, times, norms, names, res)
    (args.dir / "prefill_variants.json").write_text(json.dumps(
        {"device": torch.cuda.get_device_name(), "resources": res, "checks": checks, "times": times, "norms": norms},
        indent=1))
    (args.dir / "prefill_variants.md").write_text(text)
    print(text)
    ok = all(r["ok"] for r in checks) and all(r["bit_identical"] for r in norms)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
