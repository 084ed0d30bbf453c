"""Random Qwen3 checkpoints: names and shapes as Hugging Face writes them, bf16, seeded, cached."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open

from kern_qwen3.checkpoint import (
    QWEN3_4B_CONFIG,
    QWEN3_TINY_CONFIG,
    CheckpointError,
    cache_dir,
    qwen3_tensor_shapes,
    random_checkpoint,
    to_bf16_bits,
)


def _read(path: Path) -> dict[str, np.ndarray]:
    """Parse a safetensors file by hand (numpy has no bf16): name -> uint16 array."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    header.pop("__metadata__")
    base = 8 + n
    out = {}
    for name, meta in header.items():
        assert meta["dtype"] == "BF16"
        a, b = meta["data_offsets"]
        out[name] = np.frombuffer(raw[base + a : base + b], dtype=np.uint16).reshape(meta["shape"])
    return out


def _bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def test_tiny_checkpoint_has_every_tensor_bf16_nonzero(tmp_path: Path) -> None:
    root, written = random_checkpoint(QWEN3_TINY_CONFIG, seed=3, name="tiny", root=tmp_path)
    assert written
    tensors: dict[str, np.ndarray] = {}
    for f in sorted(root.glob("*.safetensors")):
        with safe_open(f, framework="numpy") as st:  # the reference reader accepts the header
            names = set(st.keys())
        part = _read(f)
        assert set(part) == names
        tensors |= part
    shapes = qwen3_tensor_shapes(QWEN3_TINY_CONFIG)
    assert {k: tuple(v.shape) for k, v in tensors.items()} == shapes
    assert "lm_head.weight" not in tensors  # tied
    emb = _bf16_to_f32(tensors["model.embed_tokens.weight"])
    assert np.count_nonzero(emb == 0) < emb.size // 1000
    assert 0.015 < float(emb.std()) < 0.025
    norm = _bf16_to_f32(tensors["model.norm.weight"])
    assert 0.9 < float(norm.mean()) < 1.1
    index = json.loads((root / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(shapes)
    assert json.loads((root / "config.json").read_text()) == dict(QWEN3_TINY_CONFIG)


def test_checkpoint_is_written_once_and_seeded(tmp_path: Path) -> None:
    a, first = random_checkpoint(QWEN3_TINY_CONFIG, seed=1, name="tiny", root=tmp_path)
    stamp = (a / "model-00001-of-00001.safetensors").stat().st_mtime_ns
    again, second = random_checkpoint(QWEN3_TINY_CONFIG, seed=1, name="tiny", root=tmp_path)
    assert (first, second) == (True, False) and again == a
    assert (a / "model-00001-of-00001.safetensors").stat().st_mtime_ns == stamp
    b, _ = random_checkpoint(QWEN3_TINY_CONFIG, seed=2, name="tiny", root=tmp_path / "other")
    ta, tb = _read(next(a.glob("*.safetensors"))), _read(next(b.glob("*.safetensors")))
    assert not np.array_equal(ta["model.norm.weight"], tb["model.norm.weight"])
    c, _ = random_checkpoint(QWEN3_TINY_CONFIG, seed=1, name="tiny", root=tmp_path / "third")
    assert (a / "model-00001-of-00001.safetensors").read_bytes() == (
        c / "model-00001-of-00001.safetensors"
    ).read_bytes()


def test_partial_directory_is_rebuilt(tmp_path: Path) -> None:
    root, _ = random_checkpoint(QWEN3_TINY_CONFIG, seed=0, name="tiny", root=tmp_path)
    (root / "COMPLETE").unlink()
    (root / "config.json").write_text("garbage")
    again, written = random_checkpoint(QWEN3_TINY_CONFIG, seed=0, name="tiny", root=tmp_path)
    assert written and again == root
    assert json.loads((root / "config.json").read_text())["hidden_size"] == 256


def test_untied_config_has_lm_head() -> None:
    shapes = qwen3_tensor_shapes({**QWEN3_TINY_CONFIG, "tie_word_embeddings": False})
    assert shapes["lm_head.weight"] == (4096, 256)


def test_4b_shapes_total_bytes() -> None:
    shapes = qwen3_tensor_shapes(QWEN3_4B_CONFIG)
    params = sum(int(np.prod(s)) for s in shapes.values())
    assert params == 4_022_468_096  # Qwen3-4B: 4.02 B parameters (tied)
    assert len(shapes) == 2 + 36 * 11


def test_bad_config_is_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="hidden_size"):
        random_checkpoint({**QWEN3_TINY_CONFIG, "hidden_size": 0}, root=tmp_path)
    assert not (tmp_path / "random").exists()


def test_unwritable_cache_is_a_typed_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(CheckpointError, match="cannot write"):
        random_checkpoint(QWEN3_TINY_CONFIG, root=blocker)


def test_bf16_rounding_is_nearest_even() -> None:
    x = np.array([1.0, -2.5, 1.0 + 2**-8, 1.0 + 3 * 2**-8, 1e-3], dtype=np.float32)
    bits = to_bf16_bits(x)
    assert bits.tolist() == [0x3F80, 0xC020, 0x3F80, 0x3F82, 0x3A83]


def test_cache_dir_honours_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KERN_CACHE_DIR", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"
    monkeypatch.delenv("KERN_CACHE_DIR")
    assert cache_dir() == Path.home() / ".cache" / "kern"


def test_files_hold_tensor_values(tmp_path: Path) -> None:
    from kern_qwen3.checkpoint import tensor_values

    root, _ = random_checkpoint(QWEN3_TINY_CONFIG, seed=4, name="tiny", root=tmp_path)
    part = _read(next(root.glob("*.safetensors")))
    for name in ("model.embed_tokens.weight", "model.layers.1.mlp.down_proj.weight", "model.norm.weight"):
        assert np.array_equal(part[name], tensor_values(4, name, part[name].shape))
    a = part["model.layers.0.mlp.up_proj.weight"]
    b = part["model.layers.1.mlp.up_proj.weight"]
    assert not np.array_equal(a, b)  # distinct windows per tensor
    assert len({bytes(r) for r in a[:64]}) == 64  # no repeated rows
