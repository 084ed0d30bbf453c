"""Cases and references shared by the kernel GPU tests of the product (tools/tests) and the lab
(tools/lab/tests): random bf16 tensors, the paged KV layout's block tables, the decode attention's
split plan, the rotary tables of transformers, and the folded-norm GEMV cases."""

from __future__ import annotations

import math

import torch
from helpers import kernel_harness as h

BF16 = torch.bfloat16
DEV = "cuda"
EPS = 1e-6


def randn(*shape: int, gen: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen, device=DEV) * scale).to(BF16)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16)


def rotary_embedding(maxpos: int, head_dim: int, theta: float) -> torch.nn.Module:
    """transformers' Qwen3RotaryEmbedding, built on CPU (inv_freq from torch's CPU f32 pow)."""
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

    cfg = Qwen3Config(head_dim=head_dim, max_position_embeddings=maxpos, hidden_size=head_dim * 4,
                      num_attention_heads=4, num_key_value_heads=2)
    params = getattr(cfg, "rope_parameters", None)
    if isinstance(params, dict):  # transformers 5: rope settings live in rope_parameters
        params["rope_type"] = "default"
        params["rope_theta"] = theta
    else:
        cfg.rope_theta = theta
    rotary = Qwen3RotaryEmbedding(cfg).to(DEV)
    expo = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    assert torch.allclose(rotary.inv_freq.cpu(), 1.0 / (theta**expo)), "config theta not applied"
    return rotary


