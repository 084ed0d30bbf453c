"""The buffers and programs of a bf16 manifest: `load` (once: rope tables), `prefill` (chunk rows,
writes only KV), `decode` (graph, one row: logits + two-stage argmax into `next_token`) and, when
device-fed, `start` (seeds the step's carry buffers from the staged inputs)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from types import MappingProxyType

from kern_qwen3.fragments import STEP_CARRIES, TOKENS, Json, buf, call, f32, i32, i64
from kern_qwen3.shape import PAGE_TOKENS, Qwen3Shape

__all__ = ["Picks", "advance_call", "buffers", "forward_calls", "gemv_op_name", "programs", "start_calls", "weights"]

Picks = Mapping[str, str]
"""Decode GEMM name (of GEMV_GEMMS) -> the GEMV entry it runs as; absent: cublasLt."""


def _weight(shape: Sequence[int], *tensors: str) -> Json:
    return {"dtype": "bf16", "shape": list(shape), "kind": "weight",
            "bind": [{"tensor": t} for t in tensors]}


def _layer_prefix(i: int) -> str:
    return f"model.layers.{i}"


def weights(s: Qwen3Shape) -> Json:
    """The weight buffers, bound to the Hugging Face tensor names."""
    h, d = s.hidden, s.head_dim
    out: Json = {"embed": _weight([s.vocab, h], "model.embed_tokens.weight")}
    for i in range(s.layers):
        p = _layer_prefix(i)
        out[f"l{i}.in_norm"] = _weight([h], f"{p}.input_layernorm.weight")
        out[f"l{i}.qkv"] = _weight([s.qkv_rows, h], *(f"{p}.self_attn.{x}_proj.weight" for x in "qkv"))
        out[f"l{i}.q_norm"] = _weight([d], f"{p}.self_attn.q_norm.weight")
        out[f"l{i}.k_norm"] = _weight([d], f"{p}.self_attn.k_norm.weight")
        out[f"l{i}.o"] = _weight([h, s.heads * d], f"{p}.self_attn.o_proj.weight")
        out[f"l{i}.post_norm"] = _weight([h], f"{p}.post_attention_layernorm.weight")
        out[f"l{i}.gate_up"] = _weight([2 * s.inter, h], f"{p}.mlp.gate_proj.weight", f"{p}.mlp.up_proj.weight")
        out[f"l{i}.down"] = _weight([h, s.inter], f"{p}.mlp.down_proj.weight")
    out["final_norm"] = _weight([h], "model.norm.weight")
    if not s.tied:
        out["lm_head"] = _weight([s.vocab, h], "lm_head.weight")
    return out


def buffers(s: Qwen3Shape, feed: str, fuse: bool = False, fold: bool = False) -> Json:
    """Every buffer (`fold`: the second residual `h2` the folded norms alternate with)."""
    bf16 = "bf16"
    work = {
        "h": [s.hidden], "x": [s.hidden], "y": [s.hidden], "qkv": [s.qkv_rows],
        "attn": [s.heads * s.head_dim], "gu": [2 * s.inter], "act": [s.inter],
        **({"h2": [s.hidden]} if fold else {}),
    }
    out: Json = {
        "ids": {"dtype": "i64", "shape": ["tokens"], "kind": "input", "fill": "token",
                "domain": {"min": 0, "max": s.vocab - 1}},
        "positions": {"dtype": "i64", "shape": ["tokens"], "kind": "input", "fill": "position",
                      "domain": {"min": 0, "max": s.max_pos - 1}},
        "slots": {"dtype": "i64", "shape": ["tokens"], "kind": "input", "fill": "slot",
                  "domain": {"index_into": "kv"}},
        "seq_len": {"dtype": "i32", "shape": [1], "kind": "input", "fill": "seq_len",
                    "domain": {"min": 1, "max": s.max_pos}},
        "block_table": {"dtype": "i32", "shape": [s.max_pages], "kind": "input", "fill": "blocks",
                        "domain": {"index_into": "kv", "stride": PAGE_TOKENS}},
        "rope_cos": {"dtype": bf16, "shape": [s.max_pos, s.head_dim // 2], "kind": "carry"},
        "rope_sin": {"dtype": bf16, "shape": [s.max_pos, s.head_dim // 2], "kind": "carry"},
        "logits": {"dtype": bf16, "shape": [1, s.vocab], "kind": "output"},
        "next_token": {"dtype": "i64", "shape": [1], "kind": "output", "fill": "tokens"},
    }
    for name, dims in work.items():
        out[name] = {"dtype": bf16, "shape": ["tokens", *dims], "kind": "workspace"}
    if feed == "device":
        for carry, dtype in STEP_CARRIES.values():
            out[carry] = {"dtype": dtype, "shape": [1], "kind": "carry"}
    if fuse:
        out["attn_count"] = {"dtype": "i32", "shape": [s.kv_heads], "kind": "carry"}
    out.update(weights(s))
    return out


def _gemm_call(label: str, x: str, w: str, y: str, n: int, k: int, gemv: str | None) -> Json:
    """y = x W^T: cublasLt (any rows) or, for the one-row decode step, our GEMV op of that shape
    (`gemv` is the GEMV entry)."""
    if gemv is not None:
        return call(label, gemv_op_name(gemv, n, k), buf(x), buf(w), buf(y))
    return call(label, "gemm", buf(x), buf(w), buf(y), TOKENS, i32(n), i32(k))


def gemv_op_name(entry: str, n: int, k: int) -> str:
    """The op name of a GEMV entry at one shape: gemv<suffix>_<n>x<k>; the silu entry's n is its output width (W has 2n rows)."""
    return f"gemv{entry.removeprefix('kern_gemv_bf16')}_{n}x{k}"


