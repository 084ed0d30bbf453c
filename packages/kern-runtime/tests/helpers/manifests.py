"""Manifests for the GPU tests, as plain JSON values (sha256s filled in by the caller)."""

from __future__ import annotations

import copy
import json
from typing import Any

from kern_manifest import Manifest, parse_manifest

Json = dict[str, Any]
F32_OP = ["in buffer<f32>", "out buffer<f32>", "f32", "f32", "i32"]


def parsed(doc: Json) -> Manifest:
    """`doc` parsed (not verified): the kern_manifest model that `serving_roles` and the checks read."""
    return parse_manifest(json.dumps(doc))


def _launch(module: str, entry: str, grid: list[Any], block: int = 128, **extra: Any) -> Json:
    return {"module": module, "entry": entry, "block": [block, 1, 1], "grid": grid, **extra}


def basic(sha: str, n_param: str = "i32") -> Json:
    """Arithmetic, i64/u8 scalars, weights (windows, interleave, host placement), derive, once."""
    axpb = [*F32_OP[:4], n_param]
    lit = {"i32": lambda v: {"i32": v}, "i64": lambda v: {"i64": v}}[n_param]
    return {
        "schema_version": 5,
        "model": "rt-basic",
        "vars": {"n": {"max": 1024}},
        "buffers": {
            "x": {"dtype": "f32", "shape": ["n"], "kind": "input"},
            "y": {"dtype": "f32", "shape": ["n"], "kind": "output"},
            "o64": {"dtype": "i64", "shape": ["n"], "kind": "output"},
            "w": {"dtype": "f32", "shape": [4, 8], "kind": "weight",
                  "bind": [{"tensor": "w.a", "rows": [1, 3]}, {"tensor": "w.b"}]},
            "wi": {"dtype": "f32", "shape": [8, 2], "kind": "weight",
                   "bind": [{"tensor": "g", "interleave": {"with": "u", "rows": 2}}]},
            "wc": {"dtype": "f32", "shape": [4, 2], "kind": "weight", "bind": [{"tensor": "w.a", "cols": [2, 4]}]},
            "wh": {"dtype": "f32", "shape": [8], "kind": "weight", "placement": "host", "bind": [{"tensor": "h"}]},
            "src": {"dtype": "f32", "shape": [16], "kind": "source", "bind": [{"tensor": "s"}]},
            "derived": {"dtype": "f32", "shape": [16], "kind": "weight"},
            "c": {"dtype": "f32", "shape": [16], "kind": "carry"},
            "hc": {"dtype": "f32", "shape": [8], "kind": "carry"},
            "acc": {"dtype": "f32", "shape": [32], "kind": "carry"},
        },
        "modules": {"t": {"source": "rt_test.cubin", "sha256": sha}},
        "ops": {
            "axpb": {"params": axpb, "impl": {"launches": [
                _launch("t", "rt_axpb", [{"ceil_div": ["n", 128]}, 1, 1])]}},
            "axpb_small": {"params": axpb, "impl": {"launches": [_launch("t", "rt_axpb", [1, 1, 1])]}},
            "pick": {"params": axpb, "impl": {"launches": [
                _launch("t", "rt_axpb", [{"ceil_div": ["n", 128]}, 1, 1], when={"var": "n", "max": 16},
                        args=[{"param": 0}, {"param": 1}, {"f32": 10.0}, {"param": 3}, {"param": 4}]),
                _launch("t", "rt_axpb", [{"ceil_div": ["n", 128]}, 1, 1], when={"var": "n", "min": 17})]}},
            "fill": {"params": ["out buffer<i64>", "i64", "u8", "i32"], "impl": {"launches": [
                _launch("t", "rt_fill_i64", [{"ceil_div": ["n", 128]}, 1, 1])]}},
        },
        "programs": {
            "prep": {"derive": True, "calls": [
                {"op": "axpb_small", "args": [{"buf": "src"}, {"buf": "derived"}, {"f32": 2.0}, {"f32": 0.0}, lit(16)]}]},
            "load": {"once": True, "calls": [
                {"op": "axpb_small", "args": [{"buf": "derived"}, {"buf": "c"}, {"f32": 1.0}, {"f32": 1.0}, lit(16)]},
                {"op": "axpb_small", "args": [{"buf": "wh"}, {"buf": "hc"}, {"f32": 1.0}, {"f32": 0.0}, lit(8)]},
                {"op": "axpb_small", "args": [{"buf": "w"}, {"buf": "acc"}, {"f32": 1.0}, {"f32": 0.0}, lit(32)]},
                {"op": "axpb_small", "args": [{"buf": "wi"}, {"buf": "acc"}, {"f32": 1.0}, {"f32": 0.0}, lit(16)]},
                {"op": "axpb_small", "args": [{"buf": "wc"}, {"buf": "acc"}, {"f32": 1.0}, {"f32": 0.0}, lit(8)]}]},
            "pick": {"calls": [
                {"op": "pick", "args": [{"buf": "x"}, {"buf": "y"}, {"f32": 3.0}, {"f32": 0.5}, {"var": "n"}]}]},
            "main": {"calls": [
                {"label": "axpb", "op": "axpb", "args": [{"buf": "x"}, {"buf": "y"}, {"f32": 3.0}, {"f32": 0.5}, {"var": "n"}]},
                {"label": "fill", "op": "fill", "args": [{"buf": "o64"}, {"i64": -(1 << 40)}, {"u8": 7}, {"var": "n"}]}]},
        },
    }


