"""Decode attention's KV streaming rate on the local GPU: kern_attn_decode_rows (the batched step's),
kern_attn_decode_one (the fused one-row step's) and the lab's kern_attn_decode at the Qwen3-4B heads (32 q, 8 kv, head_dim 128, pages of 16), against a device-to-device copy of
the same bytes in the same run.

Each case is a CUDA graph of 36 layer-sized launches (torch.cuda.graph), each over its own layer of
a paged KV state (pages scattered by a random block table), so no launch finds the K/V of the one
before in L2; the state holds enough layers (up to 36) that the graph streams at least 4x the L2
between two reads of a layer. L2 is flushed (a 512 MiB write) before every timed replay; the time
per launch is the median over the replays. GB/s counts the K/V bytes a launch must read (every
token's k and v rows of its row's length); the copy is the same graph shape over the same bytes
(36 copies of a layer's bytes, read + write counted, as the 1 GiB copy bandwidth is).

Rows: 1 at each context, and 8 / 32 / 64 rows of mixed lengths (evenly from a quarter of the context
to the context). kern_attn_decode (one row per launch) is timed at rows 1 and, for rows > 1, as one
launch per row. Usage (GPU host, from the repository root):

    PYTHONPATH=tools/tests python3 tools/lab/time_attention.py OUT_DIR [--contexts 128,1024] [--rows 1,8]
        [--layout scattered|sequential|layer-major] [--entries kern_attn_decode_rows_m32,...]
        [--smem 118784,...]

`--layout` places the pages (LAYOUTS). `--entries` adds lab entries with kern_attn_decode_rows' ABI
(a module in tools/lab/kernels-src), timed beside it at rows > 1; each one's outputs on the case's
first layer are compared with kern_attn_decode_rows' (the largest difference is printed). `--smem`
times each entry again at 16 splits with launches that ask for that much dynamic shared memory
(more than the kernel uses, so fewer of its blocks share an SM).

writes OUT_DIR/time_attention.json and OUT_DIR/time_attention.md.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from helpers import kernel_harness as h

NQ, NKV, D, PAGE, LAYERS = 32, 8, 128, 16, 36
CONTEXTS = (128, 1024, 2048, 8192, 16384, 32768, 40960)
ROWS = (1, 8, 32, 64)
SPLITS = 32
SPLIT_SWEEP = (16, 32, 64)
REPLAYS = 15
L2_STREAM = 4 * 50 * 2**20
"""Bytes the graph must stream between two reads of one layer (4x the H200's 50 MiB L2)."""
STATE_BUDGET = 24 * 2**30
"""At most this many bytes of KV state per case."""
ROW_BYTES = 2 * NKV * D * 2
"""K/V bytes of one token in one layer."""


def smem_bytes(d: int) -> int:
    """attention.cuh's rows_smem_bytes (4 warps x 3 page slots)."""
    return 4 * 3 * (d // 8) * 32 * 16


@dataclass(frozen=True)
class Row:
    """One timed case."""

    entry: str
    context: int
    rows: int
    max_splits: int
    tokens: int
    kv_bytes: int
    us: float
    gbps: float
    copy_us: float
    copy_gbps_rw: float
    of_copy: float
    of_big_copy: float


_FLUSH: list[torch.Tensor] = []


def flush_l2() -> None:
    if not _FLUSH:
        _FLUSH.append(torch.empty(2**29, dtype=torch.uint8, device="cuda"))
    _FLUSH[0].fill_(1)


def time_graph(bodies: list[Callable[[], None]]) -> float:
    """Microseconds per body: the bodies captured once in order into one graph, the median replay."""
    for b in bodies:
        b()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for b in bodies:
            b()
    graph.replay()
    times = []
    for _ in range(REPLAYS):
        flush_l2()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / len(bodies))
    del graph
    return statistics.median(times)


def big_copy_gbps() -> float:
    """GB/s of a 1 GiB device-to-device copy, read + write counted."""
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda").fill_(3)
    dst = torch.empty_like(src)
    us = time_graph([lambda: dst.copy_(src)] * 4)
    return 2 * 2**30 / us / 1e3


def lengths(context: int, rows: int) -> list[int]:
    if rows == 1:
        return [context]
    lo = context // 4
    return [lo + round((context - lo) * r / (rows - 1)) for r in range(rows)]


LAYOUTS = ("scattered", "sequential", "layer-major")
"""Where a row's pages lie (`--layout`): scattered (a random block table over pages that hold every
layer, as a pool that has churned: the default), sequential (the same pages in order), layer-major
(each layer's pages one contiguous run, page_stride one layer-page: a layout the pool does not
have, to see what the 2.3 MB page stride costs the KV stream, e.g. in address translation)."""


class Case:
    """The paged KV state (`layers` layers), block tables, q rows and scratch of one row set."""

    def __init__(self, lens: list[int], max_splits: int, layout: str = "scattered") -> None:
        self.lens = lens
        tokens = sum(lens)
        per_layer = tokens * ROW_BYTES
        self.layers = max(1, min(LAYERS, math.ceil(L2_STREAM / per_layer) + 1, STATE_BUDGET // per_layer))
        need = [math.ceil(n / PAGE) for n in lens]
        pages = sum(need)
        self.stride = max(need)
        gen = torch.Generator(device="cuda")
        gen.manual_seed(0)
        page = 2 * PAGE * NKV * D
        self.layout, self.pages = layout, pages
        self.page_stride = page if layout == "layer-major" else self.layers * page
        self.state = torch.randn(pages * self.layers * page, generator=gen, device="cuda", dtype=torch.bfloat16)
        perm = torch.randperm(pages, generator=gen, device="cuda").to(torch.int32)
        if layout != "scattered":
            perm = torch.arange(pages, device="cuda", dtype=torch.int32)
        self.table = torch.zeros(len(lens), self.stride, dtype=torch.int32, device="cuda")
        at = 0
        for r, n in enumerate(need):
            self.table[r, :n] = perm[at : at + n]
            at += n
        self.seq = torch.tensor(lens, dtype=torch.int32, device="cuda")
        rows = len(lens)
        self.qkv = torch.randn(rows, (NQ + 2 * NKV) * D, generator=gen, device="cuda").to(torch.bfloat16)
        self.part_o = torch.empty(rows, max(max_splits, SPLITS), NQ, D, device="cuda")
        self.part_lse = torch.empty(rows, max(max_splits, SPLITS), NQ, device="cuda")
        self.counters = torch.zeros(rows, NKV, dtype=torch.int32, device="cuda")
        self.out = torch.empty(rows, NQ * D, dtype=torch.bfloat16, device="cuda")
        self.kv_bytes = per_layer

    def layer(self, i: int) -> object:
        page = 2 * PAGE * NKV * D
        return h.ptr(self.state, (i % self.layers) * (self.pages * page if self.layout == "layer-major" else page))

    def rows_launch(self, k: h.Kernels, i: int, splits: int, entry: str = "kern_attn_decode_rows",
                    smem: int = 0) -> Callable[[], None]:
        args = (h.ptr(self.qkv), self.layer(i), h.ptr(self.table), h.ptr(self.seq), h.ptr(self.part_o),
                h.ptr(self.part_lse), h.ptr(self.counters), h.ptr(self.out), h.i32(NQ), h.i32(NKV), h.i32(D),
                h.i32(PAGE), h.i64(self.page_stride), h.i32(self.stride), h.i32(splits), h.f32(D**-0.5))
        grid = (NKV, splits, len(self.lens))
        return lambda: k.launch(entry, grid, (128,), *args, shared_mem=max(smem, smem_bytes(D)))

    def today_launch(self, k: h.Kernels, i: int, r: int) -> Callable[[], None]:
        args = (h.ptr(self.qkv[r]), self.layer(i), h.ptr(self.table[r]), h.ptr(self.seq[r:]),
                h.ptr(self.part_o[r]), h.ptr(self.part_lse[r]), h.ptr(self.counters[r]), h.ptr(self.out[r]),
                h.i32(NQ), h.i32(NKV), h.i32(D), h.i32(PAGE), h.i64(self.page_stride), h.i32(SPLITS),
                h.f32(D**-0.5))
        return lambda: k.launch("kern_attn_decode", (NKV, SPLITS), (128,), *args)

    def copy_us(self) -> float:
        """The same bytes per launch copied, 36 launches over `layers` sources."""
        n = self.kv_bytes // 2
        src = torch.empty(self.layers, n, dtype=torch.bfloat16, device="cuda").fill_(1.0)
        dst = torch.empty(n, dtype=torch.bfloat16, device="cuda")
        return time_graph([lambda i=i: dst.copy_(src[i % self.layers]) for i in range(LAYERS)])


def kernels() -> h.Kernels:
    work = Path(tempfile.mkdtemp(prefix="kern-time-attn-"))
    k = h.Kernels(work)
    try:
        k.fn("kern_attn_decode")
    except KeyError:
        k = h.Kernels(work, lab=True)  # kern_attn_decode lives in the lab
    return k


def largest_difference(k: h.Kernels, case: Case, entry: str) -> float:
    """max |out(entry) - out(kern_attn_decode_rows)| over the case's first layer."""
    case.rows_launch(k, 0, 16)()
    torch.cuda.synchronize()
    want = case.out.float().clone()
    case.out.fill_(float("nan"))
    case.rows_launch(k, 0, 16, entry)()
    torch.cuda.synchronize()
    return float((case.out.float() - want).abs().max())


def run(k: h.Kernels, contexts: list[int], row_counts: list[int], big: float,
        layout: str = "scattered", extra: tuple[str, ...] = (), smem: tuple[int, ...] = ()) -> list[Row]:
    out: list[Row] = []
    for rows in row_counts:
        for ctx in contexts:
            lens = lengths(ctx, rows)
            sweep = SPLIT_SWEEP if rows == 1 else (16,)
            case = Case(lens, max(sweep), layout)
            copy_us = case.copy_us()
            entries = ("kern_attn_decode_rows", "kern_attn_decode_one", *(extra if rows > 1 else ()))
            for e in extra if rows > 1 else ():
                print(f"{e} at {rows} rows, context {ctx}: largest difference from kern_attn_decode_rows "
                      f"{largest_difference(k, case, e):.3g}", flush=True)
            timed: list[tuple[str, int, list[Callable[[], None]]]] = [
                (e, s, [case.rows_launch(k, i, s, e) for i in range(LAYERS)]) for e in entries for s in sweep]
            # the launch asking for more shared memory than it uses, so fewer blocks share an SM
            timed += [(f"{e} ({b // 1024} KiB)", 16, [case.rows_launch(k, i, 16, e, b) for i in range(LAYERS)])
                      for e in entries for b in smem]
            timed.append(("kern_attn_decode" if rows == 1 else "kern_attn_decode (a launch per row)", SPLITS,
                          [case.today_launch(k, i, r) for i in range(LAYERS) for r in range(rows)]))
            for entry, splits, bodies in timed:
                us = time_graph(bodies) * (len(bodies) // LAYERS)
                gbps = case.kv_bytes / us / 1e3
                copy_gbps = 2 * case.kv_bytes / copy_us / 1e3
                out.append(Row(entry, ctx, rows, splits, sum(lens), case.kv_bytes, us, gbps, copy_us, copy_gbps,
                               gbps / copy_gbps, gbps / big))
                print(_line(out[-1]), flush=True)
            del case
            torch.cuda.empty_cache()
    return out


HEADER = ("| entry | context | rows | splits | KV MB / layer | us / layer | GB/s | copy us | copy GB/s (rw) "
          "| of copy | of 1 GiB copy |\n|---|---|---|---|---|---|---|---|---|---|---|")


def _line(r: Row) -> str:
    return (f"| {r.entry} | {r.context} | {r.rows} | {r.max_splits} | {r.kv_bytes / 1e6:.2f} | {r.us:.2f} | "
            f"{r.gbps:.0f} | {r.copy_us:.2f} | {r.copy_gbps_rw:.0f} | {r.of_copy:.0%} | {r.of_big_copy:.0%} |")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description="decode attention KV streaming rate against a copy of the same bytes")
    ap.add_argument("out", type=Path, help="directory for time_attention.json and time_attention.md")
    ap.add_argument("--contexts", default=",".join(map(str, CONTEXTS)))
    ap.add_argument("--rows", default=",".join(map(str, ROWS)))
    ap.add_argument("--layout", choices=LAYOUTS, default="scattered",
                    help="where the pages lie: scattered (random block table, the default), sequential, layer-major")
    ap.add_argument("--entries", default="", help="lab entries with kern_attn_decode_rows' ABI, comma separated")
    ap.add_argument("--smem", default="", help="also time each entry at 16 splits asking for these bytes of dynamic "
                    "shared memory (comma separated; more than it uses: fewer blocks on an SM)")
    args = ap.parse_args(argv[1:])
    args.out.mkdir(parents=True, exist_ok=True)
    extra = tuple(e for e in args.entries.split(",") if e)
    k = h.Kernels(Path(tempfile.mkdtemp(prefix="kern-time-attn-")), lab=True) if extra else kernels()
    big = big_copy_gbps()
    head = (f"GPU: {torch.cuda.get_device_name()}; layout {args.layout}; 1 GiB D2D copy {big:.0f} GB/s (read + write); "
            f"graphs of {LAYERS} layer launches, L2 flushed before each of {REPLAYS} replays, median")
    print(head + "\n\n" + HEADER, flush=True)
    rows = run(k, [int(c) for c in args.contexts.split(",")], [int(r) for r in args.rows.split(",")], big,
               args.layout, extra, tuple(int(b) for b in args.smem.split(",") if b))
    (args.out / "time_attention.json").write_text(json.dumps(
        {"device": torch.cuda.get_device_name(), "layout": args.layout, "copy_1gib_gbps_rw": big, "rows": [asdict(r) for r in rows]},
        indent=1) + "\n")
    (args.out / "time_attention.md").write_text(head + "\n\n" + HEADER + "\n" + "\n".join(map(_line, rows)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
