"""Qwen3's chat template: a list of messages rendered to the text the model was trained on.

The rendering follows the Jinja template shipped with the Qwen3 checkpoints (without tools): an
optional leading system message, then `<|im_start|>{role}\\n{content}<|im_end|>\\n` per message;
an assistant message after the last user message keeps its reasoning as `<think>\\n...\\n</think>\\n\\n`,
earlier ones lose it (only the text after `</think>` stays); the generation prompt is
`<|im_start|>assistant\\n`, followed by an empty `<think>\\n\\n</think>\\n\\n` when thinking is off.
A turn ends at `<|im_end|>` (or `<|endoftext|>`): `STOP_TEXTS`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = ["ROLES", "STOP_TEXTS", "ChatError", "Message", "render"]

Role = Literal["system", "user", "assistant"]
ROLES: tuple[str, ...] = ("system", "user", "assistant")
STOP_TEXTS: tuple[str, ...] = ("<|im_end|>", "<|endoftext|>")
"""The special tokens that end an assistant turn."""


class ChatError(ValueError):
    """A message list the template cannot render (unknown role, no message)."""


@dataclass(frozen=True, slots=True)
class Message:
    """One chat message."""

    role: Role
    content: str


def _split_reasoning(content: str) -> tuple[str, str]:
    """(reasoning, answer) of an assistant message that holds `</think>`."""
    if "</think>" not in content:
        return "", content
    reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
    return reasoning, content.split("</think>")[-1].lstrip("\n")


def _last_query(messages: Sequence[Message]) -> int:
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].role == "user":
            return i
    return len(messages) - 1


def _assistant(m: Message, i: int, last_query: int, last: bool) -> str:
    reasoning, content = _split_reasoning(m.content)
    if i > last_query and (last or reasoning):
        return f"<|im_start|>assistant\n<think>\n{reasoning.strip(chr(10))}\n</think>\n\n{content.lstrip(chr(10))}"
    return f"<|im_start|>assistant\n{content}"


def render(messages: Sequence[Message | Mapping[str, str]], *, add_generation_prompt: bool = True,
           enable_thinking: bool = True) -> str:
    """The Qwen3 chat text of `messages` (`Message`s or {"role", "content"} mappings).

    Raises:
        ChatError: no message, or a role other than system, user, assistant.
    """
    msgs = [m if isinstance(m, Message) else _message(m) for m in messages]
    if not msgs:
        raise ChatError("a chat needs at least one message")
    last_query = _last_query(msgs)
    out: list[str] = []
    for i, m in enumerate(msgs):
        if m.role == "assistant":
            out.append(_assistant(m, i, last_query, i == len(msgs) - 1) + "<|im_end|>\n")
        else:
            out.append(f"<|im_start|>{m.role}\n{m.content}<|im_end|>\n")
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
        if not enable_thinking:
            out.append("<think>\n\n</think>\n\n")
    return "".join(out)


def _message(m: Mapping[str, str]) -> Message:
    role, content = m.get("role"), m.get("content")
    if role not in ROLES or not isinstance(content, str):
        raise ChatError(f"a message needs a role in {list(ROLES)} and a string content, got {dict(m)!r}")
    return Message(role, content)  # type: ignore[arg-type]
