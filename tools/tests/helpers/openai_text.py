"""The text of one OpenAI-client request to `kern serve`, whole or streamed: both `kern serve`
process tests (CPU: the interpreter; GPU: the 4B) ask through these."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import openai

__all__ = ["chat_text", "completion_text"]


def completion_text(client: openai.OpenAI, model: str, prompt: str, max_tokens: int, stream: bool) -> str:
    """The text of a completion of `prompt` (a streamed one's chunks joined)."""
    if not stream:
        return client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens).choices[0].text
    parts = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, stream=True)
    return "".join(c.choices[0].text for c in parts if c.choices)


def chat_text(client: openai.OpenAI, model: str, messages: Sequence[Mapping[str, str]], max_tokens: int,
              stream: bool) -> str:
    """The assistant's text of a chat completion of `messages` (a streamed one's deltas joined)."""
    msgs: Any = messages
    if not stream:
        out = client.chat.completions.create(model=model, messages=msgs, max_tokens=max_tokens)
        return out.choices[0].message.content or ""
    parts = client.chat.completions.create(model=model, messages=msgs, max_tokens=max_tokens, stream=True)
    return "".join(c.choices[0].delta.content or "" for c in parts if c.choices)
