"""Qwen3's chat template (the checkpoints' Jinja template without tools), rendered exactly."""

from __future__ import annotations

import pytest

from kern_qwen3 import STOP_TEXTS, ChatError, Message, render


def test_a_conversation_renders_as_the_template_does() -> None:
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "<think>\nr\n</think>\n\nA"}, {"role": "user", "content": "u2"}]
    assert render(msgs) == ("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                            "<|im_start|>assistant\nA<|im_end|>\n<|im_start|>user\nu2<|im_end|>\n"
                            "<|im_start|>assistant\n")


def test_the_reasoning_after_the_last_query_stays() -> None:
    msgs = [Message("user", "hi"), Message("assistant", "<think>\nr\n</think>\n\nA")]
    assert render(msgs, add_generation_prompt=False) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\nA<|im_end|>\n")
    assert render([Message("user", "hi"), Message("assistant", "plain")], add_generation_prompt=False).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\nplain<|im_end|>\n")


def test_thinking_off_adds_an_empty_think_block() -> None:
    assert render([Message("user", "hi")], enable_thinking=False) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert STOP_TEXTS == ("<|im_end|>", "<|endoftext|>")


def test_bad_messages_are_refused() -> None:
    with pytest.raises(ChatError, match="at least one message"):
        render([])
    with pytest.raises(ChatError, match="a message needs a role in"):
        render([{"role": "tool", "content": "x"}])
