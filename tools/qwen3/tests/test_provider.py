"""The provider's random checkpoint for a manifest: bf16 for bf16 weights, and for e4m3 weights the
FP8 layout whose scales the manifest binds (Qwen's block scales, or compressed-tensors' per-row
ones); an FP8 manifest that binds no scales (or both kinds) is one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kern_qwen3 import QWEN3_TINY_CONFIG, CheckpointError, random_checkpoint, random_fp8_checkpoint
from kern_qwen3.provider import QWEN3, fp8_layout

W = "model.layers.0.mlp.down_proj.weight"


def _manifest(dtype: str, *scales: str) -> dict[str, Any]:
    buffers: dict[str, Any] = {"w": {"kind": "weight", "dtype": dtype, "bind": [{"tensor": W}]},
                               "x": {"kind": "input", "dtype": "i64"}}
    for i, suffix in enumerate(scales):
        buffers[f"s{i}"] = {"kind": "weight", "dtype": "f32", "bind": [{"tensor": W + suffix}]}
    return {"model": "qwen3-tiny-x", "buffers": buffers}


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KERN_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_a_bf16_manifest_gets_the_bf16_checkpoint(cache: Path) -> None:
    path, what, written = QWEN3.random_checkpoint(_manifest("bf16"), None)
    assert (what, written) == ("Qwen3 tiny", True)
    assert path == random_checkpoint(QWEN3_TINY_CONFIG, seed=0, name="qwen3-tiny")[0]


@pytest.mark.parametrize(("suffix", "layout", "method"), [("_scale_inv", "qwen-fp8", "fp8"),
                                                         ("_scale", "fp8-dynamic", "compressed-tensors")])
def test_an_fp8_manifest_gets_the_layout_its_scales_name(cache: Path, suffix: str, layout: str, method: str) -> None:
    m = _manifest("fp8e4m3", suffix)
    got = fp8_layout(m)
    assert got == layout and got is not None
    path, what, written = QWEN3.random_checkpoint(m, None)
    assert (what, written) == (f"Qwen3 tiny FP8 ({layout})", True)
    assert path == random_fp8_checkpoint(QWEN3_TINY_CONFIG, layout=got, seed=0, name="qwen3-tiny")[0]
    assert json.loads((path / "config.json").read_text())["quantization_config"]["quant_method"] == method
    assert QWEN3.random_checkpoint(m, None) == (path, what, False)


@pytest.mark.parametrize(("scales", "which"), [((), "no _scale_inv or _scale tensor"),
                                               (("_scale_inv", "_scale"), "both block")])
def test_an_fp8_manifest_without_one_kind_of_scales_is_one_line(cache: Path, scales: tuple[str, ...],
                                                                which: str) -> None:
    with pytest.raises(CheckpointError, match=rf"^manifest 'qwen3-tiny-x' has e4m3 weights but binds {which}.*"
                                              r"\(pass --weights\)$"):
        QWEN3.random_checkpoint(_manifest("fp8e4m3", *scales), None)
    assert not (cache / "random").exists()
