"""Manifest documents for tests: `full()` verifies and uses every feature of the format;
`problems(doc)` runs parse + verify and returns every problem."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from kern_manifest import ManifestError, ManifestRejected, check, parse_manifest

Json = dict[str, Any]

REPO = Path(__file__).resolve().parents[4]
TINY = REPO / "examples" / "tiny.json"
SHA_A = "a" * 64
SHA_B = "0123456789abcdef" * 4

_FULL: Json = {
    "schema_version": 5,
    "model": "full-test",
    "topology": {"groups": {"tp": 2}},
    "vars": {"tokens": {"max": 64}, "seqs": {"max": 4}},
    "states": {
        "kv": {"bytes_per_token": 1024},
        "conv": {"bytes_per_seq": 256},
        "flags": {"bytes": 4096},
    },
    "buffers": {
        "ids": {"dtype": "i64", "shape": ["tokens"], "kind": "input", "fill": "token",
                "domain": {"index_into": "emb"}},
        "slots": {"dtype": "i64", "shape": ["tokens"], "kind": "input", "fill": "slot",
                  "domain": {"index_into": "kv", "stride": 16}},
        "lens": {"dtype": "i32", "shape": ["seqs"], "kind": "input", "fill": "seq_len",
                 "domain": {"min": 1, "max": {"mul": ["tokens", 2]}, "monotone": True}},
        "emb": {"dtype": "bf16", "shape": [1000, 256], "kind": "weight",
                "bind": [{"tensor": "model.embed.weight", "rows": [0, 1000]}]},
        "w_gu": {"dtype": "bf16", "shape": [128, 256], "kind": "weight",
                 "bind": [{"tensor": {"group": "tp", "tensors": ["gate.0", "gate.1"]},
                           "rows": {"group": "tp", "ranges": [[0, 64], [64, 128]]},
                           "interleave": {"with": "up", "rows": 8}}]},
        "scale_src": {"dtype": "f32", "shape": [256], "kind": "source",
                      "bind": [{"tensor": "model.norm.scale"}]},
        "norm_w": {"dtype": "bf16", "shape": [256], "kind": "weight"},
        "rope": {"dtype": "bf16", "shape": [128, 64], "kind": "carry"},
        "h": {"dtype": "bf16", "shape": ["tokens", 256], "kind": "workspace", "export": True},
        "peers": {"dtype": "u64", "shape": [2], "kind": "peer", "of": "h", "group": "tp"},
        "x": {"dtype": "bf16", "shape": ["tokens", 256], "kind": "workspace"},
        "y": {"dtype": "bf16", "shape": ["tokens", 128], "kind": "workspace"},
        "gathered": {"dtype": "bf16", "shape": ["tokens", 256], "kind": "workspace"},
        "attn": {"dtype": "bf16", "shape": ["tokens", 256], "kind": "workspace"},
        "logits": {"dtype": "f32", "shape": ["tokens", 1000], "kind": "workspace"},
        "next": {"dtype": "i64", "shape": ["tokens"], "kind": "output", "fill": "tokens",
                 "domain": {"min": 0, "max": 999}},
    },
    "modules": {
        "core": {"source": "core.cubin", "sha256": SHA_A},
        "tma": {"source": "hf:org/repo/kernels/tma.cubin@main", "sha256": SHA_B},
    },
    "ops": {
        "embed": {"params": ["in buffer<i64>", "in buffer<bf16>", "out buffer<bf16>", "i32"],
                  "impl": {"launches": [{"module": "core", "entry": "embed", "block": [256, 1, 1],
                                         "grid": ["tokens", 1, 1]}]}},
        "derive_norm": {"params": ["in buffer<f32>", "out buffer<bf16>"],
                        "impl": {"launches": [{"module": "core", "entry": "to_bf16",
                                               "block": [256, 1, 1], "grid": [1, 1, 1]}]}},
        "rope_table": {"params": ["out buffer<bf16>", "f32"],
                       "impl": {"launches": [{"module": "core", "entry": "rope", "block": [64, 1, 1],
                                              "grid": [128, 1, 1]}]}},
        "norm": {
            "params": ["in buffer<bf16>", "in buffer<bf16>", "out buffer<bf16>", "in buffer<u64>"],
            "impl": {"launches": [
                {"module": "core", "entry": "norm_small", "block": [256, 1, 1],
                 "grid": ["tokens", 1, 1], "when": {"var": "tokens", "max": 16}, "pdl": True},
                {"module": "tma", "entry": "norm_tma", "block": [128, 1, 1],
                 "grid": [{"mul": [{"ceil_div": ["tokens", 16]}, 2]}, 1, 1], "cluster": [2, 1, 1],
                 "carveout": 100,
                 "shared_mem": {"mul": [{"min": ["tokens", 32]}, 1024]},
                 "when": {"var": "tokens", "min": 17},
                 "params": ["bytes<192>", "in buffer<bf16>", "out buffer<bf16>", "in buffer<u64>", "i32"],
                 "args": [
                     {"pack": {"size": 192, "fields": [
                         {"at": 0, "tensormap": {"param": 0, "dtype": "bf16", "dims": [256, "tokens"],
                                                 "strides": [512], "box": [64, 16], "swizzle": 128}},
                         {"at": 128, "param": 2},
                         {"at": 136, "var": "tokens"},
                         {"at": 140, "rank": "tp"},
                         {"at": 144, "f32": 1e-6},
                         {"at": 148, "expr": {"add": ["tokens", 1]}, "width": 8},
                     ]}},
                     {"param": 1}, {"param": 2}, {"param": 3},
                     {"expr": {"ceil_div": ["tokens", 16]}}]},
            ]}},
        "gemm": {"params": ["in buffer<bf16>", "in buffer<bf16>", "out buffer<bf16>", "i32"],
                 "impl": {"launches": [{"entry": "extern:cublaslt_bf16_tn",
                                        "args": [{"param": 0}, {"param": 1}, {"param": 2},
                                                 {"param": 3}, {"i32": 128}, {"i32": 256},
                                                 {"i32": 128}],
                                        "algo": {"id": 6, "tile": 20, "stages": 8}}]}},
        "gather": {"params": ["in buffer<bf16>", "out buffer<bf16>"],
                   "impl": {"launches": [{"entry": "extern:nccl_allgather_bf16",
                                          "args": [{"param": 0}, {"param": 1},
                                                   {"expr": {"mul": ["tokens", 128]}},
                                                   {"rank": "tp"}]}]}},
        "attn": {
            "params": ["in buffer<bf16>", "inout state", "in buffer<i64>", "in buffer<i32>",
                       "inout state", "out buffer<bf16>"],
            "impl": {
                "scratch": {"partial": {"dtype": "f32", "shape": ["seqs", 8, 256]}},
                "launches": [
                    {"module": "core", "entry": "attn_partial", "block": [128, 1, 1],
                     "grid": ["seqs", 8, 1],
                     "params": ["in buffer<bf16>", "inout state", "in buffer<i64>", "in buffer<i32>",
                                "inout state", "out buffer<f32>", "i64"],
                     "args": [{"param": 0}, {"param": 1}, {"param": 2}, {"param": 3}, {"param": 4},
                              {"scratch": "partial"}, {"i64": 1 << 40}]},
                    {"module": "core", "entry": "attn_reduce", "block": [256, 1, 1],
                     "grid": ["seqs", 1, 1],
                     "params": ["in buffer<f32>", "out buffer<bf16>", "u8"],
                     "args": [{"scratch": "partial"}, {"param": 5}, {"u8": 1}]},
                ]}},
        "lm_head": {"params": ["in buffer<bf16>", "in buffer<bf16>", "out buffer<f32>"],
                    "impl": {"launches": [{"entry": "extern:cublas_bf16_tn_f32",
                                           "args": [{"param": 0}, {"param": 1}, {"param": 2},
                                                    {"var": "tokens"}, {"i32": 1000},
                                                    {"i32": 256}]}]}},
        "argmax": {"params": ["in buffer<f32>", "out buffer<i64>"],
                   "impl": {"launches": [{"module": "core", "entry": "argmax", "block": [1024, 1, 1],
                                          "grid": ["tokens", 1, 1]}]}},
    },
    "programs": {
        "dequant": {"derive": True, "calls": [
            {"op": "derive_norm", "args": [{"buf": "scale_src"}, {"buf": "norm_w"}]}]},
        "load": {"once": True, "calls": [
            {"label": "rope", "op": "rope_table", "args": [{"buf": "rope"}, {"f32": 10000.0}]}]},
        "decode": {"batch": {"groups": 4, "rows": 1}, "graph": True, "calls": [
            {"label": "embed", "op": "embed",
             "args": [{"buf": "ids"}, {"buf": "emb"}, {"buf": "h"}, {"i32": 256}]},
            {"label": "norm", "op": "norm",
             "args": [{"buf": "h"}, {"buf": "norm_w"}, {"buf": "x"}, {"buf": "peers"}]},
            {"label": "gate_up", "op": "gemm",
             "args": [{"buf": "x"}, {"buf": "w_gu"}, {"buf": "y"}, {"var": "tokens"}]},
            {"label": "gather", "op": "gather", "args": [{"buf": "y"}, {"buf": "gathered"}]},
            {"label": "attn", "op": "attn",
             "args": [{"buf": "gathered"}, {"state": "kv", "offset": 512}, {"buf": "slots"},
                      {"buf": "lens"}, {"state": "conv", "offset": {"mul": [16, 2]}},
                      {"buf": "attn"}]},
            {"label": "lm_head", "op": "lm_head",
             "args": [{"buf": "attn"}, {"buf": "emb"}, {"buf": "logits"}]},
            {"label": "sample", "op": "argmax", "args": [{"buf": "logits"}, {"buf": "next"}]},
            {"label": "rope_read", "op": "embed",
             "args": [{"buf": "next"}, {"buf": "rope", "offset": {"mul": ["tokens", 2]}},
                      {"buf": "h"}, {"i32": 64}]},
            {"label": "flags", "op": "attn",
             "args": [{"buf": "h"}, {"state": "flags", "offset": 4080}, {"buf": "slots"},
                      {"buf": "lens"}, {"state": "kv"}, {"buf": "x"}]},
        ]},
    },
}


def full() -> Json:
    """A fresh copy of a manifest that verifies and uses every part of the format."""
    return copy.deepcopy(_FULL)


def tiny() -> Json:
    """A fresh copy of examples/tiny.json."""
    return json.loads(TINY.read_text())


def problems(doc: Json | str | bytes) -> list[ManifestError]:
    """Every problem parse + verify report for a document (empty when it verifies)."""
    text = doc if isinstance(doc, str | bytes) else json.dumps(doc)
    try:
        manifest = parse_manifest(text)
    except ManifestRejected as exc:
        return list(exc.problems)
    return list(check(manifest))


def resolve(doc: Json, pointer: str) -> tuple[Any, str]:
    """The container and last key of a JSON pointer (lists get int keys)."""
    parts = [p.replace("~1", "/").replace("~0", "~") for p in pointer.split("/")[1:]]
    node: Any = doc
    for part in parts[:-1]:
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node, parts[-1]


def put(doc: Json, pointer: str, value: Any) -> Json:
    """Sets (or appends with key "-") the value at a pointer; returns the document."""
    node, key = resolve(doc, pointer)
    if isinstance(node, list):
        if key == "-":
            node.append(value)
        else:
            node[int(key)] = value
    else:
        node[key] = value
    return doc


def drop(doc: Json, pointer: str) -> Json:
    """Deletes the value at a pointer; returns the document."""
    node, key = resolve(doc, pointer)
    del node[int(key) if isinstance(node, list) else key]
    return doc
