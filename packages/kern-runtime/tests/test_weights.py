"""Bind planning and the Safetensors reader (pure host)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from kern_runtime import (
    ApiError,
    FileBlob,
    MemoryBlob,
    Safetensors,
    TensorWindow,
    WeightArtifactError,
    plan_bind,
)
from kern_runtime.weights import RowInterleave


def _st_bytes(tensors: dict[str, np.ndarray]) -> bytes:
    names = {np.dtype(np.float32): "F32", np.dtype(np.uint16): "BF16", np.dtype(np.int32): "I32",
             np.dtype(np.uint8): "F8_E4M3"}  # fmt: skip
    header: dict[str, object] = {}
    blobs: list[bytes] = []
    pos = 0
    for name, arr in tensors.items():
        raw = arr.tobytes()
        header[name] = {"dtype": names[arr.dtype], "shape": list(arr.shape), "data_offsets": [pos, pos + len(raw)]}
        blobs.append(raw)
        pos += len(raw)
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def _apply(copies, out: bytearray, data: bytes) -> None:  # type: ignore[no-untyped-def]
    for c in copies:
        blob = c.tensor.blob
        assert isinstance(blob, MemoryBlob)
        src = blob.data
        for r in range(c.height):
            s = c.src_offset + r * c.src_pitch
            d = c.dst_offset + r * c.width
            out[d : d + c.width] = src[s : s + c.width]


def test_parse_reads_dtype_shape_and_bytes() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    st = Safetensors.parse(_st_bytes({"a": a}))
    info = st.get("a")
    assert info is not None and info.dtype == "f32" and info.shape == (3, 4) and info.nbytes == 48
    assert isinstance(info.blob, MemoryBlob) and bytes(info.blob.data) == a.tobytes()
    assert st.get("b") is None and list(st.names()) == ["a"]


def test_full_tensor_is_one_contiguous_copy() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    st = Safetensors.parse(_st_bytes({"a": a}))
    copies = plan_bind("buf", "f32", 48, [TensorWindow("a")], st)
    assert [(c.src_offset, c.dst_offset, c.width, c.height) for c in copies] == [(0, 0, 48, 1)]


def test_concatenation_and_row_window() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.arange(100, 108, dtype=np.float32).reshape(2, 4)
    data = _st_bytes({"a": a, "b": b})
    st = Safetensors.parse(data)
    copies = plan_bind("buf", "f32", 16 * 3, [TensorWindow("a", rows=(1, 3)), TensorWindow("b", rows=(0, 1))], st)
    out = bytearray(48)
    _apply(copies, out, data)
    assert np.frombuffer(bytes(out), np.float32).tolist() == [*a[1:3].ravel(), *b[0].ravel()]


def test_column_window_is_strided() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    data = _st_bytes({"a": a})
    copies = plan_bind("buf", "f32", 3 * 2 * 4, [TensorWindow("a", cols=(1, 3))], Safetensors.parse(data))
    assert len(copies) == 1 and copies[0].height == 3 and copies[0].src_pitch == 16 and copies[0].width == 8
    out = bytearray(24)
    _apply(copies, out, data)
    assert np.frombuffer(bytes(out), np.float32).tolist() == a[:, 1:3].ravel().tolist()


def test_interleave_alternates_row_blocks() -> None:
    g = np.arange(8, dtype=np.float32).reshape(4, 2)
    u = -np.arange(8, dtype=np.float32).reshape(4, 2) - 1
    data = _st_bytes({"g": g, "u": u})
    copies = plan_bind("gu", "f32", 64, [TensorWindow("g", interleave=RowInterleave("u", 2))], Safetensors.parse(data))
    out = bytearray(64)
    _apply(copies, out, data)
    expect = np.concatenate([g[0:2], u[0:2], g[2:4], u[2:4]]).ravel()
    assert np.frombuffer(bytes(out), np.float32).tolist() == expect.tolist()


def test_adjacent_runs_merge_into_one_copy() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    st = Safetensors.parse(_st_bytes({"a": a}))
    copies = plan_bind("buf", "f32", 48, [TensorWindow("a", rows=(0, 1)), TensorWindow("a", rows=(1, 3))], st)
    assert len(copies) == 1 and copies[0].width == 48


@pytest.mark.parametrize(
    ("segments", "nbytes", "match"),
    [
        ([TensorWindow("missing")], 48, "no tensor 'missing'"),
        ([TensorWindow("a")], 40, "holds 40 bytes but its bind segments give 48"),
        ([TensorWindow("a", rows=(2, 5))], 48, "outside tensor 'a'"),
        ([TensorWindow("a", interleave=RowInterleave("c", 2))], 48, "differ in shape"),
        ([TensorWindow("a", rows=(0, 3), interleave=RowInterleave("a", 2))], 96, "blocks of 2"),
    ],
)
def test_bad_binds_are_weight_artifact_errors(segments: list[TensorWindow], nbytes: int, match: str) -> None:
    st = Safetensors.parse(_st_bytes({"a": np.zeros((3, 4), np.float32), "c": np.zeros((4, 3), np.float32)}))
    with pytest.raises(WeightArtifactError, match=match):
        plan_bind("buf", "f32", nbytes, segments, st)


def test_dtype_mismatch_names_both_dtypes() -> None:
    st = Safetensors.parse(_st_bytes({"a": np.zeros((3, 4), np.float32)}))
    with pytest.raises(WeightArtifactError, match="buffer 'buf' is bf16 but tensor 'a' is f32"):
        plan_bind("buf", "bf16", 24, [TensorWindow("a")], st)


def test_open_shards_and_refuse_duplicates(tmp_path: Path) -> None:
    (tmp_path / "m-1.safetensors").write_bytes(_st_bytes({"a": np.zeros(4, np.float32)}))
    (tmp_path / "m-2.safetensors").write_bytes(_st_bytes({"b": np.ones(2, np.int32)}))
    st = Safetensors.open(tmp_path)
    assert sorted(st.names()) == ["a", "b"] and len(st.files) == 2
    b = st.get("b")
    assert b is not None and isinstance(b.blob, FileBlob) and b.blob.nbytes == 8
    (tmp_path / "m-3.safetensors").write_bytes(_st_bytes({"a": np.zeros(4, np.float32)}))
    with pytest.raises(WeightArtifactError, match="appears in two shards"):
        Safetensors.open(tmp_path)


def test_open_bad_paths_and_headers(tmp_path: Path) -> None:
    with pytest.raises(ApiError, match="no such weights file"):
        Safetensors.open(tmp_path / "nope.safetensors")
    with pytest.raises(ApiError, match="holds no"):
        Safetensors.open(tmp_path)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(struct.pack("<Q", 3) + b"{{{")
    with pytest.raises(WeightArtifactError, match="not JSON"):
        Safetensors.open(bad)
    short = tmp_path / "short.safetensors"
    data = _st_bytes({"a": np.zeros(4, np.float32)})
    short.write_bytes(data[:-4])
    with pytest.raises(WeightArtifactError, match="does not fit"):
        Safetensors.open(short)


@pytest.mark.parametrize("data", [b"hello, this is a text file\n" * 3, b"\xff" * 8, struct.pack("<Q", 200) + b"{}"],
                         ids=["text", "huge-length", "past-the-end"])
def test_a_header_length_the_file_cannot_hold_is_one_line_before_any_read(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "x.safetensors"
    path.write_bytes(data)
    want = f"not a safetensors file (its first 8 bytes give a {struct.unpack('<Q', data[:8])[0]}-byte header"
    with pytest.raises(WeightArtifactError, match=want.replace("(", r"\(")):
        Safetensors.open(path)
    with pytest.raises(WeightArtifactError, match=want.replace("(", r"\(")):
        Safetensors.parse(data)


_W8 = "model.layers.0.mlp.down_proj.weight"


def _fp8(**scales: tuple[int, ...]) -> Safetensors:
    """A [200, 300] e4m3 weight with the given companions ("scale_inv", "scale") as f32."""
    return _fp8_as(np.float32, scales)


def _fp8_as(dtype: type, scales: dict[str, tuple[int, ...]]) -> Safetensors:
    """As `_fp8`, the companions as `dtype` (float32 F32, uint16 BF16, int32 I32)."""
    tensors = {_W8: np.ones((200, 300), np.uint8)}
    tensors |= {f"{_W8}_{kind}": np.ones(shape, dtype) for kind, shape in scales.items()}
    return Safetensors.parse(_st_bytes(tensors))


@pytest.mark.parametrize("kind", ["scale_inv", "scale"])
def test_fp8_scales_of_an_integer_dtype_are_refused_and_bf16_ones_bind(kind: str) -> None:
    shape = (2, 3) if kind == "scale_inv" else (200, 1)
    with pytest.raises(WeightArtifactError, match=rf"scales '.*_{kind}' are i32; an e4m3 weight's scales are bf16 or f16 or f32$"):
        plan_bind("w", "fp8e4m3", 200 * 300, [TensorWindow(_W8)], _fp8_as(np.int32, {kind: shape}))
    assert plan_bind("w", "fp8e4m3", 200 * 300, [TensorWindow(_W8)], _fp8_as(np.uint16, {kind: shape}))


def test_fp8_checkpoint_for_a_bf16_buffer_is_refused() -> None:
    with pytest.raises(WeightArtifactError, match="an FP8 checkpoint needs a manifest with fp8 weight buffers"):
        plan_bind("w", "bf16", 200 * 300 * 2, [TensorWindow(_W8)], _fp8(scale_inv=(2, 3)))


def test_bf16_checkpoint_for_an_fp8_buffer_is_refused() -> None:
    st = Safetensors.parse(_st_bytes({_W8: np.ones((200, 300), np.uint16)}))
    with pytest.raises(WeightArtifactError, match=r"buffer 'w' is fp8e4m3 but tensor .* is bf16"):
        plan_bind("w", "fp8e4m3", 200 * 300, [TensorWindow(_W8)], st)


@pytest.mark.parametrize("scales", [{"scale_inv": (2, 3)}, {"scale": (200, 1)}, {"scale": (1,)}, {}])
def test_fp8_weight_with_fitting_scales_binds(scales: dict[str, tuple[int, ...]]) -> None:
    copies = plan_bind("w", "fp8e4m3", 200 * 300, [TensorWindow(_W8)], _fp8(**scales))
    assert sum(c.nbytes for c in copies) == 200 * 300


@pytest.mark.parametrize(
    ("scales", "message"),
    [
        ({"scale_inv": (3, 2)}, r"block scales .*_scale_inv' \[3, 2\] do not fit .* which takes \[2, 3\]"),
        ({"scale_inv": (2, 2)}, r"block scales .* \[2, 2\] do not fit"),
        ({"scale": (300, 1)}, r"scales .*_scale' \[300, 1\] do not fit .* takes \[200, 1\]"),
    ],
)
def test_fp8_scales_that_do_not_fit_their_weight_are_refused(
    scales: dict[str, tuple[int, ...]], message: str
) -> None:
    with pytest.raises(WeightArtifactError, match=message):
        plan_bind("w", "fp8e4m3", 200 * 300, [TensorWindow(_W8)], _fp8(**scales))