def _gemv_of(name: str, gemv: Picks) -> str | None:
    return gemv.get(name)


def _attention_calls(s: Qwen3Shape, i: int, io: Mapping[str, str], *, decode: bool,
                     gemv: Picks = MappingProxyType({}), fuse: bool = False) -> list[Json]:
    d, nq, nkv = s.head_dim, s.heads, s.kv_heads
    kv = {"state": "kv", "offset": s.kv_offset(i)} if i else {"state": "kv"}
    calls = [_gemm_call(f"l{i}.qkv", "x", f"l{i}.qkv", "qkv", s.qkv_rows, s.hidden, _gemv_of("qkv", gemv))]
    if fuse:
        # NOTE: prefill's many rows take the warp-per-head form; decode's one row the block per head.
        op = "qk_norm_rope_kv" if decode else "qk_norm_rope_kv_rows"
        calls.append(call(f"l{i}.qk_norm_rope_kv", op, buf("qkv"), buf(f"l{i}.q_norm"),
                           buf(f"l{i}.k_norm"), buf(io["positions"]), buf("rope_cos"), buf("rope_sin"),
                           kv, buf(io["slots"]), i32(nq), i32(nkv), i32(d), f32(s.eps),
                           i32(PAGE_TOKENS), i64(s.page_stride)))
    else:
        calls += [
            call(f"l{i}.qk_norm_rope", "qk_norm_rope", buf("qkv"), buf(f"l{i}.q_norm"),
                  buf(f"l{i}.k_norm"), buf(io["positions"]), buf("rope_cos"), buf("rope_sin"),
                  i32(nq), i32(nkv), i32(d), f32(s.eps)),
            call(f"l{i}.kv_write", "kv_write", buf("qkv"), kv, buf(io["slots"]), i32(nq), i32(nkv),
                  i32(d), i32(PAGE_TOKENS), i64(s.page_stride)),
        ]
    if decode and fuse:
        calls.append(call(f"l{i}.attn", "attn_decode_fused", buf("qkv"), kv, buf("block_table"),
                           buf(io["seq_len"]), buf("attn"), buf("attn_count")))
    elif decode:
        calls.append(call(f"l{i}.attn", "attn_decode", buf("qkv"), kv, buf("block_table"),
                           buf(io["seq_len"]), buf("attn")))
    else:
        calls.append(call(f"l{i}.attn", "attn_prefill", buf("qkv"), kv, buf("block_table"),
                           buf(io["seq_len"]), buf("attn"), TOKENS, i32(nq), i32(nkv), i32(d),
                           i32(PAGE_TOKENS), i64(s.page_stride), f32(d**-0.5)))
    return calls


