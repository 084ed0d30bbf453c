"""Seeded random FP8 Qwen3 checkpoints, in the two layouts people download.

`random_fp8_checkpoint(config, layout=..., seed=0)` takes the bf16 values `random_checkpoint`
writes for the same (config, seed) and quantises every linear weight of the layers (q/k/v/o,
gate/up/down) to float8_e4m3fn (safetensors "F8_E4M3"); embeddings, norms and lm_head stay bf16.

- `"qwen-fp8"`: Qwen's own FP8 checkpoints. `quantization_config` is `{"quant_method": "fp8",
  "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}`; each weight
  has a float32 `weight_scale_inv` of shape [ceil(n/128), ceil(k/128)], one per 128 x 128 block.
- `"fp8-dynamic"`: compressed-tensors' FP8_DYNAMIC scheme (llm-compressor). Weights per output
  channel (a float32 `weight_scale` of shape [n, 1]), activations per token at run time, lm_head
  ignored; `quantization_config` as compressed-tensors writes it ("float-quantized", "compressed").

Both scales multiply: a weight is `e4m3 value * scale`, where scale = amax / 448 over its block or
row (448 is e4m3's largest finite value), and the e4m3 bytes round `w / scale` to nearest even.
The files are cached beside the bf16 ones (`<cache>/random/<name>-<layout>-<tag>-seed<seed>/`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final, Literal, get_args

import numpy as np
from numpy.typing import NDArray

from kern_qwen3.checkpoint import (
    CheckpointError,
    TensorSpec,
    qwen3_tensor_shapes,
    random_dir,
    tensor_values,
    to_bf16_bits,
    write_checkpoint,
    write_once,
)

__all__ = [
    "E4M3_MAX",
    "FP8_BLOCK",
    "FP8_LAYOUTS",
    "Fp8Layout",
    "dequantised_checkpoint",
    "fp8_quantization_config",
    "from_e4m3_bits",
    "is_fp8_linear",
    "quantize_blocks",
    "quantize_rows",
    "random_fp8_checkpoint",
    "spread_blocks",
    "to_e4m3_bits",
]

Fp8Layout = Literal["qwen-fp8", "fp8-dynamic"]
FP8_LAYOUTS: Final[tuple[Fp8Layout, ...]] = get_args(Fp8Layout)
E4M3_MAX: Final = 448.0
"""float8_e4m3fn's largest finite value."""
FP8_BLOCK: Final = 128
"""The side of a Qwen FP8 weight's scale block."""

_MIN_NORMAL: Final = 2.0**-6
_SUBNORMAL_STEP: Final = 2.0**-9
_LINEARS: Final = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

_F8_ARGS: Final[Mapping[str, Any]] = {
    "num_bits": 8, "type": "float", "symmetric": True, "group_size": None,
    "block_structure": None, "actorder": None, "observer_kwargs": {},
}  # fmt: skip


def fp8_quantization_config(layout: Fp8Layout) -> dict[str, Any]:
    """The `quantization_config` of config.json for a layout.

    Raises:
        CheckpointError: an unknown layout.
    """
    if layout == "qwen-fp8":
        return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                "weight_block_size": [FP8_BLOCK, FP8_BLOCK]}  # fmt: skip
    if layout == "fp8-dynamic":
        weights = {**_F8_ARGS, "strategy": "channel", "dynamic": False, "observer": "minmax"}
        inputs = {**_F8_ARGS, "strategy": "token", "dynamic": True, "observer": None}
        group = {"targets": ["Linear"], "weights": weights, "input_activations": inputs,
                 "output_activations": None}  # fmt: skip
        return {"quant_method": "compressed-tensors", "format": "float-quantized",
                "quantization_status": "compressed", "config_groups": {"group_0": group},
                "ignore": ["lm_head"], "kv_cache_scheme": None,
                "global_compression_ratio": None}  # fmt: skip
    raise CheckpointError(f"unknown FP8 layout {layout!r}; use one of {', '.join(FP8_LAYOUTS)}")


