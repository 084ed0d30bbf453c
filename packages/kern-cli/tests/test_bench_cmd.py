"""kern bench on the host: the GEMM-only floor manifest, weight bytes, option errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import kern_cli.bench_cmd as bench
import kern_cli.run as run
from kern_manifest import parse_manifest, verify

ROOT = Path(__file__).resolve().parents[3]


def _example(name: str) -> dict:
    return json.loads((ROOT / "examples" / f"{name}.json").read_text())


@pytest.mark.parametrize("name", ["qwen3-4b", "qwen3-tiny"])
def test_gemm_only_manifest_verifies_and_keeps_binds(name: str) -> None:
    m = _example(name)
    g = bench.gemm_only_manifest(m, "decode")
    verify(parse_manifest(json.dumps(g)))
    calls = g["programs"]["gemms"]["calls"]
    layers = sum(1 for b in m["buffers"] if b.endswith(".qkv"))
    assert len(calls) == 4 * layers + 1 and {c["op"] for c in calls} == {"gemm"}
    for n, b in g["buffers"].items():
        if b["kind"] == "weight":
            assert b == m["buffers"][n]  # identical spec: a resident runtime's weights are claimed
    assert {n for n, b in g["buffers"].items() if b["kind"] == "input"} == {"x", "attn", "act"}
    assert g["modules"] == {} and g["programs"]["gemms"]["graph"] is True


def test_step_weight_bytes_4b() -> None:
    h, inter, vocab, d = 2560, 9728, 151936, 128
    per_layer = 6144 * h + h * 4096 + 2 * inter * h + h * inter + 2 * h + 2 * d  # GEMMs + 4 norms
    expected = 2 * (36 * per_layer + vocab * h + h)  # tied lm_head on the embedding, final norm
    for name in ("qwen3-4b", "qwen3-4b-gemv", "qwen3-4b-fast", "qwen3-4b-f32"):  # extern GEMMs, our GEMV, f32
        assert bench.decode_weight_bytes(_example(name), "decode") == expected, name


def test_program_without_gemms_is_an_error() -> None:
    with pytest.raises(bench.BenchError, match="no extern"):
        bench.gemm_only_manifest(_example("qwen3-tiny"), "load")


def test_table_aligns_columns() -> None:
    text = bench.table([bench._row("a", 1.23456, "ms", 2.9, "x"), bench._row("long_name", 10, "GB")])
    lines = text.splitlines()
    assert lines[0].split() == ["name", "value", "unit", "target", "peer"]
    assert lines[1].index("1.2346") == lines[2].index("10")


def _parse(*argv: str) -> object:
    from kern_cli.main import build_parser

    return build_parser().parse_args(["bench", *argv])


@pytest.mark.parametrize(
    ("argv", "word"),
    [
        (("--contexts", "128,x"), "comma-separated"),
        (("--contexts", "0"), "positive"),
        (("--steps", "50"), "at least 200"),
        (("--floor-manifest", "/nonexistent.json"), "no such file"),
    ],
)
def test_bad_options_exit_2(argv: tuple[str, ...], word: str, monkeypatch: pytest.MonkeyPatch,
                            capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    monkeypatch.setattr(run, "device_count", lambda: 1)
    monkeypatch.setattr(bench, "probe_gpu", lambda gpu: None)
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"")
    args = _parse("--manifest", str(ROOT / "examples" / "qwen3-tiny.json"), "--weights", str(weights), *argv)
    assert args.handler(args) == 2  # type: ignore[attr-defined]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and word in err[0]


def test_no_gpu_exit_2(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def none() -> int:
        raise run.NoGpuError("no NVIDIA GPU on this machine (test)")

    monkeypatch.setattr(run, "device_count", none)
    args = _parse("--manifest", str(ROOT / "examples" / "qwen3-tiny.json"))
    assert args.handler(args) == 2  # type: ignore[attr-defined]
    assert capsys.readouterr().err.startswith("kern bench: no NVIDIA GPU")


def test_gemv_variant_floor_counts_only_its_extern_calls() -> None:
    g = bench.gemm_only_manifest(_example("qwen3-4b-gemv"), "decode")
    verify(parse_manifest(json.dumps(g)))
    assert len(g["programs"]["gemms"]["calls"]) == 36 * 2  # qkv and down stay cublasLt
