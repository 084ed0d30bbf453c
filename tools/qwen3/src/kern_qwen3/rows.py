"""The batched decode step (`Plan.rows`): the program `decode_rows` over 1..R rows (the var `rows`),
one sequence per row, each with its own token, position, KV slot, sequence length and block-table
row; GEMMs at m = rows through cublasLt, decode attention through kern_attn_decode_rows, per-row
sampling (kern_sample_rows) and the per-row feed (kern_rows_advance), and the plain program
`seed_rows` that copies the staged inputs of the rows marked valid into the row carries.

The one-row programs keep their buffers: with rows, `seq_len`, `block_table` and `next_token`
hold R rows (the one-row programs use row 0) and the token, position and slot inputs hold
`tokens` >= R entries already."""

from __future__ import annotations

import json
from collections.abc import Mapping

from kern_qwen3.entries import SAMPLE_TOP_N
from kern_qwen3.fragments import BF16_IN, Json, buf, call, i32, kernel
from kern_qwen3.ops import ATTN_ROWS_PARAMS, attn_rows_launch, rows_scratch, zero_op
from kern_qwen3.shape import PAGE_TOKENS, Qwen3Shape

__all__ = ["ROWS_PROGRAM", "ROWS_VAR", "ROW_CARRIES", "SAMPLE_PARAMS", "SEED_PROGRAM", "add_rows", "row_buffers"]

ROWS_VAR = "rows"
"""The batched step's row count (1..R)."""
ROWS_PROGRAM = "decode_rows"
SEED_PROGRAM = "seed_rows"
SAMPLE_PARAMS = 4
"""Per-row sampling parameters (f32): temperature, top_p, top_k, logprobs (sampling.cu)."""
ROW_CARRIES: dict[str, tuple[str, str]] = {
    "ids": ("row_ids", "i64"),
    "positions": ("row_pos", "i64"),
    "slots": ("row_slot", "i64"),
    "seq_len": ("row_len", "i32"),
}
"""Step input -> the carry the batched step reads instead (seeded by `seed_rows`, moved on by
kern_rows_advance)."""

_ROW_OPS = ("embed", "rmsnorm", "add_rmsnorm", "qk_norm_rope", "kv_write", "qk_norm_rope_kv", "silu_mul")
"""Ops whose grids run over the `tokens` var: the batched step runs `<op>.rows` copies over `rows`."""


def row_buffers(s: Qwen3Shape, rows: int) -> Json:
    """The buffers the batched step adds or widens (merged over `programs.buffers`' result)."""
    return {
        "seq_len": {"dtype": "i32", "shape": [rows], "kind": "input", "fill": "seq_len",
                    "domain": {"min": 1, "max": s.max_pos}},
        "block_table": {"dtype": "i32", "shape": [rows, s.max_pages], "kind": "input", "fill": "blocks",
                        "domain": {"index_into": "kv", "stride": PAGE_TOKENS}},
        "next_token": {"dtype": "i64", "shape": [rows], "kind": "output", "fill": "tokens"},
        "row_valid": {"dtype": "i32", "shape": [rows], "kind": "input", "fill": "valid",
                      "domain": {"min": 0, "max": 1}},
        "row_sampling": {"dtype": "f32", "shape": [rows, SAMPLE_PARAMS], "kind": "input", "fill": "sampling"},
        "row_seed": {"dtype": "i64", "shape": [rows], "kind": "input", "fill": "seed"},
        "row_logprobs": {"dtype": "f32", "shape": [rows, 1 + SAMPLE_TOP_N], "kind": "output", "fill": "logprobs"},
        "row_top": {"dtype": "i64", "shape": [rows, SAMPLE_TOP_N], "kind": "output", "fill": "top_tokens"},
        "row_logits": {"dtype": "bf16", "shape": [ROWS_VAR, s.vocab], "kind": "workspace"},
        **{carry: {"dtype": dtype, "shape": [rows], "kind": "carry"} for carry, dtype in ROW_CARRIES.values()},
        "row_count": {"dtype": "i32", "shape": [rows, s.kv_heads], "kind": "carry"},
    }


def _over_rows(op: Json) -> Json:
    spec: Json = json.loads(json.dumps(op).replace('"tokens"', f'"{ROWS_VAR}"'))
    return spec


