"""kern test's two manifests, checked against each other before any GPU is looked for."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

import kern_runtime as kr
from kern_runtime import abtest as ab

from .helpers.manifests import parsed

ROOT = Path(__file__).resolve().parents[3]


def _example(name: str) -> dict[str, Any]:
    return json.loads((ROOT / "examples" / f"{name}.json").read_text())


def _pair(a: dict[str, Any], b: dict[str, Any], capacity: int) -> ab.Pair:
    return ab.check_pair(parsed(a), parsed(b), capacity)


def test_shipped_pairs_compare() -> None:
    base, fast, f32 = _example("qwen3-4b"), _example("qwen3-4b-fast"), _example("qwen3-4b-f32")
    p = _pair(base, fast, 4096)
    assert p.common == ("prefill", "decode", "head", "start") and p.a.vocab == p.b.vocab == 151936
    assert _pair(base, f32, 4096).common == ("prefill", "decode", "start")
    assert p.a.states == {"kv": 4096 * 147456} and p.a.logits == "logits"
    assert p.a.domains == {"next_token": (0, 151935)}
    assert p.a.layout("kv") == p.b.layout("kv")
    assert _pair(base, f32, 4096).b.layout("kv") != p.a.layout("kv")


def test_the_fp8_manifests_pair_with_the_bf16_ones() -> None:
    """One model whatever its checkpoint: scale tensors aside, and the tensors a derive program
    quantises at load (sources) counted as bound."""
    fast, fp8 = _example("qwen3-4b-fast"), _example("qwen3-4b-fp8")
    for a, b in ((fast, fp8), (fp8, _example("qwen3-4b-fp8-from-bf16")), (fast, _example("qwen3-4b-fp8-dynamic"))):
        assert _pair(a, b, 4096).common == ("prefill", "decode", "head", "start")
    no_scale = copy.deepcopy(fp8)
    no_scale["buffers"]["l0.qkv.bf16"] = {**no_scale["buffers"]["l0.qkv"], "dtype": "bf16", "kind": "source",
                                          "bind": [{"tensor": "model.layers.0.self_attn.x_proj.weight"}]}
    with pytest.raises(ab.AbTestError, match=r"different models: B binds .*x_proj"):
        _pair(fast, no_scale, 4096)


def test_the_paged_reach_rounds_up_to_whole_pages() -> None:
    tiny = _example("qwen3-tiny")
    assert ab.read_facts(parsed(tiny), 60, "A").states == {"kv": 64 * 2048}


def test_different_models() -> None:
    a = _example("qwen3-tiny")
    b = copy.deepcopy(a)
    b["buffers"]["final_norm"]["bind"] = [{"tensor": "model.other_norm.weight"}]
    with pytest.raises(ab.AbTestError, match=r"different models: A binds checkpoint tensors the other does not "
                                             r"\(model.norm.weight\)"):
        _pair(a, b, 64)
    with pytest.raises(ab.AbTestError, match="different models"):
        _pair(_example("qwen3-tiny"), _example("qwen3-4b"), 64)


def test_different_vocabularies() -> None:
    a = _example("qwen3-tiny")
    b = copy.deepcopy(a)
    b["buffers"]["ids"]["domain"]["max"] = 4000
    with pytest.raises(ab.AbTestError, match="different vocabularies: A takes token ids up to 4095, B up to 4000"):
        _pair(a, b, 64)
    b = copy.deepcopy(a)
    b["buffers"]["logits"]["shape"] = [1, 4000]
    with pytest.raises(ab.AbTestError, match="A's logits have 4096 token ids, B's 4000"):
        _pair(a, b, 64)


def test_no_common_program() -> None:
    a = _example("qwen3-tiny")
    b = copy.deepcopy(a)
    for old in ("prefill", "decode", "head", "start"):
        b["programs"][f"b_{old}"] = b["programs"].pop(old)
    with pytest.raises(ab.AbTestError, match="no common program: A runs prefill, decode, head, start; B runs b_prefill"):
        _pair(a, b, 64)


def test_the_logits_are_the_one_output_without_a_fill() -> None:
    a = _example("qwen3-tiny")
    b = copy.deepcopy(a)
    b["buffers"]["extra"] = {"dtype": "f32", "shape": [4], "kind": "output"}
    with pytest.raises(ab.AbTestError, match=r"B needs exactly one output without a fill \(its logits\)"):
        _pair(a, b, 64)


def test_the_capacity_must_fit_both() -> None:
    with pytest.raises(kr.PromptError, match="exceeds the model's reach"):
        _pair(_example("qwen3-tiny"), _example("qwen3-tiny"), 10**6)


def test_options_are_checked() -> None:
    ab.check_options(ab.AbOptions())
    for bad, match in ((ab.AbOptions(seed=-1), "--seed"), (ab.AbOptions(runs=0), "--runs"),
                       (ab.AbOptions(logit_kl=0), "--logit-kl"), (ab.AbOptions(logit_kl=float("nan")), "--logit-kl"),
                       (ab.AbOptions(capacity=16, decode_steps=16), "no room for a prompt")):
        with pytest.raises(ab.AbTestError, match=match):
            ab.check_options(bad)


def test_the_batched_step_is_driven_only_where_both_manifests_have_one() -> None:
    tiny, batch = _example("qwen3-tiny"), _example("qwen3-tiny-batch")
    both = _pair(batch, batch, 60)
    assert both.a.row_logits == both.b.row_logits == "row_logits" and both.no_batch() is None
    assert _pair(tiny, batch, 60).no_batch() == "A has no batched step with a [rows, vocab] logits buffer"
    assert _pair(batch, tiny, 60).no_batch() == "B has no batched step with a [rows, vocab] logits buffer"
    assert _pair(tiny, tiny, 60).no_batch() == "neither manifest has a batched step with a [rows, vocab] logits buffer"
    assert both.common == ("prefill", "decode", "head", "start", "decode_rows", "seed_rows")
    assert _pair(tiny, batch, 60).common == ("prefill", "decode", "head", "start")
