"""GPU correctness of the lab's GEMV entries (tools/lab/kernels-src/gemv_alt.cu, built beside the
product's gemv.cu against its headers) against float64 and float32 torch references and against
the product's entries, at the Qwen3-4B decode shapes and at odd ones (a column tail, rows 1..4, a
band of a wider output). Every built variant of the GEMV_* macros that tools/lab/time_gemv.py
compares is checked too, so whichever one the notes pin is covered."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers.gpu_deps import gpu_import

torch = gpu_import("torch")
gpu_import("cupy")

from helpers import kernel_harness as h  # noqa: E402 (it needs torch and cupy, checked above)

import kern_qwen3 as gen  # noqa: E402
from kern_lab import ALT_ENTRIES, LAB_GEMV_ENTRIES  # noqa: E402

BF16 = torch.bfloat16
DEV = "cuda"

# (rows, n, k): the four Qwen3-4B projections of a decode step plus lm_head, then odd shapes.
SHAPES_4B = [(1, 6144, 2560), (1, 2560, 4096), (1, 19456, 2560), (1, 2560, 9728), (1, 151936, 2560)]
SHAPES_ODD = [
    (1, 1, 8),
    (1, 3, 16),
    (2, 5, 264),
    (3, 7, 2048),
    (4, 1001, 2568),
    (4, 2561, 9728),
    (2, 6145, 4096),
    (3, 19459, 1544),
    (1, 37, 40),
]
# Variants (GEMV_WARPS, GEMV_RPW, GEMV_UNROLL, GEMV_SPLIT) built besides the pinned default.
VARIANTS = [(8, 1, 8, 1), (4, 2, 4, 1), (4, 1, 8, 1), (4, 1, 4, 4), (8, 1, 4, 2), (8, 2, 4, 4)]
MACROS = ("GEMV_WARPS", "GEMV_RPW", "GEMV_UNROLL", "GEMV_SPLIT")

pytestmark = pytest.mark.gpu


ALT = h.REPO / "tools" / "lab" / "kernels-src" / "gemv_alt.cu"


class Gemv(h.Kernels):
    """gemv_alt.cu and the product's gemv.cu (its headers beside them), built by kern's own
    build_kernels, gemv_alt.cu optionally with GEMV_* macros prepended."""

    def __init__(self, work: Path, variant: tuple[int, int, int, int] | None = None) -> None:
        src = work / "src"
        src.mkdir(parents=True)
        for header in h.KERNELS_SRC.glob("*.cuh"):
            shutil.copy(header, src / header.name)
        shutil.copy(h.KERNELS_SRC / "gemv.cu", src / "gemv.cu")
        text = ALT.read_text()  # the entries and the GEMV_* defaults
        if variant is None:
            variant = (
                _macro("GEMV_WARPS"),
                _macro("GEMV_RPW"),
                _macro("GEMV_UNROLL"),
                _macro("GEMV_SPLIT"),
            )
        else:
            text = (
                "".join(f"#define {m} {v}\n" for m, v in zip(MACROS, variant, strict=True)) + text
            )
        (src / "gemv_alt.cu").write_text(text)
        nvcc = shutil.which("nvcc") or "/usr/local/bin/nvcc"
        built = h.build_kernels(src, work / "cubins", compiler=(nvcc,))
        import cupy as cp

        self.modules = {m: cp.RawModule(path=str(p)) for m, (p, _sha) in built.items()}
        self.shas = {m: sha for m, (_p, sha) in built.items()}
        self._fns = {}
        warps, rpw, _unroll, split = variant
        self.rows_per_block = warps // split * rpw
        self.threads = warps * 32

    def gemv(
        self,
        x: torch.Tensor,
        w: torch.Tensor,
        y: torch.Tensor,
        y_stride: int,
        acc: bool = False,
        entry: str | None = None,
        n: int | None = None,
    ) -> None:
        """`entry` (a key of kern_lab.LAB_GEMV_ENTRIES) overrides the macro-built pair; `n` the
        output width (the silu entry's is half of W's rows)."""
        rows, k = x.shape
        n = w.shape[0] if n is None else n
        smem = 0
        if entry is None:
            name, threads = ("kern_gemv_bf16_acc" if acc else "kern_gemv_bf16"), self.threads
            grid = ((n + self.rows_per_block - 1) // self.rows_per_block, 1, 1)
        else:
            name = entry
            grid_x, threads, smem = gen.gemv_launch(entry, n, k, table=LAB_GEMV_ENTRIES)
            grid = (grid_x, 1, 1)
        self.launch(
            name,
            grid,
            (threads, 1, 1),
            h.ptr(x),
            h.ptr(w),
            h.ptr(y),
            h.i32(rows),
            h.i32(n),
            h.i32(k),
            h.i32(y_stride),
            shared_mem=smem,
        )


def _macro(name: str) -> int:
    for line in ALT.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "#define" and parts[1] == name:
            return int(parts[2])
    raise AssertionError(f"gemv_alt.cu defines no {name}")


@pytest.fixture(scope="module")
def k(tmp_path_factory: pytest.TempPathFactory) -> Gemv:
    return Gemv(tmp_path_factory.mktemp("gemv"))


@pytest.fixture(scope="module")
def variants(tmp_path_factory: pytest.TempPathFactory) -> list[Gemv]:
    return [Gemv(tmp_path_factory.mktemp(f"gemv{i}"), v) for i, v in enumerate(VARIANTS)]


def test_pinned_macros_are_the_documented_launch() -> None:
    """tools/lab/notes/kernel-experiments.md's grid and block for kern_gemv_bf16 follow from the
    pinned GEMV_* values."""
    warps, rpw, split = _macro("GEMV_WARPS"), _macro("GEMV_RPW"), _macro("GEMV_SPLIT")
    doc = (h.REPO / "tools" / "lab" / "notes" / "kernel-experiments.md").read_text()
    launch = f"`[ceil_div(n,{warps // split * rpw}),1,1]` / `[{warps * 32},1,1]`"
    for entry in ("kern_gemv_bf16", "kern_gemv_bf16_acc"):
        rows = [line for line in doc.splitlines() if line.startswith(f"| `{entry}` ")]
        assert len(rows) == 1 and launch in rows[0], f"kernel-experiments.md: {entry} needs {launch}"


def _gen(seed: int) -> torch.Generator:
    g = torch.Generator(device=DEV)
    g.manual_seed(seed)
    return g


def _ordered(t: torch.Tensor) -> torch.Tensor:
    """bf16 bit patterns as integers ordered like the values (+0 and -0 both 0)."""
    b = t.contiguous().view(torch.int16).to(torch.int32)
    return torch.where(b < 0, -(b & 0x7FFF), b)


def _check(out: torch.Tensor, x: torch.Tensor, w: torch.Tensor, y0: torch.Tensor | None) -> None:
    """out is bf16 of an f32 sum: the bound of any f32 summation order, then one bf16 rounding.

    Exactly: |out - ref64| <= k * 2^-24 * sum|x w| + half a bf16 ulp of the f32 value, everywhere;
    and within 1 bf16 ulp of torch's float32 matmul rounded to bf16 at >= 99.9 % of the elements.
    """
    kk = x.shape[1]
    ref64 = x.double() @ w.double().T
    absdot = x.double().abs() @ w.double().abs().T
    ref32 = x.float() @ w.float().T
    if y0 is not None:
        ref64 = ref64 + y0.double()
        absdot = absdot + y0.double().abs()
        ref32 = ref32 + y0.float()
    f32_err = kk * 2.0**-24 * absdot
    mag = ref64.abs() + f32_err
    half_ulp = torch.exp2(torch.floor(torch.log2(mag.clamp_min(2.0**-126))) - 8)
    err = (out.double() - ref64).abs()
    bad = err > 1.0001 * (f32_err + half_ulp)
    assert not bad.any(), (
        f"{int(bad.sum())} of {out.numel()} outside the f32-sum + bf16 rounding bound; "
        f"worst at {int(torch.argmax((err / (f32_err + half_ulp)).flatten()))}"
    )
    apart = (_ordered(out) - _ordered(ref32.to(BF16))).abs()
    near = (apart <= 1).double().mean().item()
    assert near >= 0.999, f"only {near:.5f} within 1 bf16 ulp of torch f32 matmul -> bf16"


def _run(
    k: Gemv,
    rows: int,
    n: int,
    kk: int,
    seed: int,
    stride_pad: int = 0,
    acc: bool = False,
    entry: str | None = None,
) -> None:
    g = _gen(seed)
    x = torch.randn(rows, kk, generator=g, device=DEV).to(BF16)
    w = (torch.randn(n, kk, generator=g, device=DEV) * 0.05).to(BF16)
    # The output is a band: columns [off, off + n) of a [rows, width] buffer, y_stride = width.
    off = 3 if stride_pad else 0
    width = off + n + stride_pad
    sentinel = torch.randn(rows, width, generator=g, device=DEV).to(BF16)
    buf = sentinel.clone()
    k.gemv(x, w, buf.view(-1)[off:], width, acc=acc, entry=entry)
    torch.cuda.synchronize()
    out = buf[:, off : off + n]
    _check(out, x, w, sentinel[:, off : off + n] if acc else None)
    outside = torch.ones_like(buf, dtype=torch.bool)
    outside[:, off : off + n] = False
    assert torch.equal(buf[outside], sentinel[outside]), "wrote outside its band"


@pytest.mark.parametrize(("rows", "n", "kk"), SHAPES_4B)
def test_gemv_qwen3_4b_shapes(k: Gemv, rows: int, n: int, kk: int) -> None:
    _run(k, rows, n, kk, seed=n + kk)


@pytest.mark.parametrize(("rows", "n", "kk"), SHAPES_ODD)
@pytest.mark.parametrize("stride_pad", [0, 5])
def test_gemv_odd_shapes(k: Gemv, rows: int, n: int, kk: int, stride_pad: int) -> None:
    _run(k, rows, n, kk, seed=7 * n + kk + stride_pad, stride_pad=stride_pad)


@pytest.mark.parametrize("rows", [1, 2, 3, 4])
def test_gemv_rows_4b_o_proj(k: Gemv, rows: int) -> None:
    _run(k, rows, 2560, 4096, seed=rows, stride_pad=5)


@pytest.mark.parametrize(("rows", "n", "kk"), [(1, 2560, 9728), (1, 2560, 4096), (3, 1001, 2568)])
def test_gemv_acc(k: Gemv, rows: int, n: int, kk: int) -> None:
    _run(k, rows, n, kk, seed=11 + n, stride_pad=5, acc=True)


def test_gemv_rows_outside_1_to_4_write_nothing(k: Gemv) -> None:
    g = _gen(3)
    x = torch.randn(5, 256, generator=g, device=DEV).to(BF16)
    w = torch.randn(64, 256, generator=g, device=DEV).to(BF16)
    y = torch.randn(5, 64, generator=g, device=DEV).to(BF16)
    before = y.clone()
    for rows in (0, 5):
        k.launch(
            "kern_gemv_bf16",
            (64 // k.rows_per_block, 1, 1),
            (k.threads, 1, 1),
            h.ptr(x),
            h.ptr(w),
            h.ptr(y),
            h.i32(rows),
            h.i32(64),
            h.i32(256),
            h.i32(64),
        )
    torch.cuda.synchronize()
    assert torch.equal(y, before)


def test_gemv_variants(variants: list[Gemv]) -> None:
    for v in variants:
        for rows, n, kk in [(1, 2560, 9728), (4, 1001, 2568), (2, 6145, 4096), (1, 37, 40)]:
            _run(v, rows, n, kk, seed=rows * n, stride_pad=5)
        _run(v, 2, 999, 2560, seed=5, stride_pad=5, acc=True)


SILU = gen.silu_entries(LAB_GEMV_ENTRIES)
PLAIN_ENTRIES = [e for e in ALT_ENTRIES if e != "kern_gemv_bf16" and e not in SILU]
"""The plain entries of gemv_alt.cu; the ring entries have their bit test in
tools/lab/tests/test_lab_kernels_gpu.py, the product's entries theirs in tools/tests/test_gemv_gpu.py."""


