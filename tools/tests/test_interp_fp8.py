"""The numpy interpreter's FP8 support: its float8_e4m3fn decode table against an independent
reference, `read_files` on random FP8 checkpoints (both layouts), the two FP8 kernel entries
(kern_gemv_e4m3_b128, kern_dequant_e4m3_b128) against float64 references, and the one-line errors
for a truncated e4m3 tensor and an unknown dtype."""

from __future__ import annotations

import importlib
import json
import math
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kern_runtime as kr
from kern_interp import qwen3 as interp
from kern_qwen3 import (
    QWEN3_TINY_CONFIG,
    qwen3_tensor_shapes,
    random_checkpoint,
    random_fp8_checkpoint,
)

BLOCK = 128


def _formula_e4m3(code: int) -> float:
    """e4m3fn by its definition, written out per code: (-1)^s 2^(e-7) (1 + m/8), subnormal
    (-1)^s 2^-6 (m/8), S.1111.111 NaN."""
    sign = -1.0 if code & 0x80 else 1.0
    e, m = (code >> 3) & 0xF, code & 7
    if e == 0xF and m == 7:
        return math.nan
    if e == 0:
        return sign * math.ldexp(m, -9)
    return sign * math.ldexp(8 + m, e - 10)


def _reference_e4m3() -> tuple[str, np.ndarray]:
    """The 256 codes decoded by ml_dtypes or torch where importable, else by `_formula_e4m3`."""
    codes = np.arange(256, dtype=np.uint8)
    try:
        ml_dtypes: Any = importlib.import_module("ml_dtypes")
        return "ml_dtypes", codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    except ImportError:
        pass
    try:
        torch: Any = importlib.import_module("torch")
        t = torch.from_numpy(codes.copy()).view(torch.float8_e4m3fn).to(torch.float32)
        return "torch", t.numpy()
    except ImportError:
        return "formula", np.array([_formula_e4m3(c) for c in range(256)], dtype=np.float32)


