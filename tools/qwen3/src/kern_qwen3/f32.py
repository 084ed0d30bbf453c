"""The reference-precision manifest (`precision="f32"`, docs/qwen3.md "Reference precision (f32)"):
bf16 weights bound as in the bf16 manifest; activations, residual, logits and the paged KV state in
float32, through qwen3_f32.cu's plain kernels (no GEMV picks, fusion options or PDL)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kern_qwen3._finish import check_kernel_limits, check_needed, finish
from kern_qwen3.entries import DEVICE_FEED_ENTRIES
from kern_qwen3.errors import GenError
from kern_qwen3.fragments import (
    BF16_IN,
    STEP_CARRIES,
    TOKENS,
    Json,
    buf,
    call,
    f32,
    i32,
    i64,
    kernel,
)
from kern_qwen3.ops import argmax_op, feed_ops
from kern_qwen3.programs import advance_call, buffers, start_calls
from kern_qwen3.shape import PAGE_TOKENS, Qwen3Shape

__all__ = ["F32_ATTN_THREADS", "F32_ENTRIES", "F32_GEMM_TILE", "F32_GEMV_COLS", "generate_f32"]

F32_ENTRIES: tuple[str, ...] = (
    "kern_f32_embed",
    "kern_f32_rmsnorm",
    "kern_f32_add_rmsnorm",
    "kern_f32_qk_norm_rope_kv",
    "kern_f32_attn",
    "kern_f32_gemm",
    "kern_f32_gemv",
    "kern_f32_silu_mul",
    "kern_f32_argmax_partial",
    "kern_argmax_final",
    "kern_f32_rope_table",
)
"""Entries every f32 manifest needs (module qwen3_f32, and sampling.cu's dtype-free argmax final
stage); a device-fed one adds DEVICE_FEED_ENTRIES."""
F32_GEMM_TILE = 64
"""qwen3_f32.cu's F32_GEMM_BM / F32_GEMM_BN: kern_f32_gemm's grid is [ceil_div(n, 64), ceil_div(m, 64)]."""
F32_GEMV_COLS = 8
"""qwen3_f32.cu's F32_GEMV_WARPS: output columns per kern_f32_gemv block."""
F32_ATTN_THREADS = 256
"""qwen3_f32.cu's F32_ATT_WARPS * 32."""

F32_IN, F32_OUT, F32_IO = "in buffer<f32>", "out buffer<f32>", "inout buffer<f32>"


def _f32_kv_bytes_per_token(s: Qwen3Shape) -> int:
    return s.layers * 2 * s.kv_heads * s.head_dim * 4


def _f32_kv_arg(s: Qwen3Shape, layer: int) -> Json:
    """The `kv` state at `layer`'s k block of page 0 (byte offset, f32 elements)."""
    offset = layer * 2 * PAGE_TOKENS * s.kv_heads * s.head_dim * 4
    return {"state": "kv", "offset": offset} if offset else {"state": "kv"}


def _f32_row_op(mods: Mapping[str, str], entry: str, params: list[str], grid: Sequence[Any], block: int) -> Json:
    return {"params": params, "impl": {"launches": [kernel(mods, entry, grid, block)]}}


