"""A Qwen3 config.json -> the numbers the manifest depends on (`Qwen3Shape`), and the presets."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kern_qwen3.checkpoint import QWEN3_4B_CONFIG, QWEN3_TINY_CONFIG
from kern_qwen3.errors import ConfigError

__all__ = ["MAX_ROPE_POSITIONS", "PAGE_TOKENS", "PRESETS", "Qwen3Shape", "preset", "shape_from_config"]

PAGE_TOKENS = 16
"""Tokens per KV page (docs/qwen3.md "KV state layout")."""
MAX_ROPE_POSITIONS = 131072
"""The most positions a manifest's rope tables hold (a config's max_position_embeddings is capped)."""

PRESETS: Mapping[str, Mapping[str, Any]] = {"qwen3-4b": QWEN3_4B_CONFIG, "qwen3-tiny": QWEN3_TINY_CONFIG}
"""Built-in configs by name (`kern-qwen3 --preset NAME`)."""


@dataclass(frozen=True, slots=True)
class Qwen3Shape:
    """The numbers of a Qwen3 config that the manifest depends on."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    vocab: int
    eps: float
    theta: float
    tied: bool
    max_pos: int

    @property
    def qkv_rows(self) -> int:
        """Rows of the concatenated q/k/v projection."""
        return (self.heads + 2 * self.kv_heads) * self.head_dim

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of bf16 KV cache one token takes over all layers."""
        return self.layers * 2 * self.kv_heads * self.head_dim * 2

    @property
    def page_stride(self) -> int:
        """Elements from one KV page to the next: every layer's k and v for PAGE_TOKENS tokens."""
        return self.layers * 2 * PAGE_TOKENS * self.kv_heads * self.head_dim

    def kv_offset(self, layer: int) -> int:
        """Byte offset of `layer`'s k|v block inside a page of the `kv` state."""
        return layer * 2 * PAGE_TOKENS * self.kv_heads * self.head_dim * 2

    @property
    def max_pages(self) -> int:
        """Block-table entries: the pages of positions 0 .. max_pos. The last one is the position after
        the model's reach, which kern_decode_advance maps (reads) after the step at the last position."""
        return self.max_pos // PAGE_TOKENS + 1


def preset(name: str) -> Mapping[str, Any]:
    """The config.json of a built-in preset.

    Raises:
        ConfigError: `name` is not one of PRESETS.
    """
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
    return PRESETS[name]


def _int_field(cfg: Mapping[str, Any], key: str) -> int:
    value = cfg.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"config.json: {key!r} must be a positive integer, got {value!r}")
    return value


def _head_dim(cfg: Mapping[str, Any], hidden: int, heads: int) -> int:
    """The config's head_dim (absent or null: hidden_size / num_attention_heads, which must divide)."""
    if cfg.get("head_dim") is None:
        if hidden % heads:
            raise ConfigError(f"config.json: no 'head_dim', and hidden_size {hidden} is not a multiple of "
                              f"{heads} attention heads: give 'head_dim'")
        head_dim = hidden // heads
    else:
        head_dim = _int_field(cfg, "head_dim")
    if head_dim % 2:
        raise ConfigError(f"config.json: 'head_dim' must be an even integer, got {head_dim!r}")
    return head_dim


def _rope_theta(cfg: Mapping[str, Any]) -> float:
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if not isinstance(params, Mapping):
        raise ConfigError(f"config.json: rope parameters must be an object, got {params!r}")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "default":
        raise ConfigError(f"config.json: rope_type {kind!r} is not supported (only 'default')")
    theta = cfg.get("rope_theta", params.get("rope_theta"))
    if not isinstance(theta, int | float) or isinstance(theta, bool) or not 0 < theta < math.inf:
        raise ConfigError(f"config.json: 'rope_theta' must be a positive number, got {theta!r}")
    return float(theta)


def shape_from_config(cfg: Mapping[str, Any]) -> Qwen3Shape:
    """Read the Qwen3 numbers from a Hugging Face config.json object.

    Raises:
        ConfigError: a field is missing or out of range, or the model is not a plain Qwen3.
    """
    arch = cfg.get("model_type")
    if arch != "qwen3":
        raise ConfigError(f"config.json: model_type must be 'qwen3', got {arch!r}")
    if cfg.get("attention_bias", False):
        raise ConfigError("config.json: attention_bias=true is not supported (Qwen3 has none)")
    heads, kv_heads = _int_field(cfg, "num_attention_heads"), _int_field(cfg, "num_key_value_heads")
    if heads % kv_heads:
        raise ConfigError(f"config.json: {heads} attention heads are not a multiple of {kv_heads} kv heads")
    hidden = _int_field(cfg, "hidden_size")
    eps = cfg.get("rms_norm_eps")
    if not isinstance(eps, float) or not 0 < eps < 1:
        raise ConfigError(f"config.json: 'rms_norm_eps' must be a float in (0, 1), got {eps!r}")
    return Qwen3Shape(
        hidden=hidden,
        layers=_int_field(cfg, "num_hidden_layers"),
        heads=heads,
        kv_heads=kv_heads,
        head_dim=_head_dim(cfg, hidden, heads),
        inter=_int_field(cfg, "intermediate_size"),
        vocab=_int_field(cfg, "vocab_size"),
        eps=eps,
        theta=_rope_theta(cfg),
        tied=bool(cfg.get("tie_word_embeddings", False)),
        max_pos=min(_int_field(cfg, "max_position_embeddings"), MAX_ROPE_POSITIONS),
    )
