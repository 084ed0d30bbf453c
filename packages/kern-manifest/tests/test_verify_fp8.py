"""kern_manifest._verify_fp8: the fp8 GEMM externs take k a multiple of 16 at every value a launch
can give it and one-element f32 scale buffers, at the launch or at each call that feeds it."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from helpers.manifests import Json, problems, put

from kern_manifest import ManifestVerify

Edit = Callable[[Json], Any]

CALL = "/programs/step/calls/0"
LAUNCH = "/ops/gemm8/impl/launches/0"

_FP8: Json = {
    "schema_version": 5,
    "model": "fp8-test",
    "vars": {"tokens": {"max": 64}},
    "buffers": {
        "a8": {"dtype": "fp8e4m3", "shape": ["tokens", 256], "kind": "input"},
        "w8": {"dtype": "fp8e4m3", "shape": [512, 256], "kind": "weight",
               "bind": [{"tensor": "w"}]},
        "a_scale": {"dtype": "f32", "shape": [1], "kind": "weight",
                    "bind": [{"tensor": "a_scale"}]},
        "w_scale": {"dtype": "f32", "shape": [1], "kind": "weight",
                    "bind": [{"tensor": "w_scale"}]},
        "c": {"dtype": "bf16", "shape": ["tokens", 512], "kind": "workspace"},
    },
    "modules": {},
    "ops": {
        "gemm8": {
            "params": ["in buffer<fp8e4m3>", "in buffer<fp8e4m3>", "out buffer<bf16>",
                       "in buffer<f32>", "in buffer<f32>", "i32", "i32", "i32"],
            "impl": {"launches": [{"entry": "extern:cublaslt_fp8_tn"}]},
        }
    },
    "programs": {
        "step": {
            "calls": [
                {"op": "gemm8", "args": [{"buf": "a8"}, {"buf": "w8"}, {"buf": "c"},
                                         {"buf": "a_scale"}, {"buf": "w_scale"},
                                         {"var": "tokens"}, {"i32": 512}, {"i32": 256}]}
            ]
        }
    },
}  # fmt: skip

_EXPLICIT = [{"param": i} for i in range(8)]


def _doc(*edits: tuple[str, Any]) -> Json:
    doc = copy.deepcopy(_FP8)
    for pointer, value in edits:
        put(doc, pointer, value)
    return doc


def _launch_args(**slots: Any) -> tuple[str, Any]:
    args: list[Any] = list(_EXPLICIT)
    for slot, value in slots.items():
        args[int(slot.removeprefix("s"))] = value
    return f"{LAUNCH}/args", args


def _verify_problems(doc: Json) -> list[tuple[str, str]]:
    found = problems(doc)
    assert all(isinstance(p, ManifestVerify) for p in found), found
    return [(p.pointer, p.message) for p in found]


@pytest.mark.parametrize(
    "edits",
    [
        pytest.param((), id="forwarded"),
        pytest.param(((f"{LAUNCH}/entry", "extern:cublaslt_fp8_tn_f32"),
                      ("/buffers/c/dtype", "f32"),
                      ("/ops/gemm8/params/2", "out buffer<f32>")), id="f32-result"),
        pytest.param(((f"{CALL}/args/7", {"expr": {"mul": ["tokens", 16]}}),), id="k-expr"),
        pytest.param(((f"{CALL}/args/7", {"var": "tokens"}),
                      (f"{LAUNCH}/when", {"var": "tokens", "min": 32, "max": 32})), id="k-when"),
        pytest.param(((f"{CALL}/args/7", {"expr": {"add": ["tokens", 15]}}),
                      (f"{LAUNCH}/when", {"var": "tokens", "min": 1, "max": 1})), id="k-expr-when"),
        pytest.param((_launch_args(s7={"i32": 4096}),), id="k-literal-in-launch"),
        pytest.param((("/ops/gemm8/params/-", "i32"),
                      (f"{CALL}/args/-", {"i32": 512})), id="with-ldc"),
    ],
)  # fmt: skip
def test_good_fp8_gemms_verify(edits: tuple[tuple[str, Any], ...]) -> None:
    assert _verify_problems(_doc(*edits)) == []


@pytest.mark.parametrize(
    ("edits", "pointer", "message"),
    [
        pytest.param(((f"{CALL}/args/7", {"i32": 100}),), f"{CALL}/args/7",
                     "k = 100 is not a multiple of 16", id="k-literal"),
        pytest.param(((f"{CALL}/args/7", {"var": "tokens"}),), f"{CALL}/args/7",
                     "k can be 1 (tokens = 1), not always a multiple of 16", id="k-var"),
        pytest.param(((f"{CALL}/args/7", {"expr": {"add": ["tokens", 15]}}),
                      (f"{LAUNCH}/when", {"var": "tokens", "min": 1, "max": 2})), f"{CALL}/args/7",
                     "k can be 17 (tokens = 2), not always a multiple of 16", id="k-under-when"),
        pytest.param((_launch_args(s7={"i32": 200}),), f"{LAUNCH}/args/7",
                     "k = 200 is not a multiple of 16", id="k-literal-in-launch"),
        pytest.param((_launch_args(s7={"expr": {"add": ["tokens", 16]}}),), f"{LAUNCH}/args/7",
                     "k can be 17 (tokens = 1), not always a multiple of 16", id="k-expr-in-launch"),
        pytest.param((("/buffers/w_scale/shape", [4]),), f"{CALL}/args/4",
                      "scale buffer 'w_scale' holds 4 f32 values", id="scale-size"),
        pytest.param((("/buffers/a_scale/shape", ["tokens"]),), f"{CALL}/args/3",
                      "scale buffer 'a_scale' holds 64 f32 values", id="scale-per-token"),
        pytest.param((("/buffers/a_scale/dtype", "bf16"),), f"{CALL}/args/3",
                      "buffer 'a_scale' of bf16 for a `in buffer<f32>` param", id="scale-dtype"),
        pytest.param((("/ops/gemm8/params/4", "in buffer<bf16>"),), f"{LAUNCH}/args/4",
                      "forwards `in buffer<bf16>` into a `in buffer<f32>` slot",
                      id="scale-param-dtype"),
        pytest.param((("/ops/gemm8/impl/scratch", {"s": {"dtype": "f32", "shape": [2]}}),
                      _launch_args(s3={"scratch": "s"})), f"{LAUNCH}/args/3",
                      "scale scratch 's' holds 2 f32 values", id="scale-scratch"),
    ],
)  # fmt: skip
def test_bad_fp8_gemms_are_refused(
    edits: tuple[tuple[str, Any], ...], pointer: str, message: str
) -> None:
    assert (pointer, message) in _verify_problems(_doc(*edits))


def test_one_problem_per_bad_k() -> None:
    found = _verify_problems(_doc((f"{CALL}/args/7", {"i32": 8})))
    assert found == [(f"{CALL}/args/7", "k = 8 is not a multiple of 16")]


def test_bf16_gemms_take_any_k() -> None:
    doc = _doc(
        (f"{LAUNCH}/entry", "extern:cublaslt_bf16_tn"),
        ("/ops/gemm8/params", ["in buffer<bf16>", "in buffer<bf16>", "out buffer<bf16>",
                               "i32", "i32", "i32"]),
        ("/buffers/a8/dtype", "bf16"),
        ("/buffers/w8/dtype", "bf16"),
        ("/buffers/a_scale/kind", "workspace"),
        (CALL, {"op": "gemm8", "args": [{"buf": "a8"}, {"buf": "w8"}, {"buf": "c"},
                                        {"var": "tokens"}, {"i32": 512}, {"i32": 100}]}),
    )  # fmt: skip
    del doc["buffers"]["a_scale"], doc["buffers"]["w_scale"]
    assert _verify_problems(doc) == []
