"""The fp8 GEMM externs on the GPU (`extern:cublaslt_fp8_tn`, `extern:cublaslt_fp8_tn_f32`): e4m3
A and W bytes, one-element f32 scales on the device, against float64 over the same bytes decoded
in numpy; the scales read at replay (a graph replays with the values they hold then); the row
stride of C."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import kern_runtime as kr
from kern_qwen3 import from_e4m3_bits

from .helpers import manifests
from .test_weights import _st_bytes

pytestmark = pytest.mark.gpu

N, K = 256, 512
E4M3_NAN = (0x7F, 0xFF)


def e4m3(bits: np.ndarray) -> np.ndarray:
    """float64 values of e4m3fn bytes."""
    return from_e4m3_bits(bits).astype(np.float64)


def _bytes(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """e4m3 bytes of every finite value (no NaN pattern)."""
    out = rng.integers(0, 256, size=shape, dtype=np.uint8)
    for nan in E4M3_NAN:
        out[out == nan] = nan - 1
    return out


def _from_bf16(b: np.ndarray) -> np.ndarray:
    return (b.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


@pytest.fixture(scope="module")
def fp8_rt(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[kr.Runtime, np.ndarray]]:
    d = tmp_path_factory.mktemp("fp8")
    path = d / "m.json"
    path.write_text(json.dumps(manifests.fp8_gemm(N, K)))
    w = _bytes(np.random.default_rng(11), (N, K))
    rt = kr.Runtime.load(path, d)
    rt.load_weights(kr.Safetensors.parse(_st_bytes({"w": w})))
    yield rt, w
    rt.close()


def _within(got: np.ndarray, a: np.ndarray, w: np.ndarray, scale: float, rel: float) -> None:
    """`got` is `scale` * a @ w.T within `rel` of it plus 2^-9 of the sum of |products|: Hopper's
    fp8 MMA accumulates in fewer bits than f32 between cuBLASLt's promotions to f32 (on an H100 a
    few elements were off by up to 2^-10.8 of that sum), while a wrong scale, operand or layout is
    off by the order of the value itself (about 2^-4.5 of the sum over k = 512 random terms)."""
    ref = a @ w.T * scale
    bound = np.abs(a) @ np.abs(w).T * abs(scale) * 2.0**-9 + np.abs(ref) * rel
    bad = np.abs(got - ref) > bound
    assert not bad.any(), f"{bad.sum()} of {bad.size} off; worst {np.abs(got - ref).max()}"


@pytest.mark.parametrize("m", [1, 16, 160, 512])
def test_fp8_gemms_against_float64_of_the_same_bytes(fp8_rt: tuple[kr.Runtime, np.ndarray], m: int) -> None:
    rt, wb = fp8_rt
    ab = _bytes(np.random.default_rng(m), (m, K))
    a, w = e4m3(ab), e4m3(wb)
    sa, sw = np.float32(0.0125), np.float32(-0.375)
    rt.write_input("a", ab)
    rt.write_input("sa", np.array([sa], np.float32))
    rt.write_input("sw", np.array([sw], np.float32))
    rt.run("f32", {"m": m})
    cf = rt.read_buffer("cf").view(np.float32)[: m * N].reshape(m, N).astype(np.float64)
    _within(cf, a, w, float(sa) * float(sw), 1e-6)
    rt.run("bf16", {"m": m})
    c = _from_bf16(rt.read_buffer("c").view(np.uint16)[: m * (N + 64)].reshape(m, N + 64))
    _within(c[:, :N], a, w, float(sa) * float(sw), 2.0**-8)


def test_a_replayed_fp8_gemm_reads_the_scales_it_finds(fp8_rt: tuple[kr.Runtime, np.ndarray]) -> None:
    rt, wb = fp8_rt
    m = 16
    ab = _bytes(np.random.default_rng(3), (m, K))
    rt.write_input("a", ab)
    rt.write_input("sa", np.array([1.0], np.float32))
    rt.write_input("sw", np.array([1.0], np.float32))
    graph = rt.capture_graph("f32", {"m": m})
    rt.replay(graph, {"m": m})
    once = rt.read_buffer("cf").view(np.float32)[: m * N].copy()
    rt.write_input("sa", np.array([2.0], np.float32))
    rt.write_input("sw", np.array([0.25], np.float32))
    rt.replay(graph, {"m": m})
    twice = rt.read_buffer("cf").view(np.float32)[: m * N]
    np.testing.assert_array_equal(twice, once * np.float32(0.5))
    _within(once.reshape(m, N).astype(np.float64), e4m3(ab), e4m3(wb), 1.0, 1e-6)


def test_an_fp8_gemm_with_k_off_16_is_refused_at_load(tmp_path: Path) -> None:
    m = manifests.fp8_gemm(N, K)
    for prog in m["programs"].values():
        prog["calls"][0]["args"][7] = {"i32": K - 8}
    path = tmp_path / "m.json"
    path.write_text(json.dumps(m))
    with pytest.raises(kr.ManifestVerifyError, match="16"):
        kr.Runtime.load(path, tmp_path)