def _same_bits(a: np.ndarray, b: np.ndarray) -> None:
    """Equal as float32 bit patterns (the sign of zero included), NaN where the other is NaN."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    assert a.shape == b.shape
    nan = np.isnan(a)
    np.testing.assert_array_equal(nan, np.isnan(b))
    np.testing.assert_array_equal(a.view(np.uint32)[~nan], b.view(np.uint32)[~nan])


# --------------------------------------------------------------------------------------------
# The decode table.


def test_e4m3_table_matches_reference() -> None:
    source, ref = _reference_e4m3()
    table = interp.E4M3_VALUES
    assert table.dtype == np.float32 and table.shape == (256,), source
    _same_bits(table, ref)


def test_e4m3_table_matches_formula() -> None:
    _same_bits(interp.E4M3_VALUES, np.array([_formula_e4m3(c) for c in range(256)], dtype=np.float32))


def test_e4m3_table_landmarks() -> None:
    t = interp.E4M3_VALUES
    assert [i for i in range(256) if np.isnan(t[i])] == [0x7F, 0xFF]
    assert not np.isinf(t).any()
    assert t[0x7E] == 448.0 and t[0xFE] == -448.0  # the largest finite
    assert t[0x38] == 1.0 and t[0x08] == 2.0**-6 and t[0x01] == 2.0**-9 and t[0x07] == 7 * 2.0**-9
    assert t[0x00] == 0 and not np.signbit(t[0x00]) and t[0x80] == 0 and np.signbit(t[0x80])


# --------------------------------------------------------------------------------------------
# Checkpoints.


def _raw_tensors(directory: Path) -> dict[str, tuple[str, list[int], bytes]]:
    """Every tensor of a checkpoint directory, parsed here: name -> (dtype, shape, bytes)."""
    out: dict[str, tuple[str, list[int], bytes]] = {}
    for path in sorted(directory.glob("*.safetensors")):
        raw = path.read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8 : 8 + n])
        header.pop("__metadata__", None)
        for name, meta in header.items():
            a, b = meta["data_offsets"]
            out[name] = (meta["dtype"], meta["shape"], raw[8 + n + a : 8 + n + b])
    return out


def _decode_ref(dtype: str, data: bytes) -> np.ndarray:
    if dtype == "F8_E4M3":
        return _reference_e4m3()[1][np.frombuffer(data, dtype=np.uint8)]
    if dtype == "F32":
        return np.frombuffer(data, dtype="<f4").astype(np.float32)
    assert dtype == "BF16"
    return (np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16).view(np.float32)


@pytest.mark.parametrize("layout", ["qwen-fp8", "fp8-dynamic"])
def test_read_fp8_checkpoint(tmp_path: Path, layout: Any) -> None:
    directory, _ = random_fp8_checkpoint(QWEN3_TINY_CONFIG, layout=layout, seed=3, name="interp-fp8", root=tmp_path)
    raw = _raw_tensors(directory)
    got = interp.read_checkpoint(directory)
    assert set(got) == set(raw)
    dtypes = {dtype for dtype, _, _ in raw.values()}
    assert dtypes == {"BF16", "F8_E4M3", "F32"}
    for name, (dtype, shape, data) in raw.items():
        assert got[name].dtype == np.float32 and got[name].shape == tuple(shape), name
        _same_bits(got[name], _decode_ref(dtype, data).reshape(shape))
    heads = {k: v for f in sorted(directory.glob("*.safetensors")) for k, v in interp.read_header(f).items()}
    assert {k: h.dtype for k, h in heads.items()} == {k: d for k, (d, _, _) in raw.items()}
    shapes = qwen3_tensor_shapes(QWEN3_TINY_CONFIG)
    q = "model.layers.1.self_attn.q_proj.weight"
    n, k = shapes[q]
    assert heads[q].dtype == "F8_E4M3" and got[q].shape == (n, k)
    scale = q + ("_scale_inv" if layout == "qwen-fp8" else "_scale")
    want = (-(-n // BLOCK), -(-k // BLOCK)) if layout == "qwen-fp8" else (n, 1)
    assert heads[scale].dtype == "F32" and got[scale].shape == want


def test_qwen_fp8_dequantises_to_the_bf16_weights(tmp_path: Path) -> None:
    """kern_dequant_e4m3_b128 over the read e4m3 weight and its block scales gives the bf16
    checkpoint's weight of the same seed to within e4m3's rounding."""
    fp8_dir, _ = random_fp8_checkpoint(QWEN3_TINY_CONFIG, layout="qwen-fp8", seed=5, name="interp-fp8", root=tmp_path)
    bf16_dir, _ = random_checkpoint(QWEN3_TINY_CONFIG, seed=5, name="interp-fp8", root=tmp_path)
    fp8, bf16 = interp.read_checkpoint(fp8_dir), interp.read_checkpoint(bf16_dir)
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight"):
        n, k = fp8[name].shape
        s = fp8[name + "_scale_inv"]
        out = np.full(n * k, np.nan, dtype=np.float32)
        interp.KERNELS["kern_dequant_e4m3_b128"](1, (fp8[name].reshape(-1), 0), (s.reshape(-1), 0), (out, 0), n, k)
        ref = bf16[name]
        step = s[np.arange(n)[:, None] // BLOCK, np.arange(k)[None, :] // BLOCK].astype(np.float64)
        err = np.abs(out.reshape(n, k).astype(np.float64) - ref)
        assert np.all(err <= np.maximum(np.abs(ref) * 2.0**-4, step * 2.0**-10) * (1 + 1e-6)), name
        assert np.abs(ref).max() > 0 and np.any(err > 0)  # quantised, not the bf16 values themselves


def _safetensors(path: Path, header: dict[str, Any], data: bytes) -> Path:
    head = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + data)
    return path


def _rejects(path: Path, *words: str) -> None:
    with pytest.raises(kr.WeightArtifactError) as exc:
        interp.read_files([path])
    text = str(exc.value)
    assert "\n" not in text and all(w in text for w in words), text


def test_read_small_files_of_each_dtype(tmp_path: Path) -> None:
    codes = bytes([0x38, 0xB8, 0x7E, 0x01, 0x00, 0x80])
    f32 = np.array([1.5, -2.25, 3e-20], dtype="<f4")
    bf16 = np.array([0x3F80, 0xC000], dtype="<u2")  # 1.0, -2.0
    header = {"__metadata__": {"format": "pt"},
              "a": {"dtype": "F8_E4M3", "shape": [2, 3], "data_offsets": [0, 6]},
              "b": {"dtype": "F32", "shape": [3], "data_offsets": [6, 18]},
              "c": {"dtype": "BF16", "shape": [2, 1], "data_offsets": [18, 22]}}
    path = _safetensors(tmp_path / "m.safetensors", header, codes + f32.tobytes() + bf16.tobytes())
    got = interp.read_files([path])
    _same_bits(got["a"], np.array([[1.0, -1.0, 448.0], [2.0**-9, 0.0, -0.0]], dtype=np.float32))
    _same_bits(got["b"], f32.astype(np.float32))
    _same_bits(got["c"], np.array([[1.0], [-2.0]], dtype=np.float32))
    assert {k: h.dtype for k, h in interp.read_header(path).items()} == {"a": "F8_E4M3", "b": "F32", "c": "BF16"}


def test_truncated_e4m3_tensor_rejected(tmp_path: Path) -> None:
    header = {"w": {"dtype": "F8_E4M3", "shape": [4, 8], "data_offsets": [0, 32]}}
    _rejects(_safetensors(tmp_path / "short.safetensors", header, bytes(31)), "'w'", "do not fit")
    # 2 bytes an element (bf16's size) do not fit an e4m3 tensor's shape
    header = {"w": {"dtype": "F8_E4M3", "shape": [4, 8], "data_offsets": [0, 64]}}
    _rejects(_safetensors(tmp_path / "wide.safetensors", header, bytes(64)), "'w'", "do not fit")
    header = {"s": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}
    _rejects(_safetensors(tmp_path / "f32.safetensors", header, bytes(8)), "'s'", "do not fit")


def test_unknown_dtype_rejected(tmp_path: Path) -> None:
    header = {"w": {"dtype": "I8", "shape": [4, 8], "data_offsets": [0, 32]}}
    _rejects(_safetensors(tmp_path / "i8.safetensors", header, bytes(32)), "'w'", "I8", "BF16", "F8_E4M3", "F32")


# --------------------------------------------------------------------------------------------
# The kernels.

SHAPES = [(1, 128, 128), (2, 200, 300), (3, 77, 129), (1, 257, 64), (3, 384, 1000), (2, 130, 256)]


def _operands(rng: np.random.Generator, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """e4m3 weight values [n, k] (no NaN codes) and positive block scales [ceil(n/128), ceil(k/128)]."""
    codes = rng.integers(0, 256, size=(n, k))
    codes = np.where((codes & 0x7F) == 0x7F, 0x7E, codes)
    w = _reference_e4m3()[1][codes]
    s = rng.uniform(0.5, 4.0, size=(-(-n // BLOCK), -(-k // BLOCK))).astype(np.float32) * 2.0**-8
    return w, s.astype(np.float32)


def _placed(values: np.ndarray, pad: int, fill: float) -> tuple[np.ndarray, int]:
    """`values` flattened into a float32 array at element offset `pad`, `fill` around it."""
    flat = np.full(values.size + 2 * pad, fill, dtype=np.float32)
    flat[pad : pad + values.size] = values.reshape(-1)
    return flat, pad


@pytest.mark.parametrize(("rows", "n", "k"), SHAPES)
def test_gemv_e4m3_b128(rows: int, n: int, k: int) -> None:
    rng = np.random.default_rng(rows * 100003 + n * 1009 + k)
    w, s = _operands(rng, n, k)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    stride = n + 7
    sentinel = -12345.0
    y = np.full(rows * stride + 10, sentinel, dtype=np.float32)
    interp.KERNELS["kern_gemv_e4m3_b128"](rows, _placed(x, 3, np.nan), _placed(w, 5, np.nan), _placed(s, 2, np.nan),
                                          (y, 4), rows, n, k, stride)
    ref = np.zeros((rows, n), dtype=np.float64)
    col_block = np.arange(n) // BLOCK
    for b in range(-(-k // BLOCK)):
        blk = slice(b * BLOCK, min((b + 1) * BLOCK, k))
        partial = x[:, blk].astype(np.float64) @ w[:, blk].astype(np.float64).T  # [rows, n]
        ref += s[col_block, b].astype(np.float64)[None, :] * partial
    bound = np.abs(x).astype(np.float64) @ (np.abs(w) * s.max()).astype(np.float64).T
    out = y[4 : 4 + rows * stride].reshape(rows, stride)
    np.testing.assert_allclose(out[:, :n], ref, rtol=0, atol=float(bound.max()) * 1e-5)
    assert np.all(out[:, n:] == sentinel)  # columns past n untouched
    assert np.all(y[:4] == sentinel) and np.all(y[4 + rows * stride :] == sentinel)


def test_gemv_e4m3_b128_uses_each_blocks_scale() -> None:
    """One scale block changed moves exactly the columns of its block row."""
    rng = np.random.default_rng(0)
    rows, n, k = 2, 300, 260
    w, s = _operands(rng, n, k)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    gemv = interp.KERNELS["kern_gemv_e4m3_b128"]
    a, b = np.zeros(rows * n, np.float32), np.zeros(rows * n, np.float32)
    gemv(rows, (x.reshape(-1), 0), (w.reshape(-1), 0), (s.reshape(-1).copy(), 0), (a, 0), rows, n, k, n)
    s2 = s.copy()
    s2[1, 2] *= 3  # columns 128..255, k 256..259
    gemv(rows, (x.reshape(-1), 0), (w.reshape(-1), 0), (s2.reshape(-1), 0), (b, 0), rows, n, k, n)
    moved = np.any(a.reshape(rows, n) != b.reshape(rows, n), axis=0)
    assert moved[128:256].all() and not moved[:128].any() and not moved[256:].any()


@pytest.mark.parametrize(("n", "k"), [(n, k) for _, n, k in SHAPES])
def test_dequant_e4m3_b128(n: int, k: int) -> None:
    rng = np.random.default_rng(n * 7919 + k)
    w, s = _operands(rng, n, k)
    out = np.full(n * k + 9, -7.0, dtype=np.float32)
    interp.KERNELS["kern_dequant_e4m3_b128"](1, _placed(w, 1, np.nan), _placed(s, 6, np.nan), (out, 4), n, k)
    ref = np.empty((n, k), dtype=np.float64)
    for c in range(n):
        for b in range(-(-k // BLOCK)):
            blk = slice(b * BLOCK, min((b + 1) * BLOCK, k))
            ref[c, blk] = w[c, blk].astype(np.float64) * float(s[c // BLOCK, b])
    # an e4m3 value times a float32 scale is exact in float64, so float32 rounds it the same way
    np.testing.assert_array_equal(out[4 : 4 + n * k].reshape(n, k), ref.astype(np.float32))
    assert np.all(out[:4] == -7.0) and np.all(out[4 + n * k :] == -7.0)



# --------------------------------------------------------------------------------------------
# The FP8 manifest end to end: kern-qwen3 --weights qwen-fp8 over a Qwen FP8 checkpoint, against
# the independent numpy Qwen3 over the same weights dequantised (float32, e4m3 * block scale).


def _dequantised(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The float32 weights e4m3 * scale of either layout (block `_scale_inv` or per-row `_scale`)."""
    out = {}
    for name, w in tensors.items():
        if name.endswith(("_scale_inv", "_scale")):
            continue
        n = w.shape[0]
        if (s := tensors.get(name + "_scale_inv")) is not None:
            w = w * np.repeat(np.repeat(s, 128, axis=0)[:n], 128, axis=1)[:, : w.shape[1]]
        elif (s := tensors.get(name + "_scale")) is not None:
            w = w * s.reshape(n, 1)
        out[name] = w.astype(np.float32)
    return out


