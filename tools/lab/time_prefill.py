"""Prefill timings on the local GPU: the attention entries alone, then the whole prefill program.

    PYTHONPATH=tools/tests:tools/gpu python3 tools/lab/time_prefill.py DIR [--reps 20] [--chunks 512,2048]
        [--manifest examples/qwen3-4b-fast.json] [--gpu 0] [--no-program | --no-kernels]
        [--prompts 709,4096,16384] [--graphs]

1. Kernels alone (Qwen3-4B heads: 32 q, 8 kv, head_dim 128, pages of 16 over a scattered block
   table): prefill.cu's kern_prefill_attn + kern_prefill_combine ("new") and attention.cu's
   kern_attn_prefill ("old") for the chunks (start, rows) of tools/tests/test_prefill_gpu.py, each
   launch between CUDA events on torch's stream, median of --reps after one warm-up; ms, TFLOP/s
   (4 * head_dim * nq * the causal (query, key) pairs) and new/old.
2. The manifest's prefill program through kern_runtime on the seeded random Qwen3-4B checkpoint
   (kern_qwen3.checkpoint, written once to the cache): prompts of 709, 4096 and 16384 tokens
   prefilled from nothing in chunks of each --chunks size (a fresh `Engine`'s prefill of a fresh
   sequence, every chunk run eagerly: its lease, zeroed by memsets, then the chunks; wall time
   between synchronizations, median of --reps // 4 + 1 after a warm-up), and one chunk of 37 and
   of 200 rows over a 14,000-token resident prefix (an engine's lease of the prefix, then stage +
   one run of the chunk program on its pages, median of --reps); with --graphs each prompt also
   with every chunk issued through the engine's graph cache of the chunk program
   (`EngineConfig.chunk_graph_rows` = the chunk: a length replays from a CUDA graph captured on its
   second use); the first run of each is reported apart (it compiles the program's launch records
   for a token count not seen before, as every new turn length does); then one run of each under torch.profiler (CUPTI: every kernel of the process) for
   the per-call breakdown: GPU time by kind (attention, GEMM = every kernel that is not ours,
   norms, q/k norm + rope + KV write, other), the GPU's span (first kernel start to last kernel
   end: the kernels' sum plus the gaps between them), the GEMMs' TFLOP/s and the ten longest kernels.

Writes DIR/time_prefill.json and DIR/time_prefill.md (both tables) and prints the tables.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from engine_inputs import add_engine_args, load_inputs
from helpers import kernel_harness as h
from helpers.prefill_cases import Chunk, new_case

CHUNKS = [(0, 1), (0, 15), (0, 16), (0, 17), (0, 709), (0, 4096), (14000, 37), (14000, 200), (30000, 512)]
NQ, NKV, D = 32, 8, 128
PROMPTS = (709, 4096, 16384)
PREFIX = 14000
TURNS = (37, 200)


def causal_flops(start: int, rows: int) -> float:
    """FLOPs of a chunk of `rows` rows after `start` cached tokens: 4 head_dim nq per causal pair."""
    pairs = rows * start + rows * (rows + 1) / 2
    return 4.0 * D * NQ * pairs


def event_ms(run: Callable[[], None], reps: int) -> float:
    """Median ms of `run` between CUDA events over `reps` runs, after one warm-up."""
    run()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def _has(k: h.Kernels, entry: str) -> bool:
    try:
        k.fn(entry)
    except KeyError:
        return False
    return True


def kernel_rows(k: h.Kernels, reps: int) -> list[dict[str, Any]]:
    """Both entries per chunk; the old one's columns are NaN where the sources no longer define it."""
    gen = torch.Generator(device="cuda")
    gen.manual_seed(7)
    has_old = _has(k, "kern_attn_prefill")
    rows = []
    for start, n in CHUNKS:
        chunk = Chunk(new_case(NQ, NKV, D, start + n, gen), start, n)
        new = event_ms(lambda c=chunk: c.launch_new(k), reps)
        old = event_ms(lambda c=chunk: c.launch_old(k), reps) if has_old else float("nan")
        fl = causal_flops(start, n)
        rows.append({"start": start, "rows": n, "new_ms": new, "old_ms": old, "new_tflops": fl / new / 1e9,
                     "old_tflops": fl / old / 1e9, "new_over_old": new / old})
        del chunk
        torch.cuda.empty_cache()
    return rows