@pytest.mark.parametrize("entry", PLAIN_ENTRIES)
@pytest.mark.parametrize(
    ("rows", "n", "kk"),
    [*SHAPES_4B[:4], (4, 1001, 2568), (3, 7, 2048), (2, 6145, 4096), (1, 37, 40)],
)
def test_gemv_entries(k: Gemv, entry: str, rows: int, n: int, kk: int) -> None:
    """The per-shape entries the lab's plans may pick, at the 4B shapes and at odd ones."""
    _run(k, rows, n, kk, seed=n + kk + rows, stride_pad=5, entry=entry)


@pytest.mark.parametrize(
    ("rows", "inter", "kk"), [(1, 9728, 2560), (1, 768, 256), (3, 1001, 264), (4, 5, 2048)]
)
def test_gemv_silu_is_gemv_then_silu_mul(k: Gemv, rows: int, inter: int, kk: int) -> None:
    """kern_gemv_bf16_silu's epilogue equals kern_gemv_bf16 over [gate; up] (the same summation
    order) followed by transformers' act(gate) * up, bit for bit; it writes only its band."""
    g = _gen(inter + rows)
    x = torch.randn(rows, kk, generator=g, device=DEV).to(BF16)
    w = (torch.randn(2 * inter, kk, generator=g, device=DEV) * 0.05).to(BF16)
    gu = torch.empty(rows, 2 * inter, device=DEV, dtype=BF16)
    k.gemv(x, w, gu, 2 * inter)
    off, width = 3, inter + 8
    sentinel = torch.randn(rows, width, generator=g, device=DEV).to(BF16)
    buf = sentinel.clone()
    k.gemv(x, w, buf.view(-1)[off:], width, entry="kern_gemv_bf16_silu", n=inter)
    torch.cuda.synchronize()
    want = h.silu_mul_ref(gu)
    got = buf[:, off : off + inter]
    assert torch.equal(got.contiguous().view(torch.int16), want.contiguous().view(torch.int16))
    outside = torch.ones_like(buf, dtype=torch.bool)
    outside[:, off : off + inter] = False
    assert torch.equal(buf[outside], sentinel[outside]), "wrote outside its band"


