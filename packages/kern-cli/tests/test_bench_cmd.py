"""kern bench on the host: the GEMM-only floor manifest, weight bytes, option errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import kern_cli.bench_cmd as bench
import kern_runtime as kr
import kern_runtime.bench as kb
from kern_cli import options
from kern_cli.config import config_for
from kern_manifest import Manifest, parse_manifest, verify
from kern_runtime import loading

ROOT = Path(__file__).resolve().parents[3]


def _example(name: str) -> dict:
    return json.loads((ROOT / "examples" / f"{name}.json").read_text())


def _model(name: str) -> Manifest:
    return kr.read_manifest(ROOT / "examples" / f"{name}.json")


@pytest.mark.parametrize("name", ["qwen3-4b", "qwen3-tiny"])
def test_gemm_only_manifest_verifies_and_keeps_binds(name: str) -> None:
    m = _model(name)
    g = kb.gemm_only_manifest(m, "decode")
    verify(g)
    calls = g.programs["gemms"].calls
    layers = sum(1 for b in m.buffers if b.endswith(".qkv"))
    assert len(calls) == 4 * layers + 1 and {c.op for c in calls} == {"gemm"}
    for n, b in g.buffers.items():
        if b.kind == "weight":
            assert b == m.buffers[n]  # identical spec: a resident runtime's weights are claimed
    assert {n for n, b in g.buffers.items() if b.kind == "input"} == {"x", "attn", "act"}
    assert g.modules == {} and g.programs["gemms"].graph is True


def test_step_weight_bytes_4b() -> None:
    h, inter, vocab, d = 2560, 9728, 151936, 128
    per_layer = 6144 * h + h * 4096 + 2 * inter * h + h * inter + 2 * h + 2 * d  # GEMMs + 4 norms
    expected = 2 * (36 * per_layer + vocab * h + h)  # tied lm_head on the embedding, final norm
    for name in ("qwen3-4b", "qwen3-4b-gemv", "qwen3-4b-fast", "qwen3-4b-f32"):  # extern GEMMs, our GEMV, f32
        assert kb.decode_weight_bytes(_model(name), "decode") == expected, name


def test_program_without_gemms_is_an_error() -> None:
    with pytest.raises(kb.BenchError, match="no extern"):
        kb.gemm_only_manifest(_model("qwen3-tiny"), "load")


def test_table_of_no_rows_is_the_header() -> None:
    assert kb.table([]).split() == ["name", "value", "unit", "target", "peer"]


def test_table_aligns_columns() -> None:
    text = kb.table([kb.row("a", 1.23456, "ms", 2.9, "x"), kb.row("long_name", 10, "GB")])
    lines = text.splitlines()
    assert lines[0].split() == ["name", "value", "unit", "target", "peer"]
    assert lines[1].index("1.2346") == lines[2].index("10")


def _parse(*argv: str) -> object:
    from kern_cli.main import build_parser

    return build_parser().parse_args(["bench", *argv])


SOURCES = ROOT / "tools" / "kernels-src"
TINY = ("--manifest", str(ROOT / "examples" / "qwen3-tiny.json"), "--kernel-sources", str(SOURCES),
        "--contexts", "128,1024", "--prefill", "709")  # NOTE: within the tiny model's 4,096 positions


def _no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    def none() -> int:
        raise loading.NoGpuError("no NVIDIA GPU on this machine (test)")

    monkeypatch.setattr(loading, "count_gpus", none)


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (("--contexts", "128,x"), "kern bench: --contexts must be comma-separated integers, got '128,x'"),
        (("--contexts", "0"), "kern bench: --contexts needs positive integers, got '0'"),
        (("--prefill", "709,4k"), "kern bench: --prefill must be comma-separated integers, got '709,4k'"),
        (("--breakdown", "128,-1"), "kern bench: --breakdown needs positive integers, got '128,-1'"),
        (("--breakdown", "4096"), "kern bench: the contexts, prefills and breakdown reach 4640 positions with 2 x "
                                  "--steps 256 and 32 more; the model holds 4096"),
        (("--out", "/proc/version"), "kern bench: --out /proc/version: exists and is not a directory"),
        (("--steps", "10"), f"kern bench: --steps must be at least {bench.MIN_STEPS} (the median needs them), got 10"),
        (("--chunk", "0"), "kern bench: --chunk must be at least 1, got 0"),
        (("--prefill", "0"), "kern bench: --prefill needs positive integers, got '0'"),
        (("--prefill-reps", "0"), "kern bench: --prefill-reps must be at least 1, got 0"),
        (("--floor-manifest", "/nonexistent.json"), "kern bench: --floor-manifest /nonexistent.json: no such file"),
        (("--weights", "/nonexistent"), "kern bench: weights /nonexistent: no such file or directory"),
        (("--kernels", "/nonexistent", "--kernel-sources", "/nosrc"),
         "kern bench: kernels directory /nonexistent does not exist and the kernel sources /nosrc do not exist"),
        (("--manifest", "/nonexistent.json"), "kern bench: --manifest /nonexistent.json: no such file"),
        (("--capacity", "0"), "kern bench: --capacity must be at least 1, got 0"),
        (("--contexts", "128,5000"), "kern bench: the contexts, prefills and breakdown reach 5544 positions with 2 x "
                                     "--steps 256 and 32 more; the model holds 4096"),
        (("--capacity", "5000"), "kern bench: capacity 5000 exceeds the model's reach of 4096 positions"),
        (("--contexts", "128,,1024"),
         "kern bench: --contexts has an empty item in '128,,1024': give comma-separated positive integers"),
        (("--json", "/dev/full"), "kern bench: --json /dev/full: No space left on device"),
        (("--json", "/nonexistent/rows.json"),
         "kern bench: --json /nonexistent/rows.json: directory /nonexistent does not exist"),
        (("--json", "/"), "kern bench: --json /: is a directory"),
    ],
)
def test_bad_options_exit_2_before_the_gpu(argv: tuple[str, ...], line: str, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    _no_gpu(monkeypatch)
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")  # NOTE: an empty safetensors file
    args = _parse(*TINY, "--weights", str(weights), *argv)
    assert args.handler(args) == 2  # type: ignore[attr-defined]
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    assert captured.err.strip().splitlines() == [line]


def test_a_floor_without_gemms_is_refused_before_the_gpu(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    _no_gpu(monkeypatch)
    (tmp_path / "floor.json").write_text((ROOT / "examples" / "qwen3-4b-fast.json").read_text())
    args = _parse(*TINY, "--floor-manifest", str(tmp_path / "floor.json"))
    assert args.handler(args) == 2  # type: ignore[attr-defined]
    assert capsys.readouterr().err.strip().splitlines() == [
        "kern bench: program 'decode' has no extern (GEMM) call to time"]


def test_no_gpu_exit_2(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _no_gpu(monkeypatch)
    args = _parse(*TINY)
    assert args.handler(args) == 2  # type: ignore[attr-defined]
    assert capsys.readouterr().err.strip().splitlines() == ["kern bench: no NVIDIA GPU on this machine (test)"]


@pytest.mark.parametrize("flag", ["--prompt", "--prompt-ids", "--output", "--tokenizer", "--eager"])
def test_bench_offers_no_flag_it_would_ignore(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    from kern_cli.main import build_parser

    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["bench", "--help"])
    assert info.value.code == 0 and flag not in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        _parse(flag, "1")
    assert info.value.code == 2 and f"unrecognized arguments: {flag}" in capsys.readouterr().err


def test_bench_chunk_reaches_the_session(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    seen: dict[str, object] = {}
    monkeypatch.setattr(loading, "probe_gpu", lambda gpu: None)
    monkeypatch.setattr(kb, "bench_session",
                        lambda load, options, log: seen.update(options=options, load=load) or kb.Report([kb.row("r", 1.0, "ms")]))
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")  # NOTE: an empty safetensors file
    args = _parse(*TINY, "--weights", str(weights), "--chunk", "97", "--steps", "300", "--gpu", "0", "--peer", "off",
                  "--out", str(tmp_path / "out"))
    assert args.handler(args) == 0  # type: ignore[attr-defined]
    assert capsys.readouterr().out.splitlines()[1].split() == ["r", "1.0", "ms"]
    o = seen["options"]
    assert (o.chunk, o.steps, o.contexts, o.prefill, o.breakdown) == (97, 300, (128, 1024), (709,), (128, 1024))  # type: ignore[attr-defined]
    assert seen["load"].weights == (weights,)  # type: ignore[attr-defined]


def test_gemv_variant_floor_counts_only_its_extern_calls() -> None:
    g = kb.gemm_only_manifest(_model("qwen3-4b-gemv"), "decode")
    verify(g)
    assert len(g.programs["gemms"].calls) == 36 * 2  # qkv and down stay cublasLt


def test_the_floor_of_a_step_without_gemms_is_its_sibling_with_the_most(tmp_path: Path) -> None:
    """qwen3-4b-fast's step runs no GEMM through cuBLASLt; qwen3-4b-gemv runs some, qwen3-4b all:
    the same checkpoint's weights. A manifest of other weights or one that does not parse is no
    candidate."""
    for name in ("qwen3-4b-fast", "qwen3-4b-gemv", "qwen3-4b"):
        (tmp_path / f"{name}.json").write_text((ROOT / "examples" / f"{name}.json").read_text())
    other = _example("qwen3-4b")
    other["buffers"]["final_norm"]["bind"] = [{"tensor": "model.other_norm.weight"}]
    (tmp_path / "qwen3-4b-other.json").write_text(json.dumps(other))  # more GEMMs would not matter: other weights
    (tmp_path / "broken.json").write_text("{")
    fast = tmp_path / "qwen3-4b-fast.json"
    assert kb.find_floor_manifest(kr.read_manifest(fast), fast) == tmp_path / "qwen3-4b.json"
    (tmp_path / "qwen3-4b.json").unlink()
    assert kb.find_floor_manifest(kr.read_manifest(fast), fast) == tmp_path / "qwen3-4b-gemv.json"


def test_a_step_without_gemms_and_no_sibling_is_benched_without_the_gemm_floor(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """No manifest to take the GEMM-only floor from (an FP8 step's case): the checks before the GPU
    pass, and the report will say so in a note instead of the row."""
    import kern_runtime as kr
    import kern_runtime.bench as kb
    from kern_runtime.bench.floors import no_floor_note

    _no_gpu(monkeypatch)
    path = tmp_path / "fast.json"
    path.write_text((ROOT / "examples" / "qwen3-4b-fast.json").read_text())
    manifest = kr.read_manifest(path)
    assert kb.floor_manifest(manifest, path, None) is None
    assert no_floor_note(manifest, path) == (
        f"no GEMM-only floor: program 'decode' runs no GEMM through cuBLASLt and no manifest beside {path} has the "
        "same weights and GEMM calls (--floor-manifest names one)")
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")  # NOTE: an empty safetensors file
    args = _parse("--manifest", str(path), "--kernels", str(ROOT / "kernels"), "--weights", str(weights))
    assert args.handler(args) == 2  # type: ignore[attr-defined]
    assert capsys.readouterr().err.strip().splitlines() == ["kern bench: no NVIDIA GPU on this machine (test)"]
    with pytest.raises(kb.BenchError, match="has no extern"):
        kb.floor_manifest(manifest, path, path)  # a named floor must have GEMMs


def test_the_default_target_finds_its_floor_before_the_gpu(monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(ROOT)
    _no_gpu(monkeypatch)
    from kern_cli.main import main

    assert main(["bench"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == ["kern bench: no NVIDIA GPU on this machine (test)"]


def test_a_peer_mode_outside_the_choices_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        _parse("--peer", "maybe")
    assert info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "kern bench: argument --peer: invalid choice: 'maybe' (choose from 'auto', 'on', 'off') "
        "(see kern bench --help)"]


def test_the_gemm_rate_manifest_verifies() -> None:
    from kern_runtime.bench.measure import GEMM_RATE_SIZE, gemm_rate_manifest

    m = gemm_rate_manifest(GEMM_RATE_SIZE, _example("qwen3-4b")["schema_version"])
    verify(parse_manifest(json.dumps(m)))
    (call,) = m["programs"]["mm"]["calls"]
    assert [a.get("i32") for a in call["args"][3:]] == [GEMM_RATE_SIZE] * 3


def test_kv_bytes_per_token_of_the_4b() -> None:
    assert kb.kv_bytes_per_token(_model("qwen3-4b-fast"), "decode") == 36 * 2 * 8 * 128 * 2
    assert kb.kv_bytes_per_token(_model("qwen3-4b-f32"), "decode") == 36 * 2 * 8 * 128 * 4


def test_defaults_fit_the_4b_and_breakdown_follows_the_contexts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain kern bench: 128..32k decode, 709..16k prefill, the breakdown at 128 and 32k, a
    capacity within the fast manifest's reach (checked before the GPU)."""
    monkeypatch.chdir(ROOT)
    args = _parse()
    o = bench._options(args)  # type: ignore[arg-type]
    assert o.contexts == (128, 2048, 8192, 32768) and o.prefill == (709, 4096, 16384)
    assert o.breakdown == (128, 32768)
    load = options.resolve_load(args, config_for(None, ROOT))  # type: ignore[arg-type]
    import kern_runtime as kr

    roles = kr.serving_roles(kr.read_manifest(load.manifest))
    assert kb.bench_capacity(load, o, roles) == -(-(32768 + 2 * o.steps + 32) // 256) * 256
    assert bench._options(_parse("--contexts", "256,4096", "--breakdown", "none")).breakdown == ()  # type: ignore[arg-type]
    assert bench._options(_parse("--contexts", "256,4096")).breakdown == (256, 4096)  # type: ignore[arg-type]


def test_help_says_the_whole_first_paragraph_and_kern_bench_serve(capsys: pytest.CaptureFixture[str]) -> None:
    from kern_cli.main import main

    with pytest.raises(SystemExit) as info:
        main(["bench", "--help"])
    assert info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "beside floors measured in the same run and a compiled PyTorch peer on the same checkpoint" in out
    assert "kern bench serve [flags]: continuous batching throughput and latency" in out
    assert out.endswith("see kern bench serve --help.")


def test_the_flags_default_to_the_librarys_options() -> None:
    """The flags' defaults live beside the parser (building it loads no runtime); they are the
    library's."""
    assert (bench.MIN_STEPS, bench.DEFAULT_BENCH_STEPS, bench.DEFAULT_BENCH_CHUNK, bench.DEFAULT_CONTEXTS,
            bench.DEFAULT_PREFILL) == (kb.MIN_STEPS, kb.DEFAULT_BENCH_STEPS, kb.DEFAULT_BENCH_CHUNK,
                                       kb.DEFAULT_CONTEXTS, kb.DEFAULT_PREFILL)
    assert bench._options(_parse("--breakdown", "none")) == kb.BenchOptions()  # type: ignore[arg-type]
    assert bench.PEER_MODES == kb.PEER_MODES


def test_building_the_parsers_loads_no_runtime() -> None:
    import subprocess
    import sys

    code = ("import sys; from kern_cli.main import build_parser; build_parser(); "
            "print(sorted(k for k in sys.modules if k.startswith(('kern_runtime', 'cuda'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
