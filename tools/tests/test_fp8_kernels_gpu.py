"""fp8.cu on the GPU over the same e4m3 bytes as their references: the FP8 GEMV (kern_gemv_e4m3_b128:
e4m3 weights with Qwen's 128x128 float32 block scales, bf16 x and y) against float64 at the Qwen3-4B
decode shapes and odd ones (a column tail, k not a multiple of 128, rows 1..4), and what it writes:
its rows' columns and nothing else of y; the dequantiser (kern_dequant_e4m3_b128) bit for bit
against bf16(e4m3 * scale); the quantiser (kern_quant_e4m3_b128) byte for byte against
kern_qwen3.quantize_blocks, the bytes of a Qwen FP8 checkpoint; the float64 reference itself against
a loop over the elements."""

from __future__ import annotations

import pytest
from helpers.gpu_deps import gpu_import

torch = gpu_import("torch")
gpu_import("cupy")

from helpers import fp8_kernels as fp8  # noqa: E402 (it needs torch and cupy, checked above)
from helpers import kernel_harness as h  # noqa: E402

pytestmark = pytest.mark.gpu

SHAPES = [(1, 6144, 2560), (1, 2560, 4096), (1, 19456, 2560), (1, 2560, 9728),
          (1, 1, 16), (2, 5, 272), (3, 130, 2048), (4, 1001, 2576), (4, 2561, 9728), (1, 37, 48)]
"""(rows, n, k): qkv, o, gate_up and down of the 4B decode step, then odd shapes."""


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> h.Kernels:
    return h.Kernels(tmp_path_factory.mktemp("fp8"))


