"""kern_prefill_attn (+ kern_prefill_combine) launched the way the generator wires them, on paged KV
built here; the old kern_attn_prefill beside it; an f32 reference over the gathered pages. Test and
lab code only (torch, cupy)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from helpers import kernel_harness as h

from kern_qwen3.entries import (
    PREFILL_BM,
    PREFILL_PART_ROWS,
    PREFILL_SPLIT_ROWS,
    PREFILL_SPLITS,
    PREFILL_THREADS,
    prefill_smem,
)

__all__ = ["PAGE", "Chunk", "PrefillCase", "attention_ref", "new_case", "prefill_grid"]

PAGE = 16
DEV = "cuda"


def prefill_grid(rows: int, nq: int, nkv: int) -> tuple[int, int, int]:
    """kern_prefill_attn's grid (kern_qwen3.ops.prefill_op's expressions at tokens = rows)."""
    return (math.ceil(rows * (nq // nkv) / PREFILL_BM), nkv,
            min(PREFILL_SPLITS, math.ceil(PREFILL_SPLIT_ROWS / rows)))


@dataclass
class PrefillCase:
    """One layer of paged KV (`length` tokens over a scattered block table) and query rows for
    every position: q[i] is position i's query heads."""

    nq: int
    nkv: int
    d: int
    length: int
    state: torch.Tensor  # [pages, 2, PAGE, nkv, d] bf16
    table: torch.Tensor  # i32
    q: torch.Tensor  # [length, nq, d] bf16

    @property
    def page_stride(self) -> int:
        return 2 * PAGE * self.nkv * self.d

    def keys_values(self) -> tuple[torch.Tensor, torch.Tensor]:
        pos = torch.arange(self.length, device=DEV)
        pages = self.table.long()[pos // PAGE]
        return self.state[pages, 0, pos % PAGE], self.state[pages, 1, pos % PAGE]

    def qkv(self, start: int, rows: int) -> torch.Tensor:
        """The chunk's qkv rows [rows, (nq + 2 nkv) d]: q from the case, k/v parts NaN (never read)."""
        out = torch.full((rows, self.nq + 2 * self.nkv, self.d), float("nan"), dtype=torch.bfloat16, device=DEV)
        out[:, : self.nq] = self.q[start : start + rows]
        return out.reshape(rows, -1).contiguous()


def new_case(nq: int, nkv: int, d: int, length: int, gen: torch.Generator, q_scale: float = 3.0) -> PrefillCase:
    """Random K/V and queries; queries scaled so each row's softmax is peaked (scores of std
    ~`q_scale`), which makes a wrong key or a lost split visible even over 30k keys."""
    pages = math.ceil(length / PAGE)
    spare = pages + 7
    state = torch.randn(spare, 2, PAGE, nkv, d, generator=gen, device=DEV).to(torch.bfloat16)
    table = torch.randperm(spare, generator=gen, device=DEV)[:pages].to(torch.int32).contiguous()
    q = (torch.randn(length, nq, d, generator=gen, device=DEV) * q_scale).to(torch.bfloat16)
    return PrefillCase(nq, nkv, d, length, state, table, q)


@dataclass
class Chunk:
    """The device buffers of one chunk (start, rows) of a case, its output NaN-filled."""

    case: PrefillCase
    start: int
    rows: int

    def __post_init__(self) -> None:
        c = self.case
        self.qkv = c.qkv(self.start, self.rows)
        self.seq = torch.tensor([self.start + self.rows], dtype=torch.int32, device=DEV)
        self.out = torch.full((self.rows, c.nq * c.d), float("nan"), dtype=torch.bfloat16, device=DEV)
        self.part_o = torch.full((PREFILL_PART_ROWS, c.nq * c.d), float("nan"), device=DEV)
        self.part_lse = torch.full((PREFILL_PART_ROWS, c.nq), float("nan"), device=DEV)

    def launch_new(self, k: h.Kernels) -> None:
        """kern_prefill_attn then kern_prefill_combine, as the manifest's attn_prefill op runs them."""
        c = self.case
        k.launch("kern_prefill_attn", prefill_grid(self.rows, c.nq, c.nkv), (PREFILL_THREADS,), h.ptr(self.qkv),
                 h.ptr(c.state), h.ptr(c.table), h.ptr(self.seq), h.ptr(self.out), h.ptr(self.part_o),
                 h.ptr(self.part_lse), h.i32(self.rows), h.i32(c.nq), h.i32(c.nkv), h.i32(c.d), h.i32(PAGE),
                 h.i64(c.page_stride), h.f32(c.d**-0.5), shared_mem=prefill_smem(c.d))
        k.launch("kern_prefill_combine", (self.rows, c.nq), (128,), h.ptr(self.part_o), h.ptr(self.part_lse),
                 h.ptr(self.seq), h.ptr(self.out), h.i32(self.rows), h.i32(c.nq), h.i32(c.nkv), h.i32(c.d))

    def launch_old(self, k: h.Kernels) -> None:
        """attention.cu's kern_attn_prefill over the same chunk."""
        c = self.case
        k.launch("kern_attn_prefill", (math.ceil(self.rows / 64), c.nq), (128,), h.ptr(self.qkv), h.ptr(c.state),
                 h.ptr(c.table), h.ptr(self.seq), h.ptr(self.out), h.i32(self.rows), h.i32(c.nq), h.i32(c.nkv),
                 h.i32(c.d), h.i32(PAGE), h.i64(c.page_stride), h.f32(c.d**-0.5))


def attention_ref(case: PrefillCase, start: int, rows: int, block: int = 1024) -> torch.Tensor:
    """f32 sdpa with an explicit causal mask over the gathered pages: the chunk's [rows, nq * d]."""
    keys, vals = case.keys_values()
    end = start + rows
    group = case.nq // case.nkv
    kk = keys[:end].float().repeat_interleave(group, dim=1).transpose(0, 1)
    vv = vals[:end].float().repeat_interleave(group, dim=1).transpose(0, 1)
    out = []
    for lo in range(start, end, block):
        hi = min(lo + block, end)
        qq = case.q[lo:hi].float().transpose(0, 1)
        mask = torch.arange(end, device=DEV)[None, :] <= torch.arange(lo, hi, device=DEV)[:, None]
        o = torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask, scale=case.d**-0.5)
        out.append(o.transpose(0, 1).reshape(hi - lo, case.nq * case.d))
    return torch.cat(out)
