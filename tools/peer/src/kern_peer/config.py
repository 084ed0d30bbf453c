"""A Qwen3 checkpoint's config.json and files, read without torch."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["PeerConfig", "PeerConfigError", "checkpoint_files", "read_config"]


class PeerConfigError(Exception):
    """The checkpoint is missing, or its config.json is not a Qwen3 one this peer runs."""


@dataclass(frozen=True, slots=True)
class PeerConfig:
    """The numbers of a Qwen3 config.json the peer's model uses."""

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
    def group(self) -> int:
        """Query heads per KV head."""
        return self.heads // self.kv_heads


def _int(cfg: dict[str, Any], key: str) -> int:
    v = cfg.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise PeerConfigError(f"config.json: {key!r} must be a positive integer, got {v!r}")
    return v


def _theta(cfg: dict[str, Any]) -> float:
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    kind = params.get("rope_type", params.get("type", "default")) if isinstance(params, dict) else None
    if kind != "default":
        raise PeerConfigError(f"config.json: rope {params!r} is not supported (only the default rope)")
    theta = cfg.get("rope_theta", params.get("rope_theta"))
    if isinstance(theta, bool) or not isinstance(theta, int | float) or theta <= 0:
        raise PeerConfigError(f"config.json: 'rope_theta' must be a positive number, got {theta!r}")
    return float(theta)


def parse_config(cfg: dict[str, Any]) -> PeerConfig:
    """The Qwen3 numbers of a config.json object.

    Raises:
        PeerConfigError: not a plain Qwen3 config.
    """
    if cfg.get("model_type") != "qwen3":
        raise PeerConfigError(f"config.json: model_type must be 'qwen3', got {cfg.get('model_type')!r}")
    heads, kv = _int(cfg, "num_attention_heads"), _int(cfg, "num_key_value_heads")
    if heads % kv:
        raise PeerConfigError(f"config.json: {heads} attention heads are not a multiple of {kv} kv heads")
    hidden = _int(cfg, "hidden_size")
    head_dim = _int(cfg, "head_dim") if cfg.get("head_dim") is not None else hidden // heads
    if head_dim % 2:
        raise PeerConfigError(f"config.json: head_dim {head_dim} is odd (rope rotates pairs)")
    if cfg.get("attention_bias", False):
        raise PeerConfigError("config.json: 'attention_bias' true is not supported (the peer's projections have no bias)")
    eps = cfg.get("rms_norm_eps")
    if not isinstance(eps, float) or not 0 < eps < 1:
        raise PeerConfigError(f"config.json: 'rms_norm_eps' must be a float in (0, 1), got {eps!r}")
    return PeerConfig(hidden=hidden, layers=_int(cfg, "num_hidden_layers"), heads=heads, kv_heads=kv,
                      head_dim=head_dim, inter=_int(cfg, "intermediate_size"), vocab=_int(cfg, "vocab_size"),
                      eps=eps, theta=_theta(cfg), tied=bool(cfg.get("tie_word_embeddings", False)),
                      max_pos=_int(cfg, "max_position_embeddings"))


def checkpoint_files(weights: Sequence[Path]) -> tuple[Path, list[Path]]:
    """(config.json, the .safetensors files) of a checkpoint given as a directory or its files
    (config.json beside the first file).

    Raises:
        PeerConfigError: a path is missing, a directory holds no .safetensors, no config.json.
    """
    if not weights:
        raise PeerConfigError("--weights needs a checkpoint directory or .safetensors files")
    files: list[Path] = []
    for p in weights:
        if p.is_dir():
            found = sorted(p.glob("*.safetensors"))
            if not found:
                raise PeerConfigError(f"weights {p}: directory holds no .safetensors file")
            files += found
        elif p.is_file():
            files.append(p)
        else:
            raise PeerConfigError(f"weights {p}: no such file or directory")
    config = (weights[0] if weights[0].is_dir() else weights[0].parent) / "config.json"
    if not config.is_file():
        raise PeerConfigError(f"weights {weights[0]}: no config.json beside them ({config})")
    return config, files


def read_config(path: Path) -> PeerConfig:
    """Parse a config.json file.

    Raises:
        PeerConfigError: unreadable, not JSON, or not a Qwen3 config.
    """
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise PeerConfigError(f"{path}: {exc}") from None
    if not isinstance(data, dict):
        raise PeerConfigError(f"{path}: not a JSON object")
    return parse_config(data)