@pytest.mark.parametrize(("rows", "n", "k"), SHAPES)
def test_the_fp8_gemv_is_the_dequantised_product(kernels: h.Kernels, rows: int, n: int, k: int) -> None:
    """Within bf16's rounding of the result (2^-8 of it) plus f32 accumulation over at most ~50
    partial sums in a row (2^-17 of the sum of |products|)."""
    x, w, s = fp8.operands(n, k, rows, seed=n * 7 + k)
    y = torch.full((rows, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    fp8.launch(kernels, x, w, s, y)
    torch.cuda.synchronize()
    ref, size = fp8.reference(x, w, s)
    got = y.double()
    bound = 2.0**-8 * ref.abs() + 2.0**-17 * size
    bad = ~((got - ref).abs() <= bound)
    assert not bool(bad.any()), f"{int(bad.sum())} of {rows * n} outside; worst {float((got - ref).abs().max())}"


def test_it_writes_its_columns_of_a_wider_output_and_nothing_else(kernels: h.Kernels) -> None:
    rows, n, k, stride = 3, 300, 512, 1000
    x, w, s = fp8.operands(n, k, rows, seed=3)
    y = torch.full((rows + 1, stride), 7.0, device="cuda", dtype=torch.bfloat16)
    fp8.launch(kernels, x, w, s, y, y_stride=stride, y_offset=200)
    torch.cuda.synchronize()
    ref, size = fp8.reference(x, w, s)
    band = y[:rows, 200:200 + n].double()
    assert bool(((band - ref).abs() <= 2.0**-8 * ref.abs() + 2.0**-17 * size).all())
    untouched = torch.ones_like(y, dtype=torch.bool)
    untouched[:rows, 200:200 + n] = False
    assert bool((y[untouched] == 7.0).all())


def test_rows_outside_1_to_4_write_nothing(kernels: h.Kernels) -> None:
    x, w, s = fp8.operands(64, 256, 4, seed=9)
    y = torch.full((5, 64), 7.0, device="cuda", dtype=torch.bfloat16)
    fn = kernels.fn(fp8.ENTRY)
    for rows in (0, 5):
        h.launch(fn, (16, 1, 1), (128, 1, 1), h.ptr(x), h.ptr(w), h.ptr(s), h.ptr(y), h.i32(rows), h.i32(64),
                 h.i32(256), h.i32(64))
    torch.cuda.synchronize()
    assert bool((y == 7.0).all())


@pytest.mark.parametrize(("n", "k"), [(3, 16), (130, 272), (257, 144)])
def test_the_float64_reference_scales_each_weight_by_its_blocks_scale(n: int, k: int) -> None:
    gen = torch.Generator().manual_seed(n + k)
    x = torch.randn(2, k, generator=gen).to(torch.bfloat16)
    w = (torch.randn(n, k, generator=gen) * 8).to(torch.float8_e4m3fn).view(torch.uint8)
    s = torch.rand(-(-n // 128), -(-k // 128), generator=gen) + 0.5
    ref, size = fp8.reference(x, w, s)
    wf = w.view(torch.float8_e4m3fn).double()
    for r in range(2):
        for c in (0, n // 2, n - 1):
            terms = [float(x[r, j]) * float(wf[c, j]) * float(s[c // 128, j // 128]) for j in range(k)]
            assert float(ref[r, c]) == pytest.approx(sum(terms), rel=1e-12, abs=1e-12)
            assert float(size[r, c]) == pytest.approx(sum(abs(t) for t in terms), rel=1e-12)


@pytest.mark.parametrize(("n", "k"), [(6144, 2560), (2560, 9728), (130, 272), (1, 16), (257, 144)])
def test_the_dequantiser_writes_bf16_of_e4m3_times_its_scale_bit_for_bit(kernels: h.Kernels, n: int, k: int) -> None:
    _x, w, s = fp8.operands(n, k, 1, seed=n + 3 * k)
    pad = 64
    out = torch.full((n * k + pad,), 7.0, device="cuda", dtype=torch.bfloat16)
    fp8.launch_dequant(kernels, w, s, out)
    torch.cuda.synchronize()
    want = fp8.dequantised(w, s)
    got = out[: n * k].view(n, k)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16)), f"{int((got != want).sum())} of {n * k} differ"
    assert bool((out[n * k :] == 7.0).all())  # nothing past the weight


@pytest.mark.parametrize(("n", "k"), [(6144, 2560), (2560, 9728), (256, 768), (130, 136), (1, 8), (300, 200)])
def test_the_quantiser_writes_a_qwen_fp8_checkpoint_s_bytes(kernels: h.Kernels, n: int, k: int) -> None:
    """Partial blocks at both edges, an all-zero block (scale 1), values that round to -0."""
    import numpy as np

    from kern_qwen3 import quantize_blocks

    gen = torch.Generator(device="cuda").manual_seed(n * 31 + k)
    src = (torch.randn(n, k, generator=gen, device="cuda") * 0.03).to(torch.bfloat16)
    src[:128, :128] = 0.0 if n >= 128 and k >= 128 else src[:128, :128]
    src[-1, :4] = torch.tensor([-1e-30, 1e-30, -0.0, 3.0], device="cuda").to(torch.bfloat16)[: min(4, k)]
    w = torch.full((n, k), 0x55, device="cuda", dtype=torch.uint8)
    blocks = (-(-n // 128), -(-k // 128))
    s = torch.full(blocks, float("nan"), device="cuda", dtype=torch.float32)
    fp8.launch_quant(kernels, src, w, s)
    torch.cuda.synchronize()
    want_w, want_s = quantize_blocks(src.float().cpu().numpy())
    assert np.array_equal(s.cpu().numpy().view(np.uint32), want_s.view(np.uint32))
    got = w.cpu().numpy()
    assert np.array_equal(got, want_w), f"{int((got != want_w).sum())} of {n * k} bytes differ"


@pytest.mark.parametrize(("rows", "n", "k"), [(1, 6144, 2560), (1, 2560, 9728), (3, 130, 272), (4, 1001, 2576),
                                              (2, 5, 16)])
def test_the_row_scaled_gemv_is_the_dequantised_product(kernels: h.Kernels, rows: int, n: int, k: int) -> None:
    """kern_gemv_e4m3_row: one scale per output row (compressed-tensors' FP8-dynamic weights)."""
    x, w, s = fp8.operands(n, k, rows, seed=n * 5 + k, per_row=True)
    y = torch.full((rows, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    fp8.launch(kernels, x, w, s, y, entry=fp8.ENTRY_ROW)
    torch.cuda.synchronize()
    ref, size = fp8.reference(x, w, s, per_row=True)
    bad = ~((y.double() - ref).abs() <= 2.0**-8 * ref.abs() + 2.0**-17 * size)
    assert not bool(bad.any()), f"{int(bad.sum())} of {rows * n} outside"


@pytest.mark.parametrize(("n", "k"), [(2560, 9728), (130, 272), (7, 16)])
def test_the_row_dequantiser_is_bit_for_bit(kernels: h.Kernels, n: int, k: int) -> None:
    _x, w, s = fp8.operands(n, k, 1, seed=n + k, per_row=True)
    out = torch.full((n, k), 7.0, device="cuda", dtype=torch.bfloat16)
    fp8.launch_dequant(kernels, w, s, out, entry=fp8.DEQUANT_ROW)
    torch.cuda.synchronize()
    assert torch.equal(out.view(torch.int16), fp8.dequantised(w, s, per_row=True).view(torch.int16))
