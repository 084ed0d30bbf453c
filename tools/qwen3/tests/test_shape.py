"""kern_qwen3.shape: a config.json's numbers, and what it refuses."""

from __future__ import annotations

from typing import Any

import pytest

import kern_qwen3 as gen
from kern_qwen3 import QWEN3_TINY_CONFIG


def test_config_errors() -> None:
    bad: list[tuple[dict[str, Any], str]] = [
        ({**QWEN3_TINY_CONFIG, "model_type": "llama"}, "model_type"),
        ({**QWEN3_TINY_CONFIG, "num_key_value_heads": 3}, "multiple"),
        ({**QWEN3_TINY_CONFIG, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_type"),
        ({**QWEN3_TINY_CONFIG, "attention_bias": True}, "attention_bias"),
        ({**QWEN3_TINY_CONFIG, "hidden_size": -1}, "hidden_size"),
        ({**QWEN3_TINY_CONFIG, "rms_norm_eps": 0}, "rms_norm_eps"),
        ({k: v for k, v in QWEN3_TINY_CONFIG.items() if k != "rope_theta"}, "rope_theta"),
    ]
    for cfg, word in bad:
        with pytest.raises(gen.ConfigError, match=word):
            gen.shape_from_config(cfg)


def test_transformers5_rope_parameters_are_read() -> None:
    cfg = {k: v for k, v in QWEN3_TINY_CONFIG.items() if k not in ("rope_theta", "rope_scaling")}
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 5e5}
    assert gen.shape_from_config(cfg).theta == 5e5




@pytest.mark.parametrize("head_dim", [0, -128, 128.0, "128", True, 3])
def test_a_given_head_dim_must_be_a_positive_even_integer(head_dim: object) -> None:
    with pytest.raises(gen.ConfigError, match="'head_dim' must be"):
        gen.shape_from_config({**QWEN3_TINY_CONFIG, "head_dim": head_dim})


def test_an_absent_head_dim_is_hidden_over_heads_when_that_divides() -> None:
    cfg = {k: v for k, v in QWEN3_TINY_CONFIG.items() if k != "head_dim"}
    assert gen.shape_from_config(cfg).head_dim == 256 // 4
    assert gen.shape_from_config({**cfg, "head_dim": None}).head_dim == 64
    with pytest.raises(gen.ConfigError, match="not a multiple of 3 attention heads"):
        gen.shape_from_config({**cfg, "num_attention_heads": 3, "num_key_value_heads": 1})


def test_presets_are_the_checkpoint_configs_and_others_are_refused() -> None:
    assert gen.preset("qwen3-tiny") is QWEN3_TINY_CONFIG and set(gen.PRESETS) == {"qwen3-4b", "qwen3-tiny"}
    with pytest.raises(gen.ConfigError, match="choose from qwen3-4b, qwen3-tiny"):
        gen.preset("qwen3-8b")
