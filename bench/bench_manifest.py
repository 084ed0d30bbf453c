"""Manifest load speed: parse + verify a generated decoder manifest of >= 900 calls and >= 300
buffers (the size of a real Qwen3 prefill + decode manifest), best of several runs.

Rows: plain `json.loads` of the same text (the floor any parser pays), `parse_manifest` (JSON +
pydantic models), `check` (the verifier alone, target < 100 ms), the two together, and the digest.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from kern_manifest import check, digest, parse_manifest

LAYERS = 38
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, VOCAB = 2560, 32, 8, 128, 9728, 151936
PAGE = 16
REPEATS = 7
TARGET_VERIFY_MS = 100.0

Json = dict[str, Any]
_BF16_IN, _BF16_OUT, _BF16_IO = "in buffer<bf16>", "out buffer<bf16>", "inout buffer<bf16>"


def _kernel(entry: str, grid: list[Any], block: int = 256, **extra: Any) -> Json:
    return {"module": "core", "entry": entry, "block": [block, 1, 1], "grid": grid, **extra}


def _ops() -> Json:
    qkv = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    tma_pack = {"pack": {"size": 192, "fields": [
        {"at": 0, "tensormap": {"param": 0, "dtype": "bf16", "dims": [qkv, "tokens"],
                                "strides": [qkv * 2], "box": [64, 16], "swizzle": 128}},
        {"at": 128, "param": 1},
        {"at": 136, "var": "tokens"},
        {"at": 140, "f32": 1e-6},
    ]}}  # fmt: skip
    attn_partial = _kernel(
        "attn_partial", [KV_HEADS, 16, 1], 128, when={"var": "tokens", "max": 1},
        params=[_BF16_IN, "in state", "in buffer<i32>", "in buffer<i32>", "out buffer<f32>", "i32", "i64"],
        args=[{"param": 0}, {"param": 1}, {"param": 2}, {"param": 3}, {"scratch": "part"},
              {"i32": HEADS}, {"i64": LAYERS * 2 * PAGE * KV_HEADS * HEAD_DIM}],
    )  # fmt: skip
    attn_reduce = _kernel(
        "attn_reduce", [HEADS, 1, 1], 128, when={"var": "tokens", "max": 1},
        params=["in buffer<f32>", _BF16_OUT, "i32"],
        args=[{"scratch": "part"}, {"param": 4}, {"i32": 16}],
    )
    attn_prefill = _kernel(
        "attn_prefill", [{"ceil_div": ["tokens", 64]}, HEADS, 1], 128,
        when={"var": "tokens", "min": 2}, shared_mem={"mul": [{"min": ["tokens", 64]}, 1024]},
        params=[_BF16_IN, "in state", "in buffer<i32>", "in buffer<i32>", _BF16_OUT, "i32"],
        args=[{"param": 0}, {"param": 1}, {"param": 2}, {"param": 3}, {"param": 4}, {"var": "tokens"}],
    )  # fmt: skip
    return {
        "embed": {"params": ["in buffer<i64>", _BF16_IN, _BF16_OUT, "i32"],
                  "impl": {"launches": [_kernel("embed", ["tokens", 1, 1])]}},
        "rmsnorm": {"params": [_BF16_IN, _BF16_IN, _BF16_OUT, "i32", "f32"],
                    "impl": {"launches": [_kernel("rmsnorm", ["tokens", 1, 1], pdl=True)]}},
        "add": {"params": [_BF16_IO, _BF16_IN, "i32"],
                "impl": {"launches": [_kernel("add", ["tokens", {"ceil_div": [HIDDEN, 1024]}, 1])]}},
        "gemm": {"params": [_BF16_IN, _BF16_IN, _BF16_OUT, "i32", "i32", "i32"],
                 "impl": {"launches": [{"entry": "extern:cublaslt_bf16_tn"}]}},
        "rope": {"params": [_BF16_IO, "in buffer<i64>", _BF16_IN, _BF16_IN, _BF16_IN, "i32"],
                 "impl": {"launches": [_kernel(
                     "rope_tma", [{"mul": [{"ceil_div": ["tokens", 16]}, 2]}, 1, 1], 128,
                     cluster=[2, 1, 1],
                     params=["bytes<192>", "in buffer<i64>", _BF16_IN, _BF16_IN, _BF16_IN, "i32"],
                     args=[tma_pack, {"param": 1}, {"param": 2}, {"param": 3}, {"param": 4},
                           {"param": 5}])]}},
        "kv_write": {"params": [_BF16_IN, "inout state", "in buffer<i64>", "i32"],
                     "impl": {"launches": [_kernel("kv_write", ["tokens", KV_HEADS, 1], 128)]}},
        "attn": {"params": [_BF16_IN, "in state", "in buffer<i32>", "in buffer<i32>", _BF16_OUT],
                 "impl": {"scratch": {"part": {"dtype": "f32", "shape": [16, HEADS * HEAD_DIM]}},
                          "launches": [attn_partial, attn_reduce, attn_prefill]}},
        "silu": {"params": [_BF16_IN, _BF16_OUT, "i32"],
                 "impl": {"launches": [_kernel("silu", ["tokens", {"ceil_div": [INTER, 1024]}, 1])]}},
        "argmax": {"params": [_BF16_IN, "out buffer<i64>"],
                   "impl": {"launches": [_kernel("argmax", ["tokens", 1, 1], 1024)]}},
        "rope_table": {"params": [_BF16_OUT, "f32"],
                       "impl": {"launches": [_kernel("rope_table", [4096, 1, 1], 64)]}},
    }  # fmt: skip


def _buffers() -> Json:
    qkv = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    w = lambda *shape: {"dtype": "bf16", "shape": list(shape), "kind": "weight",  # noqa: E731
                        "bind": [{"tensor": f"t{shape}"}]}  # fmt: skip
    out: Json = {
        "ids": {"dtype": "i64", "shape": ["tokens"], "kind": "input", "fill": "token",
                "domain": {"index_into": "embed"}},
        "positions": {"dtype": "i64", "shape": ["tokens"], "kind": "input", "fill": "position",
                      "domain": {"min": 0, "max": 4095}},
        "slots": {"dtype": "i64", "shape": ["tokens"], "kind": "input", "fill": "slot",
                  "domain": {"index_into": "kv"}},
        "block_table": {"dtype": "i32", "shape": [256], "kind": "input", "fill": "blocks",
                        "domain": {"index_into": "kv", "stride": PAGE}},
        "seq_len": {"dtype": "i32", "shape": [1], "kind": "input", "fill": "seq_len"},
        "rope": {"dtype": "bf16", "shape": [4096, HEAD_DIM], "kind": "carry"},
        "logits": {"dtype": "bf16", "shape": [1, VOCAB], "kind": "workspace"},
        "next": {"dtype": "i64", "shape": [1], "kind": "output", "fill": "tokens"},
        "embed": w(VOCAB, HIDDEN),
        "final_norm": w(HIDDEN),
    }  # fmt: skip
    for name, width in (("h", HIDDEN), ("x", HIDDEN), ("y", HIDDEN), ("qkv", qkv),
                        ("attn", HEADS * HEAD_DIM), ("gu", 2 * INTER), ("act", INTER)):  # fmt: skip
        out[name] = {"dtype": "bf16", "shape": ["tokens", width], "kind": "workspace"}
    for i in range(LAYERS):
        for name, shape in (("in_norm", (HIDDEN,)), ("qkv", (qkv, HIDDEN)), ("q_norm", (HEAD_DIM,)),
                            ("k_norm", (HEAD_DIM,)), ("o", (HIDDEN, HEADS * HEAD_DIM)),
                            ("post_norm", (HIDDEN,)), ("gate_up", (2 * INTER, HIDDEN)),
                            ("down", (HIDDEN, INTER))):  # fmt: skip
            out[f"l{i}.{name}"] = w(*shape)
    return out


def _layer(i: int) -> list[Json]:
    qkv = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    t = {"var": "tokens"}
    kv = {"state": "kv", "offset": i * 2 * PAGE * KV_HEADS * HEAD_DIM * 2}

    def c(label: str, op: str, *args: Json) -> Json:
        return {"label": f"l{i}.{label}", "op": op, "args": list(args)}

    def b(name: str) -> Json:
        return {"buf": name}

    return [
        c("in_norm", "rmsnorm", b("h"), b(f"l{i}.in_norm"), b("x"), {"i32": HIDDEN}, {"f32": 1e-6}),
        c("qkv", "gemm", b("x"), b(f"l{i}.qkv"), b("qkv"), t, {"i32": qkv}, {"i32": HIDDEN}),
        c("rope", "rope", b("qkv"), b("positions"), b("rope"), b(f"l{i}.q_norm"), b(f"l{i}.k_norm"),
          {"i32": HEADS}),
        c("kv_write", "kv_write", b("qkv"), kv, b("slots"), {"i32": KV_HEADS}),
        c("attn", "attn", b("qkv"), {**kv}, b("block_table"), b("seq_len"), b("attn")),
        c("o", "gemm", b("attn"), b(f"l{i}.o"), b("y"), t, {"i32": HIDDEN}, {"i32": HEADS * HEAD_DIM}),
        c("add_attn", "add", b("h"), b("y"), {"i32": HIDDEN}),
        c("post_norm", "rmsnorm", b("h"), b(f"l{i}.post_norm"), b("x"), {"i32": HIDDEN}, {"f32": 1e-6}),
        c("gate_up", "gemm", b("x"), b(f"l{i}.gate_up"), b("gu"), t, {"i32": 2 * INTER}, {"i32": HIDDEN}),
        c("silu", "silu", b("gu"), b("act"), {"i32": INTER}),
        c("down", "gemm", b("act"), b(f"l{i}.down"), b("y"), t, {"i32": HIDDEN}, {"i32": INTER}),
        c("add_mlp", "add", b("h"), b("y"), {"i32": HIDDEN}),
    ]


def generate(layers: int = LAYERS) -> Json:
    """A Qwen3-4B-shaped manifest: load (once), prefill and decode (graph) programs."""
    head = [{"label": "embed", "op": "embed",
             "args": [{"buf": "ids"}, {"buf": "embed"}, {"buf": "h"}, {"i32": HIDDEN}]}]  # fmt: skip
    body = [call for i in range(layers) for call in _layer(i)]
    tail = [
        {"label": "final_norm", "op": "rmsnorm",
         "args": [{"buf": "h"}, {"buf": "final_norm"}, {"buf": "x"}, {"i32": HIDDEN}, {"f32": 1e-6}]},
        {"label": "lm_head", "op": "gemm",
         "args": [{"buf": "x"}, {"buf": "embed"}, {"buf": "logits"}, {"i32": 1}, {"i32": VOCAB},
                  {"i32": HIDDEN}]},
        {"label": "argmax", "op": "argmax", "args": [{"buf": "logits"}, {"buf": "next"}]},
    ]  # fmt: skip
    return {
        "schema_version": 5,
        "model": "bench-qwen3-4b",
        "vars": {"tokens": {"max": 2048}},
        "states": {"kv": {"bytes_per_token": layers * 2 * KV_HEADS * HEAD_DIM * 2}},
        "buffers": _buffers(),
        "modules": {"core": {"source": "core.cubin", "sha256": "ab" * 32}},
        "ops": _ops(),
        "programs": {
            "load": {"once": True, "calls": [
                {"op": "rope_table", "args": [{"buf": "rope"}, {"f32": 1e6}]}]},
            "prefill": {"batch": {"groups": 1, "rows": "tokens"}, "calls": head + body},
            "decode": {"batch": {"groups": 1, "rows": 1}, "graph": True, "calls": head + body + tail},
        },
    }  # fmt: skip


def _best_ms(fn: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return round(best * 1e3, 2)


def run() -> list[dict[str, object]]:
    """Times json.loads, parse, verify, parse + verify and digest (best of 7 each)."""
    doc = generate()
    text = json.dumps(doc, indent=1)
    manifest = parse_manifest(text)
    problems = check(manifest)
    if problems:
        raise RuntimeError(f"the generated manifest does not verify: {problems[0].line()}")
    calls = sum(len(p.calls) for p in manifest.programs.values())
    loads_ms = _best_ms(lambda: json.loads(text))
    parse_ms = _best_ms(lambda: parse_manifest(text))
    verify_ms = _best_ms(lambda: check(manifest))
    both_ms = _best_ms(lambda: check(parse_manifest(text)))
    digest_ms = _best_ms(lambda: digest(manifest))
    return [
        {"name": "calls", "value": calls, "unit": "calls", "target": ">= 900"},
        {"name": "buffers", "value": len(manifest.buffers), "unit": "buffers", "target": ">= 300"},
        {"name": "manifest text", "value": round(len(text) / 1e6, 2), "unit": "MB"},
        {"name": "json.loads", "value": loads_ms, "unit": "ms"},
        {"name": "parse_manifest", "value": parse_ms, "unit": "ms", "peer": f"json.loads {loads_ms} ms"},
        {"name": "verify (check)", "value": verify_ms, "unit": "ms", "target": f"< {TARGET_VERIFY_MS:g}"},
        {"name": "parse + verify", "value": both_ms, "unit": "ms"},
        {"name": "digest", "value": digest_ms, "unit": "ms"},
    ]
