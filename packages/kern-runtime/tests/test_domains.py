"""Input domains resolved from a manifest and checked against host writes (no GPU)."""

from __future__ import annotations

import copy
import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kern_manifest import parse_manifest
from kern_runtime import ApiError, DomainError, InputDomain, StateUnits, check_domain, input_domains

from .helpers import manifests

SHA = "ab" * 32


def _manifest(buffers: dict[str, Any], states: dict[str, Any] | None = None) -> Any:
    raw = manifests.pooled(SHA)
    raw = copy.deepcopy(raw)
    raw["vars"] = {"t": {"max": 512}}
    raw["buffers"].update(buffers)
    if states:
        raw["states"].update(states)
    return parse_manifest(json.dumps(raw))


STATES = {"kv": StateUnits(256 * 16, "256 pages of 16 tokens"), "ssm": StateUnits(3 << 20, "3 slots of 1 MiB")}


def test_index_into_a_paged_state_bounds_page_numbers_by_the_pool() -> None:
    doms = input_domains(_manifest({}), STATES)
    assert doms["bt"] == InputDomain(0, 255, False, "index_into state 'kv': 256 pages of 16 tokens, stride 16", "i32")
    check_domain("bt", doms["bt"], np.arange(256, dtype=np.int32))
    with pytest.raises(DomainError, match=r"input 'bt' element 256 is 256, outside its domain \[0, 255\]"):
        check_domain("bt", doms["bt"], np.arange(300, dtype=np.int32))
    with pytest.raises(DomainError, match="element 3 is -1"):
        check_domain("bt", doms["bt"], np.array([0, 1, 2, -1], dtype=np.int32))


