"""The FP8-weight entries of fp8.cu (`kern_gemv_e4m3_b128`, `kern_dequant_e4m3_b128`) from Python:
their launches, random operands in Qwen's FP8 layout (e4m3 weights, float32 128x128 block scales)
and float64 / numpy references. Shared by their GPU test and the lab's timing script (torch and
cupy: GPU hosts only)."""

from __future__ import annotations

import torch
from helpers import kernel_harness as h

ENTRY = "kern_gemv_e4m3_b128"
DEQUANT = "kern_dequant_e4m3_b128"
DEQUANT_THREADS = 256
"""Threads of a dequantiser block: 16 weights each."""
BLOCK = 128
"""Qwen FP8's weight block: one float32 scale per 128 x 128 weights."""
COLUMNS_PER_BLOCK = 4
"""One warp per output column, 4 warps per 128-thread block."""


def operands(n: int, k: int, rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x bf16 [rows, k], W e4m3 [n, k] (as uint8, every value finite) and its scales float32
    [ceil(n / 128), ceil(k / 128)], seeded; none of them zeros."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(rows, k, generator=gen, device="cuda").to(torch.bfloat16)
    # NOTE: e4m3fn has no infinity: a value past 448 would convert to NaN, so the draw is clamped
    w = (torch.randn(n, k, generator=gen, device="cuda") * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
    w = w.view(torch.uint8)
    blocks = (-(-n // BLOCK), -(-k // BLOCK))
    exp = torch.randint(-12, -4, blocks, generator=gen, device="cuda").float()
    s = torch.exp2(exp) * (1 + torch.rand(blocks, generator=gen, device="cuda"))
    return x, w.contiguous(), s.contiguous()


def reference(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x W^T in float64 with W dequantised block by block, the sum of |x_k W_ck s| per output)."""
    n, k = w.shape
    scale = s.double().repeat_interleave(BLOCK, 0)[:n].repeat_interleave(BLOCK, 1)[:, :k]
    wd = w.view(torch.float8_e4m3fn).double() * scale
    xd = x.double()
    return xd @ wd.T, xd.abs() @ wd.abs().T


def launch(k: h.Kernels, x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, y: torch.Tensor,
           y_stride: int | None = None, y_offset: int = 0) -> None:
    """y[r, c] for the x rows (1..4) and W's columns, from element `y_offset` of y on, its rows
    `y_stride` elements apart (default n)."""
    rows, kk = x.shape
    n = w.shape[0]
    grid = (-(-n // COLUMNS_PER_BLOCK), 1, 1)
    k.launch(ENTRY, grid, (128, 1, 1), h.ptr(x), h.ptr(w), h.ptr(s), h.ptr(y, y_offset), h.i32(rows), h.i32(n),
             h.i32(kk), h.i32(n if y_stride is None else y_stride))


def scales_of(s: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """The block scales spread over the [n, k] weights they scale (float32)."""
    return s.repeat_interleave(BLOCK, 0)[:n].repeat_interleave(BLOCK, 1)[:, :k]


def dequantised(w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """bf16(e4m3 * scale), the product in float32 (exact: a 4-bit mantissa times a float32) rounded
    to nearest even: what kern_dequant_e4m3_b128 writes."""
    n, k = w.shape
    return (w.view(torch.float8_e4m3fn).float() * scales_of(s, n, k)).to(torch.bfloat16)


def launch_dequant(k: h.Kernels, w: torch.Tensor, s: torch.Tensor, out: torch.Tensor) -> None:
    """out [n, k] bf16 from W [n, k] e4m3 (k a multiple of 16) and its block scales."""
    n, kk = w.shape
    grid = (-(-(n * kk // 16) // DEQUANT_THREADS), 1, 1)
    k.launch(DEQUANT, grid, (DEQUANT_THREADS, 1, 1), h.ptr(w), h.ptr(s), h.ptr(out), h.i32(n), h.i32(kk))