def kernel_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| start | rows | new ms | new TFLOP/s | old ms | old TFLOP/s | new / old |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['start']} | {r['rows']} | {r['new_ms']:.4f} | {r['new_tflops']:.1f} | {r['old_ms']:.4f} | "
              f"{r['old_tflops']:.1f} | {r['new_over_old']:.3f} |" for r in rows]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# The prefill program through kern_runtime.


def _kind(name: str) -> str:
    if not name.startswith("kern_"):
        return "gemm"
    if "attn" in name or "prefill" in name:
        return "attention"
    if "rmsnorm" in name:
        return "norms"
    if "rope" in name or "kv_write" in name:
        return "qk_norm_rope_kv"
    return "other"


def _profile(run: Callable[[], None], sync: Callable[[], None]) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        sync()
    kinds: dict[str, float] = defaultdict(float)
    kernels = []
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if us and not e.key.startswith(("Memcpy", "Memset", "cudaMemcpy")):
            kinds[_kind(e.key)] += us / 1e3
            kernels.append({"kernel": e.key, "calls": e.count, "ms": us / 1e3})
    kernels.sort(key=lambda r: -r["ms"])
    # the GPU's span: the first kernel's start to the last kernel's end (the sum of the kernels'
    # times plus the gaps between them)
    spans = [(e.time_range.start, e.time_range.end) for e in prof.events()
             if str(getattr(e, "device_type", "")).endswith("CUDA") and not e.key.startswith(("Memcpy", "Memset"))]
    span = (max(b for _, b in spans) - min(a for a, _ in spans)) / 1e3 if spans else float("nan")
    return {"kinds_ms": dict(sorted(kinds.items())), "gpu_ms": sum(kinds.values()), "span_ms": span,
            "top": kernels[:10]}


def _wall_ms(run: Callable[[], None], sync: Callable[[], None], reps: int) -> tuple[float, float]:
    """(the first run, the median of `reps` later runs), ms between synchronizations: the first
    includes compiling the program's launch records at a token count not seen before."""
    times = []
    for _ in range(reps + 1):
        sync()
        t0 = time.perf_counter()
        run()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return times[0], statistics.median(times[1:])


def gemm_flops(tokens: int) -> float:
    """The prefill program's GEMM work for `tokens` rows at the Qwen3-4B shape: qkv, o, gate_up and
    down in every layer but the last, which runs only qkv (prefill writes only KV)."""
    from kern_qwen3 import QWEN3_4B_CONFIG, shape_from_config

    s = shape_from_config(QWEN3_4B_CONFIG)
    qkv = s.qkv_rows * s.hidden
    layer = qkv + s.hidden * s.heads * s.head_dim + 2 * s.inter * s.hidden + s.hidden * s.inter
    return 2.0 * tokens * ((s.layers - 1) * layer + qkv)


def _with_rates(row: dict[str, Any], tokens: int) -> dict[str, Any]:
    gemm_ms = row["kinds_ms"].get("gemm", 0.0)
    row["gemm_tflops"] = gemm_flops(tokens) / gemm_ms / 1e9 if gemm_ms else float("nan")
    return row


