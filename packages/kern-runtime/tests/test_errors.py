"""Error mapping: driver results, no-driver machines, manifest rejections."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cuda.bindings import driver as cu

import kern_pool
import kern_runtime as kr
from kern_manifest import ManifestParse, ManifestRejected, ManifestVerify
from kern_runtime import _driver as drv
from kern_runtime._manifest import load_manifest, map_rejection

from .helpers import manifests


def test_check_unpacks_success_values() -> None:
    ok = cu.CUresult.CUDA_SUCCESS
    assert drv.check("cuX", (ok,)) is None
    assert drv.check("cuX", (ok, 5)) == 5
    assert drv.check("cuX", (ok, 1, 2)) == (1, 2)


def test_check_raises_cuda_error_naming_the_call() -> None:
    with pytest.raises(kr.CudaError, match="cuMemAlloc failed") as info:
        drv.check("cuMemAlloc", (cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY, None))
    assert info.value.call == "cuMemAlloc" and info.value.code == 2


def test_missing_driver_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_lib(_flags: int) -> object:
        raise RuntimeError('"cuda" is an NVIDIA driver library and can only be found via system search.')

    monkeypatch.setattr(drv, "_initialized", False)
    monkeypatch.setattr(drv.cu, "cuInit", no_lib)
    with pytest.raises(kr.NoDriverError, match="no NVIDIA driver") as info:
        drv.init()
    assert isinstance(info.value, kr.CudaError)


def test_runtime_load_without_driver(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    def no_lib(_flags: int) -> object:
        raise RuntimeError("libcuda.so.1 not found")

    monkeypatch.setattr(drv, "_initialized", False)
    monkeypatch.setattr(drv.cu, "cuInit", no_lib)
    path = tmp_path / "m.json"
    path.write_text(json.dumps(manifests.chain("ab" * 32, calls=2)))
    with pytest.raises(kr.NoDriverError):
        kr.Runtime.load(path, tmp_path)


def test_capacity_is_the_pool_s() -> None:
    assert kr.Capacity is kern_pool.Capacity
    assert kern_pool.Capacity(tokens=4096, seqs=1) == kr.DEFAULT_CAPACITY


@pytest.mark.parametrize(
    ("capacity", "line"),
    [
        (kern_pool.Capacity(tokens=0, seqs=1), r"^capacity needs tokens >= 1 \(or None: all free memory\) and seqs >= 1"),
        (kern_pool.Capacity(tokens=16, seqs=0), r"^capacity needs tokens >= 1 \(or None: all free memory\) and seqs >= 1"),
        ("4096", r"^capacity must be a kern_runtime\.Capacity, got str$"),
    ],
)
def test_capacity_the_runtime_cannot_hold_is_a_caller_error_before_the_driver(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capacity: Any, line: str
) -> None:
    def touched(_flags: int) -> object:
        raise AssertionError("the driver was reached")

    monkeypatch.setattr(drv, "_initialized", False)
    monkeypatch.setattr(drv.cu, "cuInit", touched)
    path = tmp_path / "m.json"
    path.write_text(json.dumps(manifests.chain("ab" * 32, calls=2)))
    with pytest.raises(kr.ApiError, match=line):
        kr.Runtime.load(path, tmp_path, capacity=capacity)


def test_rejections_map_to_provider_errors() -> None:
    parse = ManifestRejected([ManifestParse("/x", "bad", "fix"), ManifestVerify("/y", "worse", "fix")])
    verify = ManifestRejected([ManifestVerify("/y", "worse", "fix")])
    assert isinstance(map_rejection(parse), kr.ManifestParseError)
    assert isinstance(map_rejection(verify), kr.ManifestVerifyError)


def test_load_manifest_errors(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(kr.InputFileError, match=r"missing\.json: No such file"):
        load_manifest(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(kr.ManifestParseError, match="not JSON"):
        load_manifest(bad)


def test_call_error_locates_the_call() -> None:
    cause = kr.CudaError("cuLaunchKernel", 700, "CUDA_ERROR_ILLEGAL_ADDRESS")
    err = kr.CallError("decode", 12, "l0.attn", cause)
    assert "program 'decode' call 12 (l0.attn)" in str(err) and err.cause is cause


def test_error_tree() -> None:
    for cls in (kr.ManifestParseError, kr.ManifestVerifyError, kr.ManifestUnsupportedError, kr.KernelArtifactError,
                kr.WeightArtifactError, kr.ApiError, kr.CallError, kr.CudaError, kr.BlasError):  # fmt: skip
        assert issubclass(cls, kr.KernRuntimeError)
        assert cls.__name__ in kr.__all__


def test_capacity_of_all_free_memory_passes_the_caller_checks() -> None:
    from kern_runtime._rt_core import capacity_tokens  # pyright: ignore[reportPrivateUsage]

    assert capacity_tokens(kern_pool.Capacity(tokens=None, seqs=2)) is None
    assert capacity_tokens(kern_pool.Capacity(tokens=64, seqs=1)) == 64