@pytest.mark.parametrize(
    ("rows", "inter", "kk"),
    [(1, 9728, 2560), (1, 768, 256), (3, 1001, 264), (4, 5, 2048), (2, 2561, 4096), (1, 700, 9736)],
)
def test_streaming_gemv_silu_is_gate_up_then_silu_mul(k: Gemv, rows: int, inter: int, kk: int) -> None:
    """kern_gemv_bf16_tma_silu: act(bf16(x W_gate)) * bf16(x W_up) with transformers' rounding of
    the unfused pair, where bf16(x W) is the float64 product rounded once (its f32 sums may round
    the other way at a bf16 boundary: at most 1 ulp there, rare); it writes only its band."""
    g = _gen(3 * inter + rows)
    x = torch.randn(rows, kk, generator=g, device=DEV).to(BF16)
    w = (torch.randn(2 * inter, kk, generator=g, device=DEV) * 0.05).to(BF16)
    gu = (x.double() @ w.double().T).to(BF16)
    off, width = 3, inter + 8
    sentinel = torch.randn(rows, width, generator=g, device=DEV).to(BF16)
    buf = sentinel.clone()
    k.gemv(x, w, buf.view(-1)[off:], width, entry="kern_gemv_bf16_tma_silu", n=inter)
    torch.cuda.synchronize()
    want = h.silu_mul_ref(gu)
    got = buf[:, off : off + inter]
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=1e-3)
    same = (_ordered(got) == _ordered(want)).double().mean().item()
    assert same >= 0.99, f"only {same:.4f} bit-equal to the float64 gate/up rounded once"
    outside = torch.ones_like(buf, dtype=torch.bool)
    outside[:, off : off + inter] = False
    assert torch.equal(buf[outside], sentinel[outside]), "wrote outside its band"


