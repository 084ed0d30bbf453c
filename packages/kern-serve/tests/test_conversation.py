"""Turns to prompts (`Conversation`): plain turns append after a newline, chat turns re-render the
whole conversation through the family's template and an answer's stop token is not its text; the
server's template of a family no provider knows refuses every conversation."""

from __future__ import annotations

import pytest

from kern_runtime.providers import find
from kern_serve import chat_template, conversation


class _Tok:
    """Characters as ids (ord), `@` as the stop token 0."""

    def encode(self, text: str) -> list[int]:
        return [0 if c == "@" else ord(c) for c in text.replace("<|im_end|>", "@").replace("<|endoftext|>", "@")]

    def decode(self, ids: list[int]) -> str:
        return "".join("@" if i == 0 else chr(i) for i in ids)


def test_plain_turns_append_after_a_newline() -> None:
    conv = conversation(_Tok(), None)
    assert conv.prompt([], "ab") == [97, 98] and conv.stop == frozenset()
    assert conv.prompt([97, 98, 120], "c") == [97, 98, 120, 10, 99]


def test_chat_turns_render_the_whole_conversation() -> None:
    tok = _Tok()
    conv = conversation(tok, find({"model": "qwen3-4b"}))
    assert conv.stop == frozenset({0})
    first = tok.decode(conv.prompt([], "hi"))
    assert first == "<|im_start|>user\nhi@\n<|im_start|>assistant\n"
    assert conv.answered("hi", tok.encode("yo@")) == "yo"
    again = tok.decode(conv.prompt([1, 2], "more"))
    assert again == first + "yo@\n<|im_start|>user\nmore@\n<|im_start|>assistant\n"


def test_the_servers_template_is_the_familys_or_refuses() -> None:
    messages = [{"role": "user", "content": "hi"}]
    assert chat_template({"model": "qwen3-tiny"})(messages).startswith("<|im_start|>user\nhi<|im_end|>")
    with pytest.raises(ValueError, match=r"^no chat template: no installed model provider knows model 'llama'"):
        chat_template({"model": "llama"})(messages)
