"""kern-qwen3 (kern_qwen3.cli): manifests written from presets and configs, builds, --capture, and
bad input: one line `kern-qwen3: ...` on stderr, exit 2, no traceback, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.qwen3_options import (
    FAKE_ENTRIES,
    FAKE_HASHES,
    manifest,
)
from helpers.qwen3_options import generate as _generate

import kern_qwen3 as gen
from kern_qwen3 import QWEN3_4B_CONFIG, QWEN3_TINY_CONFIG, cli

TOOLS = Path(__file__).resolve().parents[2]
ROOT = TOOLS.parent
DONOR_CAPTURE = ROOT / "tools" / "tests" / "fixtures" / "donor_run2"
"""The donor captured on the H200 with the kernels shipped in kernels/ (same sha256s)."""


def _shipped() -> tuple[dict[str, str], dict[str, str]]:
    import hashlib

    modules = {p.name.rsplit("-", 1)[0]: hashlib.sha256(p.read_bytes()).hexdigest()
               for p in (ROOT / "kernels").glob("*.cubin")}
    return modules, gen.entry_modules(ROOT / "tools" / "kernels-src")


def test_main_reports_bad_config_on_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({**QWEN3_TINY_CONFIG, "model_type": "gpt2"}))
    assert cli.main([str(cfg), "-o", str(tmp_path / "m.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model_type" in err[0]
    assert not (tmp_path / "m.json").exists()


# --------------------------------------------------------------------------------------------
# The manifest's kernel ABI against the signatures in tools/kernels-src.

def test_main_reports_a_failed_build_on_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(dict(QWEN3_TINY_CONFIG)))
    assert cli.main([str(cfg), "-o", str(tmp_path / "m.json"), "--kernels-src", str(tmp_path / "nosrc")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kern-qwen3: ")
    assert not (tmp_path / "m.json").exists()


def test_main_with_a_preset_writes_the_manifest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "build_and_hash", lambda src, out: FAKE_HASHES)
    monkeypatch.setattr(cli, "entry_modules", lambda src: FAKE_ENTRIES)
    out = tmp_path / "qwen3-tiny.json"
    assert cli.main(["--preset", "qwen3-tiny", "-o", str(out)]) == 0
    assert json.loads(out.read_text()) == manifest(QWEN3_TINY_CONFIG, feed="device") | {"model": "qwen3-tiny"}
    flags = ["--gemv", "all", "--fuse", "--pdl", "--fold-norm", "--defer-norm"]
    assert cli.main(["--preset", "qwen3-tiny", "-o", str(out), *flags]) == 0
    assert json.loads(out.read_text()) == manifest(
        QWEN3_TINY_CONFIG, feed="device", gemv=list(gen.GEMV_GEMMS), fuse=True, pdl=True, fold_norm=True,
        defer_norm=True) | {"model": "qwen3-tiny"}


def test_main_writes_the_batched_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cli, "build_and_hash", lambda src, out: FAKE_HASHES)
    monkeypatch.setattr(cli, "entry_modules", lambda src: FAKE_ENTRIES)
    out = tmp_path / "b.json"
    assert cli.main(["--preset", "qwen3-tiny", "-o", str(out), "--rows", "8"]) == 0
    assert json.loads(out.read_text()) == manifest(QWEN3_TINY_CONFIG, feed="device", rows=8) | {"model": "b"}
    capsys.readouterr()
    for flags, words in ((["--rows", "8", "--feed", "host"], "needs feed device"),):
        assert cli.main(["--preset", "qwen3-tiny", "-o", str(tmp_path / "x.json"), *flags]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0] and not (tmp_path / "x.json").exists()


def test_main_writes_the_f32_manifest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cli, "build_and_hash", lambda src, out: FAKE_HASHES)
    monkeypatch.setattr(cli, "entry_modules", lambda src: FAKE_ENTRIES)
    out = tmp_path / "qwen3-tiny-f32.json"
    assert cli.main(["--preset", "qwen3-tiny", "-o", str(out), "--precision", "f32", "--feed", "host"]) == 0
    assert json.loads(out.read_text()) == manifest(QWEN3_TINY_CONFIG, feed="host", precision="f32") | {
        "model": "qwen3-tiny-f32"}
    capsys.readouterr()
    assert cli.main(["--preset", "qwen3-tiny", "-o", str(tmp_path / "x.json"), "--precision", "f32", "--fuse"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "drop fuse" in err[0] and not (tmp_path / "x.json").exists()


def test_capture_agrees_with_the_generated_donor_shape() -> None:
    modules, entries = _shipped()
    m = _generate(gen.shape_from_config(QWEN3_TINY_CONFIG), modules, entries, model="t", feed="device")
    assert cli.against_capture(m, DONOR_CAPTURE) == []


def test_capture_refuses_another_shape_and_other_constants(monkeypatch: pytest.MonkeyPatch) -> None:
    modules, entries = _shipped()
    m = _generate(gen.shape_from_config(QWEN3_4B_CONFIG), modules, entries, model="t", feed="device")
    problems = cli.against_capture(m, DONOR_CAPTURE)
    assert any("bytes_per_token 147456, mined 2048" in p for p in problems)
    tiny = _generate(gen.shape_from_config(QWEN3_TINY_CONFIG), modules, entries, model="t", feed="device")
    monkeypatch.setattr("kern_qwen3.entries.DECODE_SPLITS", 32)
    assert "decode_splits is 32 here but 16 in the capture" in cli.against_capture(tiny, DONOR_CAPTURE)


def test_capture_of_other_kernels_names_the_module(tmp_path: Path) -> None:
    modules, entries = _shipped()
    stale = {k: "0" * 64 for k in modules}
    m = _generate(gen.shape_from_config(QWEN3_TINY_CONFIG), stale, entries, model="t", feed="device")
    problems = cli.against_capture(m, DONOR_CAPTURE)
    assert any(p.startswith("module qwen3_core pins sha256 000000000000") for p in problems)
    assert cli.against_capture(m, tmp_path) != []  # an empty directory is not a capture


def test_capture_pins_the_cubins_it_ran(tmp_path: Path) -> None:
    modules, entries = _shipped()
    donor_ran = json.loads((ROOT / "examples" / "qwen3-tiny.json").read_text())["modules"]  # the donor's shape
    assert cli.captured_modules(DONOR_CAPTURE, entries) == {k: modules[k] for k in donor_ran}
    out = tmp_path / "tiny.json"
    rc = cli.main(["--preset", "qwen3-tiny", "--capture", str(DONOR_CAPTURE), "-o", str(out)])
    assert rc == 0 and json.loads(out.read_text())["modules"]["attention"]["sha256"] == modules["attention"]


def test_capture_that_cannot_be_mined_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "tiny.json"
    assert cli.main(["--preset", "qwen3-tiny", "--capture", str(tmp_path), "-o", str(out)]) == 2
    assert cli.main(["--preset", "qwen3-4b", "--capture", str(DONOR_CAPTURE), "-o", str(out)]) == 2
    assert not out.exists()


def _run(tmp_path: Path, capsys: pytest.CaptureFixture[str], config: bytes) -> list[str]:
    cfg = tmp_path / "config.json"
    cfg.write_bytes(config)
    out = tmp_path / "m.json"
    assert cli.main([str(cfg), "-o", str(out), "--kernels-src", "tools/kernels-src"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and not out.exists()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kern-qwen3: ")
    return lines


@pytest.mark.parametrize(("config", "words"), [
    (b"[1, 2]", "must be a JSON object, got a JSON list"),
    (b"\xff\xfe{}", "is not UTF-8"),
    (b"{not json", "is not JSON"),
    (json.dumps({**QWEN3_TINY_CONFIG, "head_dim": 0}).encode(), "'head_dim' must be a positive integer"),
    (json.dumps({**QWEN3_TINY_CONFIG, "head_dim": -64}).encode(), "'head_dim' must be a positive integer"),
    (json.dumps({**QWEN3_TINY_CONFIG, "head_dim": 64.0}).encode(), "'head_dim' must be a positive integer"),
    (json.dumps({**QWEN3_TINY_CONFIG, "num_hidden_layers": "2"}).encode(), "'num_hidden_layers' must be"),
    (json.dumps({k: v for k, v in QWEN3_TINY_CONFIG.items() if k != "vocab_size"}).encode(), "'vocab_size' must be"),
])
def test_bad_configs_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], config: bytes, words: str) -> None:
    assert words in _run(tmp_path, capsys, config)[0]


def test_a_manifest_the_verifier_rejects_is_not_written(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "build_and_hash", lambda src, out: dict.fromkeys(
        ("attention", "gemv", "gemv_defer", "prefill", "qwen3_core", "sampling", "qwen3_f32"), "c" * 64))
    line = _run(tmp_path, capsys, json.dumps({**QWEN3_TINY_CONFIG, "vocab_size": 10**12}).encode())[0]
    assert "the generated manifest does not verify" in line


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.startswith("kern-qwen3 ")


@pytest.mark.parametrize(("argv", "line"), [
    (["--preset", "qwen3-tiny", "-o", "m.json", "--rows", "0"],
     "kern-qwen3: --rows 0: the batched step needs R >= 2 (one row is the decode program itself) (see kern-qwen3 --help)"),
    (["--preset", "qwen3-tiny", "-o", "m.json", "--rows", "1"],
     "kern-qwen3: --rows 1: the batched step needs R >= 2 (one row is the decode program itself) (see kern-qwen3 --help)"),
    (["--preset", "qwen3-tiny", "-o", "m.json", "--rows", "abc"],
     "kern-qwen3: argument --rows: invalid int value: 'abc' (see kern-qwen3 --help)"),
    (["-o", "m.json"], "kern-qwen3: one of the arguments config --preset is required (see kern-qwen3 --help)"),
])
def test_bad_flags_are_one_line(argv: list[str], line: str, capsys: pytest.CaptureFixture[str],
                                tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    try:
        code = cli.main(argv)
    except SystemExit as exc:
        code = exc.code
    assert code == 2 and not (tmp_path / "m.json").exists()
    assert capsys.readouterr().err.strip().splitlines() == [line]
