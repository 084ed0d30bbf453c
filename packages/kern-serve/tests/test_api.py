"""The OpenAI wire format without a server: the request checks (`completion_ask`, `chat_ask`: a bad
field is a 400 `ApiFailure` naming it) and the text a client sees (`Text`: stop ids and strings,
streamed deltas whose sum is the whole answer, the same as the rule applied to the whole decode)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kern_serve import ApiFailure, Text, chat_ask, completion_ask


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
