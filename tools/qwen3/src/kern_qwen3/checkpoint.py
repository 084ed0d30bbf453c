"""Seeded random Qwen3 checkpoints for runs without real weights.

`random_checkpoint(config, seed=0)` writes `config.json` plus safetensors shards (bf16, named as
Hugging Face names them) under `<cache>/random/<name>-seed<seed>/` once and returns the
directory; later calls find the `COMPLETE` marker and return at once. Values are
N(0, 0.02) for matrices (the Qwen3 initializer range) and 1 + N(0, 0.02) for norm weights, rounded
to bf16 (round to nearest even): realistic magnitudes, never zeros. Each tensor is a window of a
seeded pool of 2^24 + 17 such values starting at an offset drawn from (seed, tensor name), so
writing the 8 GB of a 4B checkpoint runs at memory speed. The cache is `$KERN_CACHE_DIR`
or `~/.cache/kern`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "QWEN3_4B_CONFIG",
    "QWEN3_TINY_CONFIG",
    "CheckpointError",
    "Pieces",
    "TensorSpec",
    "cache_dir",
    "iter_weight_files",
    "qwen3_tensor_shapes",
    "random_checkpoint",
    "random_dir",
    "tensor_values",
    "to_bf16_bits",
    "write_checkpoint",
    "write_once",
]

QWEN3_4B_CONFIG: Mapping[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2560,
    "initializer_range": 0.02,
    "intermediate_size": 9728,
    "max_position_embeddings": 40960,
    "max_window_layers": 36,
    "model_type": "qwen3",
    "num_attention_heads": 32,
    "num_hidden_layers": 36,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
"""The Qwen3-4B config.json (Hugging Face Qwen/Qwen3-4B)."""

QWEN3_TINY_CONFIG: Mapping[str, Any] = {
    **QWEN3_4B_CONFIG,
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "max_window_layers": 2,
    "max_position_embeddings": 4096,
    "vocab_size": 4096,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
"""A 2-layer Qwen3 with the 4B's head_dim, for fast correctness runs."""

SHARD_BYTES = 2 << 30
POOL = (1 << 24) + 17
"""Values drawn per seed; tensors read windows of it (fast: a 4B checkpoint is 8 GB)."""
_SCALE = 0.02


class CheckpointError(Exception):
    """The config cannot describe a Qwen3 checkpoint, or the cache dir cannot be written."""