def features(sha: str) -> Json:
    """> 48 KiB dynamic shared memory, a cluster launch (with PDL), and a tensormap pack."""
    return {
        "schema_version": 5,
        "model": "rt-features",
        "buffers": {
            "sx": {"dtype": "f32", "shape": [16384], "kind": "input"},
            "sy": {"dtype": "f32", "shape": [16384], "kind": "output"},
            "ranks": {"dtype": "i32", "shape": [8], "kind": "output"},
            "tin": {"dtype": "f32", "shape": [64, 32], "kind": "input"},
            "tout": {"dtype": "f32", "shape": [2048], "kind": "output"},
        },
        "modules": {"t": {"source": "rt_test.cubin", "sha256": sha}},
        "ops": {
            "reverse": {"params": ["in buffer<f32>", "out buffer<f32>", "i32"], "impl": {"launches": [
                _launch("t", "rt_smem_reverse", [1, 1, 1], 256, shared_mem=65536)]}},
            "cluster": {"params": ["out buffer<i32>"], "impl": {"launches": [
                _launch("t", "rt_cluster_rank", [8, 1, 1], 32, cluster=[4, 1, 1], pdl=True)]}},
            "tma": {"params": ["in buffer<f32>", "out buffer<f32>"], "impl": {"launches": [
                _launch("t", "rt_tma_tile", [8, 1, 1], 128, params=["bytes<192>", "out buffer<f32>"], args=[
                    {"pack": {"size": 192, "fields": [
                        {"at": 0, "tensormap": {"param": 0, "dtype": "f32", "dims": [32, 64], "strides": [128],
                                                "box": [32, 8]}},
                        {"at": 128, "i32": 5}]}},
                    {"param": 1}])]}},
        },
        "programs": {"main": {"calls": [
            {"op": "reverse", "args": [{"buf": "sx"}, {"buf": "sy"}, {"i32": 16384}]},
            {"op": "cluster", "args": [{"buf": "ranks"}]},
            {"op": "tma", "args": [{"buf": "tin"}, {"buf": "tout"}]}]}},
    }