def rope_tables(maxpos: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [maxpos, D/2] from transformers' Qwen3RotaryEmbedding (built on CPU, run on GPU)."""
    rotary = rotary_embedding(maxpos, head_dim, theta)
    x = torch.zeros(1, 1, dtype=BF16, device=DEV)
    cos, sin = rotary(x, torch.arange(maxpos, device=DEV)[None, :])
    return cos[0, :, : head_dim // 2].contiguous(), sin[0, :, : head_dim // 2].contiguous()


def qkv_case(gen: torch.Generator, rows: int, nq: int, nkv: int, d: int, maxpos: int):
    qkv = randn(rows, (nq + 2 * nkv) * d, gen=gen, scale=2.0)
    wq = randn(d, gen=gen)
    wk = randn(d, gen=gen)
    pos = torch.randint(0, maxpos, (rows,), generator=gen, device=DEV, dtype=torch.int64)
    return qkv, wq, wk, pos


PAGE = 16
LAYERS = 3
LAYER = 1


def block_table(pages: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randperm(pages, generator=gen, device=DEV).to(torch.int32)


# The lab's kern_attn_decode runs in clusters of 8 blocks along grid y (attention_cluster.cu), so its
# split counts are multiples of 8. Up to 8 * 4 pages (512 tokens) it takes the sequence in 8 splits
# and combines in the first cluster's shared memory when a kv head's rows fit (group * head_dim <=
# 2048); else it uses the `splits` plan and combines through part_o / counters.
DECODE_CLUSTER = 8
DECODE_CLUSTER_PAGES = 4
DECODE_CLUSTER_FLOATS = 2048


def used_splits(seq_len: int, splits: int) -> int:
    pages = math.ceil(seq_len / PAGE)
    pps = max(math.ceil(pages / splits), 1)
    return math.ceil(pages / pps)


def on_cluster_path(seq_len: int, group: int, d: int) -> bool:
    pages = math.ceil(seq_len / PAGE)
    return pages <= DECODE_CLUSTER * DECODE_CLUSTER_PAGES and group * d <= DECODE_CLUSTER_FLOATS


def norm_gemv_case(k: object, gen: torch.Generator, band: str, rows: int, n: int,
                    kk: int, grid: int | None = None) -> tuple[torch.Tensor, ...]:
    """res, y_add, w_norm, W ([2n, kk] for a SiLU band) and what kern_add_rmsnorm then `band` give:
    the new residual and the GEMV's output, the bits every folded-norm GEMV must give (`grid`: the
    GEMV's blocks, min(n, 792) by default, which any band entry takes)."""
    res = randn(rows, kk, gen=gen, scale=2.0)
    y_add = randn(rows, kk, gen=gen)
    w_norm = randn(kk, gen=gen)
    w = randn(2 * n if band.endswith("_silu") else n, kk, gen=gen, scale=0.05)
    res_a, x = res.clone(), torch.empty(rows, kk, dtype=BF16, device=DEV)
    k.launch("kern_add_rmsnorm", (rows,), (256,), h.ptr(res_a), h.ptr(y_add), h.ptr(w_norm), h.ptr(x), h.i32(kk),
             h.f32(EPS))
    want = torch.full((rows, n), float("nan"), dtype=BF16, device=DEV)
    k.launch(band, (min(n, 792) if grid is None else grid,), (128,), h.ptr(x), h.ptr(w), h.ptr(want), h.i32(rows), h.i32(n), h.i32(kk),
             h.i32(n))
    torch.cuda.synchronize()
    return res, y_add, w_norm, w, res_a, want


def run_folded(k: object, entry: str, case: tuple[torch.Tensor, ...], n: int, kk: int, grid: int,
                smem: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A folded-norm GEMV launch on `norm_gemv_case`'s inputs: (its y, its res_out), both NaN where it
    wrote nothing; res_in must come back untouched."""
    res, y_add, w_norm, w, _res_a, _want = case
    rows = res.shape[0]
    res_in = res.clone()
    res_out = torch.full_like(res, float("nan"))
    got = torch.full((rows, n), float("nan"), dtype=BF16, device=DEV)
    k.launch(entry, (grid,), (128,), h.ptr(res_in), h.ptr(y_add), h.ptr(w_norm), h.ptr(res_out), h.ptr(w), h.ptr(got),
             h.i32(rows), h.i32(n), h.i32(kk), h.i32(n), h.f32(EPS), shared_mem=smem)
    torch.cuda.synchronize()
    assert torch.equal(bits(res_in), bits(res)), "res_in must stay as it was"
    return got, res_out


def assert_folded(k: object, entry: str, case: tuple[torch.Tensor, ...], n: int, kk: int, grid: int, smem: int,
                   what: str) -> None:
    """The launch gives `norm_gemv_case`'s bits: the GEMV's output and the new residual."""
    got, res_out = run_folded(k, entry, case, n, kk, grid, smem)
    assert torch.equal(bits(got), bits(case[5])), what
    assert torch.equal(bits(res_out), bits(case[4])), f"{what}: the new residual"


RING_GRIDS = ((264, 12), (1, 1), (1, 3), (7, 2), (7, 32), (-1, 1), (-5, 4))
"""(grid, stages) of the ring GEMV tests: the generator's wave, one block whose ring wraps every
column or every 3, 7 blocks, all 32 mbarriers, a block per column (-1: n), more blocks than columns
(-5: n + 5)."""


RING_SMEM_MAX = 220 * 1024
"""Dynamic shared memory a ring test block takes at most (sm_90: 227 KiB less the static part)."""


def ring_launch(grid: int, stages: int, n: int, column: int, norm: int = 0) -> tuple[int, int]:
    """(grid, dynamic shared bytes) of a RING_GRIDS case: as many of its stages as fit."""
    stages = max(1, min(stages, (RING_SMEM_MAX - norm) // column))
    return (n - grid - 1 if grid < 0 else grid), norm + stages * column


def gate_up_ref(k: object, x: torch.Tensor, w: torch.Tensor, inter: int) -> torch.Tensor:
    """kern_gemv_bf16_s4 over [gate; up] then transformers' act(gate) * up: `_b4_silu`'s bits."""
    gu = torch.empty(x.shape[0], 2 * inter, device=DEV, dtype=BF16)
    k.launch("kern_gemv_bf16_s4", (2 * inter,), (128,), h.ptr(x), h.ptr(w), h.ptr(gu), h.i32(x.shape[0]),
             h.i32(2 * inter), h.i32(x.shape[1]), h.i32(2 * inter))
    return h.silu_mul_ref(gu).contiguous()