def test_index_into_a_buffer_counts_its_rows_at_the_vars_maxima() -> None:
    m = _manifest({
        "emb": {"dtype": "bf16", "shape": [1000, 64], "kind": "weight"},
        "ids": {"dtype": "i64", "shape": ["t"], "kind": "input", "domain": {"index_into": "emb"}},
        "rows": {"dtype": "i32", "shape": ["t"], "kind": "input", "domain": {"index_into": "scratch", "stride": 4}},
        "scratch": {"dtype": "f32", "shape": ["t", 8], "kind": "workspace"},
    })  # fmt: skip
    doms = input_domains(m, STATES)
    assert (doms["ids"].lo, doms["ids"].hi) == (0, 999)
    assert (doms["rows"].lo, doms["rows"].hi) == (0, 512 // 4 - 1)  # t at its max, 4 rows per index
    check_domain("ids", doms["ids"], np.array([0, 999], np.int64))
    with pytest.raises(DomainError, match="buffer 'emb' of 1000 rows"):
        check_domain("ids", doms["ids"], np.array([1000], np.int64))


def test_per_seq_and_fixed_states_bound_byte_lines() -> None:
    m = _manifest({
        "lines": {"dtype": "i32", "shape": [4], "kind": "input", "domain": {"index_into": "ssm", "stride": 4096}},
        "cells": {"dtype": "i32", "shape": [4], "kind": "input", "domain": {"index_into": "table"}},
    }, states={"table": {"bytes": 100}})  # fmt: skip
    doms = input_domains(m, {**STATES, "table": StateUnits(100, "100 bytes")})
    assert doms["lines"].hi == (3 << 20) // 4096 - 1
    assert doms["cells"].hi == 99


def test_min_max_bounds_take_expressions_at_the_vars_maxima_and_skip_empty_domains() -> None:
    m = _manifest({
        "pos": {"dtype": "i64", "shape": ["t"], "kind": "input", "domain": {"min": 0, "max": {"add": ["t", 7]}}},
        "temp": {"dtype": "f32", "shape": [1], "kind": "input", "domain": {"min": 0.0, "max": 2.0}},
        "any": {"dtype": "f32", "shape": [1], "kind": "input", "domain": {}},
        "out": {"dtype": "i32", "shape": [1], "kind": "output", "domain": {"min": 0, "max": 3}},
    })  # fmt: skip
    doms = input_domains(m, STATES)
    assert (doms["pos"].lo, doms["pos"].hi) == (0, 519)
    assert "any" not in doms and "out" not in doms  # no bound; outputs are postconditions, not writes
    check_domain("temp", doms["temp"], np.array([0.0, 2.0], np.float32))
    with pytest.raises(DomainError, match="element 1 is nan"):
        check_domain("temp", doms["temp"], np.array([1.0, np.nan], np.float32))
    with pytest.raises(DomainError, match=r"outside its domain \[0.0, 2.0\]"):
        check_domain("temp", doms["temp"], np.array([2.5], np.float32))


def test_a_state_the_runtime_did_not_allocate_bounds_nothing_and_one_without_a_stride_is_refused() -> None:
    assert "bt" not in input_domains(_manifest({}), {})
    with pytest.raises(ApiError, match="input 'bt' indexes state 'kv': 0 pages of 16 tokens in strides of 16: no index"):
        input_domains(_manifest({}), {"kv": StateUnits(15, "0 pages of 16 tokens")})


def _bf16_bits(values: list[float]) -> np.ndarray[Any, Any]:
    return (np.array(values, np.float32).view(np.uint32) >> 16).astype(np.uint16)


def test_float_bounds_compare_the_values_that_bf16_and_fp8_bits_stand_for() -> None:
    m = _manifest({
        "scale": {"dtype": "bf16", "shape": [4], "kind": "input", "domain": {"min": 0.0, "max": 1.0}},
        "q": {"dtype": "fp8e4m3", "shape": [4], "kind": "input", "domain": {"min": -2.0, "max": 2.0}},
        "e": {"dtype": "fp8e8m0", "shape": [4], "kind": "input", "domain": {"max": 4.0}},
    })  # fmt: skip
    doms = input_domains(m, STATES)
    check_domain("scale", doms["scale"], _bf16_bits([0.0, 0.5, 1.0]))  # 0.5 is the bits 0x3f00
    with pytest.raises(DomainError, match=r"element 1 is 1\.5,"):
        check_domain("scale", doms["scale"], _bf16_bits([0.5, 1.5]))
    with pytest.raises(DomainError, match="element 0"):
        check_domain("scale", doms["scale"], np.array([0x7FC0], np.uint16))  # a bf16 NaN
    # e4m3: 0x38 = 1.0, 0xc0 = -2.0, 0x40 = 2.0, 0x48 = 4.0, 0x7f = NaN, 0x01 = 2^-9.
    check_domain("q", doms["q"], np.array([0x38, 0xC0, 0x40, 0x01], np.uint8))
    with pytest.raises(DomainError, match=r"element 1 is 4\.0,"):
        check_domain("q", doms["q"], np.array([0x38, 0x48], np.uint8))
    with pytest.raises(DomainError, match="element 0 is nan"):
        check_domain("q", doms["q"], np.array([0x7F], np.uint8))
    # e8m0: the byte e is 2^(e - 127): 129 is 4.0, 130 is 8.0.
    check_domain("e", doms["e"], np.array([0, 127, 129], np.uint8))
    with pytest.raises(DomainError, match=r"element 0 is 8\.0,"):
        check_domain("e", doms["e"], np.array([130], np.uint8))


def test_monotone_requires_a_non_decreasing_sequence() -> None:
    m = _manifest({"starts": {"dtype": "i32", "shape": [8], "kind": "input",
                              "domain": {"min": 0, "monotone": True}}})  # fmt: skip
    dom = input_domains(m, STATES)["starts"]
    check_domain("starts", dom, np.array([0, 0, 3, 9], np.int32))
    with pytest.raises(DomainError, match="element 2 is 1, below element 1 \\(3\\)"):
        check_domain("starts", dom, np.array([0, 3, 1], np.int32))
    floats = input_domains(_manifest({"ts": {"dtype": "f32", "shape": [8], "kind": "input",
                                             "domain": {"monotone": True}}}), STATES)["ts"]  # fmt: skip
    check_domain("ts", floats, np.array([-1.0, 0.5, 0.5], np.float32))
    with pytest.raises(DomainError, match="element 1 is nan"):
        check_domain("ts", floats, np.array([0.0, np.nan, 1.0], np.float32))


def test_domain_error_is_an_api_error_and_empty_writes_pass() -> None:
    assert issubclass(DomainError, ApiError)
    check_domain("bt", InputDomain(0, 0, True, "x"), np.array([], np.int32))
    with pytest.raises(DomainError, match="2 of 3 elements are outside"):
        check_domain("bt", InputDomain(0, 1, False, "x"), np.array([5, 1, 7], np.int32))


@given(st.lists(st.integers(-5, 20), max_size=40), st.integers(-3, 5), st.integers(0, 15))
def test_check_domain_accepts_exactly_the_in_range_writes(values: list[int], lo: int, span: int) -> None:
    dom = InputDomain(lo, lo + span, False, "x")
    arr = np.array(values, dtype=np.int64)
    inside = all(lo <= v <= lo + span for v in values)
    if inside:
        check_domain("a", dom, arr)
    else:
        with pytest.raises(DomainError):
            check_domain("a", dom, arr)