def _f32_ops(s: Qwen3Shape, mods: Mapping[str, str]) -> Json:
    d, nq, nkv = s.head_dim, s.heads, s.kv_heads
    i64_in, i32_in = "in buffer<i64>", "in buffer<i32>"
    return {
        "embed": _f32_row_op(mods, "kern_f32_embed", [i64_in, BF16_IN, F32_OUT, "i32"], ["tokens", 1, 1], 256),
        "rmsnorm": _f32_row_op(mods, "kern_f32_rmsnorm", [F32_IN, BF16_IN, F32_OUT, "i32", "f32"],
                               ["tokens", 1, 1], 256),
        "add_rmsnorm": _f32_row_op(mods, "kern_f32_add_rmsnorm", [F32_IO, F32_IN, BF16_IN, F32_OUT, "i32", "f32"],
                                   ["tokens", 1, 1], 256),
        "qk_norm_rope_kv": _f32_row_op(
            mods, "kern_f32_qk_norm_rope_kv",
            [F32_IO, BF16_IN, BF16_IN, i64_in, F32_IN, F32_IN, "inout state", i64_in, "i32", "i32", "i32", "f32",
             "i32", "i64"], ["tokens", nq + 2 * nkv, 1], d // 2),
        "attn": _f32_row_op(
            mods, "kern_f32_attn",
            [F32_IN, "in state", i32_in, i32_in, F32_OUT, "i32", "i32", "i32", "i32", "i32", "i64", "f32"],
            ["tokens", nq, 1], F32_ATTN_THREADS),
        "silu_mul": _f32_row_op(mods, "kern_f32_silu_mul", [F32_IN, F32_OUT, "i32"],
                                ["tokens", -(-s.inter // 1024), 1], 256),
        "argmax": argmax_op(s, mods, "kern_f32_argmax_partial", F32_IN),
        "rope_table": _f32_row_op(mods, "kern_f32_rope_table", [F32_OUT, F32_OUT, "i32", "i32", "f32"],
                                  [s.max_pos, 1, 1], min(d // 2, 1024)),
    }


def _f32_linear_op(mods: Mapping[str, str], entry: str, n: int, k: int) -> Json:
    """y = x W^T for `m` rows (the call's 4th arg): kern_f32_gemm's tiles or kern_f32_gemv's columns."""
    if entry == "kern_f32_gemm":
        grid: list[Any] = [-(-n // F32_GEMM_TILE), {"ceil_div": ["tokens", F32_GEMM_TILE]}, 1]
    else:
        grid = [-(-n // F32_GEMV_COLS), 1, 1]
    launch = kernel(mods, entry, grid, 256, params=[F32_IN, BF16_IN, F32_OUT, "i32", "i32", "i32"],
                     args=[{"param": 0}, {"param": 1}, {"param": 2}, {"param": 3}, i32(n), i32(k)])
    return {"params": [F32_IN, BF16_IN, F32_OUT, "i32"], "impl": {"launches": [launch]}}


def _f32_linear(label: str, x: str, w: str, y: str, n: int, k: int, decode: bool) -> Json:
    """A linear call; its op (`gemv_f32_<n>x<k>` in decode, `gemm_f32_<n>x<k>` in prefill) is
    built by `_f32_linear_ops`."""
    kind = "gemv" if decode else "gemm"
    return call(label, f"{kind}_f32_{n}x{k}", buf(x), buf(w), buf(y), TOKENS)


def _f32_linear_ops(mods: Mapping[str, str], programs: Json) -> Json:
    ops: Json = {}
    for c in (c for p in programs.values() for c in p["calls"]):
        kind, sep, shape_nk = c["op"].partition("_f32_")
        if sep and kind in ("gemm", "gemv"):
            n, k = (int(v) for v in shape_nk.split("x"))
            ops[c["op"]] = _f32_linear_op(mods, f"kern_f32_{kind}", n, k)
    return ops


def _f32_layer_calls(s: Qwen3Shape, i: int, io: Mapping[str, str], next_norm: str, *, decode: bool,
                     last: bool) -> list[Json]:
    d, nq, nkv, h = s.head_dim, s.heads, s.kv_heads, s.hidden
    kv = _f32_kv_arg(s, i)
    calls = [
        _f32_linear(f"l{i}.qkv", "x", f"l{i}.qkv", "qkv", s.qkv_rows, h, decode),
        call(f"l{i}.qk_norm_rope_kv", "qk_norm_rope_kv", buf("qkv"), buf(f"l{i}.q_norm"), buf(f"l{i}.k_norm"),
              buf(io["positions"]), buf("rope_cos"), buf("rope_sin"), kv, buf(io["slots"]), i32(nq),
              i32(nkv), i32(d), f32(s.eps), i32(PAGE_TOKENS), i64(s.page_stride)),
    ]
    if last and not decode:
        return calls  # NOTE: prefill writes only KV; the last layer's attention output is never read.
    return [
        *calls,
        call(f"l{i}.attn", "attn", buf("qkv"), kv, buf("block_table"), buf(io["seq_len"]), buf("attn"),
              TOKENS, i32(nq), i32(nkv), i32(d), i32(PAGE_TOKENS), i64(s.page_stride), f32(d**-0.5)),
        _f32_linear(f"l{i}.o", "attn", f"l{i}.o", "y", h, nq * d, decode),
        call(f"l{i}.post_norm", "add_rmsnorm", buf("h"), buf("y"), buf(f"l{i}.post_norm"), buf("x"),
              i32(h), f32(s.eps)),
        _f32_linear(f"l{i}.gate_up", "x", f"l{i}.gate_up", "gu", 2 * s.inter, h, decode),
        call(f"l{i}.silu_mul", "silu_mul", buf("gu"), buf("act"), i32(s.inter)),
        _f32_linear(f"l{i}.down", "act", f"l{i}.down", "y", h, s.inter, decode),
        call(f"l{i}.next_norm", "add_rmsnorm", buf("h"), buf("y"), buf(next_norm), buf("x"), i32(h),
              f32(s.eps)),
    ]


def _f32_forward(s: Qwen3Shape, io: Mapping[str, str], *, decode: bool) -> list[Json]:
    calls = [
        call("embed", "embed", buf(io["ids"]), buf("embed"), buf("h"), i32(s.hidden)),
        call("l0.in_norm", "rmsnorm", buf("h"), buf("l0.in_norm"), buf("x"), i32(s.hidden), f32(s.eps)),
    ]
    for i in range(s.layers):
        last = i == s.layers - 1
        calls += _f32_layer_calls(s, i, io, "final_norm" if last else f"l{i + 1}.in_norm", decode=decode, last=last)
    return calls


def _f32_programs(s: Qwen3Shape, feed: str) -> Json:
    host = {k: k for k in STEP_CARRIES}
    step_io = host if feed == "host" else {k: v[0] for k, v in STEP_CARRIES.items()}
    tail = [
        _f32_linear("lm_head", "x", "embed" if s.tied else "lm_head", "logits", s.vocab, s.hidden, True),
        call("argmax", "argmax", buf("logits"), buf("next_token")),
    ]
    if feed == "device":
        tail.append(advance_call())
    programs: Json = {
        "load": {"once": True, "calls": [call("rope_table", "rope_table", buf("rope_cos"), buf("rope_sin"),
                                               i32(s.max_pos), i32(s.head_dim // 2), f32(s.theta))]},
        "prefill": {"batch": {"groups": 1, "rows": "tokens"}, "calls": _f32_forward(s, host, decode=False)},
        "decode": {"batch": {"groups": 1, "rows": 1}, "graph": True,
                   "calls": _f32_forward(s, step_io, decode=True) + tail},
    }
    if feed == "device":
        programs["start"] = {"calls": start_calls()}
    return programs


def _f32_buffers(s: Qwen3Shape, feed: str) -> Json:
    out = buffers(s, feed)
    for name, b in out.items():
        if b["kind"] in ("workspace", "output", "carry") and b["dtype"] == "bf16":
            out[name] = {**b, "dtype": "f32"}
    return out


def generate_f32(shape: Qwen3Shape, modules: Mapping[str, str], entries: Mapping[str, str], *, model: str,
                 chunk: int, feed: str) -> Json:
    """The reference-precision manifest for one shape (`generate` with a `precision="f32"` plan).

    Raises:
        KernelsError: an entry is missing, its module has no hash, or the shape exceeds the kernels.
        GenError: the chunk exceeds the model.
    """
    needed = F32_ENTRIES + (DEVICE_FEED_ENTRIES if feed == "device" else ())
    check_needed(modules, entries, needed, missing_hint="precision f32 needs qwen3_f32.cu (docs/qwen3.md)",
                 unhashed_hint="build the kernels first")
    check_kernel_limits(shape)
    if chunk > shape.max_pos:
        raise GenError(f"chunk {chunk} must be in [1, {shape.max_pos}]")
    programs = _f32_programs(shape, feed)
    ops = _f32_ops(shape, entries) | (feed_ops(entries) if feed == "device" else {}) | _f32_linear_ops(entries, programs)
    manifest: Json = {"buffers": _f32_buffers(shape, feed), "ops": ops, "programs": programs}
    return finish(manifest, modules, model=model, chunk=chunk, kv_bytes_per_token=_f32_kv_bytes_per_token(shape),
                  layers=shape.layers)
