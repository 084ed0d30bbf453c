"""kern test on the host: bad inputs are one line and exit 2 before any GPU is looked for; flags
over kern.toml [test] over defaults."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

import kern_cli.abtest_cmd as abtest_cmd
import kern_runtime.abtest as ab
from kern_cli.config import KernTomlError, load_config
from kern_runtime import loading

ROOT = Path(__file__).resolve().parents[3]
TINY = ROOT / "examples" / "qwen3-tiny.json"
SOURCES = ("--kernel-sources", str(ROOT / "tools" / "kernels-src"))


def _parse(*argv: str) -> Any:
    from kern_cli.main import build_parser

    return build_parser().parse_args(["test", *argv])


def _probed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The GPUs looked for; none is there."""
    seen: list[int] = []

    def probe(gpu: int) -> None:
        seen.append(gpu)
        raise loading.NoGpuError("no NVIDIA GPU on this machine (test)")

    monkeypatch.setattr(loading, "probe_gpu", probe)
    return seen


def _run(*argv: str) -> int:
    args = _parse(*argv)
    return int(args.handler(args))


def _write(tmp_path: Path, name: str, m: dict[str, Any]) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(m))
    return str(path)


def _tiny() -> dict[str, Any]:
    return json.loads(TINY.read_text())


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    out = capsys.readouterr()
    assert out.out == "" and "Traceback" not in out.err
    lines = out.err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_valid_inputs_reach_the_gpu_probe(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    seen = _probed(monkeypatch)
    assert _run(str(TINY), str(TINY), *SOURCES, "--gpu", "1") == 2
    assert seen == [1]
    assert _one_line(capsys) == "kern test: no NVIDIA GPU on this machine (test)"


def _bad(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    other_model = _tiny()
    other_model["buffers"]["final_norm"]["bind"] = [{"tensor": "model.final.weight"}]
    other_vocab = _tiny()
    other_vocab["buffers"]["ids"]["domain"]["max"] = 4000
    renamed = _tiny()
    for name in ("prefill", "decode", "head", "start"):
        renamed["programs"]["b_" + name] = renamed["programs"].pop(name)
    no_roles = copy.deepcopy(_tiny())
    del no_roles["buffers"]["next_token"]["fill"]
    tiny = str(TINY)
    return {
        "missing A": ([str(tmp_path / "nope.json"), tiny], "kern test: A " + str(tmp_path / "nope.json") +
                      ": no such manifest file or kern.toml target (targets: none)"),
        "missing B": ([tiny, "nope"], "kern test: B nope: no such manifest file or kern.toml target (targets: none)"),
        "models": ([tiny, _write(tmp_path, "m.json", other_model)],
                   "kern test: different models: A binds checkpoint tensors the other does not (model.norm.weight)"),
        "models 4b": ([tiny, str(ROOT / "examples" / "qwen3-4b.json")], "kern test: different models: B binds"),
        "vocabularies": ([tiny, _write(tmp_path, "v.json", other_vocab)],
                         "kern test: different vocabularies: A takes token ids up to 4095, B up to 4000"),
        "no common program": ([tiny, _write(tmp_path, "r.json", renamed)],
                              "kern test: no common program: A runs prefill, decode, head, start; B runs b_prefill"),
        "no roles": ([tiny, _write(tmp_path, "n.json", no_roles)], "kern test: manifest needs exactly one buffer"),
        "broken": ([_write(tmp_path, "x.json", {"schema_version": 5}), tiny], "kern test: manifest "),
        "steps": ([tiny, tiny, "--decode-steps", "0"], "kern test: --decode-steps must be at least 1, got 0"),
        "runs": ([tiny, tiny, "--runs", "0"], "kern test: --runs must be at least 1, got 0"),
        "seed": ([tiny, tiny, "--seed", "-1"], "kern test: --seed must not be negative, got -1"),
        "kl": ([tiny, tiny, "--logit-kl", "-0.5"], "kern test: --logit-kl must be a positive number of nats"),
        "room": ([tiny, tiny, "--capacity", "8", "--decode-steps", "8"], "kern test: --capacity 8 leaves no room"),
        "reach": ([tiny, tiny, "--capacity", "100000"], "kern test: capacity 100000 exceeds the model's reach"),
        "negative --gpu": ([tiny, tiny, "--gpu", "-1"], "kern test: --gpu must not be negative, got -1"),
        "kernels": ([tiny, tiny, "--kernels", str(tmp_path / "k"), "--kernel-sources", str(tmp_path / "s")],
                    f"kern test: kernels directory {tmp_path / 'k'} does not exist and the kernel sources"),
    }


@pytest.mark.parametrize("case", ["missing A", "missing B", "models", "models 4b", "vocabularies", "no common program",
                                  "no roles", "broken", "steps", "runs", "seed", "kl", "room", "reach", "negative --gpu",
                                  "kernels"])
def test_bad_input_is_one_line_before_the_gpu(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    seen = _probed(monkeypatch)
    argv, want = _bad(tmp_path)[case]
    if case != "kernels":
        argv = [*argv, *SOURCES]
    assert _run(*argv) == 2
    assert _one_line(capsys).startswith(want)
    assert seen == []


def test_a_bad_flag_value_is_argparse_s_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        _parse(str(TINY), str(TINY), "--logit-kl", "lots")
    assert info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "kern test: argument --logit-kl: invalid float value: 'lots' (see kern test --help)"]


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "kern.toml"
    path.write_text(text)
    return path


def test_flag_over_toml_over_default(tmp_path: Path) -> None:
    config = _toml(tmp_path, f'capacity = 512\n[targets.tiny]\nmanifest = "{TINY}"\nkernels = "{ROOT / "kernels"}"\n'
                             "[test]\nseed = 7\nruns = 3\ndecode_steps = 5\nlogit_kl = 1\n")
    plan = abtest_cmd._plan(_parse("tiny", str(TINY), "--config", str(config), "--runs", "4", "--no-noise"))  # pyright: ignore[reportPrivateUsage]
    o = plan.options
    assert (o.seed, o.runs, o.decode_steps, o.logit_kl, o.capacity, o.iters) == (7, 4, 5, 1.0, 512, ab.DEFAULT_ITERS)
    assert (o.noise, o.perf) == (False, True)
    assert plan.a.manifest == TINY and plan.kernels == ROOT / "kernels"
    plan = abtest_cmd._plan(_parse(str(TINY), str(TINY), "--config", str(_toml(tmp_path, "")), *SOURCES))  # pyright: ignore[reportPrivateUsage]
    assert plan.options == ab.AbOptions(capacity=abtest_cmd.DEFAULT_CAPACITY)
    assert abtest_cmd.DEFAULT_CAPACITY == ab.DEFAULT_CAPACITY


@pytest.mark.parametrize(("text", "want"), [
    ("[test]\nlogit_kl = 0\n", "[test]: logit_kl must be a positive number, got 0"),
    ("[test]\nlogit_kl = true\n", "[test]: logit_kl must be a positive number, got True"),
    ("[test]\nruns = -1\n", "[test]: runs must not be negative, got -1"),
    ("[test]\nfuzz = 1\n", "[test]: unknown key(s)"),
])
def test_toml_test_table_is_checked(tmp_path: Path, text: str, want: str) -> None:
    with pytest.raises(KernTomlError) as info:
        load_config(_toml(tmp_path, text))
    assert want in str(info.value)


def test_the_repository_kern_toml_reads() -> None:
    t = load_config(ROOT / "kern.toml").test
    assert (t.seed, t.logit_kl) == (ab.DEFAULT_SEED, ab.DEFAULT_LOGIT_KL)


def test_an_fp8_candidate_takes_its_own_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """The tiny FP8 manifest against the bf16 one: the same model (its scale tensors aside); B binds
    `--weights-b`, A `--weights`; an FP8 checkpoint for the bf16 side is one line."""
    from kern_qwen3 import QWEN3_TINY_CONFIG, random_checkpoint, random_fp8_checkpoint

    bf16, _ = random_checkpoint(QWEN3_TINY_CONFIG, seed=1, name="tiny", root=tmp_path)
    fp8, _ = random_fp8_checkpoint(QWEN3_TINY_CONFIG, layout="qwen-fp8", seed=1, name="tiny", root=tmp_path)
    fp8_manifest = str(ROOT / "examples" / "qwen3-tiny-fp8.json")
    plan = abtest_cmd._plan(_parse(str(TINY), fp8_manifest, *SOURCES, "--weights", str(bf16),  # pyright: ignore[reportPrivateUsage]
                                   "--weights-b", str(fp8)))
    assert plan.weights is not None and {p.parent for p in plan.weights} == {bf16}
    assert plan.weights_b is not None and {p.parent for p in plan.weights_b} == {fp8}
    seen = _probed(monkeypatch)
    monkeypatch.chdir(tmp_path)
    assert _run(str(TINY), fp8_manifest, *SOURCES, "--weights", str(bf16)) == 2
    assert "FP8" in _one_line(capsys) and seen == []