def chain(sha: str, calls: int = 400) -> Json:
    """A graph program of `calls` launches over one carried vector."""
    body = [{"op": "mix", "args": [{"buf": "x"}, {"buf": "y"}, {"f32": 1.0 - 1e-4 * (i % 7)}, {"f32": 1e-3 * (i % 11)},
                                   {"i32": 4096}]} for i in range(calls - 1)]  # fmt: skip
    first = {"op": "first", "args": [{"buf": "x"}, {"buf": "y"}, {"f32": 1.0}, {"f32": 0.25}, {"i32": 4096}]}
    return {
        "schema_version": 5,
        "model": "rt-chain",
        "buffers": {
            "x": {"dtype": "f32", "shape": [4096], "kind": "input"},
            "y": {"dtype": "f32", "shape": [4096], "kind": "output"},
        },
        "modules": {"t": {"source": "rt_test.cubin", "sha256": sha}},
        "ops": {
            "first": {"params": F32_OP, "impl": {"launches": [_launch("t", "rt_axpb", [32, 1, 1])]}},
            "mix": {"params": F32_OP, "impl": {"launches": [_launch("t", "rt_mix", [32, 1, 1])]}},
        },
        "programs": {"chain": {"graph": True, "calls": [first, *body]}},
    }


def gemm(algo: Json | None = None) -> Json:
    """The extern GEMMs: plain, strided (ldc/lda + byte offset), accumulate, f32 output."""
    mnk = [{"var": "m"}, {"i32": 256}, {"i32": 512}]
    plain: Json = {"entry": "extern:cublaslt_bf16_tn"}
    if algo is not None:
        plain["algo"] = algo
    return {
        "schema_version": 5,
        "model": "rt-gemm",
        "vars": {"m": {"max": 2048}},
        "buffers": {
            "a": {"dtype": "bf16", "shape": ["m", 640], "kind": "input"},
            "w": {"dtype": "bf16", "shape": [256, 512], "kind": "weight", "bind": [{"tensor": "w"}]},
            "c": {"dtype": "bf16", "shape": ["m", 384], "kind": "carry"},
            "cf": {"dtype": "f32", "shape": ["m", 256], "kind": "carry"},
        },
        "modules": {},
        "ops": {
            "gemm": {"params": ["in buffer<bf16>", "in buffer<bf16>", "out buffer<bf16>", "i32", "i32", "i32"],
                     "impl": {"launches": [plain]}},
            "gemm_strided": {"params": ["in buffer<bf16>", "in buffer<bf16>", "out buffer<bf16>", "i32", "i32", "i32",
                                        "i32", "i32"],
                             "impl": {"launches": [{"entry": "extern:cublaslt_bf16_tn"}]}},
            "gemm_acc": {"params": ["in buffer<bf16>", "in buffer<bf16>", "inout buffer<bf16>", "i32", "i32", "i32",
                                    "i32", "i32"],
                         "impl": {"launches": [{"entry": "extern:cublaslt_bf16_tn_acc"}]}},
            "gemm_f32": {"params": ["in buffer<bf16>", "in buffer<bf16>", "out buffer<f32>", "i32", "i32", "i32"],
                         "impl": {"launches": [{"entry": "extern:cublas_bf16_tn_f32"}]}},
        },
        "programs": {
            "plain": {"calls": [{"op": "gemm", "args": [{"buf": "a"}, {"buf": "w"}, {"buf": "c"}, *mnk]}]},
            "strided": {"calls": [{"op": "gemm_strided", "args": [
                {"buf": "a"}, {"buf": "w"}, {"buf": "c", "offset": 128}, *mnk, {"i32": 384}, {"i32": 640}]}]},
            "acc": {"calls": [{"op": "gemm_acc", "args": [
                {"buf": "a"}, {"buf": "w"}, {"buf": "c"}, *mnk, {"i32": 384}, {"i32": 640}]}]},
            "f32": {"calls": [{"op": "gemm_f32", "args": [{"buf": "a"}, {"buf": "w"}, {"buf": "cf"}, *mnk]}]},
        },
    }