@pytest.mark.parametrize("entry", ["kern_gemv_bf16_tma", "kern_gemv_bf16_tma_silu"])
def test_streaming_gemv_is_deterministic_and_any_grid_covers_n(k: Gemv, entry: str) -> None:
    """The same bits on every launch, and the same bits for any grid size (1 block, 7 blocks, more
    blocks than units): the column split changes which block sums a column, not how."""
    g = _gen(99)
    rows, n, kk = 2, 3001, 2560
    wn = 2 * n if entry in SILU else n
    x = torch.randn(rows, kk, generator=g, device=DEV).to(BF16)
    w = (torch.randn(wn, kk, generator=g, device=DEV) * 0.05).to(BF16)
    _grid, threads, smem = gen.gemv_launch(entry, n, kk, table=LAB_GEMV_ENTRIES)
    outs = []
    for grid in (gen.GEMV_TMA_BLOCKS, gen.GEMV_TMA_BLOCKS, 1, 7, n):
        y = torch.full((rows, n), float("nan"), dtype=BF16, device=DEV)
        k.launch(entry, (grid, 1, 1), (threads, 1, 1), h.ptr(x), h.ptr(w), h.ptr(y), h.i32(rows), h.i32(n),
                 h.i32(kk), h.i32(n), shared_mem=smem)
        torch.cuda.synchronize()
        outs.append(y)
    assert not outs[0].isnan().any()
    for y in outs[1:]:
        assert torch.equal(y.view(torch.int16), outs[0].view(torch.int16))


