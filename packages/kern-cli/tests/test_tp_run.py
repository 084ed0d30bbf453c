"""kern-run --tp and kern chat --tp: the flag's checks, the manifest's topology, and the GPU count,
each one line and exit 2 before anything touches a GPU (and before the default checkpoint is
written), for one generation and for turns alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import kern_cli.chat as chat
import kern_cli.run as run
from kern_cli import options
from kern_runtime import loading

from .test_run import _manifest, _model, _one_line, _touch, _write_manifest


def _tp_manifest(n: int) -> dict[str, Any]:
    m = _manifest()
    m["topology"] = {"groups": {"tp": n}}
    m["buffers"]["x"] = {"dtype": "bf16", "shape": [4], "kind": "workspace"}
    m["ops"]["sum"] = {"params": ["in buffer<bf16>", "out buffer<bf16>", "i64"], "impl": {"launches": [
        {"entry": "extern:nccl_allreduce_bf16", "args": [{"param": 0}, {"param": 1}, {"param": 2}, {"rank": "tp"}]}]}}
    m["programs"]["step"]["calls"] = [_touch(), {"op": "sum", "args": [{"buf": "w"}, {"buf": "x"}, {"i64": 4}]}]
    return m


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KERN_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def _main(path: Path, *extra: str) -> int:
    return run.main(["--manifest", str(path), "--kernels", "kernels", "--prompt-ids", "1,2,3", "--steps", "2",
                     *extra])


def test_fewer_gpus_than_ranks_is_one_line(in_tmp: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(loading, "count_gpus", lambda: 1)
    assert _main(_write_manifest(in_tmp, _tp_manifest(2)), "--tp", "2") == 2
    assert _one_line(capsys) == "kern-run: --tp 2 from --gpu 0 needs 2 GPUs; this machine shows 1"
    assert not (in_tmp / "cache").exists()


def test_gpu_offset_counts_too(in_tmp: Path, monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(loading, "count_gpus", lambda: 2)
    assert _main(_write_manifest(in_tmp, _tp_manifest(2)), "--tp", "2", "--gpu", "1") == 2
    assert "needs 3 GPUs; this machine shows 2" in _one_line(capsys)


def test_a_manifest_of_another_size_is_refused_before_the_gpu(in_tmp: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(loading, "count_gpus", lambda: pytest.fail("the GPU was looked for"))
    assert _main(_write_manifest(in_tmp, {**_tp_manifest(4), "model": "qwen3-4b-tp4"}), "--tp", "2") == 2
    assert "declares {'tp': 4}: generate one with kern-qwen3 --tp 2" in _one_line(capsys)
    assert _main(_write_manifest(in_tmp, _tp_manifest(4)), "--tp", "2") == 2
    assert "declares {'tp': 4}: generate one with the model family's manifest generator --tp 2" in _one_line(capsys)
    assert _main(_write_manifest(in_tmp), "--tp", "2") == 2
    assert "declares none" in _one_line(capsys)


def test_bad_tp_flags(in_tmp: Path) -> None:
    args = run.build_parser().parse_args(["--manifest", "m", "--tp", "0"])
    with pytest.raises(options.RunError, match="at least 1"):
        options.resolve_options(args)


def test_tp_takes_turns_and_the_chat_template_too(in_tmp: Path) -> None:
    o = options.resolve_options(run.build_parser().parse_args(["--manifest", "m", "--tp", "2", "--chat"]))
    assert (o.tp, o.chat) == (2, True)
    o = options.resolve_options(chat.build_parser().parse_args(["--manifest", "m", "--tp", "2"]))
    assert (o.tp, o.chat, o.prog) == (2, True, "kern chat")


def test_turns_and_kern_chat_over_ranks_check_the_gpus_first(in_tmp: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(loading, "count_gpus", lambda: 1)
    path = _write_manifest(in_tmp, _tp_manifest(2))
    (in_tmp / "turns.txt").write_text("hello\nagain\n")
    assert run.main(["--manifest", str(path), "--kernels", "kernels", "--turns", "turns.txt", "--tp", "2"]) == 2
    assert _one_line(capsys) == "kern-run: --tp 2 from --gpu 0 needs 2 GPUs; this machine shows 1"
    assert chat.main(["--manifest", str(path), "--kernels", "kernels", "--tp", "2", "--raw"]) == 2
    assert _one_line(capsys) == "kern chat: --tp 2 from --gpu 0 needs 2 GPUs; this machine shows 1"
    assert chat.main(["--manifest", str(_write_manifest(in_tmp)), "--kernels", "kernels", "--tp", "2", "--raw"]) == 2
    assert "kern chat: --tp 2 needs a manifest with topology" in _one_line(capsys)
    assert not (in_tmp / "cache").exists()


def test_check_topology_and_gpus_directly() -> None:
    loading.check_topology(_model(_tp_manifest(2)), 2)
    with pytest.raises(loading.LoadError, match="declares"):
        loading.check_topology(_model({**_tp_manifest(2), "topology": {"groups": {"tp": 2, "dp": 1}}}), 2)
    loading.check_gpus(2, 0, lambda: 2)
    with pytest.raises(loading.NoGpuError, match="needs 8 GPUs; this machine shows 1"):
        loading.check_gpus(8, 0, lambda: 1)
