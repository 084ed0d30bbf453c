"""GB/s of kern's bf16 GEMVs (the product's tools/kernels-src/gemv.cu and the lab's
tools/lab/kernels-src/gemv_alt.cu, built together) at the Qwen3-4B decode shapes, against
torch.mm (cuBLAS) and a device-to-device copy in the same run, on the local GPU.

Each case is captured LAUNCHES times back to back into one CUDA graph (torch.cuda.graph), the
launches rotating over enough copies of W that they never find it in L2 (as in a decode step, whose
36 layers of weights are far larger than L2); the graph is replayed REPLAYS times between CUDA
events and the median replay gives the time per launch (the ~1 us a graph node costs included).
Bytes counted: W + x + y. Besides the pinned build, the GEMV_* variants listed below are built and
timed (the pinned values are the ones tools/lab/notes/kernel-experiments.md's grid uses).

Usage: PYTHONPATH=tools/tests python3 tools/lab/time_gemv.py [out.md]
       PYTHONPATH=tools/tests python3 tools/lab/time_gemv.py --entries PICK.json [out.md]
       PYTHONPATH=tools/tests python3 tools/lab/time_gemv.py --tma [out.md]
       PYTHONPATH=tools/tests python3 tools/lab/time_gemv.py --p4 [out.md]
       PYTHONPATH=tools/tests python3 tools/lab/time_gemv.py --defer [out.md]

`--defer` times the deferred-norm bands (qkv's `_b4_d`, gate_up's `_b4_silu_d`) at 1-4 blocks per SM
(DEFER_BLOCKS), beside the band without a norm, checking that every grid gives the same bits.

`--p4` times each decode GEMM's pick (kern_qwen3.GEMV_PICK) beside the prefetched entries (`_p4`,
`_p4_silu` for gate_up) at several columns per block (P4_COLUMNS), checking their outputs.

`--tma` times kern_gemv_bf16_tma built with other GEMV_TMA_CAP / GEMV_TMA_COPY / GEMV_TMA_HINT values
and launched with other shared-memory sizes (TMA_VARIANTS), beside the pinned kern_gemv_bf16_s4.

`--entries` times instead every GEMV entry of the built gemv.cu and gemv_alt.cu (TIMED) at
the decode shapes and writes the fastest entry per GEMM as JSON for `tools/lab/qwen3_variants.py --gemv-pick` (gate_up:
kern_gemv_bf16_silu unless a plain entry plus a kern_silu_mul launch, SILU_MUL_US, is faster).
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import cupy as cp
import torch
from helpers import kernel_harness as h

import kern_qwen3 as gen
from kern_lab import ALT_ENTRIES, LAB_GEMV_ENTRIES

TIMED = {**gen.GEMV_ENTRIES, **ALT_ENTRIES}
"""The GEMV entries of gemv.cu and gemv_alt.cu (kern_lab's ring entries are gemv_ring.cu's)."""
TIMED_SILU = gen.silu_entries(TIMED)

SILU_MUL_US = 1.64
"""kern_silu_mul at t = 1 on the H200, one graph node included (docs/kernels.md)."""
GEMM_OF = {"qkv 6144x2560": "qkv", "o 2560x4096": "o", "gate_up 19456x2560": "gate_up",
           "down 2560x9728": "down", "lm_head 151936x2560": "lm_head"}

LAUNCHES = 200
REPLAYS = 5
MIN_ROTATION_BYTES = 512 << 20
LAYERS = 36
# (name, n, k, per step): qkv, o, gate+up, down per layer; lm_head once.
SHAPES = [
    ("qkv 6144x2560", 6144, 2560, LAYERS),
    ("o 2560x4096", 2560, 4096, LAYERS),
    ("gate_up 19456x2560", 19456, 2560, LAYERS),
    ("down 2560x9728", 2560, 9728, LAYERS),
    ("lm_head 151936x2560", 151936, 2560, 1),
]
# (GEMV_WARPS, GEMV_RPW, GEMV_UNROLL, GEMV_SPLIT); None is the source as committed.
VARIANTS: list[tuple[int, int, int, int] | None] = [
    None,
    (4, 1, 8, 1),
    (4, 2, 4, 1),
    (4, 1, 4, 4),
    (4, 1, 8, 4),
    (8, 1, 4, 2),
    (8, 2, 4, 4),
]
MACROS = ("GEMV_WARPS", "GEMV_RPW", "GEMV_UNROLL", "GEMV_SPLIT")


def macro(text: str, name: str) -> int:
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "#define" and parts[1] == name:
            return int(parts[2])
    raise SystemExit(f"gemv_alt.cu defines no {name}")


def operands(n: int, k: int) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """Random bf16 copies of an [n, k] W (at least MIN_ROTATION_BYTES together, so launches rotating
    over them miss L2), a [1, k] x and a [1, n] y."""
    copies = max(2, math.ceil(MIN_ROTATION_BYTES / (n * k * 2)))
    ws = [torch.randn(n, k, device="cuda").to(torch.bfloat16) for _ in range(copies)]
    x = torch.randn(1, k, device="cuda").to(torch.bfloat16)
    return ws, x, torch.empty(1, n, device="cuda", dtype=torch.bfloat16)


ALT_SRC = h.REPO / "tools" / "lab" / "kernels-src" / "gemv_alt.cu"


class GemvModules:
    """The gemv and gemv_alt modules of one build: `get_function` finds an entry in either."""

    def __init__(self, modules: list[cp.RawModule]) -> None:
        self.modules = modules

    def get_function(self, name: str) -> cp.RawKernel:
        for module in self.modules:
            try:
                return module.get_function(name)
            except cp.cuda.driver.CUDADriverError:
                continue
        raise KeyError(name)


def build_gemv(work: Path, defines: dict[str, int] | None = None) -> GemvModules:
    """gemv.cu and gemv_alt.cu (each with `#define`s prepended, if any) built by kern's build_kernels
    under `work`, the product's headers beside them."""
    src = work / "src"
    src.mkdir(parents=True)
    for header in h.KERNELS_SRC.glob("*.cuh"):
        shutil.copy(header, src / header.name)
    prefix = "".join(f"#define {m} {v}\n" for m, v in (defines or {}).items())
    (src / "gemv.cu").write_text(prefix + (h.KERNELS_SRC / "gemv.cu").read_text())
    (src / "gemv_alt.cu").write_text(prefix + ALT_SRC.read_text())
    nvcc = shutil.which("nvcc") or "/usr/local/bin/nvcc"
    built = h.build_kernels(src, work / "cubins", compiler=(nvcc,))
    return GemvModules([cp.RawModule(path=str(built[m][0])) for m in ("gemv", "gemv_alt")])


