"""GPU correctness of kern's bf16 GEMV entries (tools/kernels-src/gemv.cu) against float64 and
float32 torch references and against kern_gemv_bf16_s4's bits, at the Qwen3-4B decode shapes and at
odd ones (a column tail, rows 1..4, a band of a wider output). The lab's configurations and layouts
(tools/lab/kernels-src/gemv_alt.cu) have theirs in tools/lab/tests/test_gemv_alt_gpu.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers.gpu_deps import gpu_import

torch = gpu_import("torch")
gpu_import("cupy")

from helpers import kernel_harness as h  # noqa: E402 (it needs torch and cupy, checked above)

import kern_qwen3 as gen  # noqa: E402

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
PLAIN_ENTRIES = [e for e in gen.GEMV_ENTRIES if e not in gen.SILU_ENTRIES]
"""gemv.cu's entries without the SiLU epilogue (`_s4`, `_b4`, `_p4`)."""

pytestmark = pytest.mark.gpu


class Gemv(h.Kernels):
    """gemv.cu alone (its headers beside it), built by kern's own build_kernels."""

    def __init__(self, work: Path) -> None:
        src = work / "src"
        src.mkdir(parents=True)
        for header in h.KERNELS_SRC.glob("*.cuh"):
            shutil.copy(header, src / header.name)
        shutil.copy(h.KERNELS_SRC / "gemv.cu", src / "gemv.cu")
        nvcc = shutil.which("nvcc") or "/usr/local/bin/nvcc"
        built = h.build_kernels(src, work / "cubins", compiler=(nvcc,))
        import cupy as cp

        self.modules = {m: cp.RawModule(path=str(p)) for m, (p, _sha) in built.items()}
        self.shas = {m: sha for m, (_p, sha) in built.items()}
        self._fns = {}

    def gemv(self, x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, y_stride: int, entry: str,
             n: int | None = None) -> None:
        """`entry` (a key of kern_qwen3.GEMV_ENTRIES) on its generator launch; `n` the output
        width (the silu entry's is half of W's rows)."""
        rows, k = x.shape
        n = w.shape[0] if n is None else n
        grid_x, threads, smem = gen.gemv_launch(entry, n, k)
        self.launch(entry, (grid_x, 1, 1), (threads, 1, 1), h.ptr(x), h.ptr(w), h.ptr(y), h.i32(rows), h.i32(n),
                    h.i32(k), h.i32(y_stride), shared_mem=smem)


@pytest.fixture(scope="module")
def k(tmp_path_factory: pytest.TempPathFactory) -> Gemv:
    return Gemv(tmp_path_factory.mktemp("gemv"))


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
    entry: str,
    stride_pad: int = 0,
) -> None:
    g = _gen(seed)
    x = torch.randn(rows, kk, generator=g, device=DEV).to(BF16)
    w = (torch.randn(n, kk, generator=g, device=DEV) * 0.05).to(BF16)
    # The output is a band: columns [off, off + n) of a [rows, width] buffer, y_stride = width.
    off = 3 if stride_pad else 0
    width = off + n + stride_pad
    sentinel = torch.randn(rows, width, generator=g, device=DEV).to(BF16)
    buf = sentinel.clone()
    k.gemv(x, w, buf.view(-1)[off:], width, entry)
    torch.cuda.synchronize()
    out = buf[:, off : off + n]
    _check(out, x, w, None)
    outside = torch.ones_like(buf, dtype=torch.bool)
    outside[:, off : off + n] = False
    assert torch.equal(buf[outside], sentinel[outside]), "wrote outside its band"


@pytest.mark.parametrize("entry", PLAIN_ENTRIES)
def test_gemv_rows_outside_1_to_4_write_nothing(k: Gemv, entry: str) -> None:
    g = _gen(3)
    x = torch.randn(5, 256, generator=g, device=DEV).to(BF16)
    w = torch.randn(64, 256, generator=g, device=DEV).to(BF16)
    y = torch.randn(5, 64, generator=g, device=DEV).to(BF16)
    before = y.clone()
    grid, threads, smem = gen.gemv_launch(entry, 64, 256)
    for rows in (0, 5):
        k.launch(entry, (grid, 1, 1), (threads, 1, 1), h.ptr(x), h.ptr(w), h.ptr(y), h.i32(rows), h.i32(64),
                 h.i32(256), h.i32(64), shared_mem=smem)
    torch.cuda.synchronize()
    assert torch.equal(y, before)


@pytest.mark.parametrize("entry", PLAIN_ENTRIES)
@pytest.mark.parametrize(
    ("rows", "n", "kk"),
    [*SHAPES_4B[:4], (4, 1001, 2568), (3, 7, 2048), (2, 6145, 4096), (1, 37, 40)],
)
def test_gemv_entries(k: Gemv, entry: str, rows: int, n: int, kk: int) -> None:
    """The per-shape entries kern_qwen3 picks (GEMV_PICK), at the 4B shapes and at odd ones."""
    _run(k, rows, n, kk, seed=n + kk + rows, stride_pad=5, entry=entry)


@pytest.mark.parametrize("entry", PLAIN_ENTRIES)
@pytest.mark.parametrize(("rows", "n", "kk"), SHAPES_ODD)
@pytest.mark.parametrize("stride_pad", [0, 5])
def test_gemv_entries_odd_shapes(k: Gemv, entry: str, rows: int, n: int, kk: int, stride_pad: int) -> None:
    _run(k, rows, n, kk, seed=7 * n + kk + stride_pad, stride_pad=stride_pad, entry=entry)


