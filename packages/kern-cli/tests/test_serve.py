"""kern serve on the host, without a model: flags checked before anything loads (one line, exit 2),
the OpenAI request checks, and the text a client sees (stop ids and strings, streamed deltas whose
sum is the whole answer). The server itself runs as a process in tools/tests/test_serve_interp.py."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kern_cli import serve
from kern_cli.main import main as kern_main
from kern_cli.serve_api import ApiFailure, Text, chat_ask, completion_ask
from kern_runtime.loading import available_ram, size_text

ROOT = Path(__file__).resolve().parents[3]
TINY = str(ROOT / "examples" / "qwen3-tiny.json")


def _line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize(("argv", "line"), [
    (["--port", "70000"], "kern serve: --port must be in 0..65535, got 70000"),
    (["--rows", "0"], "kern serve: --rows must be at least 1, got 0"),
    (["--grow", "-1"], "kern serve: --grow must be at least 0, got -1"),
    (["--chunk-graphs", "-1"], "kern serve: --chunk-graphs must be at least 0, got -1"),
    (["--api-key", ""], "kern serve: the API key is empty: pass --api-key KEY or unset KERN_API_KEY"),
    (["--backend", "nomodule"], "kern serve: --backend 'nomodule': write MODULE:ATTRIBUTE (e.g. "
                                "kern_runtime.serving:open_engine)"),
    (["--backend", "kern_cli.nothing:engine"], "kern serve: --backend 'kern_cli.nothing:engine': cannot import "
                                               "kern_cli.nothing (No module named 'kern_cli.nothing')"),
    (["--backend", "kern_cli.serve:nothing"], "kern serve: --backend 'kern_cli.serve:nothing': kern_cli.serve has "
                                              "no callable nothing"),
    (["--tokenizer", "kern_cli.serve:nothing"], "kern serve: --tokenizer 'kern_cli.serve:nothing': kern_cli.serve has "
                                                "no callable nothing"),
])
def test_bad_flags_are_one_line(argv: list[str], line: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert kern_main(["serve", "--manifest", TINY, "--port", "0", *argv]) == 2
    assert _line(capsys) == line


def test_a_missing_manifest_and_a_taken_port(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert kern_main(["serve", "--manifest", str(tmp_path / "no.json")]) == 2
    assert _line(capsys) == f"kern serve: --manifest {tmp_path / 'no.json'}: no such file"
    sock = serve._bind("127.0.0.1", 0)  # pyright: ignore[reportPrivateUsage]
    try:
        port = sock.getsockname()[1]
        argv = ["serve", "--manifest", TINY, "--port", str(port), "--tokenizer", "kern_interp.serve:tokenizer"]
        assert kern_main(argv) == 2
        assert _line(capsys).startswith(f"kern serve: cannot listen on 127.0.0.1:{port}: ")
    finally:
        sock.close()


def test_the_api_key_comes_from_the_environment() -> None:
    args = serve.build_parser().parse_args(["--manifest", TINY])
    assert serve.resolve(args, {"KERN_API_KEY": "k"}).api_key == "k"
    assert serve.resolve(args, {}).api_key is None
    args = serve.build_parser().parse_args(["--manifest", TINY, "--api-key", "flag"])
    assert serve.resolve(args, {"KERN_API_KEY": "env"}).api_key == "flag"
    assert serve.resolve(args, {}).host == "127.0.0.1"
    assert serve.resolve(args, {}).chunk_graphs == 32
    args = serve.build_parser().parse_args(["--manifest", TINY, "--chunk-graphs", "0"])
    assert serve.resolve(args, {}).chunk_graphs == 0
    assert serve.resolve(args, {}).first_token == "step"
    args = serve.build_parser().parse_args(["--manifest", TINY, "--first-token", "head"])
    assert serve.resolve(args, {}).first_token == "head"


def test_bench_serve_is_routed_and_checks_its_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert kern_main(["bench", "serve", "--manifest", TINY, "--clients", "0"]) == 2
    assert _line(capsys) == "kern bench serve: --clients needs positive integers, got '0'"
    assert kern_main(["bench", "serve", "--manifest", TINY, "--rounds", "0"]) == 2
    assert _line(capsys) == "kern bench serve: --rounds must be at least 1, got 0"


# ---- the request checks ---------------------------------------------------------------------------


def test_completion_asks() -> None:
    ask = completion_ask({"model": "m", "prompt": ["hi"], "max_tokens": 3, "stop": "x", "seed": -1,
                          "stream": True, "stream_options": {"include_usage": True}}, "m")
    assert (ask.prompt, ask.max_tokens, ask.stop, ask.stream, ask.usage) == ("hi", 3, ("x",), True, True)
    assert ask.sampling.seed == (1 << 63) - 1 and ask.sampling.temperature == 0 and ask.sampling.logprobs == -1
    assert completion_ask({"model": "m", "prompt": [[1, 2]], "logprobs": 2}, "m").prompt == [1, 2]
    assert completion_ask({"model": "m", "prompt": "a"}, "m").max_tokens == 16


@pytest.mark.parametrize(("body", "param"), [
    ({"model": "m", "prompt": ["a", "b"]}, "prompt"),
    ({"model": "m", "prompt": [True]}, "prompt"),
    ({"model": "m", "prompt": "a", "top_p": 1.5}, "top_p"),
    ({"model": "m", "prompt": "a", "temperature": float("inf")}, "temperature"),
    ({"model": "m", "prompt": "a", "stream_options": {"include_usage": True}}, "stream_options"),
    ({"model": "m", "prompt": "a", "echo": True}, "echo"),
    ({"model": "m", "prompt": "a", "suffix": "z"}, "suffix"),
    ({"model": "m", "prompt": "a", "presence_penalty": 0.5}, "presence_penalty"),
    ({"model": "m", "prompt": "a", "logit_bias": {"1": 2}}, "logit_bias"),
    ({"model": "m", "prompt": "a", "logprobs": 21}, "logprobs"),
])
def test_bad_completion_asks(body: dict[str, object], param: str) -> None:
    with pytest.raises(ApiFailure) as err:
        completion_ask(body, "m")
    assert err.value.status == 400 and err.value.param == param


def test_chat_asks() -> None:
    ask = chat_ask({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                          {"type": "text", "text": "b"}]}],
                    "max_completion_tokens": 5, "logprobs": True, "top_logprobs": 3}, "m")
    assert ask.messages == ({"role": "user", "content": "ab"},) and ask.max_tokens == 5 and ask.sampling.logprobs == 3
    with pytest.raises(ApiFailure, match="text parts"):
        chat_ask({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "m")


# ---- the text ---------------------------------------------------------------------------------


def _letters(ids: Sequence[int]) -> str:
    return "".join(chr(ord("a") + i) if i < 26 else "\ufffd" for i in ids)


def test_text_deltas_sum_to_the_whole_and_stop_strings_cut() -> None:
    t = Text(_letters, ("cd",), frozenset({25}))
    deltas = [t.push(i) for i in (0, 1, 2)]
    assert deltas == ["", "a", "b"]  # one character held back: it could start "cd"
    assert t.push(3) == "" and t.end() == ""  # "abcd" holds the stop string: the answer is "ab"
    assert t.shown == "ab"
    u = Text(_letters, (), frozenset({25}))
    assert [u.push(i) for i in (0, 30, 1, 25)] == ["a", "", "\ufffdb", ""] and u.end() == ""
    assert u.shown == "a\ufffdb"


_PIECES = [b"a", b"b", b"c", b" ", "\u00e9".encode(), "\u4e2d".encode()[:1], "\u4e2d".encode()[1:], b"\xff",
           b"cd", b"\n"]


def _bytes(ids: Sequence[int]) -> str:
    return b"".join(_PIECES[i] for i in ids).decode("utf-8", errors="replace")


class _WholeText:
    """The streaming rule over the whole decode each token: the text cut at the first stop string;
    while running, the last len(longest stop) - 1 characters and a trailing U+FFFD held back; a
    delta only when the text extends what was shown."""

    def __init__(self, stops: tuple[str, ...], stop_ids: frozenset[int]) -> None:
        self.stops, self.stop_ids, self.ids, self.shown = stops, stop_ids, list[int](), ""

    def _text(self, final: bool) -> str:
        text = _bytes(self.ids)
        cuts = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if cuts:
            return text[: min(cuts)]
        if not final:
            hold = max((len(s) for s in self.stops), default=1) - 1
            text = (text[: len(text) - hold] if hold else text).rstrip("\ufffd")
        return text

    def _delta(self, text: str) -> str:
        if len(text) <= len(self.shown) or not text.startswith(self.shown):
            return ""
        delta, self.shown = text[len(self.shown) :], text
        return delta

    def push(self, token: int) -> str:
        if token not in self.stop_ids:
            self.ids.append(token)
        return self._delta(self._text(False))

    def end(self) -> str:
        return self._delta(self._text(True))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, len(_PIECES) - 1), max_size=40),
       st.lists(st.sampled_from(["cd", "b c", "\u4e2d", "a", "\ufffd\n", "ca"]), max_size=2, unique=True))
def test_text_streams_what_the_whole_decode_streams(ids: list[int], stops: list[str]) -> None:
    """Token by token the same deltas as the rule applied to the whole decode each time, though
    each token decodes only a few ids."""
    t, ref = Text(_bytes, tuple(stops), frozenset({9})), _WholeText(tuple(stops), frozenset({9}))
    for i in ids:
        assert t.push(i) == ref.push(i)
    assert t.end() == ref.end() and t.shown == ref.shown


def _toml(tmp: Path, serve_table: str) -> Path:
    (tmp / "a.json").write_text("{}")
    (tmp / "b.json").write_text("{}")
    path = tmp / "kern.toml"
    path.write_text('target = "a"\n[targets.a]\nmanifest = "a.json"\n[targets.b]\nmanifest = "b.json"\n' + serve_table)
    return path


def test_serve_takes_kern_toml_serve_target_unless_one_is_named(tmp_path: Path) -> None:
    cfg = str(_toml(tmp_path, '[serve]\ntarget = "b"\n'))
    assert serve.resolve(serve.build_parser().parse_args(["--config", cfg])).load.manifest == tmp_path / "b.json"
    named = serve.build_parser().parse_args(["--config", cfg, "a"])
    assert serve.resolve(named).load.manifest == tmp_path / "a.json"
    flag = serve.build_parser().parse_args(["--config", cfg, "--manifest", TINY])
    assert serve.resolve(flag).load.manifest == Path(TINY)
    plain = str(_toml(tmp_path, ""))
    assert serve.resolve(serve.build_parser().parse_args(["--config", plain])).load.manifest == tmp_path / "a.json"


@pytest.mark.parametrize(("table", "word"), [
    ('[serve]\ntarget = "nope"\n', "no target 'nope' (declared: a, b)"),
    ("[serve]\ntarget = 3\n", "[serve]"),
    ('[serve]\nrows = 4\n', "rows"),
])
def test_a_bad_serve_table_is_one_line(tmp_path: Path, table: str, word: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert kern_main(["serve", "--config", str(_toml(tmp_path, table))]) == 2
    line = _line(capsys)
    assert line.startswith("kern serve: ") and word in line


# ---- startup checks: backend, tokenizer, sizes ----------------------------------------------------

CPU_TOKENIZER = ["--tokenizer", "kern_interp.serve:tokenizer"]


@pytest.mark.parametrize(("argv", "line"), [
    (["--backend", "os:getcwd"],
     "kern serve: --backend 'os:getcwd': getcwd() cannot be called with one kern_runtime.serving.EngineSpec"),
    (["--backend", "kern_cli." + "x" * 200 + ":engine"],
     "kern serve: --backend 'kern_cli.xxxxxxxx...xxxxxxxxxxx:engine': cannot import kern_cli.xxxxxxxxxxxxxxxxxxxxxxxxxxxx"
     "... (No module named 'kern_cli.xxxxxxxxxxx...)"),
    ([*CPU_TOKENIZER[:1], "os:getcwd"],
     "kern serve: --tokenizer 'os:getcwd' gave a str, which has no encode(text) and decode(ids)"),
    ([*CPU_TOKENIZER[:1], "os:getenv"],
     "kern serve: --tokenizer 'os:getenv': getenv(key, default=None) cannot be called with no argument"),
    ([], "kern serve: --tokenizer 'qwen2.5-72b-instruct' gives ids up to 151850; the model ('qwen3-tiny.json') takes "
         "token ids 0..4095: pass this model's tokenizer"),
    ([*CPU_TOKENIZER, "--rows", "1000000000"],
     "kern serve: --rows 1000000000: a pool of 65536 tokens has 4096 pages of 16 tokens and a running request holds "
     "at least one: pass --rows 4096 or less, or a larger --capacity"),
    ([*CPU_TOKENIZER, "--capacity", "100", "--rows", "8"],
     "kern serve: --rows 8: a pool of 100 tokens has 7 pages of 16 tokens and a running request holds at least one: "
     "pass --rows 7 or less, or a larger --capacity"),
    ([*CPU_TOKENIZER, "--capacity", "100000000000000000000"],
     "kern serve: --capacity 100000000000000000000: the capacity cannot hold the pool: a budget of "
     "3051757812500000 chunks of 67108864 bytes is past the 1048576 chunks a pool holds: ask for fewer tokens"),
])
def test_bad_backends_tokenizers_and_sizes_are_one_line(argv: list[str], line: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Checked before the GPU is looked for (this machine has none) and before the port is bound."""
    assert kern_main(["serve", "--manifest", TINY, "--port", "0", *argv]) == 2
    assert _line(capsys) == line