def to_e4m3_bits(x: NDArray[np.float32]) -> NDArray[np.uint8]:
    """float32 -> float8_e4m3fn bytes, rounding to nearest even; magnitudes clip to 448."""
    x = np.asarray(x, dtype=np.float32)
    a = np.minimum(np.abs(x), np.float32(E4M3_MAX))
    u = a.view(np.uint32)
    rounded = (u + np.uint32(0x7FFFF) + ((u >> np.uint32(20)) & np.uint32(1))) >> np.uint32(20)
    normal = rounded - np.uint32(120 << 3)
    subnormal = np.rint(a / np.float32(_SUBNORMAL_STEP)).astype(np.uint32)
    bits = np.where(a >= np.float32(_MIN_NORMAL), normal, subnormal).astype(np.uint8)
    return bits | np.where(np.signbit(x), np.uint8(0x80), np.uint8(0))


def _e4m3_table() -> NDArray[np.float32]:
    codes = np.arange(256)
    exp, man = (codes >> 3) & 0xF, (codes & 7).astype(np.float64)
    mag = np.where(exp == 0, man / 8 * 2.0**-6, (1 + man / 8) * 2.0 ** (exp - 7))
    mag = np.where((exp == 0xF) & (man == 7), np.nan, mag)
    return np.where(codes & 0x80, -mag, mag).astype(np.float32)


_E4M3_VALUES: Final = _e4m3_table()


def from_e4m3_bits(bits: NDArray[np.uint8]) -> NDArray[np.float32]:
    """float8_e4m3fn bytes -> float32 (exact; 0x7F and 0xFF are NaN)."""
    return _E4M3_VALUES[np.asarray(bits, dtype=np.uint8)]


def spread_blocks(scales: NDArray[np.float32], n: int, k: int) -> NDArray[np.float32]:
    """Block scales [ceil(n/128), ceil(k/128)] spread over the [n, k] weights they scale (the last
    block row and column trimmed where partial)."""
    return np.repeat(np.repeat(scales, FP8_BLOCK, axis=0)[:n], FP8_BLOCK, axis=1)[:, :k]


def _scales(amax: NDArray[np.float32]) -> NDArray[np.float32]:
    return np.where(amax > 0, amax / np.float32(E4M3_MAX), np.float32(1)).astype(np.float32)


