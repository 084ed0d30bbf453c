"""kern_manifest.verify: a manifest using every feature verifies; each invalid manifest gets its
typed problem at the right JSON pointer."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
from helpers.manifests import REPO, SHA_A, TINY, Json, drop, full, problems, put, tiny

from kern_manifest import (
    MAX_BUFFER_BYTES,
    ManifestParse,
    ManifestRejected,
    ManifestVerify,
    check,
    load_manifest,
    parse_manifest,
    verify,
)

Edit = Callable[[Json], Any]

LAUNCH = "/ops/embed/impl/launches/0"
TMA = "/ops/norm/impl/launches/1"
PACK = f"{TMA}/args/0/pack"
DECODE = "/programs/decode/calls"


def _set(pointer: str, value: Any) -> Edit:
    return lambda doc: put(doc, pointer, value)


def _drop(pointer: str) -> Edit:
    return lambda doc: drop(doc, pointer)


def _both(*edits: Edit) -> Edit:
    def run(doc: Json) -> None:
        for e in edits:
            e(doc)

    return run


def _new_op(name: str, op: Json) -> Edit:
    return _set(f"/ops/{name}", op)


def _kernel_op(params: list[str], **launch: Any) -> Json:
    base = {"module": "core", "entry": "k", "block": [32, 1, 1], "grid": [1, 1, 1]}
    return {"params": params, "impl": {"launches": [{**base, **launch}]}}


def _call(op: str, *args: Json) -> Json:
    return {"op": op, "args": list(args)}


# NOTE: an op whose kernel launch takes a peer buffer while an extern launch runs a GEMM.
MIXED: Json = {
    "params": ["in buffer<u64>", "in buffer<bf16>", "in buffer<bf16>", "out buffer<bf16>", "i32"],
    "impl": {
        "launches": [
            {
                "module": "core",
                "entry": "k",
                "block": [32, 1, 1],
                "grid": [1, 1, 1],
                "params": ["in buffer<u64>"],
                "args": [{"param": 0}],
            },
            {
                "entry": "extern:cublaslt_bf16_tn",
                "args": [
                    {"param": 1},
                    {"param": 2},
                    {"param": 3},
                    {"param": 4},
                    {"i32": 128},
                    {"i32": 256},
                ],
            },
        ]
    },
}

# (id, edit of full(), problem type, JSON pointer of the problem)
INVALID: list[tuple[str, Edit, type, str]] = [
    # ---- parse: JSON shape and types
    ("schema-version-4", _set("/schema_version", 4), ManifestParse, "/schema_version"),
    ("schema-version-missing", _drop("/schema_version"), ManifestParse, "/schema_version"),
    ("unknown-top-field", _set("/extra", 1), ManifestParse, "/extra"),
    (
        "unknown-arg-field",
        _set(f"{DECODE}/0/args/0/bogus", 1),
        ManifestParse,
        f"{DECODE}/0/args/0/bogus",
    ),
    (
        "unknown-arg-kind",
        _set(f"{DECODE}/0/args/0", {"buffer": "ids"}),
        ManifestParse,
        f"{DECODE}/0/args/0",
    ),
    (
        "malformed-param",
        _set("/ops/embed/params/0", "in buffer"),
        ManifestParse,
        "/ops/embed/params/0",
    ),
    (
        "param-unknown-dtype",
        _set("/ops/embed/params/0", "in buffer<f64>"),
        ManifestParse,
        "/ops/embed/params/0",
    ),
    (
        "expr-negative",
        _set(f"{LAUNCH}/grid/1", {"add": [1, -1]}),
        ManifestParse,
        f"{LAUNCH}/grid/1/add/1",
    ),
    (
        "expr-two-keys",
        _set(f"{LAUNCH}/grid/1", {"add": [1, 1], "mul": [1, 1]}),
        ManifestParse,
        f"{LAUNCH}/grid/1",
    ),
    (
        "expr-one-operand",
        _set(f"{LAUNCH}/grid/0", {"max": ["tokens"]}),
        ManifestParse,
        f"{LAUNCH}/grid/0/max",
    ),
    (
        "expr-ceil-div-zero",
        _set(f"{LAUNCH}/grid/0", {"ceil_div": ["tokens", 0]}),
        ManifestParse,
        f"{LAUNCH}/grid/0/ceil_div/1",
    ),
    ("buffer-dtype", _set("/buffers/h/dtype", "bf17"), ManifestParse, "/buffers/h/dtype"),
    ("var-max-string", _set("/vars/tokens/max", "64"), ManifestParse, "/vars/tokens/max"),
    (
        "i32-literal-bool",
        _set(f"{DECODE}/0/args/3", {"i32": True}),
        ManifestParse,
        f"{DECODE}/0/args/3/i32",
    ),
    (
        "i32-literal-float",
        _set(f"{DECODE}/0/args/3", {"i32": 2.5}),
        ManifestParse,
        f"{DECODE}/0/args/3/i32",
    ),
    (
        "unknown-extern",
        _set("/ops/gemm/impl/launches/0/entry", "extern:cublas_magic"),
        ManifestParse,
        "/ops/gemm/impl/launches/0/entry",
    ),
    (
        "module-launch-extern-entry",
        _set(f"{LAUNCH}/entry", "extern:cublaslt_bf16_tn"),
        ManifestParse,
        f"{LAUNCH}/entry",
    ),
    ("launch-missing-block", _drop(f"{LAUNCH}/block"), ManifestParse, f"{LAUNCH}/block"),
    ("grid-two-dims", _set(f"{LAUNCH}/grid", ["tokens", 1]), ManifestParse, f"{LAUNCH}/grid"),
    ("buffer-kind", _set("/buffers/h/kind", "scratch"), ManifestParse, "/buffers/h/kind"),
    ("fill-role", _set("/buffers/ids/fill", "tokenz"), ManifestParse, "/buffers/ids/fill"),
    ("programs-array", _set("/programs", []), ManifestParse, "/programs"),
    (
        "param-index-negative",
        _set("/ops/gemm/impl/launches/0/args/0", {"param": -1}),
        ManifestParse,
        "/ops/gemm/impl/launches/0/args/0/param",
    ),
    # ---- verify: header
    ("var-max-zero", _set("/vars/seqs/max", 0), ManifestVerify, "/vars/seqs/max"),
    ("state-two-sizes", _set("/states/kv/bytes", 8), ManifestVerify, "/states/kv"),
    ("state-no-size", _set("/states/kv", {}), ManifestVerify, "/states/kv"),
    ("state-zero-bytes", _set("/states/flags/bytes", 0), ManifestVerify, "/states/flags/bytes"),
    ("slices-not-paged", _set("/states/conv/slices", 2), ManifestVerify, "/states/conv/slices"),
    ("slices-not-a-divisor", _set("/states/kv/slices", 3), ManifestVerify, "/states/kv/slices"),
    ("slices-past-the-token", _set("/states/kv/slices", 2048), ManifestVerify, "/states/kv/slices"),
    ("sha-short", _set("/modules/core/sha256", "abc"), ManifestVerify, "/modules/core/sha256"),
    (
        "sha-upper",
        _set("/modules/core/sha256", SHA_A.upper()),
        ManifestVerify,
        "/modules/core/sha256",
    ),
    (
        "hf-source-dotdot",
        _set("/modules/tma/source", "hf:org/../x.cubin"),
        ManifestVerify,
        "/modules/tma/source",
    ),
    ("empty-source", _set("/modules/core/source", " "), ManifestVerify, "/modules/core/source"),
    ("group-size-zero", _set("/topology/groups/tp", 0), ManifestVerify, "/topology/groups/tp"),
    ("empty-model", _set("/model", ""), ManifestVerify, "/model"),
    # ---- verify: buffers
    ("shape-unknown-var", _set("/buffers/x/shape/0", "rows"), ManifestVerify, "/buffers/x/shape/0"),
    ("shape-zero-dim", _set("/buffers/x/shape/1", 0), ManifestVerify, "/buffers/x/shape/1"),
    (
        "shape-overflow",
        _set("/buffers/x/shape", ["tokens", 1 << 40, 1 << 20]),
        ManifestVerify,
        "/buffers/x/shape",
    ),
    (
        "host-workspace",
        _set("/buffers/x/placement", "host"),
        ManifestVerify,
        "/buffers/x/placement",
    ),
    (
        "bind-on-workspace",
        _set("/buffers/x/bind", [{"tensor": "t"}]),
        ManifestVerify,
        "/buffers/x/bind",
    ),
    ("source-without-bind", _drop("/buffers/scale_src/bind"), ManifestVerify, "/buffers/scale_src"),
    (
        "bind-empty-rows",
        _set("/buffers/emb/bind/0/rows", [10, 10]),
        ManifestVerify,
        "/buffers/emb/bind/0/rows",
    ),
    (
        "bind-rank-table-size",
        _set("/buffers/w_gu/bind/0/tensor/tensors", ["gate.0"]),
        ManifestVerify,
        "/buffers/w_gu/bind/0/tensor",
    ),
    (
        "bind-interleave-zero",
        _set("/buffers/w_gu/bind/0/interleave/rows", 0),
        ManifestVerify,
        "/buffers/w_gu/bind/0/interleave/rows",
    ),
    ("fill-on-f32", _set("/buffers/logits/fill", "tokens"), ManifestVerify, "/buffers/logits/fill"),
    ("float-fill-on-i64", _set("/buffers/next/fill", "logprobs"), ManifestVerify, "/buffers/next/fill"),
    ("float-fill-wrong-direction", _set("/buffers/logits/fill", "sampling"), ManifestVerify, "/buffers/logits/fill"),
    (
        "fill-twice",
        _set(
            "/buffers/positions",
            {"dtype": "i64", "shape": ["tokens"], "kind": "input", "fill": "token"},
        ),
        ManifestVerify,
        "/buffers/positions/fill",
    ),
    (
        "fill-wrong-direction",
        _set("/buffers/next/fill", "token"),
        ManifestVerify,
        "/buffers/next/fill",
    ),
    (
        "domain-index-and-min",
        _set("/buffers/ids/domain/min", 0),
        ManifestVerify,
        "/buffers/ids/domain",
    ),
    (
        "domain-index-unknown",
        _set("/buffers/ids/domain/index_into", "nothing"),
        ManifestVerify,
        "/buffers/ids/domain/index_into",
    ),
    (
        "domain-float-on-int",
        _set("/buffers/lens/domain/min", 0.5),
        ManifestVerify,
        "/buffers/lens/domain/min",
    ),
    (
        "domain-min-gt-max",
        _set("/buffers/next/domain/min", 1000),
        ManifestVerify,
        "/buffers/next/domain",
    ),
    (
        "domain-bound-fit",
        _set("/buffers/next/domain/max", 1 << 63),
        ManifestVerify,
        "/buffers/next/domain/max",
    ),
    (
        "domain-monotone-2d",
        _set("/buffers/x/domain", {"monotone": True}),
        ManifestVerify,
        "/buffers/x/domain/monotone",
    ),
    (
        "domain-stride-zero",
        _set("/buffers/slots/domain/stride", 0),
        ManifestVerify,
        "/buffers/slots/domain/stride",
    ),
    ("peer-dtype", _set("/buffers/peers/dtype", "i64"), ManifestVerify, "/buffers/peers/dtype"),
    ("peer-shape", _set("/buffers/peers/shape", [4]), ManifestVerify, "/buffers/peers/shape"),
    ("peer-of-not-export", _set("/buffers/h/export", False), ManifestVerify, "/buffers/peers/of"),
    ("peer-of-self", _set("/buffers/peers/of", "peers"), ManifestVerify, "/buffers/peers/of"),
    (
        "peer-group-unknown",
        _set("/buffers/peers/group", "ep"),
        ManifestVerify,
        "/buffers/peers/group",
    ),
    (
        "peer-domain",
        _set("/buffers/peers/domain", {"min": 0}),
        ManifestVerify,
        "/buffers/peers/domain",
    ),
    ("of-on-workspace", _set("/buffers/x/of", "h"), ManifestVerify, "/buffers/x/of"),
    (
        "export-on-host",
        _both(_set("/buffers/emb/placement", "host"), _set("/buffers/emb/export", True)),
        ManifestVerify,
        "/buffers/emb/export",
    ),
    # ---- verify: launches
    ("unknown-module", _set(f"{LAUNCH}/module", "nope"), ManifestVerify, f"{LAUNCH}/module"),
    ("block-threads", _set(f"{LAUNCH}/block", [512, 4, 1]), ManifestVerify, f"{LAUNCH}/block"),
    ("block-z", _set(f"{LAUNCH}/block", [1, 1, 128]), ManifestVerify, f"{LAUNCH}/block"),
    (
        "grid-y-limit",
        _set(f"{LAUNCH}/grid/1", {"mul": ["tokens", 2048]}),
        ManifestVerify,
        f"{LAUNCH}/grid/1",
    ),
    (
        "grid-zero-at-min",
        _set(f"{LAUNCH}/grid/0", {"min": ["tokens", 0]}),
        ManifestVerify,
        f"{LAUNCH}/grid/0",
    ),
    ("grid-unknown-var", _set(f"{LAUNCH}/grid/2", "rows"), ManifestVerify, f"{LAUNCH}/grid/2"),
    (
        "shared-mem-limit",
        _set(f"{LAUNCH}/shared_mem", {"mul": ["tokens", 4096]}),
        ManifestVerify,
        f"{LAUNCH}/shared_mem",
    ),
    ("cluster-divides-grid", _set(f"{TMA}/cluster", [4, 1, 1]), ManifestVerify, f"{TMA}/grid/0"),
    ("cluster-too-big", _set(f"{TMA}/cluster", [2, 16, 1]), ManifestVerify, f"{TMA}/cluster"),
    ("carveout-over-100", _set(f"{TMA}/carveout", 101), ManifestVerify, f"{TMA}/carveout"),
    ("carveout-negative", _set(f"{TMA}/carveout", -1), ManifestVerify, f"{TMA}/carveout"),
    ("carveout-not-int", _set(f"{TMA}/carveout", "max"), ManifestParse, f"{TMA}/carveout"),
    (
        "carveout-disagrees",
        _new_op("again", _kernel_op([], module="tma", entry="norm_tma", carveout=50)),
        ManifestVerify,
        "/ops/again/impl/launches/0/carveout",
    ),
    (
        "when-empty",
        _set(f"{TMA}/when", {"var": "tokens", "min": 65}),
        ManifestVerify,
        f"{TMA}/when",
    ),
    ("when-unknown-var", _set(f"{TMA}/when", {"var": "rows"}), ManifestVerify, f"{TMA}/when/var"),
    ("launch-arg-count", _set(f"{TMA}/args", [{"param": 1}]), ManifestVerify, f"{TMA}/args"),
    (
        "forward-out-of-range",
        _set(f"{TMA}/args/1", {"param": 9}),
        ManifestVerify,
        f"{TMA}/args/1/param",
    ),
    ("forward-dtype", _set(f"{TMA}/params/1", "in buffer<f16>"), ManifestVerify, f"{TMA}/args/1"),
    (
        "write-through-in",
        _set(f"{TMA}/params/3", "inout buffer<u64>"),
        ManifestVerify,
        f"{TMA}/args/3",
    ),
    (
        "out-never-written",
        _set("/ops/attn/impl/launches/1/params/1", "in buffer<bf16>"),
        ManifestVerify,
        "/ops/attn/params/5",
    ),
    (
        "scratch-read-first",
        _set("/ops/attn/impl/launches/0/params/5", "in buffer<f32>"),
        ManifestVerify,
        "/ops/attn/impl/launches/0",
    ),
    (
        "scratch-unused",
        _set("/ops/attn/impl/scratch/spare", {"dtype": "u8", "shape": [16]}),
        ManifestVerify,
        "/ops/attn/impl/scratch/spare",
    ),
    (
        "scratch-unknown",
        _set("/ops/attn/impl/launches/1/args/0", {"scratch": "nope"}),
        ManifestVerify,
        "/ops/attn/impl/launches/1/args/0/scratch",
    ),
    (
        "scratch-dtype",
        _set("/ops/attn/impl/scratch/partial/dtype", "bf16"),
        ManifestVerify,
        "/ops/attn/impl/launches/0/args/5",
    ),
    (
        "i64-literal-range",
        _set("/ops/attn/impl/launches/0/args/6", {"i64": 1 << 63}),
        ManifestVerify,
        "/ops/attn/impl/launches/0/args/6/i64",
    ),
    (
        "u8-literal-range",
        _set("/ops/attn/impl/launches/1/args/2", {"u8": 256}),
        ManifestVerify,
        "/ops/attn/impl/launches/1/args/2/u8",
    ),
    (
        "literal-type",
        _set("/ops/attn/impl/launches/1/args/2", {"i32": 1}),
        ManifestVerify,
        "/ops/attn/impl/launches/1/args/2",
    ),
    (
        "expr-exceeds-i32",
        _set(f"{TMA}/args/4", {"expr": {"mul": ["tokens", 1 << 30]}}),
        ManifestVerify,
        f"{TMA}/args/4/expr",
    ),
    ("pack-size", _set(f"{PACK}/size", 256), ManifestVerify, f"{PACK}/size"),
    (
        "pack-for-scalar",
        _set(f"{TMA}/args/4", {"pack": {"size": 4, "fields": []}}),
        ManifestVerify,
        f"{TMA}/args/4",
    ),
    ("pack-overlap", _set(f"{PACK}/fields/3/at", 138), ManifestVerify, f"{PACK}/fields/3"),
    ("pack-past-end", _set(f"{PACK}/fields/5/at", 188), ManifestVerify, f"{PACK}/fields/5"),
    ("pack-width", _set(f"{PACK}/fields/2/width", 2), ManifestVerify, f"{PACK}/fields/2/width"),
    (
        "pack-rank-group",
        _set(f"{PACK}/fields/3/rank", "ep"),
        ManifestVerify,
        f"{PACK}/fields/3/rank",
    ),
    (
        "tensormap-align",
        _both(
            _set(f"{PACK}/fields/0/at", 32),
            _set(f"{PACK}/fields/1/at", 160),
            _drop(f"{PACK}/fields/5"),
        ),
        ManifestVerify,
        f"{PACK}/fields/0/at",
    ),
    (
        "tensormap-stride16",
        _set(f"{PACK}/fields/0/tensormap/strides/0", 520),
        ManifestVerify,
        f"{PACK}/fields/0/tensormap/strides/0",
    ),
    (
        "tensormap-box",
        _set(f"{PACK}/fields/0/tensormap/box", [512, 16]),
        ManifestVerify,
        f"{PACK}/fields/0/tensormap/box",
    ),
    (
        "tensormap-rank",
        _set(f"{PACK}/fields/0/tensormap/strides", []),
        ManifestVerify,
        f"{PACK}/fields/0/tensormap/strides",
    ),
    (
        "tensormap-scalar-param",
        _set(f"{PACK}/fields/0/tensormap/param", 9),
        ManifestVerify,
        f"{PACK}/fields/0/tensormap/param",
    ),
    (
        "tensormap-footprint",
        _set(f"{PACK}/fields/0/tensormap/dims", [256, {"mul": ["tokens", 2]}]),
        ManifestVerify,
        f"{DECODE}/1/args/0",
    ),
    (
        "algo-on-f32-gemm",
        _set("/ops/lm_head/impl/launches/0/algo", {"id": 1}),
        ManifestVerify,
        "/ops/lm_head/impl/launches/0/algo",
    ),
    (
        "extern-arg-count",
        _set("/ops/lm_head/impl/launches/0/args", [{"param": 0}]),
        ManifestVerify,
        "/ops/lm_head/impl/launches/0/args",
    ),
    (
        "extern-default-args",
        _drop("/ops/lm_head/impl/launches/0/args"),
        ManifestVerify,
        "/ops/lm_head/impl/launches/0",
    ),
    (
        "collective-no-rank",
        _set("/ops/gather/impl/launches/0/args/3", {"i32": 0}),
        ManifestVerify,
        "/ops/gather/impl/launches/0/args",
    ),
    (
        "rank-on-u8",
        _set("/ops/attn/impl/launches/1/args/2", {"rank": "tp"}),
        ManifestVerify,
        "/ops/attn/impl/launches/1/args/2",
    ),
    (
        "var-for-f32",
        _set("/programs/load/calls/0/args/1", {"var": "tokens"}),
        ManifestVerify,
        "/programs/load/calls/0/args/1",
    ),
    (
        "bytes-in-interface",
        _new_op("b", _kernel_op(["bytes<16>"])),
        ManifestVerify,
        "/ops/b/params/0",
    ),
    (
        "op-no-launches",
        _set("/ops/argmax/impl/launches", []),
        ManifestVerify,
        "/ops/argmax/impl/launches",
    ),
    ("abi-too-large", _set(f"{TMA}/params/0", "bytes<40000>"), ManifestVerify, f"{TMA}/params"),
    # ---- verify: programs and calls
    ("unknown-op", _set(f"{DECODE}/6/op", "sample"), ManifestVerify, f"{DECODE}/6/op"),
    ("call-arg-count", _drop(f"{DECODE}/6/args/1"), ManifestVerify, f"{DECODE}/6/args"),
    (
        "call-unknown-buffer",
        _set(f"{DECODE}/6/args/0", {"buf": "logitz"}),
        ManifestVerify,
        f"{DECODE}/6/args/0/buf",
    ),
    (
        "call-dtype",
        _set(f"{DECODE}/6/args/0", {"buf": "attn"}),
        ManifestVerify,
        f"{DECODE}/6/args/0",
    ),
    (
        "call-state-to-buffer",
        _set(f"{DECODE}/6/args/0", {"state": "kv"}),
        ManifestVerify,
        f"{DECODE}/6/args/0",
    ),
    (
        "call-buffer-to-state",
        _set(f"{DECODE}/4/args/1", {"buf": "h"}),
        ManifestVerify,
        f"{DECODE}/4/args/1",
    ),
    (
        "call-unknown-state",
        _set(f"{DECODE}/4/args/1", {"state": "ssm"}),
        ManifestVerify,
        f"{DECODE}/4/args/1/state",
    ),
    (
        "offset-misaligned",
        _set(f"{DECODE}/0/args/2/offset", 3),
        ManifestVerify,
        f"{DECODE}/0/args/2/offset",
    ),
    (
        "offset-out-of-bounds",
        _set(f"{DECODE}/0/args/2/offset", 32768),
        ManifestVerify,
        f"{DECODE}/0/args/2/offset",
    ),
    (
        "offset-expr-out-of-bounds",
        _set(f"{DECODE}/7/args/1/offset", {"mul": ["tokens", 256]}),
        ManifestVerify,
        f"{DECODE}/7/args/1/offset",
    ),
    (
        "state-offset-misaligned",
        _set(f"{DECODE}/4/args/1/offset", 8),
        ManifestVerify,
        f"{DECODE}/4/args/1/offset",
    ),
    (
        "state-offset-past-slot",
        _set(f"{DECODE}/4/args/4/offset", 256),
        ManifestVerify,
        f"{DECODE}/4/args/4/offset",
    ),
    (
        "sliced-state-offset-reads-a-var",
        _both(_set("/states/kv/slices", 4), _set(f"{DECODE}/4/args/1/offset", {"mul": ["tokens", 16]})),
        ManifestVerify,
        f"{DECODE}/4/args/1/offset",
    ),
    (
        "state-offset-past-page",
        _set(f"{DECODE}/4/args/1/offset", 16384),
        ManifestVerify,
        f"{DECODE}/4/args/1/offset",
    ),
    (
        "call-literal-range",
        _set(f"{DECODE}/0/args/3", {"i32": 1 << 31}),
        ManifestVerify,
        f"{DECODE}/0/args/3/i32",
    ),
    (
        "call-var-range",
        _both(_set("/vars/tokens/max", 1 << 32), _set("/buffers/h/shape", [1, 256])),
        ManifestVerify,
        f"{DECODE}/2/args/3/var",
    ),
    (
        "read-before-write",
        _set(f"{DECODE}/0/args/2", {"buf": "x"}),
        ManifestVerify,
        f"{DECODE}/1/args/0",
    ),
    (
        "output-read-first",
        _set(f"{DECODE}/0/args/0", {"buf": "next"}),
        ManifestVerify,
        f"{DECODE}/0/args/0",
    ),
    (
        "writes-input",
        _set(f"{DECODE}/6/args/1", {"buf": "ids"}),
        ManifestVerify,
        f"{DECODE}/6/args/1",
    ),
    (
        "writes-weight",
        _set("/programs/load/calls/0/args/0", {"buf": "emb"}),
        ManifestVerify,
        "/programs/load/calls/0/args/0",
    ),
    (
        "writes-bound-weight-in-derive",
        _set("/programs/dequant/calls/0/args/1", {"buf": "emb"}),
        ManifestVerify,
        "/programs/dequant/calls/0/args/1",
    ),
    (
        "writes-peer",
        _both(
            _new_op("poke", _kernel_op(["out buffer<u64>"])),
            _set(f"{DECODE}/-", _call("poke", {"buf": "peers"})),
        ),
        ManifestVerify,
        f"{DECODE}/9/args/0",
    ),
    (
        "source-outside-derive",
        _set(
            "/programs/load/calls/0", _call("derive_norm", {"buf": "scale_src"}, {"buf": "norm_w"})
        ),
        ManifestVerify,
        "/programs/load/calls/0/args/0",
    ),
    (
        "derive-touches-state",
        _set(
            "/programs/dequant/calls/-",
            _call(
                "attn",
                {"buf": "norm_w"},
                {"state": "kv"},
                {"buf": "slots"},
                {"buf": "lens"},
                {"state": "conv"},
                {"buf": "norm_w"},
            ),
        ),
        ManifestVerify,
        "/programs/dequant/calls/1/args/1",
    ),
    (
        "derive-collective",
        _set("/programs/dequant/calls/-", _call("gather", {"buf": "norm_w"}, {"buf": "norm_w"})),
        ManifestVerify,
        "/programs/dequant/calls/1/op",
    ),
    (
        "peer-to-extern",
        _both(
            _new_op("mixed", MIXED),
            _set(
                f"{DECODE}/-",
                _call(
                    "mixed",
                    {"buf": "peers"},
                    {"buf": "x"},
                    {"buf": "w_gu"},
                    {"buf": "y"},
                    {"var": "tokens"},
                ),
            ),
        ),
        ManifestVerify,
        f"{DECODE}/9/args/0",
    ),
    (
        "derive-with-graph",
        _set("/programs/dequant/graph", True),
        ManifestVerify,
        "/programs/dequant/derive",
    ),
    (
        "once-with-batch",
        _set("/programs/load/batch", {"groups": 1, "rows": 1}),
        ManifestVerify,
        "/programs/load/once",
    ),
    (
        "batch-groups-zero",
        _set("/programs/decode/batch/groups", 0),
        ManifestVerify,
        "/programs/decode/batch/groups",
    ),
    (
        "batch-rows-unknown-var",
        _set("/programs/decode/batch/rows", "rows"),
        ManifestVerify,
        "/programs/decode/batch/rows",
    ),
    (
        "program-no-calls",
        _set("/programs/idle", {"calls": []}),
        ManifestVerify,
        "/programs/idle/calls",
    ),
    ("no-programs", _set("/programs", {}), ManifestVerify, "/programs"),
    ("carry-never-written", _drop("/programs/load"), ManifestVerify, "/buffers/rope"),
    ("output-never-written", _drop(f"{DECODE}/6"), ManifestVerify, "/buffers/next"),
    ("derived-weight-never-written", _drop("/programs/dequant"), ManifestVerify, "/buffers/norm_w"),
    # ---- verify: unused declarations
    (
        "unused-buffer",
        _set("/buffers/spare", {"dtype": "u8", "shape": [4], "kind": "workspace"}),
        ManifestVerify,
        "/buffers/spare",
    ),
    ("unused-state", _set("/states/ssm", {"bytes_per_seq": 64}), ManifestVerify, "/states/ssm"),
    ("unused-var", _set("/vars/span", {"max": 4}), ManifestVerify, "/vars/span"),
    ("unused-op", _new_op("spare", _kernel_op(["in buffer<u8>"])), ManifestVerify, "/ops/spare"),
    (
        "unused-module",
        _set("/modules/spare", {"source": "s.cubin", "sha256": SHA_A}),
        ManifestVerify,
        "/modules/spare",
    ),
    ("unused-group", _set("/topology/groups/ep", 4), ManifestVerify, "/topology/groups/ep"),
]


@pytest.mark.parametrize(
    ("edit", "kind", "pointer"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID]
)
def test_invalid_manifest_reports_typed_problem_at_pointer(
    edit: Edit, kind: type, pointer: str
) -> None:
    doc = full()
    edit(doc)
    found = problems(doc)
    assert found, "the edited manifest verified"
    hits = [p for p in found if p.pointer == pointer]
    assert hits, f"no problem at {pointer}; got {[p.line() for p in found]}"
    assert all(type(p) is kind for p in hits), [p.line() for p in hits]
    assert all(p.message and p.hint for p in found)


def test_enough_distinct_invalid_manifests() -> None:
    ids = [c[0] for c in INVALID]
    assert len(set(ids)) == len(ids) >= 40


def test_full_manifest_verifies() -> None:
    assert problems(full()) == []


def test_a_sliced_paged_state_with_constant_offsets_verifies_and_keeps_its_slices() -> None:
    doc = full()
    put(doc, "/states/kv/slices", 4)
    assert problems(doc) == []
    assert parse_manifest(json.dumps(doc)).states["kv"].slices == 4


def test_tiny_example_verifies_and_is_in_the_docs() -> None:
    assert problems(tiny()) == []
    assert TINY.read_text() in (REPO / "docs" / "manifest.md").read_text()


def test_verify_collects_every_problem() -> None:
    doc = full()
    put(doc, "/vars/seqs/max", 0)
    put(doc, f"{LAUNCH}/block", [2048, 1, 1])
    put(doc, "/modules/core/sha256", "x")
    pointers = {p.pointer for p in problems(doc)}
    assert {"/vars/seqs/max", f"{LAUNCH}/block", "/modules/core/sha256"} <= pointers


def test_verify_raises_rejected_with_all_problems() -> None:
    doc = full()
    put(doc, "/vars/seqs/max", 0)
    put(doc, f"{LAUNCH}/block", [2048, 1, 1])
    manifest = parse_manifest(json.dumps(doc))
    with pytest.raises(ManifestRejected) as info:
        verify(manifest)
    assert len(info.value.problems) == len(check(manifest)) >= 2
    assert all(isinstance(p, ManifestVerify) for p in info.value.problems)


def test_load_manifest_returns_model_or_raises() -> None:
    manifest = load_manifest(json.dumps(full()))
    assert manifest.model == "full-test"
    doc = full()
    put(doc, "/buffers/spare", {"dtype": "u8", "shape": [4], "kind": "workspace"})
    with pytest.raises(ManifestRejected) as info:
        load_manifest(json.dumps(doc))
    assert [p.pointer for p in info.value.problems] == ["/buffers/spare"]


def test_problem_line_has_pointer_message_and_hint() -> None:
    doc = full()
    put(doc, "/modules/core/sha256", "x")
    (p,) = problems(doc)
    assert p.line() == f"/modules/core/sha256: {p.message} ({p.hint})"
    assert "\n" not in p.line()


def test_when_narrows_ranges() -> None:
    # NOTE: the small launch runs only for tokens <= 16, so its grid may use tokens * 4095 (<= 65535).
    doc = full()
    put(doc, "/ops/norm/impl/launches/0/grid/1", {"mul": ["tokens", 4095]})
    assert problems(doc) == []
    drop(doc, "/ops/norm/impl/launches/0/when")
    assert [p.pointer for p in problems(doc)] == ["/ops/norm/impl/launches/0/grid/1"]


def test_carry_counts_as_written_in_every_program() -> None:
    doc = full()
    # rope (carry, written by load) is read by decode before decode writes it: allowed.
    assert any(a.get("buf") == "rope" for a in doc["programs"]["decode"]["calls"][7]["args"])
    assert problems(doc) == []


def test_unbound_weight_written_by_derive_is_fine_but_not_elsewhere() -> None:
    doc = full()
    put(doc, "/programs/load/calls/-", _call("derive_norm", {"buf": "rope"}, {"buf": "norm_w"}))
    found = problems(doc)
    assert any(
        p.pointer == "/programs/load/calls/1/args/1" and "weight" in p.message for p in found
    )


def test_paged_state_offset_unbounded_without_page_size() -> None:
    doc = full()
    drop(doc, "/buffers/slots/domain/stride")
    put(doc, f"{DECODE}/4/args/1/offset", 1 << 20)
    assert problems(doc) == []


def _lines(doc: Json) -> list[str]:
    return [p.line() for p in problems(doc)]


def test_var_max_0_is_one_problem_with_what_follows_folded_in() -> None:
    doc = tiny()
    doc["vars"]["tokens"]["max"] = 0
    assert _lines(doc) == [
        "/vars/tokens/max: var max 0 < 1 (vars range over [1, max]; use max >= 1)"
        " (and 13 problems that follow from it)"
    ]
    (root,) = problems(doc)
    assert root.follows == 13 and root.message == "var max 0 < 1"


def test_a_fold_keeps_problems_of_other_causes() -> None:
    doc = tiny()
    doc["vars"]["tokens"]["max"] = 0
    doc["ops"]["embed"]["impl"]["launches"][0]["block"] = [2048, 1, 1]
    assert _lines(doc) == [
        "/vars/tokens/max: var max 0 < 1 (vars range over [1, max]; use max >= 1)"
        " (and 13 problems that follow from it)",
        "/ops/embed/impl/launches/0/block: block [2048, 1, 1] outside CUDA limits"
        " (each dim >= 1; x, y <= 1024; z <= 64)",
    ]


def test_each_broken_var_carries_its_own_followers() -> None:
    doc = full()
    doc["vars"]["tokens"]["max"] = 0
    doc["vars"]["seqs"]["max"] = 0
    assert _lines(doc) == [
        "/vars/tokens/max: var max 0 < 1 (vars range over [1, max]; use max >= 1)"
        " (and 25 problems that follow from it)",
        "/vars/seqs/max: var max 0 < 1 (vars range over [1, max]; use max >= 1)"
        " (and 4 problems that follow from it)",
    ]


def test_group_size_0_is_one_problem() -> None:
    doc = full()
    doc["topology"]["groups"]["tp"] = 0
    assert _lines(doc) == [
        "/topology/groups/tp: group size 0 < 1 (a group has at least one rank)"
        " (and 3 problems that follow from it)"
    ]


def test_a_when_on_a_broken_var_follows_from_it() -> None:
    doc = tiny()
    doc["vars"]["tokens"]["max"] = 0
    doc["ops"]["embed"]["impl"]["launches"][0]["when"] = {"var": "tokens", "max": 8}
    assert _lines(doc) == [
        "/vars/tokens/max: var max 0 < 1 (vars range over [1, max]; use max >= 1)"
        " (and 14 problems that follow from it)"
    ]


@pytest.mark.parametrize(
    "pointer",
    [
        "/ops/norm/impl/launches/1/args/0/pack/fields/0/tensormap/dims/1",
        "/buffers/lens/domain/max",
    ],
)
def test_a_divisor_that_is_always_0_is_a_problem_not_a_crash(pointer: str) -> None:
    doc = put(full(), pointer, {"ceil_div": [256, {"min": ["tokens", 0]}]})
    assert _lines(doc) == [
        f"{pointer}: divisor {{'min': ['tokens', 0]}} can be 0"
        " (keep ceil_div divisors >= 1 at the var bounds)"
    ]


def _rename_buffer(doc: Json, old: str, new: str) -> Json:
    doc["buffers"][new] = doc["buffers"].pop(old)
    for program in doc["programs"].values():
        for call in program["calls"]:
            for arg in call["args"]:
                if arg.get("buf") == old:
                    arg["buf"] = new
    return doc


def test_a_buffer_may_not_share_a_state_name() -> None:
    doc = _rename_buffer(tiny(), "h", "kv")
    assert _lines(doc) == [
        "/buffers/kv: buffer 'kv' has the name of a state"
        " (rename one: index_into and of name a buffer or a state)"
    ]


def test_call_labels_are_unique_within_a_program() -> None:
    doc = tiny()
    doc["programs"]["decode"]["calls"][3]["label"] = "embed"
    assert _lines(doc) == [
        "/programs/decode/calls/3/label: label 'embed' again (first at call 0)"
        " (give each call of a program its own label)"
    ]


def test_the_same_label_in_two_programs_is_fine() -> None:
    doc = tiny()
    doc["programs"]["again"] = copy.deepcopy(doc["programs"]["decode"])
    assert _lines(doc) == []


def test_names_with_control_characters_are_echoed_escaped() -> None:
    doc = _rename_buffer(tiny(), "h", "a\x1b[2J\u202e")
    doc["buffers"]["spare\n"] = {"dtype": "u8", "shape": [4], "kind": "workspace"}
    doc["programs"]["decode"]["calls"][4]["args"][1]["buf"] = "b\x07"
    lines = _lines(doc)
    assert lines == [
        "/programs/decode/calls/4/args/1/buf: unknown buffer 'b\\x07' (declare it under /buffers"
        " (declared: a\\x1b[2J\\u202e, emb, ids, logits, next_token, norm_w, slots, spare\\n, x))",
        "/buffers/next_token: unused buffer 'next_token' (remove it or reference it)",
        "/buffers/spare\\n: unused buffer 'spare\\n' (remove it or reference it)",
    ]
    assert all(line.isprintable() for line in lines)


def test_a_buffer_no_device_could_hold_is_refused() -> None:
    doc = tiny()
    doc["buffers"]["h"]["shape"] = [1_000_000_000_000_000]
    assert _lines(doc) == [
        "/buffers/h/shape: 2000000000000000 bytes at the vars' maxima, over the 1099511627776 (1 TiB)"
        " a buffer may take (lower the var maxima or the dims)"
    ]


def test_a_buffer_or_scratch_of_1_tib_verifies_and_one_byte_more_does_not() -> None:
    doc = tiny()
    doc["buffers"]["h"]["shape"] = ["tokens", MAX_BUFFER_BYTES // 2 // 64]
    assert MAX_BUFFER_BYTES == 1 << 40 and _lines(doc) == []
    doc["buffers"]["h"] = {"dtype": "u8", "shape": [MAX_BUFFER_BYTES + 1], "kind": "workspace"}
    assert [p.pointer for p in problems(doc)][:1] == ["/buffers/h/shape"]


@pytest.mark.parametrize("key", ["bytes", "bytes_per_token", "bytes_per_seq"])
def test_a_state_no_device_could_hold_is_refused(key: str) -> None:
    doc = tiny()
    doc["states"]["kv"] = {key: MAX_BUFFER_BYTES}
    assert not any(p.pointer.startswith("/states/kv/") for p in problems(doc))
    doc["states"]["kv"] = {key: MAX_BUFFER_BYTES + 1}
    assert f"/states/kv/{key}: {key} {MAX_BUFFER_BYTES + 1} out of range" \
           " (use a positive byte count of at most 1 TiB (2^40))" in _lines(doc)
