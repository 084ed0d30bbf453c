"""Per-kernel times of kern's Qwen3 kernels at the Qwen3-4B shape on the local GPU.

Each kernel is captured `LAUNCHES` times back to back into one CUDA graph (torch.cuda.graph), the
graph is replayed `REPLAYS` times between CUDA events, and the time per launch is reported (it
includes the ~1 us per graph node). Usage:

    PYTHONPATH=tools/tests python3 tools/lab/time_kernels.py [out.md] [--only SUBSTRING]

--only times just the rows whose name contains SUBSTRING (e.g. under ncu, `--only attn_decode`).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from helpers import kernel_harness as h

LAUNCHES = 50
REPLAYS = 20
H, NQ, NKV, D, INTER, VOCAB, LAYERS = 2560, 32, 8, 128, 9728, 151936, 36
PAGE = 16
EPS = 1e-6


def time_graph(body: Callable[[], None]) -> float:
    """Microseconds per call of `body`, captured LAUNCHES times into one graph."""
    body()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(LAUNCHES):
            body()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(REPLAYS):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000.0 / (LAUNCHES * REPLAYS)


KEEP: list[torch.Tensor] = []


def p(t: torch.Tensor, offset: int = 0) -> object:
    """A launch pointer; the tensor stays alive for the whole run (graph capture frees the cache)."""
    KEEP.append(t)
    return h.ptr(t, offset)


def rnd(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, device="cuda").to(torch.bfloat16)


def cases(k: h.Kernels, ctx_pages: int) -> list[tuple[str, Callable[[], None], float]]:
    """(name, launch, bytes moved) at batch 1 unless the name says otherwise."""
    g = torch.Generator(device="cuda")
    g.manual_seed(0)
    qkv_w = (NQ + 2 * NKV) * D
    x1, w, out1 = rnd(1, H), rnd(H), rnd(1, H)
    res1 = rnd(1, H)
    table = rnd(4096, H)
    ids = torch.randint(0, 4096, (709,), device="cuda")
    qkv1, qkv709 = rnd(1, qkv_w), rnd(709, qkv_w)
    wq, wk = rnd(D), rnd(D)
    cos, sin = rnd(40960, D // 2), rnd(40960, D // 2)
    pos = torch.randint(0, 40960, (709,), device="cuda")
    gu1, act1 = rnd(1, 2 * INTER), rnd(1, INTER)
    gu709, act709 = rnd(709, 2 * INTER), rnd(709, INTER)
    kv = h.new_paged(LAYERS, ctx_pages + 8, PAGE, NKV, D, g)
    bt = torch.randperm(ctx_pages + 8, device="cuda").to(torch.int32)
    slots = torch.arange(709, device="cuda")
    x709, out709, res709 = rnd(709, H), rnd(709, H), rnd(709, H)
    logits = rnd(VOCAB)
    pval = torch.empty(64, device="cuda")
    pidx = torch.empty(64, dtype=torch.int32, device="cuda")
    nxt = torch.zeros(1, dtype=torch.int64, device="cuda")
    ids1, pos1, slot1 = (torch.zeros(1, dtype=torch.int64, device="cuda") for _ in range(3))
    seq1 = torch.ones(1, dtype=torch.int32, device="cuda")
    adv_table = torch.arange(1 << 16, dtype=torch.int32, device="cuda")
    lay = p(kv.state, kv.layer_offset(17))
    ps = h.i64(kv.page_stride)
    rows = []

    def add(name: str, fn: str, grid: tuple[int, ...], block: tuple[int, ...], nbytes: float, *args: object) -> None:
        rows.append((name, lambda: k.launch(fn, grid, block, *args), nbytes))

    add("embed t=1", "kern_embed", (1,), (256,), 4 * H, p(ids), p(table), p(out1), h.i32(H))
    add("rmsnorm t=1", "kern_rmsnorm", (1,), (256,), 6 * H, p(x1), p(w), p(out1), h.i32(H), h.f32(EPS))
    add("add_rmsnorm t=1", "kern_add_rmsnorm", (1,), (256,), 10 * H, p(res1), p(x1), p(w),
        p(out1), h.i32(H), h.f32(EPS))
    add("qk_norm_rope t=1", "kern_qk_norm_rope", (1, NQ + NKV), (D // 2,), 8 * (NQ + NKV) * D, p(qkv1),
        p(wq), p(wk), p(pos), p(cos), p(sin), h.i32(NQ), h.i32(NKV), h.i32(D), h.f32(EPS))
    add("kv_write t=1", "kern_kv_write", (1, NKV), (32,), 8 * NKV * D, p(qkv1), lay, p(slots),
        h.i32(NQ), h.i32(NKV), h.i32(D), h.i32(PAGE), ps)
    add("silu_mul t=1", "kern_silu_mul", (1, math.ceil(INTER / 1024)), (128,), 6 * INTER, p(gu1),
        p(act1), h.i32(INTER))
    add("argmax_partial", "kern_argmax_partial", (64,), (256,), 2 * VOCAB, p(logits), p(pval),
        p(pidx), h.i32(VOCAB))
    add("argmax_final", "kern_argmax_final", (1,), (256,), 512, p(pval), p(pidx), p(nxt), h.i32(64))
    add("decode_advance", "kern_decode_advance", (1,), (1,), 40, p(nxt), p(ids1), p(pos1),
        p(slot1), p(seq1), p(adv_table), h.i32(PAGE))
    add("embed t=709", "kern_embed", (709,), (256,), 709 * 4 * H, p(ids), p(table), p(out709), h.i32(H))
    add("rmsnorm t=709", "kern_rmsnorm", (709,), (256,), 709 * 4 * H, p(x709), p(w), p(out709),
        h.i32(H), h.f32(EPS))
    add("add_rmsnorm t=709", "kern_add_rmsnorm", (709,), (256,), 709 * 8 * H, p(res709), p(x709),
        p(w), p(out709), h.i32(H), h.f32(EPS))
    add("qk_norm_rope t=709", "kern_qk_norm_rope", (709, NQ + NKV), (D // 2,), 709 * 8 * (NQ + NKV) * D,
        p(qkv709), p(wq), p(wk), p(pos), p(cos), p(sin), h.i32(NQ), h.i32(NKV),
        h.i32(D), h.f32(EPS))
    add("kv_write t=709", "kern_kv_write", (709, NKV), (32,), 709 * 8 * NKV * D, p(qkv709), lay,
        p(slots), h.i32(NQ), h.i32(NKV), h.i32(D), h.i32(PAGE), ps)
    add("silu_mul t=709", "kern_silu_mul", (709, math.ceil(INTER / 1024)), (128,), 709 * 6 * INTER,
        p(gu709), p(act709), h.i32(INTER))
    for ctx in (128, 8192):
        for splits in (16, 32):
            seq = torch.tensor([ctx], dtype=torch.int32, device="cuda")
            po = torch.empty(splits, NQ, D, device="cuda")
            pl = torch.empty(splits, NQ, device="cuda")
            o = rnd(1, NQ * D)
            add(f"attn_decode_partial ctx={ctx} S={splits}", "kern_attn_decode_partial", (NKV, splits), (128,),
                ctx * NKV * D * 4, p(qkv1), lay, p(bt), p(seq), p(po), p(pl), h.i32(NQ),
                h.i32(NKV), h.i32(D), h.i32(PAGE), ps, h.i32(splits), h.f32(D**-0.5))
            add(f"attn_decode_reduce ctx={ctx} S={splits}", "kern_attn_decode_reduce", (NQ,), (128,),
                splits * NQ * D * 4, p(po), p(pl), p(o), h.i32(NQ), h.i32(D), h.i32(splits))
    # The one-launch decode attention at both sides of its one-split limit (128 tokens), at the
    # contexts kern bench's "ctx 128" rows decode at (~140-395); at 2048 and 8192, beyond the cluster
    # path (> 512 tokens), where the grid's splits set the parallelism, a sweep of them.
    # kern_attn_decode_wide (attention_wide.cu) over the same sweep: per-cluster combine first.
    long = [(c, s) for c in (2048, 8192) for s in (32, 64, 128, 256)]
    attn_cases = [("kern_attn_decode", ctx, 32) for ctx in (128, 129, 256, 395)] + [
        (e, c, s) for e in ("kern_attn_decode", "kern_attn_decode_wide") for c, s in long]
    for entry, ctx, splits in attn_cases:
        seq = torch.tensor([ctx], dtype=torch.int32, device="cuda")
        po = torch.empty(splits, NQ, D, device="cuda")
        pl = torch.empty(splits, NQ, device="cuda")
        counters = torch.zeros(NKV, dtype=torch.int32, device="cuda")
        o = rnd(1, NQ * D)
        label = "attn_decode (one launch)" if entry == "kern_attn_decode" else "attn_decode_wide"
        add(f"{label} ctx={ctx} S={splits}", entry, (NKV, splits), (128,),
            ctx * NKV * D * 4, p(qkv1), lay, p(bt), p(seq), p(po), p(pl), p(counters), p(o), h.i32(NQ),
            h.i32(NKV), h.i32(D), h.i32(PAGE), ps, h.i32(splits), h.f32(D**-0.5))
    seq709 = torch.tensor([709], dtype=torch.int32, device="cuda")
    out_attn = rnd(709, NQ * D)
    add("attn_prefill rows=709 seq=709", "kern_attn_prefill", (math.ceil(709 / 64), NQ), (128,),
        709 * NKV * D * 4, p(qkv709), lay, p(bt), p(seq709), p(out_attn), h.i32(709), h.i32(NQ),
        h.i32(NKV), h.i32(D), h.i32(PAGE), ps, h.f32(D**-0.5))
    seq4k = torch.tensor([4096 + 512], dtype=torch.int32, device="cuda")
    add("attn_prefill rows=512 seq=4608", "kern_attn_prefill", (8, NQ), (128,), 4608 * NKV * D * 4,
        p(qkv709), lay, p(bt), p(seq4k), p(out_attn), h.i32(512), h.i32(NQ), h.i32(NKV),
        h.i32(D), h.i32(PAGE), ps, h.f32(D**-0.5))
    return rows


def main(argv: list[str]) -> int:
    import argparse
    import tempfile

    ap = argparse.ArgumentParser(description="per-launch GPU time of kern's small kernels at the 4B shape")
    ap.add_argument("out", nargs="?", type=Path, help="write the table here too (markdown)")
    ap.add_argument("--only", default="", help="time just the rows whose name contains this")
    args = ap.parse_args(argv[1:])
    k = h.Kernels(Path(tempfile.mkdtemp(prefix="kern-time-")), lab=True)
    lines = [
        f"GPU: {torch.cuda.get_device_name()}; {LAUNCHES} launches per graph x {REPLAYS} replays",
        "",
        "| kernel | us / launch | GB/s (bytes moved / time) |",
        "|---|---|---|",
    ]
    for name, body, nbytes in cases(k, 8192 // PAGE):
        if args.only not in name:
            continue
        us = time_graph(body)
        lines.append(f"| {name} | {us:.2f} | {nbytes / us / 1e3:.0f} |")
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if args.out is not None:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
