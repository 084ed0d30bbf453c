"""The ops of a bf16 manifest: one per kernel, interface = the kernel's ABI (docs/qwen3.md), except
the two-launch attention and argmax ops, whose partials live in impl scratch."""

from __future__ import annotations

from collections.abc import Mapping

from kern_qwen3.entries import (
    ARGMAX_PARTS,
    DECODE_ROWS_WARPS,
    DECODE_SPLITS,
    PREFILL_BM,
    PREFILL_PART_ROWS,
    PREFILL_SPLIT_ROWS,
    PREFILL_SPLITS,
    PREFILL_THREADS,
    QK_ROWS_HEADS,
    decode_rows_smem,
    prefill_smem,
)
from kern_qwen3.fragments import BF16_IN, BF16_IO, BF16_OUT, Json, f32, i32, i64, kernel
from kern_qwen3.shape import PAGE_TOKENS, Qwen3Shape

__all__ = ["ATTN_ROWS_PARAMS", "PREFILL_PARAMS", "argmax_op", "attn_rows_launch", "base_ops", "feed_ops", "prefill_op",
           "rows_scratch", "split_scratch", "zero_op"]


def base_ops(s: Qwen3Shape, mods: Mapping[str, str]) -> Json:
    d, nq, nkv = s.head_dim, s.heads, s.kv_heads
    heads_out = nq * d
    ops: Json = {
        "embed": {
            "params": ["in buffer<i64>", BF16_IN, BF16_OUT, "i32"],
            "impl": {"launches": [kernel(mods, "kern_embed", ["tokens", 1, 1], 256)]},
        },
        "rmsnorm": {
            "params": [BF16_IN, BF16_IN, BF16_OUT, "i32", "f32"],
            "impl": {"launches": [kernel(mods, "kern_rmsnorm", ["tokens", 1, 1], 256)]},
        },
        "add_rmsnorm": {
            "params": [BF16_IO, BF16_IN, BF16_IN, BF16_OUT, "i32", "f32"],
            "impl": {"launches": [kernel(mods, "kern_add_rmsnorm", ["tokens", 1, 1], 256)]},
        },
        "qk_norm_rope": {
            "params": [BF16_IO, BF16_IN, BF16_IN, "in buffer<i64>", BF16_IN, BF16_IN,
                       "i32", "i32", "i32", "f32"],
            "impl": {"launches": [kernel(mods, "kern_qk_norm_rope", ["tokens", nq + nkv, 1], d // 2)]},
        },
        "kv_write": {
            "params": [BF16_IN, "inout state", "in buffer<i64>", "i32", "i32", "i32", "i32", "i64"],
            "impl": {"launches": [kernel(mods, "kern_kv_write", ["tokens", nkv, 1], 32)]},
        },
        "attn_prefill": prefill_op(s, mods),
        "silu_mul": {
            "params": [BF16_IN, BF16_OUT, "i32"],
            "impl": {"launches": [kernel(
                mods, "kern_silu_mul", ["tokens", -(-s.inter // 1024), 1], 128)]},
        },
        "gemm": {
            "params": [BF16_IN, BF16_IN, BF16_OUT, "i32", "i32", "i32"],
            "impl": {"launches": [{"entry": "extern:cublaslt_bf16_tn"}]},
        },
        "attn_decode": _attn_decode_op(s, mods, heads_out),
        **(_fused_ops(s, mods, heads_out) if "kern_attn_decode_one" in mods else {}),
        "argmax": argmax_op(s, mods),
        "rope_table": {
            "params": [BF16_OUT, BF16_OUT, "i32", "i32", "f32"],
            "impl": {"launches": [kernel(mods, "kern_rope_table", [s.max_pos, 1, 1], min(d // 2, 1024))]},
        },
    }
    return ops


PREFILL_PARAMS = [BF16_IN, "in state", "in buffer<i32>", "in buffer<i32>", BF16_OUT,
                  "i32", "i32", "i32", "i32", "i32", "i64", "f32"]
"""attn_prefill's interface: qkv, kv, block_table, seq_len, out, rows, nq, nkv, head_dim,
page_tokens, page_stride, scale."""


def prefill_op(s: Qwen3Shape, mods: Mapping[str, str]) -> Json:
    """Causal prefill attention (prefill.cu): kern_prefill_attn over the kv heads, its key splits
    (chosen on the device) in grid z, then kern_prefill_combine, which merges the partials when the
    split ran (and returns at once when it did not). A chunk of PREFILL_SPLIT_ROWS rows or more
    never splits (grid z is 1), so the combine launches only below that (`when`)."""
    d, nq, nkv = s.head_dim, s.heads, s.kv_heads
    group = nq // nkv
    grid = [{"ceil_div": [{"mul": ["tokens", group]}, PREFILL_BM]}, nkv,
            {"min": [PREFILL_SPLITS, {"ceil_div": [PREFILL_SPLIT_ROWS, "tokens"]}]}]
    attn = kernel(
        mods, "kern_prefill_attn", grid, PREFILL_THREADS, shared_mem=prefill_smem(d),
        params=[*PREFILL_PARAMS[:5], "out buffer<f32>", "out buffer<f32>", *PREFILL_PARAMS[5:]],
        args=[*({"param": i} for i in range(5)), {"scratch": "part_o"}, {"scratch": "part_lse"},
              *({"param": i} for i in range(5, 12))],
    )
    combine = kernel(
        mods, "kern_prefill_combine", ["tokens", nq, 1], 128, when={"var": "tokens", "max": PREFILL_SPLIT_ROWS - 1},
        params=["in buffer<f32>", "in buffer<f32>", "in buffer<i32>", BF16_OUT, "i32", "i32", "i32", "i32"],
        args=[{"scratch": "part_o"}, {"scratch": "part_lse"}, {"param": 3}, {"param": 4}, {"param": 5},
              {"param": 6}, {"param": 7}, {"param": 8}],
    )
    scratch = {
        "part_o": {"dtype": "f32", "shape": [PREFILL_PART_ROWS, nq * d]},
        "part_lse": {"dtype": "f32", "shape": [PREFILL_PART_ROWS, nq]},
    }
    return {"params": PREFILL_PARAMS, "impl": {"scratch": scratch, "launches": [attn, combine]}}


def split_scratch(nq: int, heads_out: int) -> Json:
    """The split-KV decode attention's f32 partial outputs and log-sum-exps (impl-private)."""
    return {
        "part_o": {"dtype": "f32", "shape": [DECODE_SPLITS, heads_out]},
        "part_lse": {"dtype": "f32", "shape": [DECODE_SPLITS, nq]},
    }


ATTN_ROWS_PARAMS: list[str] = [BF16_IN, "in state", "in buffer<i32>", "in buffer<i32>", BF16_OUT, "inout buffer<i32>"]
"""The params of an op over kern_attn_decode_rows (`attn_rows_launch`): qkv rows, the layer's kv
state, the block table ([rows, table_stride]), seq_lens [rows], the attention output [rows, nq * d],
the counters ([rows, nkv], zero between launches)."""


def rows_scratch(nq: int, heads_out: int, rows: int = 1) -> Json:
    """kern_attn_decode_rows' f32 partial outputs and log-sum-exps for `rows` rows (impl-private)."""
    return {
        "part_o": {"dtype": "f32", "shape": [rows * DECODE_SPLITS, heads_out]},
        "part_lse": {"dtype": "f32", "shape": [rows * DECODE_SPLITS, nq]},
    }


def attn_rows_launch(s: Qwen3Shape, mods: Mapping[str, str], rows: int | str = 1,
                     entry: str = "kern_attn_decode_rows") -> Json:
    """`entry` (kern_attn_decode_rows, or the one-row step's kern_attn_decode_one: the same
    arguments) over `rows` rows (a count or a var), for an op with ATTN_ROWS_PARAMS and
    `rows_scratch`: grid [nkv, DECODE_SPLITS, rows], each row's splits decided on the device from its
    seq_len, the block-table rows `s.max_pages` apart."""
    d, nq, nkv = s.head_dim, s.heads, s.kv_heads
    return kernel(
        mods, entry, [nkv, DECODE_SPLITS, rows], 32 * DECODE_ROWS_WARPS,
        shared_mem=decode_rows_smem(d),
        params=[BF16_IN, "in state", "in buffer<i32>", "in buffer<i32>", "out buffer<f32>",
                "out buffer<f32>", "inout buffer<i32>", BF16_OUT, "i32", "i32", "i32", "i32", "i64",
                "i32", "i32", "f32"],
        args=[{"param": 0}, {"param": 1}, {"param": 2}, {"param": 3}, {"scratch": "part_o"},
              {"scratch": "part_lse"}, {"param": 5}, {"param": 4}, i32(nq), i32(nkv), i32(d),
              i32(PAGE_TOKENS), i64(s.page_stride), i32(s.max_pages), i32(DECODE_SPLITS), f32(d**-0.5)],
    )


def _fused_ops(s: Qwen3Shape, mods: Mapping[str, str], heads_out: int) -> Json:
    d, nq, nkv = s.head_dim, s.heads, s.kv_heads
    fused = attn_rows_launch(s, mods, entry="kern_attn_decode_one")
    norm_rope_params = [BF16_IO, BF16_IN, BF16_IN, "in buffer<i64>", BF16_IN, BF16_IN, "inout state",
                        "in buffer<i64>", "i32", "i32", "i32", "f32", "i32", "i64"]
    heads_grid = -(-(nq + 2 * nkv) // QK_ROWS_HEADS)
    return {
        "qk_norm_rope_kv": {
            "params": norm_rope_params,
            "impl": {"launches": [kernel(mods, "kern_qk_norm_rope_kv", ["tokens", nq + 2 * nkv, 1], d // 2)]},
        },
        "qk_norm_rope_kv_rows": {
            "params": norm_rope_params,
            "impl": {"launches": [kernel(mods, "kern_qk_norm_rope_kv_rows", ["tokens", heads_grid, 1],
                                         32 * QK_ROWS_HEADS)]},
        },
        "attn_decode_fused": {
            "params": list(ATTN_ROWS_PARAMS),
            "impl": {
                "scratch": rows_scratch(nq, heads_out),
                "launches": [fused],
            },
        },
        "zero_i32": zero_op(mods),
    }


def zero_op(mods: Mapping[str, str]) -> Json:
    """zero_i32(buf, n): the load program's reset of the block counters (attention, norm tails)."""
    return {"params": ["out buffer<i32>", "i32"], "impl": {"launches": [kernel(mods, "kern_zero_i32", [1, 1, 1], 32)]}}



def feed_ops(mods: Mapping[str, str]) -> Json:
    return {
        "decode_advance": {
            "params": ["in buffer<i64>", "inout buffer<i64>", "inout buffer<i64>", "inout buffer<i64>",
                       "inout buffer<i32>", "in buffer<i32>", "i32"],
            "impl": {"launches": [kernel(mods, "kern_decode_advance", [1, 1, 1], 32)]},
        },
        "copy_i64": {
            "params": ["in buffer<i64>", "out buffer<i64>", "i32"],
            "impl": {"launches": [kernel(mods, "kern_copy_i64", [1, 1, 1], 32)]},
        },
        "copy_i32": {
            "params": ["in buffer<i32>", "out buffer<i32>", "i32"],
            "impl": {"launches": [kernel(mods, "kern_copy_i32", [1, 1, 1], 32)]},
        },
    }


def _attn_decode_op(s: Qwen3Shape, mods: Mapping[str, str], heads_out: int) -> Json:
    d, nq, nkv = s.head_dim, s.heads, s.kv_heads
    partial = kernel(
        mods, "kern_attn_decode_partial", [nkv, DECODE_SPLITS, 1], 128,
        params=[BF16_IN, "in state", "in buffer<i32>", "in buffer<i32>", "out buffer<f32>",
                "out buffer<f32>", "i32", "i32", "i32", "i32", "i64", "i32", "f32"],
        args=[{"param": 0}, {"param": 1}, {"param": 2}, {"param": 3}, {"scratch": "part_o"},
              {"scratch": "part_lse"}, i32(nq), i32(nkv), i32(d), i32(PAGE_TOKENS),
              i64(s.page_stride), i32(DECODE_SPLITS), f32(d**-0.5)],
    )
    reduce = kernel(
        mods, "kern_attn_decode_reduce", [nq, 1, 1], 128,
        params=["in buffer<f32>", "in buffer<f32>", BF16_OUT, "i32", "i32", "i32"],
        args=[{"scratch": "part_o"}, {"scratch": "part_lse"}, {"param": 4}, i32(nq), i32(d),
              i32(DECODE_SPLITS)],
    )
    return {
        "params": [BF16_IN, "in state", "in buffer<i32>", "in buffer<i32>", BF16_OUT],
        "impl": {
            "scratch": split_scratch(nq, heads_out),
            "launches": [partial, reduce],
        },
    }


def argmax_op(s: Qwen3Shape, mods: Mapping[str, str], partial_entry: str = "kern_argmax_partial",
               logits: str = BF16_IN) -> Json:
    """Two stages: `partial_entry` over the `logits` (bf16, or f32 with kern_f32_argmax_partial), then
    sampling.cu's kern_argmax_final over the partials (ties to the lowest index)."""
    partial = kernel(
        mods, partial_entry, [ARGMAX_PARTS, 1, 1], 256,
        params=[logits, "out buffer<f32>", "out buffer<i32>", "i32"],
        args=[{"param": 0}, {"scratch": "pval"}, {"scratch": "pidx"}, i32(s.vocab)],
    )
    final = kernel(
        mods, "kern_argmax_final", [1, 1, 1], 256,
        params=["in buffer<f32>", "in buffer<i32>", "out buffer<i64>", "i32"],
        args=[{"scratch": "pval"}, {"scratch": "pidx"}, {"param": 1}, i32(ARGMAX_PARTS)],
    )
    return {
        "params": [logits, "out buffer<i64>"],
        "impl": {
            "scratch": {
                "pval": {"dtype": "f32", "shape": [ARGMAX_PARTS]},
                "pidx": {"dtype": "i32", "shape": [ARGMAX_PARTS]},
            },
            "launches": [partial, final],
        },
    }