def cache_dir() -> Path:
    """`$KERN_CACHE_DIR`, else `~/.cache/kern`."""
    env = os.environ.get("KERN_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "kern"


def _dim(config: Mapping[str, Any], key: str) -> int:
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise CheckpointError(f"config {key!r} must be a positive integer, got {value!r}")
    return value


def qwen3_tensor_shapes(config: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every tensor of a Qwen3 checkpoint by Hugging Face name, in layer order.

    Raises:
        CheckpointError: a dimension is missing or not a positive integer.
    """
    h, inter, vocab = _dim(config, "hidden_size"), _dim(config, "intermediate_size"), _dim(config, "vocab_size")
    nq, nkv = _dim(config, "num_attention_heads"), _dim(config, "num_key_value_heads")
    d = config.get("head_dim") or h // nq
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, h)}
    for i in range(_dim(config, "num_hidden_layers")):
        p = f"model.layers.{i}"
        shapes |= {
            f"{p}.input_layernorm.weight": (h,),
            f"{p}.self_attn.q_proj.weight": (nq * d, h),
            f"{p}.self_attn.k_proj.weight": (nkv * d, h),
            f"{p}.self_attn.v_proj.weight": (nkv * d, h),
            f"{p}.self_attn.q_norm.weight": (d,),
            f"{p}.self_attn.k_norm.weight": (d,),
            f"{p}.self_attn.o_proj.weight": (h, nq * d),
            f"{p}.post_attention_layernorm.weight": (h,),
            f"{p}.mlp.gate_proj.weight": (inter, h),
            f"{p}.mlp.up_proj.weight": (inter, h),
            f"{p}.mlp.down_proj.weight": (h, inter),
        }
    shapes["model.norm.weight"] = (h,)
    if not config.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = (vocab, h)
    return shapes


def to_bf16_bits(x: NDArray[np.float32]) -> NDArray[np.uint16]:
    """float32 -> bf16 bit patterns (uint16), rounding to nearest even (NaN is not expected)."""
    u = x.astype(np.float32, copy=False).view(np.uint32)
    rounded = u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))
    return (rounded >> np.uint32(16)).astype(np.uint16)


@functools.cache
def _pool(seed: int, norm: bool) -> NDArray[np.uint16]:
    rng = np.random.default_rng([seed, int(norm)])
    x = rng.standard_normal(POOL, dtype=np.float32)
    x *= np.float32(_SCALE)
    if norm:
        x += np.float32(1.0)
    return to_bf16_bits(x)


def _windows(seed: int, name: str, shape: tuple[int, ...]) -> Iterator[NDArray[np.uint16]]:
    """The tensor's values as views of the seeded pool: a window starting at a per-name offset,
    wrapping around (no copy: the slices go straight to the file)."""
    pool = _pool(seed, len(shape) == 1)
    n = int(np.prod(shape))
    start = int(_seed_for(seed, name).integers(0, POOL))
    pos = 0
    while pos < n:
        take = min(n - pos, POOL - start)
        yield pool[start : start + take]
        pos += take
        start = 0


def tensor_values(seed: int, name: str, shape: tuple[int, ...]) -> NDArray[np.uint16]:
    """The bf16 bits random_checkpoint writes for one tensor (for tests and tools)."""
    return np.concatenate(list(_windows(seed, name, shape))).reshape(shape)


_DTYPE_BYTES = {"BF16": 2, "F8_E4M3": 1, "F32": 4}


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One tensor of a checkpoint being written: its name, safetensors dtype and shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        """Its bytes in the file."""
        return int(np.prod(self.shape)) * _DTYPE_BYTES[self.dtype]


Pieces = Callable[[TensorSpec], Iterable[Any]]
"""A tensor's bytes in order, as buffers (bytes or contiguous arrays)."""


def _shards(tensors: Sequence[TensorSpec]) -> list[list[TensorSpec]]:
    shards: list[list[TensorSpec]] = [[]]
    size = 0
    for t in tensors:
        if shards[-1] and size + t.nbytes > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += t.nbytes
    return shards


def _write_safetensors(path: Path, tensors: Sequence[TensorSpec], pieces: Pieces,
                       wrote: Callable[[int], None]) -> None:
    """Stream tensors into one safetensors file (the header first, then each tensor's pieces)."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for t in tensors:
        header[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for t in tensors:
            for piece in pieces(t):
                f.write(piece)
                wrote(memoryview(piece).nbytes)


def write_checkpoint(root: Path, config: Mapping[str, Any], tensors: Sequence[TensorSpec], pieces: Pieces,
                     progress: Callable[[int, int], None] | None) -> None:
    """A Hugging Face checkpoint in `root`: the tensors in shards of at most SHARD_BYTES, their
    index, and `config` as config.json; `progress(done, total)` after each piece."""
    total = sum(t.nbytes for t in tensors)
    done = 0

    def wrote(n: int) -> None:
        nonlocal done
        done += n
        if progress is not None:
            progress(done, total)

    shards = _shards(tensors)
    weight_map: dict[str, str] = {}
    for n, part in enumerate(shards, start=1):
        file = f"model-{n:05d}-of-{len(shards):05d}.safetensors"
        _write_safetensors(root / file, part, pieces, wrote)
        weight_map |= dict.fromkeys((t.name for t in part), file)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=1) + "\n")
    (root / "config.json").write_text(json.dumps(dict(config), indent=1) + "\n")


def _seed_for(seed: int, name: str) -> np.random.Generator:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def _populate(root: Path, config: Mapping[str, Any], seed: int,
              progress: Callable[[int, int], None] | None) -> None:
    tensors = [TensorSpec(name, "BF16", shape) for name, shape in qwen3_tensor_shapes(config).items()]
    write_checkpoint(root, config, tensors, lambda t: _windows(seed, t.name, t.shape), progress)


def random_checkpoint(
    config: Mapping[str, Any],
    *,
    seed: int = 0,
    name: str = "qwen3-4b",
    root: Path | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[Path, bool]:
    """Write a seeded random Qwen3 checkpoint once; return (directory, whether it was written now).

    The same (config, seed) gives byte-identical files. A partly written directory (no `COMPLETE`
    marker) is rebuilt.

    Raises:
        CheckpointError: the config is not a Qwen3 config, or the directory cannot be written.
    """
    qwen3_tensor_shapes(config)
    target = random_dir(config, name, seed, root)
    return write_once(target, lambda staging: _populate(staging, config, seed, progress), "random checkpoint")


def random_dir(config: Mapping[str, Any], name: str, seed: int, root: Path | None, layout: str = "") -> Path:
    """Where the seeded random checkpoint of `config` (in `layout`, "" for bf16) lives:
    `<root or cache>/random/<name>[-<layout>]-<config sha256 prefix>-seed<seed>`."""
    tag = hashlib.sha256(json.dumps(dict(config), sort_keys=True).encode()).hexdigest()[:8]
    return (root or cache_dir()) / "random" / "-".join(p for p in (name, layout, tag, f"seed{seed}") if p)


def write_once(target: Path, populate: Callable[[Path], None], what: str) -> tuple[Path, bool]:
    """`target` as `populate` writes it into a staging directory, renamed into place with a
    `COMPLETE` marker; a complete target is kept, a partial one rebuilt. Returns (target, written now).

    Raises:
        CheckpointError: the directory cannot be written.
    """
    if (target / "COMPLETE").is_file():
        return target, False
    staging = target.with_name(target.name + ".partial")
    try:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        populate(staging)
        (staging / "COMPLETE").write_text("ok\n")
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise CheckpointError(f"cannot write the {what} under {target.parent}: {exc}") from exc
    return target, True


def iter_weight_files(directory: Path) -> Iterator[Path]:
    """The safetensors files of a checkpoint directory, sorted by name."""
    yield from sorted(directory.glob("*.safetensors"))
