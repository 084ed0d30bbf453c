"""The Qwen3 family as kern_cli sees it: `QWEN3`, registered in the `kern.providers` entry-point
group (tools/qwen3/pyproject.toml) and answering `kern_runtime.providers.Provider` by shape (this
package imports no kern_runtime)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kern_qwen3.chat import STOP_TEXTS, ChatError, render
from kern_qwen3.checkpoint import (
    QWEN3_4B_CONFIG,
    QWEN3_TINY_CONFIG,
    CheckpointError,
    random_checkpoint,
)
from kern_qwen3.errors import ConfigError
from kern_qwen3.fp8_checkpoint import Fp8Layout, random_fp8_checkpoint
from kern_qwen3.shape import shape_from_config

__all__ = ["QWEN3", "Qwen3Provider", "fp8_layout"]


@dataclass(frozen=True, slots=True)
class Qwen3Provider:
    """The Qwen3 family: manifests whose `model` starts with `qwen3` (kern-qwen3's presets)."""

    name: str = "qwen3"
    prefixes: tuple[str, ...] = ("qwen3",)
    stop_texts: tuple[str, ...] = STOP_TEXTS
    special_texts: tuple[str, ...] = ("<|im_start|>", *STOP_TEXTS)
    errors: tuple[type[Exception], ...] = (ChatError, CheckpointError, ConfigError)
    generator: str = "kern-qwen3"

    def render(self, messages: Sequence[Mapping[str, str]]) -> str:
        """Qwen3's chat template (`kern_qwen3.render`), thinking on, the generation prompt added."""
        return render(messages)

    def random_checkpoint(self, manifest: Mapping[str, Any],
                          progress: Callable[[int, int], None] | None) -> tuple[Path, str, bool]:
        """The seeded (0) random Qwen3-4B checkpoint in the cache, the tiny one for a `qwen3-tiny*`
        manifest; written once. A manifest with e4m3 weight buffers gets the FP8 checkpoint of the
        layout its scales name (`fp8_layout`).

        Raises:
            CheckpointError: the cache cannot be written, or an FP8 manifest binds no scales.
        """
        tiny = str(manifest.get("model", "")).lower().startswith("qwen3-tiny")
        config, name, what = ((QWEN3_TINY_CONFIG, "qwen3-tiny", "Qwen3 tiny") if tiny
                              else (QWEN3_4B_CONFIG, "qwen3-4b", "Qwen3-4B"))
        layout = fp8_layout(manifest)
        if layout is None:
            path, written = random_checkpoint(config, seed=0, name=name, progress=progress)
            return path, what, written
        path, written = random_fp8_checkpoint(config, layout=layout, seed=0, name=name, progress=progress)
        return path, f"{what} FP8 ({layout})", written

    def prefill_flops(self, config: Mapping[str, Any], tokens: int) -> float:
        """FLOPs of a Qwen3 forward over `tokens` prompt tokens: every layer's GEMMs for each
        token, causal attention (q.k and p.v over the tokens before each), and the lm_head of the
        last token.

        Raises:
            ConfigError: `config` is not a Qwen3 config.json.
        """
        s = shape_from_config(config)
        per_token = s.hidden * s.qkv_rows + s.heads * s.head_dim * s.hidden + 3 * s.inter * s.hidden
        attention = 2.0 * tokens * tokens * s.head_dim * s.heads  # NOTE: 2 GEMMs x 2 FLOPs x n^2/2 pairs
        return 2.0 * tokens * per_token * s.layers + attention * s.layers + 2.0 * s.vocab * s.hidden


def fp8_layout(manifest: Mapping[str, Any]) -> Fp8Layout | None:
    """The FP8 checkpoint layout a manifest (plain JSON) binds: None without bound e4m3 weight buffers;
    "qwen-fp8" when a weight buffer binds a `*_scale_inv` tensor (Qwen's 128 x 128 block scales),
    "fp8-dynamic" when one binds a `*_scale` tensor (compressed-tensors' per-row scales).

    Raises:
        CheckpointError: e4m3 weight buffers but no scale tensor bound, or both kinds.
    """
    weights = [b for b in manifest.get("buffers", {}).values() if b.get("kind") == "weight"]
    if not any(b.get("dtype") == "fp8e4m3" and b.get("bind") for b in weights):
        return None  # NOTE: e4m3 weights a derive program writes come from a bf16 checkpoint
    names = {str(seg.get("tensor", "")) for b in weights for seg in b.get("bind", ())}
    block = any(n.endswith("_scale_inv") for n in names)
    row = any(n.endswith("_scale") for n in names)
    if block == row:
        which = "both block (_scale_inv) and row (_scale) scales" if block else "no _scale_inv or _scale tensor"
        raise CheckpointError(f"manifest {str(manifest.get('model', ''))[:64]!r} has e4m3 weights but binds {which}: "
                              "no random FP8 checkpoint fits it (pass --weights)")
    return "qwen-fp8" if block else "fp8-dynamic"


QWEN3 = Qwen3Provider()
"""The object the `kern.providers` entry point `qwen3` names."""