def _fp8_checkpoint(root: Path, layout: str) -> dict[str, np.ndarray]:
    from kern_qwen3 import random_fp8_checkpoint

    path, _ = random_fp8_checkpoint(interp.UNTIED_CONFIG, layout=layout, seed=11, name="untied",  # type: ignore[arg-type]
                                    root=root)
    return interp.read_checkpoint(path)


@pytest.fixture(scope="module")
def fp8_untied(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    return _fp8_checkpoint(tmp_path_factory.mktemp("fp8"), "qwen-fp8")


@pytest.fixture(scope="module")
def dynamic_untied(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    return _fp8_checkpoint(tmp_path_factory.mktemp("dyn"), "fp8-dynamic")


@pytest.mark.parametrize("kw", [{"feed": "host"}, {"feed": "device", "gemv": ["lm_head"], "fuse": True, "pdl": True},
                                {"feed": "device", "weights": "fp8-dynamic"}],
                         ids=["plain", "fast", "fp8-dynamic"])
@pytest.mark.parametrize(("n", "chunk"), [(1, 512), (37, 16), (200, 97)])
def test_the_fp8_manifest_is_the_model_over_its_dequantised_weights(
        request: pytest.FixtureRequest, kw: dict[str, Any], n: int, chunk: int) -> None:
    from helpers.qwen3_options import generate

    import kern_qwen3 as gen

    entries = {e: "m" for e in (*gen.ENTRIES, *gen.DEVICE_FEED_ENTRIES, *gen.GEMV_ENTRIES, *gen.FUSED_ENTRIES,
                                *gen.FP8_ENTRIES)}  # NOTE: FP8_ENTRIES holds every form's entries
    kw = {"weights": "qwen-fp8", **kw}
    tensors = request.getfixturevalue("dynamic_untied" if kw["weights"] == "fp8-dynamic" else "fp8_untied")
    m = generate(gen.shape_from_config(interp.UNTIED_CONFIG), {"m": "0" * 64}, entries, model="t", chunk=128, **kw)
    assert any(b["dtype"] == "fp8e4m3" for b in m["buffers"].values())
    machine = interp.Interp(m, tensors, capacity=512)
    tokens, first = interp.greedy(machine, interp.random_prompt(n), 12, chunk)
    want_tokens, want_first = interp.reference_greedy(interp.UNTIED_CONFIG, _dequantised(tensors),
                                                      interp.random_prompt(n), 12)
    assert np.linalg.norm(first - want_first) / np.linalg.norm(want_first) < 1e-4
    assert tokens == want_tokens


def test_quantising_a_bf16_checkpoint_at_load_is_the_fp8_checkpoint(fp8_untied: dict[str, np.ndarray],
                                                                     tmp_path: Path) -> None:
    """`--weights bf16-to-fp8` over the bf16 checkpoint of seed 11 holds, after its derive programs,
    the e4m3 values and scales of the Qwen FP8 checkpoint of seed 11, and computes the same logits as
    the `qwen-fp8` manifest over that checkpoint, to the bit."""
    from helpers.qwen3_options import generate

    import kern_qwen3 as gen

    entries = {e: "m" for e in (*gen.ENTRIES, *gen.DEVICE_FEED_ENTRIES, *gen.GEMV_ENTRIES, *gen.FUSED_ENTRIES,
                                *gen.FP8_ENTRIES)}
    shape = gen.shape_from_config(interp.UNTIED_CONFIG)
    made = {w: generate(shape, {"m": "0" * 64}, entries, model="t", chunk=128, feed="device", weights=w)
            for w in ("bf16-to-fp8", "qwen-fp8")}
    assert not made["bf16-to-fp8"]["buffers"]["l1.down"].get("bind")
    assert made["bf16-to-fp8"]["programs"]["quantise.l1"]["derive"] is True
    bf16 = interp.untied_weights(tmp_path)
    at_load = interp.Interp(made["bf16-to-fp8"], bf16, capacity=512)
    stored = interp.Interp(made["qwen-fp8"], fp8_untied, capacity=512)
    for name in ("l0.qkv", "l0.qkv.scale", "l2.gate_up", "l2.gate_up.scale", "l1.down"):
        np.testing.assert_array_equal(at_load.mem[name], stored.mem[name])
    a = interp.greedy(at_load, interp.random_prompt(37), 6, 16)
    b = interp.greedy(stored, interp.random_prompt(37), 6, 16)
    assert a[0] == b[0] and np.array_equal(a[1], b[1])
