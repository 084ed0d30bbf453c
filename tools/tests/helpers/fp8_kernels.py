"""The FP8-weight entries of fp8.cu (`kern_gemv_e4m3_b128`, `kern_dequant_e4m3_b128`) from Python:
their launches, random operands in Qwen's FP8 layout (e4m3 weights, float32 128x128 block scales)
and float64 / numpy references. Shared by their GPU test and the lab's timing script (torch and
cupy: GPU hosts only)."""

from __future__ import annotations

import torch
from helpers import kernel_harness as h

ENTRY = "kern_gemv_e4m3_b128"
ENTRY_ROW = "kern_gemv_e4m3_row"
DEQUANT = "kern_dequant_e4m3_b128"
DEQUANT_ROW = "kern_dequant_e4m3_row"
QUANT = "kern_quant_e4m3_b128"
DEQUANT_THREADS = 256
"""Threads of a dequantiser block: 16 weights each."""
BLOCK = 128
"""Qwen FP8's weight block: one float32 scale per 128 x 128 weights."""
COLUMNS_PER_BLOCK = 4
"""One warp per output column, 4 warps per 128-thread block."""


def operands(n: int, k: int, rows: int, seed: int, per_row: bool = False) -> tuple[torch.Tensor, torch.Tensor,
                                                                                    torch.Tensor]:
    """x bf16 [rows, k], W e4m3 [n, k] (as uint8, every value finite) and its scales float32
    [ceil(n / 128), ceil(k / 128)] (`per_row`: [n, 1]), seeded; none of them zeros."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(rows, k, generator=gen, device="cuda").to(torch.bfloat16)
    # NOTE: e4m3fn has no infinity: a value past 448 would convert to NaN, so the draw is clamped
    w = (torch.randn(n, k, generator=gen, device="cuda") * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
    w = w.view(torch.uint8)
    blocks = (n, 1) if per_row else (-(-n // BLOCK), -(-k // BLOCK))
    exp = torch.randint(-12, -4, blocks, generator=gen, device="cuda").float()
    s = torch.exp2(exp) * (1 + torch.rand(blocks, generator=gen, device="cuda"))
    return x, w.contiguous(), s.contiguous()


def reference(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, per_row: bool = False) -> tuple[torch.Tensor,
                                                                                                 torch.Tensor]:
    """(x W^T in float64 with W dequantised by its scales, the sum of |x_k W_ck s| per output)."""
    n, k = w.shape
    wd = w.view(torch.float8_e4m3fn).double() * scales_of(s.double(), n, k, per_row)
    xd = x.double()
    return xd @ wd.T, xd.abs() @ wd.abs().T


def launch(k: h.Kernels, x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, y: torch.Tensor,
           y_stride: int | None = None, y_offset: int = 0, entry: str = ENTRY) -> None:
    """y[r, c] for the x rows (1..4) and W's columns, from element `y_offset` of y on, its rows
    `y_stride` elements apart (default n)."""
    rows, kk = x.shape
    n = w.shape[0]
    grid = (-(-n // COLUMNS_PER_BLOCK), 1, 1)
    k.launch(entry, grid, (128, 1, 1), h.ptr(x), h.ptr(w), h.ptr(s), h.ptr(y, y_offset), h.i32(rows), h.i32(n),
             h.i32(kk), h.i32(n if y_stride is None else y_stride))


def scales_of(s: torch.Tensor, n: int, k: int, per_row: bool = False) -> torch.Tensor:
    """The scales (block, or `per_row` [n, 1]) spread over the [n, k] weights they scale."""
    if per_row:
        return s.reshape(n, 1).expand(n, k)
    return s.repeat_interleave(BLOCK, 0)[:n].repeat_interleave(BLOCK, 1)[:, :k]


def dequantised(w: torch.Tensor, s: torch.Tensor, per_row: bool = False) -> torch.Tensor:
    """bf16(e4m3 * scale), the product in float32 (exact: a 4-bit mantissa times a float32) rounded
    to nearest even: what the dequantisers write."""
    n, k = w.shape
    return (w.view(torch.float8_e4m3fn).float() * scales_of(s, n, k, per_row)).to(torch.bfloat16)


def launch_dequant(k: h.Kernels, w: torch.Tensor, s: torch.Tensor, out: torch.Tensor, entry: str = DEQUANT) -> None:
    """out [n, k] bf16 from W [n, k] e4m3 (k a multiple of 16) and its scales."""
    n, kk = w.shape
    grid = (-(-(n * kk // 16) // DEQUANT_THREADS), 1, 1)
    k.launch(entry, grid, (DEQUANT_THREADS, 1, 1), h.ptr(w), h.ptr(s), h.ptr(out), h.i32(n), h.i32(kk))


def launch_quant(k: h.Kernels, src: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> None:
    """W [n, k] e4m3 (uint8) and its block scales s from the bf16 weight src [n, k] (k a multiple of 8)."""
    n, kk = src.shape
    grid = (-(-kk // BLOCK), -(-n // BLOCK), 1)
    k.launch(QUANT, grid, (256, 1, 1), h.ptr(src), h.ptr(w), h.ptr(s), h.i32(n), h.i32(kk))
