"""kern_qwen3.plan: one frozen Plan, validated where it is made; its passes in order."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

import kern_qwen3 as gen
from kern_qwen3 import QWEN3_TINY_CONFIG


@pytest.mark.parametrize(("fields", "words"), [
    ({"feed": "disk"}, "feed must be one of host, device"),
    ({"precision": "f16"}, "precision must be one of bf16, f32"),
    ({"chunk": 0}, "chunk 0 must be a positive integer"),
    ({"chunk": True}, "chunk True must be a positive integer"),
    ({"gemv": ("attn",)}, "gemv names attn; choose from"),
    ({"picks": {**gen.GEMV_PICK, "o": "kern_gemv_fast"}}, "unknown entries \\['kern_gemv_fast'\\]"),
    ({"picks": {**gen.GEMV_PICK, "o": "kern_gemv_bf16_silu"}}, "outside gate_up \\['o'\\]"),
    ({"gemv": ("o",), "picks": {}}, "no pick for \\['o'\\]"),
    ({"precision": "f32", "fuse": True}, "drop fuse"),
    ({"precision": "f32", "passes": (gen.PDL,)}, "drop pdl"),
])
def test_bad_plans_are_refused_where_they_are_made(fields: dict[str, Any], words: str) -> None:
    with pytest.raises(gen.GenError, match=words) as info:
        gen.Plan(**fields)
    assert "\n" not in str(info.value)


def test_a_plan_is_frozen_and_lists_its_passes_in_order() -> None:
    plan = gen.Plan(gemv=gen.GEMV_GEMMS, fuse=True, passes=gen.plan_passes(fold_norm=True, defer_norm=True, pdl=True))
    assert plan.passes == (gen.DEFER_NORMS, gen.PDL) and plan.bf16_options() == ["gemv", "fuse", "defer_norm", "pdl"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.fuse = False  # type: ignore[misc]
    assert gen.plan_passes(pdl=True) == (gen.PDL,) and gen.plan_passes() == ()
    for flags, words in (({"defer_norm": True}, "needs --fold-norm too"), ({"fold_norm": True}, "give --defer-norm")):
        with pytest.raises(gen.GenError, match=words):
            gen.plan_passes(**flags)


def test_pass_preconditions_and_the_chunk_are_checked_against_the_shape() -> None:
    shape = gen.shape_from_config(QWEN3_TINY_CONFIG)
    with pytest.raises(gen.GenError, match="pdl needs every decode GEMM as our GEMV"):
        gen.Plan(gemv=("o",), passes=(gen.PDL,)).needs(shape)
    with pytest.raises(gen.GenError, match=f"chunk 5000 must be in \\[1, {shape.max_pos}\\]"):
        gen.Plan(chunk=5000).needs(shape)
    plan = gen.Plan(gemv=gen.GEMV_GEMMS, passes=(gen.DEFER_NORMS,))
    assert plan.needs(shape) == ("kern_gemv_bf16_b4_d", "kern_gemv_bf16_b4_silu_d")