def fp8_gemm(n: int, k: int) -> Json:
    """Both fp8 GEMM externs over e4m3 A [m, k] and W [n, k] with one-element f32 scales: bf16 C
    with a row stride of n + 64, and f32 C."""

    def op(entry: str, out: str) -> Json:
        return {"params": ["in buffer<fp8e4m3>", "in buffer<fp8e4m3>", f"out buffer<{out}>", "in buffer<f32>",
                           "in buffer<f32>", "i32", "i32", "i32", "i32"],
                "impl": {"launches": [{"entry": entry}]}}

    def call(name: str, out: str, ldc: int) -> Json:
        return {"op": name, "args": [{"buf": "a"}, {"buf": "w"}, {"buf": out}, {"buf": "sa"}, {"buf": "sw"},
                                     {"var": "m"}, {"i32": n}, {"i32": k}, {"i32": ldc}]}

    return {
        "schema_version": 5, "model": "rt-fp8-gemm", "vars": {"m": {"max": 512}},
        "buffers": {
            "a": {"dtype": "fp8e4m3", "shape": ["m", k], "kind": "input"},
            "w": {"dtype": "fp8e4m3", "shape": [n, k], "kind": "weight", "bind": [{"tensor": "w"}]},
            "sa": {"dtype": "f32", "shape": [1], "kind": "input"},
            "sw": {"dtype": "f32", "shape": [1], "kind": "input"},
            "c": {"dtype": "bf16", "shape": ["m", n + 64], "kind": "carry"},
            "cf": {"dtype": "f32", "shape": ["m", n], "kind": "carry"},
        },
        "modules": {},
        "ops": {"gemm8": op("extern:cublaslt_fp8_tn", "bf16"), "gemm8f": op("extern:cublaslt_fp8_tn_f32", "f32")},
        "programs": {"bf16": {"graph": True, "calls": [call("gemm8", "c", n + 64)]},
                     "f32": {"graph": True, "calls": [call("gemm8f", "cf", n)]}},
    }  # fmt: skip


def same_name(sha: str, extra: int) -> Json:
    """Two ops on one module whose two `add_k` instances differ in ABI (n runtime vs constexpr)."""
    pad = ["i64"] * extra
    zeros = [{"i64": 0}] * extra
    fwd = [{"param": i} for i in range(4)]

    def launch(params: list[str], args: list[Json]) -> Json:
        return _launch("tri", "add_k", [4, 1, 1], 128, params=params, args=args)

    return {
        "schema_version": 5,
        "model": "rt-same-name",
        "buffers": {
            "x": {"dtype": "f32", "shape": [1024], "kind": "input"},
            "y": {"dtype": "f32", "shape": [1024], "kind": "input"},
            "oa": {"dtype": "f32", "shape": [1024], "kind": "output"},
            "ob": {"dtype": "f32", "shape": [1024], "kind": "output"},
        },
        "modules": {"tri": {"source": "pair.fatbin", "sha256": sha}},
        "ops": {
            "runtime_n": {"params": ["in buffer<f32>", "in buffer<f32>", "out buffer<f32>", "i32"], "impl": {"launches": [
                launch(["in buffer<f32>", "in buffer<f32>", "out buffer<f32>", "i32", *pad], [*fwd, *zeros])]}},
            "const_n": {"params": ["in buffer<f32>", "in buffer<f32>", "out buffer<f32>"], "impl": {"launches": [
                launch(["in buffer<f32>", "in buffer<f32>", "out buffer<f32>", *pad], [*fwd[:3], *zeros])]}},
        },
        "programs": {"main": {"calls": [
            {"op": "runtime_n", "args": [{"buf": "x"}, {"buf": "y"}, {"buf": "oa"}, {"i32": 1024}]},
            {"op": "const_n", "args": [{"buf": "x"}, {"buf": "y"}, {"buf": "ob"}]}]}},
    }