class Build:
    """One build of gemv_alt.cu (optionally with GEMV_* macros prepended) by kern's build_kernels."""

    def __init__(self, work: Path, variant: tuple[int, int, int, int] | None) -> None:
        pinned = variant is None
        if variant is None:
            text = ALT_SRC.read_text()
            w, r, u, s = (macro(text, m) for m in MACROS)
            variant = (w, r, u, s)
        warps, rpw, unroll, split = variant
        self.label = f"kern {warps} warps, split {split}, {rpw} col, unroll {unroll}" + (
            " (pinned)" if pinned else ""
        )
        defines = None if pinned else dict(zip(MACROS, variant, strict=True))
        self.fn = build_gemv(work, defines).get_function("kern_gemv_bf16")
        self.rows_per_block = warps // split * rpw
        self.threads = warps * 32

    def launch(self, x: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> None:
        rows, k = x.shape
        n = w.shape[0]
        grid = ((n + self.rows_per_block - 1) // self.rows_per_block, 1, 1)
        h.launch(self.fn, grid, (self.threads, 1, 1), h.ptr(x), h.ptr(w), h.ptr(y), h.i32(rows), h.i32(n),
                 h.i32(k), h.i32(n))


class Entries:
    """Every GEMV entry of gemv.cu and gemv_alt.cu as built (no macros prepended)."""

    def __init__(self, work: Path) -> None:
        module = build_gemv(work)
        self.fns = {e: module.get_function(e) for e in TIMED}

    def launch(self, entry: str, x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, n: int) -> None:
        k = x.shape[1]
        grid, threads, smem = gen.gemv_launch(entry, n, k, table=LAB_GEMV_ENTRIES)
        h.launch(self.fns[entry], (grid, 1, 1), (threads, 1, 1), h.ptr(x), h.ptr(w), h.ptr(y), h.i32(x.shape[0]),
                 h.i32(n), h.i32(k), h.i32(n), shared_mem=smem)


def entries_main(pick_out: Path, out: Path | None) -> None:
    torch.manual_seed(0)
    ent = Entries(Path(tempfile.mkdtemp(prefix="time_gemv_entries_")))
    plain = [e for e in TIMED if e not in TIMED_SILU]
    silus = {e: f"{e} (gate_up + SiLU-mul)" for e in TIMED_SILU}
    labels = ["cuBLAS torch.mm", *plain, *silus.values()]
    lines = [
        f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}; {LAUNCHES} launches per "
        f"graph, median of {REPLAYS}; us per launch (GB/s of W + x + y)",
        "",
        "| shape (n x k), rows 1 | " + " | ".join(labels) + " |",
        "|---" * (len(labels) + 1) + "|",
    ]
    picks: dict[str, str] = {}
    step = {e: 0.0 for e in labels}
    for name, n, k, per_step in SHAPES:
        nbytes = n * k * 2
        ws, x, y = operands(n, k)
        moved = nbytes + 2 * k + 2 * n
        times = {labels[0]: time_graph([lambda w=w, x=x, y=y: torch.mm(x, w.t(), out=y) for w in ws])}
        for e in plain:
            times[e] = time_graph([lambda w=w, e=e, x=x, y=y, n=n: ent.launch(e, x, w, y, n) for w in ws])
        gemm = GEMM_OF[name]
        ref = (x.float() @ ws[0].float().t()).flatten()
        wrong = []
        for e in plain:  # NOTE: an entry that computes wrong values is never picked
            ent.launch(e, x, ws[0], y, n)
            torch.cuda.synchronize()
            if not torch.allclose(y.float().flatten(), ref, rtol=2e-2, atol=2e-2 * float(ref.abs().max())):
                wrong.append(e)
        best = min((e for e in plain if e not in wrong), key=lambda e: times[e])
        if wrong:
            lines.append(f"| {name}: WRONG VALUES from {', '.join(wrong)} (not picked) |")
        picks[gemm] = best
        if gemm == "gate_up":
            g, u = ref[: n // 2], ref[n // 2 :]
            want = torch.nn.functional.silu(g) * u
            fastest = times[best] + SILU_MUL_US
            for e, label in silus.items():
                silu = times[label] = time_graph(
                    [lambda w=w, e=e, x=x, y=y, n=n: ent.launch(e, x, w, y, n // 2) for w in ws])
                ent.launch(e, x, ws[0], y, n // 2)
                torch.cuda.synchronize()
                got = y.float().flatten()[: n // 2]
                if not torch.allclose(got, want, rtol=3e-2, atol=3e-2 * float(want.abs().max())):
                    lines.append(f"| {name}: WRONG VALUES from {e} (not picked) |")
                elif silu <= fastest:
                    picks[gemm], fastest = e, silu
        for e, us in times.items():
            step[e] += us * per_step
        cells = [f"{times[e]:.2f} ({moved / times[e] / 1e3:.0f})" if e in times else "" for e in labels]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
        del ws
        torch.cuda.empty_cache()
    lines.append("| GEMV time of a decode step (36 layers + lm_head) | "
                 + " | ".join(f"{step[e] / 1000:.3f} ms" for e in labels[: 1 + len(plain)])
                 + " |" * (len(silus) + 1))
    lines += ["", f"picks (qwen3_variants --gemv-pick): {json.dumps(picks)}"]
    text = "\n".join(lines) + "\n"
    print(text)
    pick_out.write_text(json.dumps(picks, indent=1) + "\n")
    if out is not None:
        out.write_text(text)


def time_graph(bodies: list[Callable[[], None]], launches: int = LAUNCHES) -> float:
    """Microseconds per launch: `launches` launches cycling over `bodies`, in one graph."""
    for b in bodies:
        b()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(launches):
            bodies[i % len(bodies)]()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / launches)
    return statistics.median(times)


def copy_bandwidth() -> float:
    """GB/s of a 1 GiB device-to-device copy (read + write counted)."""
    src = torch.empty(1 << 29, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    us = time_graph([lambda: dst.copy_(src)], launches=20)
    return 2 * src.numel() * 2 / us / 1e3


def main(out: Path | None) -> None:
    torch.manual_seed(0)
    work = Path(tempfile.mkdtemp(prefix="time_gemv_"))
    builds = [Build(work / f"v{i}", v) for i, v in enumerate(VARIANTS)]
    labels = ["cuBLAS torch.mm", *[b.label for b in builds]]
    copy_gbs = copy_bandwidth()
    lines = [
        f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}; "
        f"1 GiB D2D copy {copy_gbs:.0f} GB/s; {LAUNCHES} launches per graph, median of {REPLAYS}",
        "",
        "| shape (n x k), rows 1 | " + " | ".join(labels) + " |",
        "|---" * (len(labels) + 1) + "|",
    ]
    step = [0.0] * len(labels)
    for name, n, k, per_step in SHAPES:
        nbytes = n * k * 2
        ws, x, y = operands(n, k)
        moved = nbytes + 2 * k + 2 * n
        cells: list[str] = []
        times = [time_graph([lambda w=w, x=x, y=y: torch.mm(x, w.t(), out=y) for w in ws])]
        for b in builds:
            times.append(time_graph([lambda w=w, b=b, x=x, y=y: b.launch(x, w, y) for w in ws]))
        for i, us in enumerate(times):
            step[i] += us * per_step
            cells.append(f"{us:.2f} us, {moved / us / 1e3:.0f} GB/s")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
        del ws
        torch.cuda.empty_cache()
    lines.append(
        "| GEMV time of a decode step (36 layers + lm_head) | "
        + " | ".join(f"{s / 1000:.3f} ms" for s in step)
        + " |"
    )
    text = "\n".join(lines) + "\n"
    print(text)
    if out is not None:
        out.write_text(text)


# (GEMV_TMA_CAP, GEMV_TMA_COPY, GEMV_TMA_HINT, dynamic shared bytes) of the --tma comparison.
TMA_VARIANTS = [
    (32768, 0, 1, 196608),
    (32768, 0, 0, 196608),
    (32768, 4096, 1, 196608),
    (32768, 8192, 0, 196608),
    (16384, 0, 1, 196608),
    (16384, 2048, 0, 196608),
    (65536, 16384, 0, 196608),
    (32768, 0, 1, 98304),
    (8192, 0, 0, 196608),
]


def tma_main(out: Path | None) -> None:
    torch.manual_seed(0)
    work = Path(tempfile.mkdtemp(prefix="time_gemv_tma_"))
    fns = []
    for i, (cap, copy, hint, smem) in enumerate(TMA_VARIANTS):
        module = build_gemv(work / f"v{i}", {"GEMV_TMA_CAP": cap, "GEMV_TMA_COPY": copy, "GEMV_TMA_HINT": hint})
        fns.append((module.get_function("kern_gemv_bf16_tma"), module.get_function("kern_gemv_bf16_s4"), smem))
    labels = ["kern_gemv_bf16_s4"] + [f"cap {c} copy {cp_} hint {hn} smem {s // 1024}K"
                                      for c, cp_, hn, s in TMA_VARIANTS]
    lines = [f"device: {torch.cuda.get_device_name()}; {LAUNCHES} launches per graph, median of {REPLAYS}; "
             "us per launch (GB/s)", "", "| shape | " + " | ".join(labels) + " |", "|---" * (len(labels) + 1) + "|"]
    for name, n, k, _per_step in SHAPES:
        if name.startswith("gate_up"):
            continue
        nbytes = n * k * 2
        ws, x, y = operands(n, k)
        ref = (x.float() @ ws[0].float().t()).flatten()

        def go(fn: cp.RawKernel, grid: int, threads: int, smem: int, w: torch.Tensor,
               x: torch.Tensor = x, y: torch.Tensor = y, n: int = n, k: int = k) -> None:
            h.launch(fn, (grid, 1, 1), (threads, 1, 1), h.ptr(x), h.ptr(w), h.ptr(y), h.i32(1), h.i32(n), h.i32(k),
                     h.i32(n), shared_mem=smem)

        s4 = fns[0][1]
        blocks = min(n, gen.GEMV_TMA_BLOCKS)
        times = [time_graph([lambda w=w, go=go, s4=s4, n=n: go(s4, n, 128, 0, w) for w in ws])]
        for fn, _s4, smem in fns:
            times.append(time_graph([lambda w=w, go=go, fn=fn, smem=smem, b=blocks: go(fn, b, 512, smem, w)
                                     for w in ws]))
            go(fn, blocks, 512, smem, ws[0])
            torch.cuda.synchronize()
            assert torch.allclose(y.float().flatten(), ref, rtol=2e-2, atol=2e-2 * float(ref.abs().max()))
        lines.append(f"| {name} | " + " | ".join(f"{us:.2f} ({nbytes / us / 1e3:.0f})" for us in times) + " |")
        del ws
        torch.cuda.empty_cache()
    text = "\n".join(lines) + "\n"
    print(text)
    if out is not None:
        out.write_text(text)


P4_COLUMNS = (1, 2, 3, 4, 6, 8, 12, 16)
"""Columns per block `--p4` times the prefetched entries at (where their rows fit a block)."""


def _p4_cells(ent: Entries, name: str, n: int, k: int) -> dict[str, float]:
    """us per launch of one shape's pick and of `_p4` / `_p4_silu` at each of P4_COLUMNS."""
    gemm = GEMM_OF[name]
    silu = gemm == "gate_up"
    pick = gen.GEMV_PICK[gemm]
    fn = ent.fns["kern_gemv_bf16_p4_silu" if silu else "kern_gemv_bf16_p4"]
    out_n = n // 2 if silu else n
    column = (2 if silu else 1) * 2 * k
    ws, x, y = operands(n, k)
    times = {"pick": time_graph([lambda w=w: ent.launch(pick, x, w, y, out_n) for w in ws])}
    # NOTE: `_p4` sums in `_s4`'s order and `_p4_silu` in `_b4_silu`'s: their outputs must be those bits.
    ent.launch("kern_gemv_bf16_b4_silu" if silu else "kern_gemv_bf16_s4", x, ws[0], y, out_n)
    torch.cuda.synchronize()
    want = y.clone()

    def go(w: torch.Tensor, cols: int) -> None:
        h.launch(fn, (-(-out_n // cols), 1, 1), (128, 1, 1), h.ptr(x), h.ptr(w), h.ptr(y), h.i32(1), h.i32(out_n),
                 h.i32(k), h.i32(out_n), shared_mem=cols * column)

    for c in P4_COLUMNS:
        if c * column > gen.GEMV_P4_MAX_ROW:
            continue
        times[f"p4 x{c}"] = time_graph([lambda w=w, c=c: go(w, c) for w in ws])
        go(ws[0], c)
        torch.cuda.synchronize()
        assert torch.equal(y, want), f"{name}: p4 x{c} differs from the `_s4`-order bits"
    return times


def p4_main(out: Path | None) -> None:
    """Each decode GEMM's pick (kern_qwen3.GEMV_PICK) beside `_p4` (`_p4_silu` for gate_up) at
    P4_COLUMNS columns per block: the shared-memory budget per block is the knob."""
    torch.manual_seed(0)
    ent = Entries(Path(tempfile.mkdtemp(prefix="time_gemv_p4_")))
    labels = ["pick", *(f"p4 x{c}" for c in P4_COLUMNS)]
    lines = [f"device: {torch.cuda.get_device_name()}; {LAUNCHES} launches per graph, median of {REPLAYS}; "
             "us per launch (GB/s of W); `p4 xC`: C columns per block", "",
             "| shape (pick) | " + " | ".join(labels) + " |", "|---" * (len(labels) + 1) + "|"]
    for name, n, k, _per_step in SHAPES:
        times = _p4_cells(ent, name, n, k)
        torch.cuda.empty_cache()
        nbytes = n * k * 2
        cells = [f"{times[lb]:.2f} ({nbytes / times[lb] / 1e3:.0f})" if lb in times else "" for lb in labels]
        pick = gen.GEMV_PICK[GEMM_OF[name]].removeprefix("kern_gemv_bf16")
        lines.append(f"| {name} ({pick}) | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if out is not None:
        out.write_text(text)


DEFER_SHAPES = (("qkv 6144x2560", "kern_gemv_bf16_b4_d", "kern_gemv_bf16_b4", 6144, 6144),
                ("gate_up 19456x2560", "kern_gemv_bf16_b4_silu_d", "kern_gemv_bf16_b4_silu", 19456, 9728))
"""(shape, deferred-norm band, the band without a norm, W rows, output columns) that `--defer` times."""
DEFER_BLOCKS = (1, 2, 3, 4)
"""Blocks per SM `--defer` launches the deferred-norm bands at (one wave; kern_qwen3's is GEMV_DEFER_BLOCKS)."""


def _defer_row(k: h.Kernels, name: str, entry: str, band: str, rows: int, n: int) -> str:
    """One `--defer` table row: the deferred-norm band at each of DEFER_BLOCKS, then `band`."""
    kk = 2560
    ws, x, y_all = operands(rows, kk)
    y = y_all[:, :n]
    res, y_add = torch.randn_like(x), torch.randn_like(x)
    w_norm, res_out = (torch.rand_like(x) + 0.5).view(-1), torch.empty_like(x)
    fn, bfn = k.fn(entry), k.fn(band)

    def deferred(w: torch.Tensor, grid: int) -> None:
        h.launch(fn, (grid, 1, 1), (128, 1, 1), h.ptr(res), h.ptr(y_add), h.ptr(w_norm), h.ptr(res_out),
                 h.ptr(w), h.ptr(y), h.i32(1), h.i32(n), h.i32(kk), h.i32(n), h.f32(1e-6))

    band_grid, threads, smem = gen.gemv_launch(band, n, kk, table=LAB_GEMV_ENTRIES)

    def plain(w: torch.Tensor) -> None:
        h.launch(bfn, (band_grid, 1, 1), (threads, 1, 1), h.ptr(x), h.ptr(w), h.ptr(y), h.i32(1), h.i32(n),
                 h.i32(kk), h.i32(n), shared_mem=smem)

    cells: list[float] = []
    want: torch.Tensor | None = None
    for b in DEFER_BLOCKS:
        grid = gen.defer_launch(n, b)[0]
        cells.append(time_graph([lambda w=w, g=grid: deferred(w, g) for w in ws]))
        deferred(ws[0], grid)
        torch.cuda.synchronize()
        want = y.clone() if want is None else want
        assert torch.equal(y, want), f"{name}: {b} blocks per SM gives other bits"
    cells.append(time_graph([lambda w=w: plain(w) for w in ws]))
    text = " | ".join(f"{us:.2f} ({rows * kk * 2 / us / 1e3:.0f})" for us in cells)
    return f"| {name} ({entry.removeprefix('kern_gemv_bf16')}, {fn.num_regs} registers) | {text} |"


def defer_main(out: Path | None) -> None:
    """The deferred-norm bands (gemv_defer.cu) at DEFER_BLOCKS blocks per SM, beside the band with
    no norm at kern_qwen3's grid: whether a band that leaves part of each SM free streams as fast
    (then the next GEMV's blocks could be resident, loading weights, while it runs). Alone, no PDL:
    each launch waits for the one before it. Every grid must give the same bits."""
    torch.manual_seed(0)
    k = h.Kernels(Path(tempfile.mkdtemp(prefix="time_gemv_defer_")), lab=True)
    labels = [*(f"{b}/SM" for b in DEFER_BLOCKS), "band, no norm"]
    lines = [f"device: {torch.cuda.get_device_name()}; {LAUNCHES} launches per graph, median of {REPLAYS}; "
             "us per launch (GB/s of W); `B/SM`: the deferred-norm band at B blocks per SM (one wave)", "",
             "| shape (entry) | " + " | ".join(labels) + " |", "|---" * (len(labels) + 1) + "|"]
    for name, entry, band, rows, n in DEFER_SHAPES:
        lines.append(_defer_row(k, name, entry, band, rows, n))
        torch.cuda.empty_cache()
    text = "\n".join(lines) + "\n"
    print(text)
    if out is not None:
        out.write_text(text)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--defer":
        defer_main(Path(sys.argv[2]) if len(sys.argv) > 2 else None)
        sys.exit(0)
    if len(sys.argv) > 1 and sys.argv[1] == "--p4":
        p4_main(Path(sys.argv[2]) if len(sys.argv) > 2 else None)
        sys.exit(0)
    if len(sys.argv) > 1 and sys.argv[1] == "--tma":
        tma_main(Path(sys.argv[2]) if len(sys.argv) > 2 else None)
        sys.exit(0)
    if len(sys.argv) > 2 and sys.argv[1] == "--entries":
        entries_main(Path(sys.argv[2]), Path(sys.argv[3]) if len(sys.argv) > 3 else None)
    else:
        main(Path(sys.argv[1]) if len(sys.argv) > 1 else None)