def test_host_bytes_past_the_ram_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert kern_main(["serve", "--manifest", TINY, *CPU_TOKENIZER, "--host-bytes", "1000000000000000"]) == 2
    assert re.fullmatch(r"kern serve: backend 'kern_runtime\.serving:open_engine' needs 909\.5 TiB of RAM \(the host "
                        r"tier 909\.5 TiB\); this machine has [\d.]+ [KMGT]iB available: pass a smaller --capacity or "
                        r"--host-bytes", _line(capsys))


def test_bench_serve_checks_the_same_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    assert kern_main(["bench", "serve", "--manifest", TINY, "--capacity", "100000000000000000000"]) == 2
    assert _line(capsys).startswith("kern bench serve: --capacity 100000000000000000000: the capacity cannot hold the "
                                    "pool: a budget of 3051757812500000 chunks")
    assert kern_main(["bench", "serve", "--manifest", TINY, "--rows", "1000000000"]) == 2
    assert _line(capsys).startswith("kern bench serve: --rows 1000000000: a pool of 65536 tokens has 4096 pages")


def test_size_text_and_the_ram_available(tmp_path: Path) -> None:
    assert [size_text(n) for n in (0, 1023, 1024, 3 << 29, 10**15, 1 << 80)] == [
        "0 bytes", "1023 bytes", "1.0 KiB", "1.5 GiB", "909.5 TiB", "over 1024 EiB"]
    info = tmp_path / "meminfo"
    info.write_text("MemTotal:       16000000 kB\nMemAvailable:    8000000 kB\n")
    assert available_ram(info) == 8000000 * 1024
    assert available_ram(tmp_path / "none") > 0


def test_a_host_tier_below_one_page_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """A tier that holds no KV page would silently be none."""
    assert kern_main(["serve", "--manifest", TINY, *CPU_TOKENIZER, "--host-bytes", "32767"]) == 2
    assert _line(capsys) == ("kern serve: --host-bytes 32767 holds no KV page of 32768 bytes: pass 0 (no host tier) "
                             "or at least 32768")
