"""Random FP8 Qwen3 checkpoints: e4m3 bytes by round-to-nearest-even, block and per-channel
scales, both layouts' names, dtypes, shapes and config, and values within e4m3's error of the
bf16 random weights of the same seed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray
from safetensors import safe_open

from kern_qwen3 import (
    E4M3_MAX,
    FP8_LAYOUTS,
    QWEN3_TINY_CONFIG,
    CheckpointError,
    Fp8Layout,
    from_e4m3_bits,
    is_fp8_linear,
    quantize_blocks,
    quantize_rows,
    qwen3_tensor_shapes,
    random_fp8_checkpoint,
    tensor_values,
    to_bf16_bits,
    to_e4m3_bits,
)
from kern_runtime import FileBlob, Safetensors, TensorInfo

_FINITE = np.array([c for c in range(256) if c & 0x7F != 0x7F], dtype=np.uint8)
_SUBNORMAL_HALF_STEP = 2.0**-10


def _bf16(bits: NDArray[np.uint16]) -> NDArray[np.float32]:
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def _within_e4m3(deq: NDArray[np.float32], w: NDArray[np.float32], scale: NDArray[np.float32]) -> None:
    """Round to nearest in e4m3 is off by at most 2^-4 relative (normals) or half a subnormal
    step, 2^-10 x scale, plus float32 slack."""
    bound = 2.0**-4 * np.abs(w) + _SUBNORMAL_HALF_STEP * scale
    assert np.all(np.abs(deq - w) <= bound * (1 + 1e-6))


def test_every_finite_e4m3_value_round_trips() -> None:
    np.testing.assert_array_equal(to_e4m3_bits(from_e4m3_bits(_FINITE)), _FINITE)
    assert from_e4m3_bits(np.array([0x7E, 0x08, 0x01], dtype=np.uint8)).tolist() == [448.0, 2.0**-6, 2.0**-9]
    assert np.isnan(from_e4m3_bits(np.array([0x7F, 0xFF], dtype=np.uint8))).all()


def test_midpoints_round_to_the_even_code() -> None:
    codes = np.arange(0x7F, dtype=np.uint8)
    values = from_e4m3_bits(codes).astype(np.float64)
    mids = ((values[:-1] + values[1:]) / 2).astype(np.float32)
    got = to_e4m3_bits(mids)
    even = np.where(codes[:-1] % 2 == 0, codes[:-1], codes[1:])
    np.testing.assert_array_equal(got, even)
    np.testing.assert_array_equal(to_e4m3_bits(-mids), even | 0x80)


def test_magnitudes_past_448_clip() -> None:
    big = np.array([449.0, 470.0, 1e6, -1e6], dtype=np.float32)
    assert to_e4m3_bits(big).tolist() == [0x7E, 0x7E, 0x7E, 0xFE]


def test_block_scales_cover_partial_blocks() -> None:
    w = np.random.default_rng(1).standard_normal((200, 300), dtype=np.float32)
    w[130:, 260:] *= 1000
    q, s = quantize_blocks(w)
    assert q.dtype == np.uint8 and q.shape == (200, 300)
    assert s.dtype == np.float32 and s.shape == (2, 3)
    assert s[1, 2] == np.float32(np.abs(w[128:, 256:]).max() / np.float32(E4M3_MAX))
    full = np.repeat(np.repeat(s, 128, 0), 128, 1)[:200, :300]
    deq = from_e4m3_bits(q) * full
    _within_e4m3(deq, w, full)
    assert np.abs(deq).max() == pytest.approx(np.abs(w).max(), rel=1e-6)


def test_row_scales_are_per_output_channel() -> None:
    w = np.random.default_rng(2).standard_normal((64, 96), dtype=np.float32)
    w[5] *= 100
    q, s = quantize_rows(w)
    assert s.shape == (64, 1) and s.dtype == np.float32
    np.testing.assert_array_equal(s[:, 0], np.abs(w).max(axis=1) / np.float32(E4M3_MAX))
    _within_e4m3(from_e4m3_bits(q) * s, w, np.broadcast_to(s, w.shape))


def _read(info: TensorInfo) -> NDArray[np.generic]:
    blob = info.blob
    assert isinstance(blob, FileBlob)
    dtype = {"fp8e4m3": np.uint8, "f32": np.float32, "bf16": np.uint16}[info.dtype]
    with open(blob.path, "rb") as f:
        f.seek(blob.offset)
        raw = f.read(blob.nbytes)
    return np.frombuffer(raw, dtype=dtype).reshape(info.shape)


_SCALE = {"qwen-fp8": "weight_scale_inv", "fp8-dynamic": "weight_scale"}


def _scale_shape(layout: Fp8Layout, shape: tuple[int, ...]) -> tuple[int, ...]:
    n, k = shape
    return (-(-n // 128), -(-k // 128)) if layout == "qwen-fp8" else (n, 1)


@pytest.mark.parametrize("layout", FP8_LAYOUTS)
def test_tiny_fp8_checkpoint_layout(layout: Fp8Layout, tmp_path: Path) -> None:
    root, written = random_fp8_checkpoint(
        QWEN3_TINY_CONFIG, layout=layout, seed=3, name="tiny", root=tmp_path
    )
    assert written
    st = Safetensors.open(root)
    shapes = qwen3_tensor_shapes(QWEN3_TINY_CONFIG)
    linears = [n for n in shapes if is_fp8_linear(n)]
    assert len(linears) == 7 * 2
    scales = {n.removesuffix("weight") + _SCALE[layout] for n in linears}
    assert set(st.names()) == set(shapes) | scales
    for name, shape in shapes.items():
        info = st.get(name)
        assert info is not None and info.shape == shape
        assert info.dtype == ("fp8e4m3" if name in linears else "bf16"), name
    for name in scales:
        info = st.get(name)
        weight = name.rsplit(".", 1)[0] + ".weight"
        assert info is not None and info.dtype == "f32"
        assert info.shape == _scale_shape(layout, shapes[weight])
    for f in root.glob("*.safetensors"):
        with safe_open(f, framework="numpy") as ref:
            assert set(ref.keys()) <= set(st.names())


@pytest.mark.parametrize("layout", FP8_LAYOUTS)
def test_tiny_fp8_weights_are_the_bf16_weights_quantised(layout: Fp8Layout, tmp_path: Path) -> None:
    root, _ = random_fp8_checkpoint(QWEN3_TINY_CONFIG, layout=layout, seed=3, name="tiny", root=tmp_path)
    st = Safetensors.open(root)
    for name, shape in qwen3_tensor_shapes(QWEN3_TINY_CONFIG).items():
        info = st.get(name)
        assert info is not None
        bits = tensor_values(3, name, shape)
        if not is_fp8_linear(name):
            np.testing.assert_array_equal(_read(info), bits)
            continue
        scale_info = st.get(name.removesuffix("weight") + _SCALE[layout])
        assert scale_info is not None
        s = _read(scale_info).astype(np.float32)
        assert np.all(s > 0)
        full = np.broadcast_to(np.repeat(np.repeat(s, 128, 0), 128, 1)[: shape[0], : shape[1]]
                               if layout == "qwen-fp8" else s, shape)  # fmt: skip
        w = _bf16(bits)
        deq = from_e4m3_bits(_read(info).astype(np.uint8)) * full
        _within_e4m3(deq, w, full)
        assert np.count_nonzero(deq == 0) < deq.size // 1000


def test_config_names_the_layout(tmp_path: Path) -> None:
    qwen, _ = random_fp8_checkpoint(QWEN3_TINY_CONFIG, layout="qwen-fp8", root=tmp_path)
    ct, _ = random_fp8_checkpoint(QWEN3_TINY_CONFIG, layout="fp8-dynamic", root=tmp_path)
    q = json.loads((qwen / "config.json").read_text())
    assert q["quantization_config"] == {
        "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
        "weight_block_size": [128, 128],
    }  # fmt: skip
    c = json.loads((ct / "config.json").read_text())["quantization_config"]
    assert (c["quant_method"], c["format"], c["ignore"]) == ("compressed-tensors", "float-quantized", ["lm_head"])
    group = c["config_groups"]["group_0"]
    assert group["targets"] == ["Linear"]
    assert (group["weights"]["strategy"], group["weights"]["dynamic"]) == ("channel", False)
    assert (group["input_activations"]["strategy"], group["input_activations"]["dynamic"]) == ("token", True)
    index = json.loads((ct / "model.safetensors.index.json").read_text())
    assert "model.layers.0.mlp.down_proj.weight_scale" in index["weight_map"]


def test_same_seed_same_bytes_and_cached(tmp_path: Path) -> None:
    a, written = random_fp8_checkpoint(QWEN3_TINY_CONFIG, layout="qwen-fp8", seed=5, root=tmp_path / "a")
    b, _ = random_fp8_checkpoint(QWEN3_TINY_CONFIG, layout="qwen-fp8", seed=5, root=tmp_path / "b")
    again, rewritten = random_fp8_checkpoint(QWEN3_TINY_CONFIG, layout="qwen-fp8", seed=5, root=tmp_path / "a")
    assert written and not rewritten and again == a
    for fa in sorted(a.glob("*.safetensors")):
        assert fa.read_bytes() == (b / fa.name).read_bytes()


def test_unknown_layout_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="unknown FP8 layout 'int8'"):
        random_fp8_checkpoint(QWEN3_TINY_CONFIG, layout="int8", root=tmp_path)  # type: ignore[arg-type]


def test_the_dequantised_checkpoint_is_the_fp8_ones_values_in_bf16(tmp_path: Path) -> None:
    from kern_qwen3 import dequantised_checkpoint

    fp8, _ = random_fp8_checkpoint(QWEN3_TINY_CONFIG, layout="qwen-fp8", seed=3, name="tiny", root=tmp_path)
    deq, written = dequantised_checkpoint(QWEN3_TINY_CONFIG, seed=3, name="tiny", root=tmp_path)
    assert written and deq != fp8
    assert "quantization_config" not in json.loads((deq / "config.json").read_text())
    q, d = Safetensors.open(fp8), Safetensors.open(deq)
    shapes = qwen3_tensor_shapes(QWEN3_TINY_CONFIG)
    assert set(d.names()) == set(shapes)
    for name, shape in shapes.items():
        got = d.get(name)
        assert got is not None and got.dtype == "bf16" and got.shape == shape
        src = q.get(name)
        assert src is not None
        if not is_fp8_linear(name):
            np.testing.assert_array_equal(_read(got), _read(src))
            continue
        scale_info = q.get(name.removesuffix("weight") + "weight_scale_inv")
        assert scale_info is not None
        s = _read(scale_info).astype(np.float32)
        full = np.repeat(np.repeat(s, 128, 0), 128, 1)[: shape[0], : shape[1]]
        exact = from_e4m3_bits(_read(src).astype(np.uint8)) * full
        # NOTE: bf16 of the exact product, to nearest even: at most half a bf16 ulp (2^-8 relative) away
        np.testing.assert_array_equal(_read(got), to_bf16_bits(exact))
        assert np.all(np.abs(_bf16(_read(got).astype(np.uint16)) - exact) <= np.abs(exact) * 2.0**-8)
    assert dequantised_checkpoint(QWEN3_TINY_CONFIG, seed=3, name="tiny", root=tmp_path) == (deq, False)