@pytest.mark.parametrize(
    ("rows", "inter", "kk"),
    [(1, 9728, 2560), (1, 768, 256), (3, 1001, 264), (4, 5, 2048), (2, 2561, 4096), (1, 700, 9736)],
)
def test_gemv_silu_is_gate_up_then_silu_mul(k: Gemv, rows: int, inter: int, kk: int) -> None:
    """kern_gemv_bf16_silu: act(bf16(x W_gate)) * bf16(x W_up) with transformers' rounding of
    the unfused pair, where bf16(x W) is the float64 product rounded once (its f32 sums may round
    the other way at a bf16 boundary: at most 1 ulp there, rare); it writes only its band."""
    g = _gen(5 * inter + rows)
    x = torch.randn(rows, kk, generator=g, device=DEV).to(BF16)
    w = (torch.randn(2 * inter, kk, generator=g, device=DEV) * 0.05).to(BF16)
    gu = (x.double() @ w.double().T).to(BF16)
    off, width = 3, inter + 8
    sentinel = torch.randn(rows, width, generator=g, device=DEV).to(BF16)
    buf = sentinel.clone()
    k.gemv(x, w, buf.view(-1)[off:], width, entry="kern_gemv_bf16_silu", n=inter)
    torch.cuda.synchronize()
    want = h.silu_mul_ref(gu)
    got = buf[:, off : off + inter]
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=1e-3)
    same = (_ordered(got) == _ordered(want)).double().mean().item()
    assert same >= 0.99, f"only {same:.4f} bit-equal to the float64 gate/up rounded once"
    outside = torch.ones_like(buf, dtype=torch.bool)
    outside[:, off : off + inter] = False
    assert torch.equal(buf[outside], sentinel[outside]), "wrote outside its band"


@pytest.mark.parametrize(("entry", "threads", "smem"), [("kern_gemv_bf16_p4", 128, 2 * 2560 - 16)])
def test_gemv_without_room_for_its_rows_writes_nothing(k: Gemv, entry: str, threads: int, smem: int) -> None:
    """Dynamic shared memory below one W row (`_p4`): the launch returns without touching y."""
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
    k.gemv(x, w, want, n, "kern_gemv_bf16_s4")
    return x, w, want


@pytest.mark.parametrize("entry", sorted(gen.GEMV_BAND))
@pytest.mark.parametrize(("rows", "n", "kk"), [*SHAPES_4B[:4], (4, 1001, 2568), (1, 37, 40), (3, 925, 4096),
                                               (2, 77, 9736), (1, 5, 8)])
def test_band_gemv_is_s4_bit_for_bit_on_any_grid(k: Gemv, entry: str, rows: int, n: int, kk: int) -> None:
    """The band entry (`_b4`) sums each column in kern_gemv_bf16_s4's order:
    the same bits, whatever the grid (the generator's one wave, 1 block, 7 blocks, a block per
    column, more blocks than columns) and whatever k (one partial segment, several, a ragged last one)."""
    x, w, want = _s4_case(k, rows, n, kk, seed=n * 3 + kk + rows)
    grid0, threads, _smem = gen.gemv_launch(entry, n, kk)
    for grid in (grid0, 1, 7, n, n + 5):
        y = torch.full((rows, n), float("nan"), dtype=BF16, device=DEV)
        k.launch(entry, (grid, 1, 1), (threads, 1, 1), h.ptr(x), h.ptr(w), h.ptr(y), h.i32(rows),
                 h.i32(n), h.i32(kk), h.i32(n))
        torch.cuda.synchronize()
        assert torch.equal(y.view(torch.int16), want.view(torch.int16)), f"grid {grid}"


@pytest.mark.parametrize("entry", sorted(gen.GEMV_BAND))
def test_band_gemv_wave_fits_on_the_gpu(k: Gemv, entry: str) -> None:
    """The blocks per SM the generator sizes a band launch for fit by registers, threads and shared
    memory (so the whole grid is resident at once)."""
    fn = k.fn(entry)
    warps = 128 // 32
    regs_per_warp = -(-fn.num_regs * 32 // 256) * 256
    by_regs = 65536 // (regs_per_warp * warps)
    by_smem = (227 * 1024) // max(1, fn.shared_size_bytes + 1024)
    assert min(by_regs, 2048 // 128, 32, by_smem) >= gen.GEMV_BAND[entry], (fn.num_regs, fn.shared_size_bytes)


@pytest.mark.parametrize(("rows", "n", "kk"), [(1, 2560, 4096), (1, 6144, 2560), (4, 1001, 2568), (2, 37, 40),
                                               (3, 925, 9728)])
def test_prefetched_gemv_is_s4_bit_for_bit(k: Gemv, rows: int, n: int, kk: int) -> None:
    """kern_gemv_bf16_p4 sums each column in kern_gemv_bf16_s4's order: the same bits, for the
    generator's columns per block and for 1, 3 and every column per block (shared memory n * 2k
    where it fits); a grid larger than the columns leaves the rest alone."""
    x, w, want = _s4_case(k, rows, n, kk, seed=n * 5 + kk + rows)
    _grid, threads, smem0 = gen.gemv_launch("kern_gemv_bf16_p4", n, kk)
    per_block = [smem0 // (2 * kk), 1, 3] + ([n] if n * 2 * kk <= 200 * 1024 else [])
    for cols in per_block:
        y = torch.full((rows, n), float("nan"), dtype=BF16, device=DEV)
        grid = -(-n // cols) + 2
        k.launch("kern_gemv_bf16_p4", (grid, 1, 1), (threads, 1, 1), h.ptr(x), h.ptr(w), h.ptr(y), h.i32(rows),
                 h.i32(n), h.i32(kk), h.i32(n), shared_mem=cols * 2 * kk)
        torch.cuda.synchronize()
        assert torch.equal(y.view(torch.int16), want.view(torch.int16)), f"{cols} columns per block"