def row_ops(s: Qwen3Shape, ops: Mapping[str, Json], mods: Mapping[str, str], rows: int) -> Json:
    """`<op>.rows` copies of the token-grid ops, and the batched step's own ops."""
    d, nq = s.head_dim, s.heads
    out: Json = {f"{name}.rows": _over_rows(ops[name]) for name in _ROW_OPS if name in ops}
    out["attn_decode_rows"] = {
        "params": list(ATTN_ROWS_PARAMS),
        "impl": {"scratch": rows_scratch(nq, nq * d, rows), "launches": [attn_rows_launch(s, mods, ROWS_VAR)]},
    }
    out["sample_rows"] = {
        "params": [BF16_IN, "in buffer<f32>", "in buffer<i64>", "in buffer<i64>", "out buffer<i64>",
                   "out buffer<f32>", "out buffer<i64>", "i32", "i32"],
        "impl": {"launches": [kernel(mods, "kern_sample_rows", [ROWS_VAR, 1, 1], 1024)]},
    }
    out["rows_advance"] = {
        "params": ["in buffer<i64>", "inout buffer<i64>", "inout buffer<i64>", "inout buffer<i64>",
                   "inout buffer<i32>", "in buffer<i32>", "i32", "i32", "i32"],
        "impl": {"launches": [kernel(mods, "kern_rows_advance", [1, 1, 1], 256)]},
    }
    if "zero_i32" not in ops:
        out["zero_i32"] = zero_op(mods)
    out["rows_seed"] = {
        "params": ["in buffer<i64>", "in buffer<i64>", "in buffer<i64>", "in buffer<i32>", "in buffer<i32>",
                   "out buffer<i64>", "out buffer<i64>", "out buffer<i64>", "out buffer<i32>", "i32"],
        "impl": {"launches": [kernel(mods, "kern_rows_seed", [1, 1, 1], 256)]},
    }
    return out


def _row_call(c: Json, attn: Json) -> Json:
    """A one-row step call as the batched step's: `<op>.rows`, m = rows, the rows attention."""
    if c["op"] in ("attn_decode", "attn_decode_fused"):
        return attn | {"label": c["label"], "args": [*c["args"][:2], attn["args"][2], attn["args"][3], buf("attn"),
                                                    buf("row_count")]}
    op = f"{c['op']}.rows" if c["op"] in _ROW_OPS else c["op"]
    args = [{"var": ROWS_VAR} if a == {"var": "tokens"} else a for a in c["args"]]
    return {"label": c["label"], "op": op, "args": args}


def rows_calls(s: Qwen3Shape, forward: list[Json]) -> list[Json]:
    """The batched step: the one-row forward (`forward`, over the row carries, cublasLt GEMMs) per
    row, then lm_head at m = rows, kern_sample_rows and kern_rows_advance."""
    c = {k: v[0] for k, v in ROW_CARRIES.items()}
    attn = call("", "attn_decode_rows", buf("qkv"), {"state": "kv"}, buf("block_table"), buf(c["seq_len"]))
    head = "embed" if s.tied else "lm_head"
    return [
        *(_row_call(x, attn) for x in forward),
        call("lm_head", "gemm", buf("x"), buf(head), buf("row_logits"), {"var": ROWS_VAR}, i32(s.vocab),
             i32(s.hidden)),
        call("sample", "sample_rows", buf("row_logits"), buf("row_sampling"), buf("row_seed"),
             buf(c["positions"]), buf("next_token"), buf("row_logprobs"), buf("row_top"), i32(s.vocab),
             i32(SAMPLE_TOP_N)),
        call("advance", "rows_advance", buf("next_token"), buf(c["ids"]), buf(c["positions"]), buf(c["slots"]),
             buf(c["seq_len"]), buf("block_table"), i32(s.max_pages), i32(PAGE_TOKENS), {"var": ROWS_VAR}),
    ]


def seed_calls(rows: int) -> list[Json]:
    """`seed_rows`: the staged inputs of the rows with row_valid set into the row carries."""
    c = {k: v[0] for k, v in ROW_CARRIES.items()}
    return [call("seed", "rows_seed", buf("ids"), buf("positions"), buf("slots"), buf("seq_len"), buf("row_valid"),
                 buf(c["ids"]), buf(c["positions"]), buf(c["slots"]), buf(c["seq_len"]), i32(rows))]


def add_rows(manifest: Json, s: Qwen3Shape, mods: Mapping[str, str], rows: int, forward: list[Json]) -> None:
    """Adds the batched step to a device-fed manifest (in place): its buffers, ops, the programs
    `decode_rows` (graph) and `seed_rows`, and the zeroing of its attention counters at load.
    `forward` is the one-row forward over the row carries with cublasLt GEMMs."""
    manifest["buffers"] |= row_buffers(s, rows)
    manifest["ops"] |= row_ops(s, manifest["ops"], mods, rows)
    progs = manifest["programs"]
    progs["load"]["calls"].append(call("row_count", "zero_i32", buf("row_count"), i32(rows * s.kv_heads)))
    progs[ROWS_PROGRAM] = {"batch": {"groups": rows, "rows": 1}, "graph": True, "calls": rows_calls(s, forward)}
    progs[SEED_PROGRAM] = {"calls": seed_calls(rows)}