def _mlp_calls(s: Qwen3Shape, i: int, next_norm: str, gemv: Picks, silu_entries: Collection[str]) -> list[Json]:
    h = s.hidden
    if (silu := gemv.get("gate_up")) in silu_entries:
        # NOTE: the silu GEMV's n is its output width (act), its W the [2 * inter, h] gate_up.
        mlp = [_gemm_call(f"l{i}.gate_up", "x", f"l{i}.gate_up", "act", s.inter, h, silu)]
    else:
        mlp = [
            _gemm_call(f"l{i}.gate_up", "x", f"l{i}.gate_up", "gu", 2 * s.inter, h, _gemv_of("gate_up", gemv)),
            call(f"l{i}.silu_mul", "silu_mul", buf("gu"), buf("act"), i32(s.inter)),
        ]
    return [
        _gemm_call(f"l{i}.o", "attn", f"l{i}.o", "y", h, s.heads * s.head_dim, _gemv_of("o", gemv)),
        call(f"l{i}.post_norm", "add_rmsnorm", buf("h"), buf("y"), buf(f"l{i}.post_norm"),
              buf("x"), i32(h), f32(s.eps)),
        *mlp,
        _gemm_call(f"l{i}.down", "act", f"l{i}.down", "y", h, s.inter, _gemv_of("down", gemv)),
        call(f"l{i}.next_norm", "add_rmsnorm", buf("h"), buf("y"), buf(next_norm), buf("x"),
              i32(h), f32(s.eps)),
    ]


def forward_calls(s: Qwen3Shape, io: Mapping[str, str], *, decode: bool,
                  gemv: Picks = MappingProxyType({}), fuse: bool = False,
                  silu_entries: Collection[str] = ()) -> list[Json]:
    """embed through the last layer (prefill: up to the last layer's KV write) over the step
    inputs `io` names (ids, positions, slots, seq_len)."""
    calls = [
        call("embed", "embed", buf(io["ids"]), buf("embed"), buf("h"), i32(s.hidden)),
        call("l0.in_norm", "rmsnorm", buf("h"), buf("l0.in_norm"), buf("x"), i32(s.hidden),
              f32(s.eps)),
    ]
    for i in range(s.layers):
        last = i == s.layers - 1
        if last and not decode:
            # NOTE: prefill writes only KV; the last layer's attention output is never read.
            calls += _attention_calls(s, i, io, decode=False, fuse=fuse)[:-1]
            break
        calls += _attention_calls(s, i, io, decode=decode, gemv=gemv, fuse=fuse)
        calls += _mlp_calls(s, i, "final_norm" if last else f"l{i + 1}.in_norm", gemv, silu_entries)
    return calls


def _decode_tail(s: Qwen3Shape, feed: str, gemv: Picks) -> list[Json]:
    head = "embed" if s.tied else "lm_head"
    calls = [
        _gemm_call("lm_head", "x", head, "logits", s.vocab, s.hidden, _gemv_of("lm_head", gemv)),
        call("argmax", "argmax", buf("logits"), buf("next_token")),
    ]
    if feed == "device":
        calls.append(advance_call())
    return calls


def advance_call() -> Json:
    """kern_decode_advance over the step carries: the device-fed decode step's last call."""
    c = {k: v[0] for k, v in STEP_CARRIES.items()}
    return call("advance", "decode_advance", buf("next_token"), buf(c["ids"]), buf(c["positions"]),
                buf(c["slots"]), buf(c["seq_len"]), buf("block_table"), i32(PAGE_TOKENS))


def start_calls() -> list[Json]:
    """Seed the step carries from the host inputs (row 0): run once per sequence after staging
    the last prompt token."""
    return [
        call(f"start.{name}", f"copy_{dtype}", buf(name), buf(carry), i32(1))
        for name, (carry, dtype) in STEP_CARRIES.items()
    ]


def programs(s: Qwen3Shape, feed: str, gemv: Picks, fuse: bool = False, silu_entries: Collection[str] = ()) -> Json:
    """The four programs (`start` only when device-fed); `gemv` picks the decode GEMMs' entries,
    `silu_entries` the picks that apply SiLU-and-mul themselves."""
    half = s.head_dim // 2
    host = {k: k for k in STEP_CARRIES}
    step_io = host if feed == "host" else {k: v[0] for k, v in STEP_CARRIES.items()}
    load = [call("rope_table", "rope_table", buf("rope_cos"), buf("rope_sin"), i32(s.max_pos),
                  i32(half), f32(s.theta))]
    if fuse:
        load.append(call("attn_count", "zero_i32", buf("attn_count"), i32(s.kv_heads)))
    programs: Json = {
        "load": {"once": True, "calls": load},
        "prefill": {"batch": {"groups": 1, "rows": "tokens"},
                    "calls": forward_calls(s, host, decode=False, fuse=fuse)},
        "decode": {"batch": {"groups": 1, "rows": 1}, "graph": True,
                   "calls": forward_calls(s, step_io, decode=True, gemv=gemv, fuse=fuse, silu_entries=silu_entries)
                   + _decode_tail(s, feed, gemv)},
    }
    if feed == "device":
        programs["start"] = {"calls": start_calls()}
    return programs


