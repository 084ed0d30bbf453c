"""kern bench's PyTorch peer on the host: when it runs, its command line, its result's checks, and
the one-line errors (`--peer on` where it cannot run) before any GPU is looked for."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

import kern_runtime.bench as kb
import kern_runtime.bench.peer as bp
from kern_qwen3 import QWEN3_4B_CONFIG
from kern_runtime import loading

ROOT = Path(__file__).resolve().parents[3]
TINY = ("--manifest", str(ROOT / "examples" / "qwen3-tiny.json"), "--kernel-sources", str(ROOT / "tools" / "kernels-src"),
        "--contexts", "128,1024", "--prefill", "709")


def _without(monkeypatch: pytest.MonkeyPatch, *missing: str) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *a: Any) -> Any:
        return None if name in missing else real(name, *a)

    monkeypatch.setattr(bp.importlib.util, "find_spec", find_spec)


def _with_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *a: Any) -> Any:
        return real("json") if name == "torch" else real(name, *a)

    monkeypatch.setattr(bp.importlib.util, "find_spec", find_spec)


QWEN3 = dict(QWEN3_4B_CONFIG)


@pytest.mark.parametrize(
    ("mode", "config", "default", "run_it", "note"),
    [
        ("off", None, False, False, ""),
        ("auto", QWEN3, False, True, ""),
        ("on", QWEN3, False, True, ""),
        ("auto", None, True, True, ""),  # the seeded random Qwen3-4B
        ("auto", None, False, False, "the PyTorch peer is skipped: the weights have no config.json beside them "
                                     "(--peer off says nothing)"),
        ("auto", {"model_type": "llama"}, False, False,
         "the PyTorch peer is skipped: it runs Qwen3 checkpoints, and config.json says model_type 'llama' "
         "(--peer off says nothing)"),
        ("auto", {**QWEN3, "quantization_config": {"quant_method": "fp8"}}, False, False,
         "the PyTorch peer is skipped: it runs bf16 checkpoints, and config.json has a quantization_config (fp8) "
         "(--peer off says nothing)"),
    ],
)
def test_plan(monkeypatch: pytest.MonkeyPatch, mode: str, config: dict[str, Any] | None, default: bool,
              run_it: bool, note: str) -> None:
    _with_torch(monkeypatch)
    assert bp.plan_peer(mode, config, default_weights=default) == bp.PeerPlan(run_it, note)


def test_without_torch_auto_notes_and_on_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    _without(monkeypatch, "torch")
    plan = bp.plan_peer("auto", QWEN3, default_weights=False)
    assert plan == bp.PeerPlan(False, "the PyTorch peer is skipped: torch is not installed (uv sync --group gpu-test, "
                                      "or pip install torch) (--peer off says nothing)")
    with pytest.raises(bp.PeerError, match=r"^--peer on: the PyTorch peer cannot run: torch is not installed"):
        bp.plan_peer("on", QWEN3, default_weights=False)
    _without(monkeypatch, "kern_peer")
    with pytest.raises(bp.PeerError, match="kern_peer is not installed"):
        bp.plan_peer("on", QWEN3, default_weights=True)
    with pytest.raises(bp.PeerError, match="--peer must be one of auto, on, off, got 'yes'"):
        bp.plan_peer("yes", QWEN3, default_weights=True)


def _no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    def none() -> int:
        raise loading.NoGpuError("no NVIDIA GPU on this machine (test)")

    monkeypatch.setattr(loading, "count_gpus", none)


def _handle(*argv: str) -> int:
    from kern_cli.main import build_parser

    args = build_parser().parse_args(["bench", *argv])
    return int(args.handler(args))


@pytest.mark.parametrize(
    ("setup", "line"),
    [
        ("no-torch", "kern bench: --peer on: the PyTorch peer cannot run: torch is not installed "
                     "(uv sync --group gpu-test, or pip install torch)"),
        ("no-config", "kern bench: --peer on: the PyTorch peer cannot run: the weights have no config.json beside them"),
    ],
)
def test_peer_on_that_cannot_run_exits_2_before_the_gpu(setup: str, line: str, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    _no_gpu(monkeypatch)
    if setup == "no-torch":
        _without(monkeypatch, "torch")
        (tmp_path / "config.json").write_text(json.dumps(QWEN3))
    else:
        _with_torch(monkeypatch)
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")  # NOTE: an empty safetensors file
    assert _handle(*TINY, "--weights", str(weights), "--peer", "on") == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.strip().splitlines() == [line]


def test_kern_toml_bench_table(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                               tmp_path: Path) -> None:
    _no_gpu(monkeypatch)
    _without(monkeypatch, "torch")
    toml = tmp_path / "kern.toml"
    toml.write_text('[bench]\npeer = "on"\n')
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")  # NOTE: an empty safetensors file
    assert _handle(*TINY, "--config", str(toml), "--weights", str(weights)) == 2
    assert "--peer on: the PyTorch peer cannot run: torch is not installed" in capsys.readouterr().err
    assert _handle(*TINY, "--config", str(toml), "--weights", str(weights), "--peer", "off") == 2  # the flag wins
    assert capsys.readouterr().err.strip().splitlines() == ["kern bench: no NVIDIA GPU on this machine (test)"]
    toml.write_text('[bench]\npeer = "sometimes"\n')
    assert _handle(*TINY, "--config", str(toml), "--weights", str(weights)) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"kern bench: {toml}: [bench]: peer must be one of auto, on, off, got 'sometimes'"]
    toml.write_text('[bench]\nplot = true\n')
    assert _handle(*TINY, "--config", str(toml), "--weights", str(weights)) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"kern bench: {toml}: [bench]: unknown key(s) plot (allowed: out, peer)"]


def test_command_line() -> None:
    cmd = bp.peer_command([Path("/ck")], contexts=(128, 2048), prefill=(709,), steps=256, gpu=1, out=Path("/o.json"))
    assert cmd == [sys.executable, "-m", "kern_peer", "--weights", "/ck", "--contexts", "128,2048", "--prefill", "709",
                   "--steps", "256", "--gpu", "1", "--json", "/o.json"]


def _result(contexts: tuple[int, ...], prefill: tuple[int, ...]) -> dict[str, Any]:
    return {"peer": "torch x", "compile_s": 40.5,
            "decode": [{"context": c, "fed_ms_per_token": 3.0 + c / 1e4, "fixed_ms_per_token": 2.9 + c / 1e4}
                       for c in contexts],
            "prefill": [{"tokens": n, "ms": n / 100} for n in prefill]}


def test_result_checks() -> None:
    good = _result((128, 2048), (709,))
    assert bp.check_result(good, (128, 2048), (709,)) is good
    with pytest.raises(bp.PeerError, match="no decode at context 8192"):
        bp.check_result(good, (128, 8192), (709,))
    with pytest.raises(bp.PeerError, match="no prefill of 4096 tokens"):
        bp.check_result(good, (128,), (4096,))
    bad = json.loads(json.dumps(good))
    bad["decode"][0]["fixed_ms_per_token"] = -1
    with pytest.raises(bp.PeerError, match=r"decode@128.fixed_ms_per_token must be a positive number, got -1"):
        bp.check_result(bad, (128,), (709,))
    with pytest.raises(bp.PeerError, match="missing or malformed field 'compile_s'"):
        bp.check_result({"decode": [], "prefill": []}, (), ())
    with pytest.raises(bp.PeerError, match="not a JSON object"):
        bp.check_result([], (), ())


def _script(tmp_path: Path, body: str) -> list[str]:
    script = tmp_path / "peer.py"
    script.write_text(body)
    return [sys.executable, str(script)]


def test_run_peer_reads_the_result_or_says_why(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    result = _result((128,), (709,))
    ok = _script(tmp_path, f"import json, pathlib; pathlib.Path({str(out)!r}).write_text(json.dumps({result!r}))")
    assert bp.run_peer(ok, out, (128,), (709,)) == result
    failing = _script(tmp_path, "import sys; print('kern-peer: torch sees no CUDA device', file=sys.stderr); sys.exit(2)")
    with pytest.raises(bp.PeerError, match=r"the PyTorch peer failed \(exit 2; its kern-peer lines above say why\)"):
        bp.run_peer(failing, tmp_path / "none.json", (128,), (709,))
    silent = _script(tmp_path, "pass")
    with pytest.raises(bp.PeerError, match="wrote no readable result"):
        bp.run_peer(silent, tmp_path / "none.json", (128,), (709,))
    slow = _script(tmp_path, "import time; time.sleep(30)")
    with pytest.raises(bp.PeerError, match="ran past 1 s"):
        bp.run_peer(slow, out, (128,), (709,), timeout=1)


def test_the_peer_module_is_there_and_speaks_one_line(tmp_path: Path) -> None:
    """`python -m kern_peer` exists in this environment (a workspace member) and refuses bad input
    in one line, before torch is imported."""
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "kern_peer", "--weights", str(tmp_path / "none"),
                           "--json", str(tmp_path / "r.json")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [f"kern-peer: weights {tmp_path / 'none'}: no such file or directory"]


def test_a_failed_peer_keeps_kerns_report_and_exits_1(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    _with_torch(monkeypatch)
    monkeypatch.setattr(loading, "probe_gpu", lambda gpu: None)
    monkeypatch.setattr(kb, "bench_session", lambda load, options, log: kb.Report([kb.row("r", 1.0, "ms")]))

    def failing(*a: Any, **k: Any) -> Any:
        raise bp.PeerError("the PyTorch peer failed (exit 1; its kern-peer lines above say why)")

    monkeypatch.setattr(bp, "run_peer", failing)
    weights = tmp_path / "ck"
    weights.mkdir()
    (weights / "config.json").write_text(json.dumps(QWEN3))
    (weights / "model.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")  # NOTE: an empty safetensors file
    assert _handle(*TINY, "--weights", str(weights), "--out", str(tmp_path / "out")) == 1
    err = capsys.readouterr().err
    assert "kern bench: the PyTorch peer failed (exit 1; its kern-peer lines above say why)" in err
    saved = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert saved["rows"][0]["name"] == "r" and saved["peer"] is None and saved["notes"] == [
        "the PyTorch peer failed (exit 1; its kern-peer lines above say why)"]


def test_an_fp8_manifest_on_its_default_checkpoint_has_no_peer(monkeypatch: pytest.MonkeyPatch) -> None:
    _with_torch(monkeypatch)
    assert bp.plan_peer("auto", None, default_weights=True, fp8=True) == bp.PeerPlan(
        False, f"the PyTorch peer is skipped: {bp.FP8_MANIFEST} (--peer off says nothing)")
    with pytest.raises(bp.PeerError, match="--peer on: the PyTorch peer cannot run: it runs bf16 checkpoints"):
        bp.plan_peer("on", None, default_weights=True, fp8=True)