def program_rows(args: argparse.Namespace, log: Callable[[str], None]) -> list[dict[str, Any]]:
    import kern_runtime as kr
    from kern_runtime.inputs import stage

    model, files = load_inputs(args, log)
    roles = kr.serving_roles(model)
    rng = np.random.default_rng(0)
    prompt = [int(x) for x in rng.integers(0, 150000, size=max(*args.prompts, PREFIX + max(TURNS)) + 1)]
    rows: list[dict[str, Any]] = []
    torch.cuda.init()
    tokens = roles.whole_pages(max(*args.prompts, PREFIX + max(TURNS)) + 64)
    rt = kr.Runtime.load(model, args.kernels, gpu=args.gpu, capacity=kr.Capacity(tokens=tokens, seqs=1))
    try:
        rt.load_weights(kr.Safetensors.open([str(p) for p in files]), threads=8)
        sync = rt.synchronize
        for chunk in args.chunks:
            # NOTE: every chunk eagerly; --graphs: every chunk through the engine's graph cache
            configs = [("", kr.EngineConfig(chunk=chunk, chunk_graphs=0))]
            if args.graphs:
                configs.append((" graphs", kr.EngineConfig(chunk=chunk, chunk_graph_rows=chunk)))
            for n in args.prompts:
                for tag, config in configs:
                    with kr.Engine(rt, roles, config) as eng:
                        def run(n: int = n, eng: kr.Engine = eng) -> None:
                            seq = eng.sequence()
                            eng.prefill(seq, prompt[: n + 1], 1)  # NOTE: prefill runs all but the last token
                            eng.release(seq)  # NOTE: nothing kept: the next run computes the prompt again

                        log(f"prefill {n} tokens, chunks of {chunk}{tag}")
                        first, ms = _wall_ms(run, sync, args.reps // 4 + 1)
                        rows.append(_with_rates({"case": f"prefill {n} (chunk {chunk}){tag}", "wall_ms": ms,
                                                 "first_ms": first, **_profile(run, sync)}, n))
        with kr.Engine(rt, roles, kr.EngineConfig(chunk=args.chunks[-1], chunk_graphs=0)) as eng:
            seq = eng.sequence()
            eng.prefill(seq, prompt[: PREFIX + max(TURNS) + 1], 1)
            assert seq.lease is not None
            pages = np.asarray(seq.lease.pages, dtype=np.int64)
            for turn in TURNS:
                ids = prompt[PREFIX : PREFIX + turn]

                def chunk_run(ids: list[int] = ids) -> None:
                    # NOTE: the engine's prefill wrote the block table of the lease
                    stage(rt, roles, pages, ids, PREFIX)
                    rt.run(roles.chunk_program, {roles.chunk_var: len(ids)})

                log(f"a {turn}-row chunk over a {PREFIX}-token prefix")
                first, ms = _wall_ms(chunk_run, sync, args.reps)
                rows.append(_with_rates({"case": f"chunk {turn} over {PREFIX}", "wall_ms": ms, "first_ms": first,
                                         **_profile(chunk_run, sync)}, turn))
    finally:
        rt.close()
    return rows


def program_table(rows: list[dict[str, Any]]) -> str:
    kinds = sorted({k for r in rows for k in r["kinds_ms"]})
    head = ["case", "wall ms", "first run ms", "GPU ms", "GPU span ms", *(f"{k} ms" for k in kinds), "GEMM TFLOP/s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["case"], f"{r['wall_ms']:.2f}", f"{r['first_ms']:.2f}", f"{r['gpu_ms']:.2f}", f"{r['span_ms']:.2f}",
                 *(f"{r['kinds_ms'].get(k, 0.0):.2f}" for k in kinds), f"{r['gemm_tflops']:.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    for r in rows:
        lines.append(f"\n{r['case']}: longest kernels")
        lines += [f"  {t['ms']:9.3f} ms {t['calls']:5d}x  {t['kernel'][:100]}" for t in r["top"]]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    add_engine_args(ap, "qwen3-4b-fast")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--chunks", type=lambda v: [int(x) for x in v.split(",")], default=[512, 2048])
    ap.add_argument("--no-program", action="store_true", help="time the kernels alone only")
    ap.add_argument("--no-kernels", action="store_true", help="time the prefill program only")
    ap.add_argument("--prompts", type=lambda v: tuple(int(x) for x in v.split(",")), default=PROMPTS)
    ap.add_argument("--graphs", action="store_true",
                    help="also time each prompt with its chunks replayed from CUDA graphs of the chunk program")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:
        print(f"time_prefill: {msg}", file=sys.stderr, flush=True)

    torch.cuda.set_device(args.gpu)
    k = h.Kernels(args.out / "kernels")
    result: dict[str, Any] = {"kernels": [] if args.no_kernels else kernel_rows(k, args.reps)}
    text = "## Attention entries alone\n\n" + kernel_table(result["kernels"]) + "\n"
    print(text, flush=True)
    (args.out / "time_prefill.json").write_text(json.dumps(result, indent=1) + "\n")
    if not args.no_program:
        result["program"] = program_rows(args, log)
        text += "\n## The prefill program (" + args.manifest.name + ")\n\n" + program_table(result["program"]) + "\n"
        print(text.split("## The prefill program", 1)[1], flush=True)
    (args.out / "time_prefill.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "time_prefill.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