def quantize_blocks(w: NDArray[np.float32]) -> tuple[NDArray[np.uint8], NDArray[np.float32]]:
    """A [n, k] weight -> (e4m3 bytes [n, k], float32 scales [ceil(n/128), ceil(k/128)]): each
    128 x 128 block (the last row and column of blocks may be partial) scaled by its amax / 448."""
    n, k = w.shape
    nb, kb = -(-n // FP8_BLOCK), -(-k // FP8_BLOCK)
    padded = np.zeros((nb * FP8_BLOCK, kb * FP8_BLOCK), dtype=np.float32)
    padded[:n, :k] = w
    blocks = padded.reshape(nb, FP8_BLOCK, kb, FP8_BLOCK)
    scales = _scales(np.abs(blocks).max(axis=3).max(axis=1))
    scaled = (blocks / scales[:, None, :, None]).reshape(padded.shape)[:n, :k]
    return to_e4m3_bits(scaled), scales


def quantize_rows(w: NDArray[np.float32]) -> tuple[NDArray[np.uint8], NDArray[np.float32]]:
    """A [n, k] weight -> (e4m3 bytes [n, k], float32 scales [n, 1]), each row by amax / 448."""
    scales = _scales(np.abs(w).max(axis=1, keepdims=True))
    return to_e4m3_bits(w / scales), scales


def is_fp8_linear(name: str) -> bool:
    """Whether an FP8 checkpoint stores tensor `name` (a Hugging Face Qwen3 name) as e4m3."""
    parts = name.split(".")
    return name.startswith("model.layers.") and parts[-1] == "weight" and parts[-2] in _LINEARS


def _scale_name(name: str, layout: Fp8Layout) -> str:
    return name + ("_scale_inv" if layout == "qwen-fp8" else "_scale")


def _scale_shape(shape: tuple[int, ...], layout: Fp8Layout) -> tuple[int, int]:
    n, k = shape
    if layout == "qwen-fp8":
        return (-(-n // FP8_BLOCK), -(-k // FP8_BLOCK))
    return (n, 1)


def _layout_tensors(config: Mapping[str, Any], layout: Fp8Layout) -> list[TensorSpec]:
    out: list[TensorSpec] = []
    for name, shape in qwen3_tensor_shapes(config).items():
        if is_fp8_linear(name):
            out.append(TensorSpec(name, "F8_E4M3", shape))
            out.append(TensorSpec(_scale_name(name, layout), "F32", _scale_shape(shape, layout)))
        else:
            out.append(TensorSpec(name, "BF16", shape))
    return out


class _Quantised:
    """The bytes of each tensor, from the bf16 random values of the same seed; a weight is
    quantised once and its scale handed out right after it."""

    def __init__(self, seed: int, layout: Fp8Layout) -> None:
        self.seed = seed
        self.layout: Fp8Layout = layout
        self.quantise = quantize_blocks if layout == "qwen-fp8" else quantize_rows
        self.pending: dict[str, NDArray[np.float32]] = {}

    def data(self, t: TensorSpec) -> bytes:
        if t.dtype == "F32":
            return self.pending.pop(t.name).tobytes()
        bits = tensor_values(self.seed, t.name, t.shape)
        if t.dtype == "BF16":
            return bits.tobytes()
        w = (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)
        q, scales = self.quantise(w)
        self.pending[_scale_name(t.name, self.layout)] = scales
        return q.tobytes()


def _populate(root: Path, config: Mapping[str, Any], layout: Fp8Layout, seed: int,
              progress: Callable[[int, int], None] | None) -> None:  # fmt: skip
    quantised = _Quantised(seed, layout)
    full = {**config, "quantization_config": fp8_quantization_config(layout)}
    write_checkpoint(root, full, _layout_tensors(config, layout), lambda t: (quantised.data(t),), progress)


def random_fp8_checkpoint(
    config: Mapping[str, Any],
    *,
    layout: Fp8Layout,
    seed: int = 0,
    name: str = "qwen3-4b",
    root: Path | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[Path, bool]:
    """Write a seeded random FP8 Qwen3 checkpoint once; return (directory, whether it was written
    now). The same (config, layout, seed) gives byte-identical files.

    Raises:
        CheckpointError: an unknown layout, a config that is not a Qwen3 config, or a directory
            that cannot be written.
    """
    fp8_quantization_config(layout)
    qwen3_tensor_shapes(config)
    target = random_dir(config, name, seed, root, layout)
    return write_once(target, lambda staging: _populate(staging, config, layout, seed, progress), "FP8 checkpoint")


def _dequantised(seed: int, layout: Fp8Layout, t: TensorSpec) -> bytes:
    bits = tensor_values(seed, t.name, t.shape)
    if not is_fp8_linear(t.name):
        return bits.tobytes()
    w = (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)
    n, k = t.shape
    if layout == "qwen-fp8":
        q, scales = quantize_blocks(w)
        spread = spread_blocks(scales, n, k)
    else:
        q, spread = quantize_rows(w)
    return to_bf16_bits(from_e4m3_bits(q) * spread).tobytes()


def dequantised_checkpoint(
    config: Mapping[str, Any],
    *,
    layout: Fp8Layout = "qwen-fp8",
    seed: int = 0,
    name: str = "qwen3-4b",
    root: Path | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[Path, bool]:
    """Write once the bf16 checkpoint whose weights are the random FP8 checkpoint's of the same
    (config, layout, seed) dequantised: each linear weight bf16(e4m3 * its scale), rounded to
    nearest even, every other tensor as it is there; no quantization_config. What transformers (or a
    bf16 manifest) runs as the reference of an FP8 manifest. Returns (directory, written now).

    Raises:
        CheckpointError: an unknown layout, a config that is not a Qwen3 config, or a directory that
            cannot be written.
    """
    fp8_quantization_config(layout)
    tensors = [TensorSpec(n, "BF16", shape) for n, shape in qwen3_tensor_shapes(config).items()]
    target = random_dir(config, name, seed, root, f"{layout}-dequantised")
    return write_once(target, lambda staging: write_checkpoint(
        staging, dict(config), tensors, lambda t: (_dequantised(seed, layout, t),), progress), "dequantised checkpoint")
