"""Per-kernel times of kern's Qwen3 kernels at the Qwen3-4B shape on the local GPU.

Each kernel is captured `LAUNCHES` times back to back into one CUDA graph (torch.cuda.graph), the
graph is replayed `REPLAYS` times between CUDA events, and the time per launch is reported (it
includes the ~1 us per graph node). Usage: python3 tools/tests/helpers/time_kernels.py [out.md]
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from pathlib import Path

import kernel_harness as h
import torch

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
    lay = h.ptr(kv.state, kv.layer_offset(17))
    ps = h.i64(kv.page_stride)
    rows = []

    def add(name: str, fn: str, grid: tuple[int, ...], block: tuple[int, ...], nbytes: float, *args: object) -> None:
        rows.append((name, lambda: k.launch(fn, grid, block, *args), nbytes))

    add("embed t=1", "kern_embed", (1,), (256,), 4 * H, h.ptr(ids), h.ptr(table), h.ptr(out1), h.i32(H))
    add("rmsnorm t=1", "kern_rmsnorm", (1,), (256,), 6 * H, h.ptr(x1), h.ptr(w), h.ptr(out1), h.i32(H), h.f32(EPS))
    add("add_rmsnorm t=1", "kern_add_rmsnorm", (1,), (256,), 10 * H, h.ptr(res1), h.ptr(x1), h.ptr(w),
        h.ptr(out1), h.i32(H), h.f32(EPS))
    add("qk_norm_rope t=1", "kern_qk_norm_rope", (1, NQ + NKV), (D // 2,), 8 * (NQ + NKV) * D, h.ptr(qkv1),
        h.ptr(wq), h.ptr(wk), h.ptr(pos), h.ptr(cos), h.ptr(sin), h.i32(NQ), h.i32(NKV), h.i32(D), h.f32(EPS))
    add("kv_write t=1", "kern_kv_write", (1, NKV), (32,), 8 * NKV * D, h.ptr(qkv1), lay, h.ptr(slots),
        h.i32(NQ), h.i32(NKV), h.i32(D), h.i32(PAGE), ps)
    add("silu_mul t=1", "kern_silu_mul", (1, math.ceil(INTER / 1024)), (128,), 6 * INTER, h.ptr(gu1),
        h.ptr(act1), h.i32(INTER))
    add("argmax_partial", "kern_argmax_partial", (64,), (256,), 2 * VOCAB, h.ptr(logits), h.ptr(pval),
        h.ptr(pidx), h.i32(VOCAB))
    add("argmax_final", "kern_argmax_final", (1,), (256,), 512, h.ptr(pval), h.ptr(pidx), h.ptr(nxt), h.i32(64))
    add("decode_advance", "kern_decode_advance", (1,), (1,), 40, h.ptr(nxt), h.ptr(ids1), h.ptr(pos1),
        h.ptr(slot1), h.ptr(seq1), h.ptr(adv_table), h.i32(PAGE))
    add("embed t=709", "kern_embed", (709,), (256,), 709 * 4 * H, h.ptr(ids), h.ptr(table), h.ptr(out709), h.i32(H))
    add("rmsnorm t=709", "kern_rmsnorm", (709,), (256,), 709 * 4 * H, h.ptr(x709), h.ptr(w), h.ptr(out709),
        h.i32(H), h.f32(EPS))
    add("add_rmsnorm t=709", "kern_add_rmsnorm", (709,), (256,), 709 * 8 * H, h.ptr(res709), h.ptr(x709),
        h.ptr(w), h.ptr(out709), h.i32(H), h.f32(EPS))
    add("qk_norm_rope t=709", "kern_qk_norm_rope", (709, NQ + NKV), (D // 2,), 709 * 8 * (NQ + NKV) * D,
        h.ptr(qkv709), h.ptr(wq), h.ptr(wk), h.ptr(pos), h.ptr(cos), h.ptr(sin), h.i32(NQ), h.i32(NKV),
        h.i32(D), h.f32(EPS))
    add("kv_write t=709", "kern_kv_write", (709, NKV), (32,), 709 * 8 * NKV * D, h.ptr(qkv709), lay,
        h.ptr(slots), h.i32(NQ), h.i32(NKV), h.i32(D), h.i32(PAGE), ps)
    add("silu_mul t=709", "kern_silu_mul", (709, math.ceil(INTER / 1024)), (128,), 709 * 6 * INTER,
        h.ptr(gu709), h.ptr(act709), h.i32(INTER))
    for ctx in (128, 8192):
        for splits in (16, 32):
            seq = torch.tensor([ctx], dtype=torch.int32, device="cuda")
            po = torch.empty(splits, NQ, D, device="cuda")
            pl = torch.empty(splits, NQ, device="cuda")
            o = rnd(1, NQ * D)
            add(f"attn_decode_partial ctx={ctx} S={splits}", "kern_attn_decode_partial", (NKV, splits), (128,),
                ctx * NKV * D * 4, h.ptr(qkv1), lay, h.ptr(bt), h.ptr(seq), h.ptr(po), h.ptr(pl), h.i32(NQ),
                h.i32(NKV), h.i32(D), h.i32(PAGE), ps, h.i32(splits), h.f32(D**-0.5))
            add(f"attn_decode_reduce ctx={ctx} S={splits}", "kern_attn_decode_reduce", (NQ,), (128,),
                splits * NQ * D * 4, h.ptr(po), h.ptr(pl), h.ptr(o), h.i32(NQ), h.i32(D), h.i32(splits))
    seq709 = torch.tensor([709], dtype=torch.int32, device="cuda")
    out_attn = rnd(709, NQ * D)
    add("attn_prefill rows=709 seq=709", "kern_attn_prefill", (math.ceil(709 / 64), NQ), (128,),
        709 * NKV * D * 4, h.ptr(qkv709), lay, h.ptr(bt), h.ptr(seq709), h.ptr(out_attn), h.i32(709), h.i32(NQ),
        h.i32(NKV), h.i32(D), h.i32(PAGE), ps, h.f32(D**-0.5))
    seq4k = torch.tensor([4096 + 512], dtype=torch.int32, device="cuda")
    add("attn_prefill rows=512 seq=4608", "kern_attn_prefill", (8, NQ), (128,), 4608 * NKV * D * 4,
        h.ptr(qkv709), lay, h.ptr(bt), h.ptr(seq4k), h.ptr(out_attn), h.i32(512), h.i32(NQ), h.i32(NKV),
        h.i32(D), h.i32(PAGE), ps, h.f32(D**-0.5))
    return rows


def main(argv: list[str]) -> int:
    import tempfile

    k = h.Kernels(Path(tempfile.mkdtemp(prefix="kern-time-")))
    lines = [
        f"GPU: {torch.cuda.get_device_name()}; {LAUNCHES} launches per graph x {REPLAYS} replays",
        "",
        "| kernel | us / launch | GB/s (bytes moved / time) |",
        "|---|---|---|",
    ]
    for name, body, nbytes in cases(k, 8192 // PAGE):
        us = time_graph(body)
        lines.append(f"| {name} | {us:.2f} | {nbytes / us / 1e3:.0f} |")
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if len(argv) > 1:
        Path(argv[1]).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