@pytest.mark.parametrize(("entry", "threads", "smem"), [("kern_gemv_bf16_tma", 256, 4096),
                                                    ("kern_gemv_bf16_p4_silu", 128, 4 * 2560 - 16)])
def test_gemv_without_room_for_its_rows_writes_nothing(k: Gemv, entry: str, threads: int, smem: int) -> None:
    """Dynamic shared memory below one stage (`_tma`) or one gate and up row (`_p4_silu`): the
    launch returns without touching y."""
    g = _gen(5)
    x = torch.randn(1, 2560, generator=g, device=DEV).to(BF16)
    w = torch.randn(64, 2560, generator=g, device=DEV).to(BF16)
    y = torch.randn(1, 64, generator=g, device=DEV).to(BF16)
    before = y.clone()
    k.launch(entry, (4, 1, 1), (threads, 1, 1), h.ptr(x), h.ptr(w), h.ptr(y), h.i32(1), h.i32(64),
             h.i32(2560), h.i32(64), shared_mem=smem)
    torch.cuda.synchronize()
    assert torch.equal(y, before)


def _s4_case(k: Gemv, rows: int, n: int, kk: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [rows, kk], W [n, kk] and kern_gemv_bf16_s4's y: the bits the `_s4`-order entries must give."""
    g = _gen(seed)
    x = torch.randn(rows, kk, generator=g, device=DEV).to(BF16)
    w = (torch.randn(n, kk, generator=g, device=DEV) * 0.05).to(BF16)
    want = torch.full((rows, n), float("nan"), dtype=BF16, device=DEV)
    k.gemv(x, w, want, n, entry="kern_gemv_bf16_s4")
    return x, w, want


BANDS = {e: v.per_sm for e, v in ALT_ENTRIES.items() if v.layout is gen.Layout.BAND}
BAND_PLAIN = sorted(e for e in BANDS if e not in SILU)
BAND_SILU = sorted(e for e in BANDS if e in SILU)


@pytest.mark.parametrize("entry", BAND_PLAIN)
@pytest.mark.parametrize(("rows", "n", "kk"), [*SHAPES_4B[:4], (4, 1001, 2568), (1, 37, 40), (3, 925, 4096),
                                               (2, 77, 9736), (1, 5, 8)])
def test_band_gemv_is_s4_bit_for_bit_on_any_grid(k: Gemv, entry: str, rows: int, n: int, kk: int) -> None:
    """The deep band entries (`_d4` / `_d8`) sum each column in kern_gemv_bf16_s4's order:
    the same bits, whatever the grid (the generator's one wave, 1 block, 7 blocks, a block per
    column, more blocks than columns) and whatever k (one partial segment, several, a ragged last one)."""
    x, w, want = _s4_case(k, rows, n, kk, seed=n * 3 + kk + rows)
    grid0, threads, _smem = gen.gemv_launch(entry, n, kk, table=LAB_GEMV_ENTRIES)
    for grid in (grid0, 1, 7, n, n + 5):
        y = torch.full((rows, n), float("nan"), dtype=BF16, device=DEV)
        k.launch(entry, (grid, 1, 1), (threads, 1, 1), h.ptr(x), h.ptr(w), h.ptr(y), h.i32(rows),
                 h.i32(n), h.i32(kk), h.i32(n))
        torch.cuda.synchronize()
        assert torch.equal(y.view(torch.int16), want.view(torch.int16)), f"grid {grid}"


@pytest.mark.parametrize("entry", BAND_SILU)
@pytest.mark.parametrize(("rows", "inter", "kk"), [(1, 9728, 2560), (1, 768, 256), (3, 1001, 264), (4, 5, 2048),
                                                   (2, 33, 5128)])
def test_band_gemv_silu_is_s4_gate_up_then_silu_mul(k: Gemv, entry: str, rows: int, inter: int, kk: int) -> None:
    """The band SiLU entries (`_b4_silu`, `_d4_silu`): kern_gemv_bf16_s4 over [gate; up] then
    transformers' act(gate) * up, bit for bit, on the generator's grid and on others; each writes
    only its band."""
    g = _gen(inter + 7 * rows)
    x = torch.randn(rows, kk, generator=g, device=DEV).to(BF16)
    w = (torch.randn(2 * inter, kk, generator=g, device=DEV) * 0.05).to(BF16)
    gu = torch.empty(rows, 2 * inter, device=DEV, dtype=BF16)
    k.gemv(x, w, gu, 2 * inter, entry="kern_gemv_bf16_s4")
    want = h.silu_mul_ref(gu)
    off, width = 3, inter + 8
    sentinel = torch.randn(rows, width, generator=g, device=DEV).to(BF16)
    buf = sentinel.clone()
    k.gemv(x, w, buf.view(-1)[off:], width, entry=entry, n=inter)
    torch.cuda.synchronize()
    assert torch.equal(buf[:, off : off + inter].contiguous().view(torch.int16), want.contiguous().view(torch.int16))
    outside = torch.ones_like(buf, dtype=torch.bool)
    outside[:, off : off + inter] = False
    assert torch.equal(buf[outside], sentinel[outside]), "wrote outside its band"
    for grid in (1, 7, inter + 3):
        y = torch.full((rows, inter), float("nan"), dtype=BF16, device=DEV)
        k.launch(entry, (grid, 1, 1), (128, 1, 1), h.ptr(x), h.ptr(w), h.ptr(y), h.i32(rows),
                 h.i32(inter), h.i32(kk), h.i32(inter))
        torch.cuda.synchronize()
        assert torch.equal(y.view(torch.int16), want.contiguous().view(torch.int16)), f"grid {grid}"


@pytest.mark.parametrize("entry", sorted(BANDS))
def test_band_gemv_wave_fits_on_the_gpu(k: Gemv, entry: str) -> None:
    """The blocks per SM the generator sizes a band launch for fit by registers, threads and shared
    memory (so the whole grid is resident at once)."""
    fn = k.fn(entry)
    warps = 128 // 32
    regs_per_warp = -(-fn.num_regs * 32 // 256) * 256
    by_regs = 65536 // (regs_per_warp * warps)
    by_smem = (227 * 1024) // max(1, fn.shared_size_bytes + 1024)
    assert min(by_regs, 2048 // 128, 32, by_smem) >= BANDS[entry], (fn.num_regs, fn.shared_size_bytes)


@pytest.mark.parametrize(("rows", "inter", "kk"), [(1, 9728, 2560), (3, 1001, 264), (4, 5, 2048), (2, 33, 5128)])
def test_prefetched_gemv_silu_is_s4_gate_up_then_silu_mul(k: Gemv, rows: int, inter: int, kk: int) -> None:
    """kern_gemv_bf16_p4_silu: kern_gemv_bf16_s4 over [gate; up] then transformers' act(gate) * up,
    bit for bit, for the generator's columns per block and for 1, 3 and every column per block (where
    they fit); a grid larger than the columns leaves the rest alone."""
    g = _gen(inter + 11 * rows)
    x = torch.randn(rows, kk, generator=g, device=DEV).to(BF16)
    w = (torch.randn(2 * inter, kk, generator=g, device=DEV) * 0.05).to(BF16)
    gu = torch.empty(rows, 2 * inter, device=DEV, dtype=BF16)
    k.gemv(x, w, gu, 2 * inter, entry="kern_gemv_bf16_s4")
    want = h.silu_mul_ref(gu).contiguous()
    _grid, threads, smem0 = gen.gemv_launch("kern_gemv_bf16_p4_silu", inter, kk, table=LAB_GEMV_ENTRIES)
    per_block = [smem0 // (4 * kk), 1, 3] + ([inter] if inter * 4 * kk <= 200 * 1024 else [])
    for cols in per_block:
        y = torch.full((rows, inter), float("nan"), dtype=BF16, device=DEV)
        grid = -(-inter // cols) + 2
        k.launch("kern_gemv_bf16_p4_silu", (grid, 1, 1), (threads, 1, 1), h.ptr(x), h.ptr(w), h.ptr(y),
                 h.i32(rows), h.i32(inter), h.i32(kk), h.i32(inter), shared_mem=cols * 4 * kk)
        torch.cuda.synchronize()
        assert torch.equal(y.view(torch.int16), want.view(torch.int16)), f"{cols} columns per block"