def pooled(sha: str) -> Json:
    """A paged state (16-token pages through a block table's stride) and a per-seq state."""
    stamp = _launch("t", "rt_fill_i64", [1, 1, 1], params=["inout state", "i64", "u8", "i32"],
                    args=[{"param": 0}, {"param": 2}, {"param": 3}, {"param": 4}])
    return {
        "schema_version": 5,
        "model": "rt-pooled",
        "states": {"kv": {"bytes_per_token": 4096}, "ssm": {"bytes_per_seq": 1 << 20}},
        "buffers": {"bt": {"dtype": "i32", "shape": [4, 64], "kind": "input",
                           "domain": {"index_into": "kv", "stride": 16}}},
        "modules": {"t": {"source": "rt_test.cubin", "sha256": sha}},
        "ops": {"stamp": {"params": ["inout state", "in buffer<i32>", "i64", "u8", "i32"],
                          "impl": {"launches": [stamp]}}},
        "programs": {"stamp": {"calls": [
            {"op": "stamp", "args": [{"state": "kv", "offset": 32768}, {"buf": "bt"}, {"i64": 7}, {"u8": 1}, {"i32": 128}]},
            {"op": "stamp", "args": [{"state": "ssm", "offset": 1 << 19}, {"buf": "bt"}, {"i64": 9}, {"u8": 1},
                                     {"i32": 128}]}]}},
    }  # fmt: skip


def serving(sha: str = "ab" * 32) -> Json:
    """The serving roles of one sequence and nothing else: a token/position/slot/seq_len/block
    table input each, the next-token output, a once program, a chunk and a step program."""

    def buf(dtype: str, shape: list[Any], kind: str, fill: str | None = None) -> Json:
        return {"dtype": dtype, "shape": shape, "kind": kind, **({"fill": fill} if fill else {})}

    return {
        "schema_version": 5,
        "model": "serving",
        "vars": {"tokens": {"max": 256}},
        "buffers": {
            "ids": buf("i64", ["tokens"], "input", "token"),
            "pos": buf("i64", ["tokens"], "input", "position"),
            "sl": buf("i64", ["tokens"], "input", "slot"),
            "len": buf("i32", [1], "input", "seq_len"),
            "bt": buf("i32", [64], "input", "blocks"),
            "nt": buf("i64", [1], "output", "tokens"),
            "w": buf("bf16", [4], "weight"),
        },
        "modules": {"core": {"source": "core.cubin", "sha256": sha}},
        "ops": {},
        "programs": {
            "load": {"once": True, "calls": []},
            "chunk": {"batch": {"groups": 1, "rows": "tokens"}, "calls": []},
            "step": {"batch": {"groups": 1, "rows": 1}, "graph": True, "calls": []},
        },
    }


def remapping(sha: str) -> Json:
    """`pooled` with 32 MiB slots (two a chunk) and a graph program that keeps the GPU busy."""
    doc = copy.deepcopy(pooled(sha))
    doc["states"]["ssm"]["bytes_per_seq"] = 32 << 20
    n = 1 << 20
    doc["buffers"]["x"] = {"dtype": "f32", "shape": [n], "kind": "carry"}
    doc["buffers"]["y"] = {"dtype": "f32", "shape": [n], "kind": "carry"}
    doc["ops"]["mix"] = {"params": F32_OP, "impl": {"launches": [
        {"module": "t", "entry": "rt_mix", "block": [128, 1, 1], "grid": [n // 128, 1, 1]}]}}
    there = {"op": "mix", "args": [{"buf": "x"}, {"buf": "y"}, {"f32": 0.5}, {"f32": 0.25}, {"i32": n}]}
    back = {"op": "mix", "args": [{"buf": "y"}, {"buf": "x"}, {"f32": 0.5}, {"f32": 0.25}, {"i32": n}]}
    doc["programs"]["spin"] = {"graph": True, "calls": [there, back] * 100}
    return doc


def two_paged(sha: str) -> Json:
    """`pooled` with a second paged state (8 KiB a token), stamped through the same block table."""
    doc = copy.deepcopy(pooled(sha))
    doc["states"]["kv2"] = {"bytes_per_token": 8192}
    stamp_kv2 = copy.deepcopy(doc["programs"]["stamp"]["calls"][0])
    stamp_kv2["args"][0] = {"state": "kv2", "offset": 0}
    doc["programs"]["stamp"]["calls"].append(stamp_kv2)
    return doc
