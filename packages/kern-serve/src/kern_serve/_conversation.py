"""Conversations: a user's turns to prompts through the model family's chat template, and the chat
template a server renders its requests' messages with.

The family is the provider `kern_runtime.providers.find` gives for the manifest (`kern_qwen3.provider`
for Qwen3 manifests); kern_serve imports no provider.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kern_manifest import Manifest
    from kern_runtime import Provider

__all__ = ["Conversation", "Template", "chat_template", "conversation"]

Template = Callable[[Sequence[Mapping[str, str]]], str]
"""A chat template: the messages ({"role", "content"}) to the chat text, ending in the generation
prompt."""


@dataclass
class Conversation:
    """Turns to prompts: the chat template re-renders every message, plain turns append tokens.

    Attributes:
        encode: text to token ids.
        decode: token ids to text.
        template: the chat template, or None for plain appended turns.
        stop: ids that end an answer (the template's stop tokens).
    """

    encode: Callable[[str], list[int]]
    decode: Callable[[Sequence[int]], str]
    template: Template | None
    stop: frozenset[int] = frozenset()
    messages: list[dict[str, str]] = field(default_factory=list[dict[str, str]])

    def prompt(self, tokens: Sequence[int], text: str) -> list[int]:
        """The whole conversation's prompt when the user says `text` (`tokens`: the conversation so far)."""
        if self.template is None:
            return [*tokens, *self.encode(text if not tokens else "\n" + text)]
        return self.encode(self.template([*self.messages, {"role": "user", "content": text}]))

    def answered(self, text: str, answer: Sequence[int]) -> str:
        """Record the user's `text` and the model's `answer`; returns the answer as text (without
        a final stop token)."""
        body = list(answer[:-1]) if answer and answer[-1] in self.stop else list(answer)
        said = self.decode(body)
        self.messages += [{"role": "user", "content": text}, {"role": "assistant", "content": said}]
        return said


def conversation(tok: Any, provider: Provider | None) -> Conversation:
    """A Conversation over the tokenizer `tok`, with `provider`'s chat template and stop tokens
    (None: plain appended turns)."""
    from kern_runtime.loading import decode_text

    template = provider.render if provider is not None else None
    stop = frozenset(i for s in provider.stop_texts for i in tok.encode(s)) if provider is not None else frozenset[int]()
    return Conversation(lambda s: list(tok.encode(s)), lambda ids: decode_text(tok, ids), template, stop)


def chat_template(manifest: Manifest) -> Template:
    """The chat template of the manifest's family; for a family no installed provider knows, a
    template that refuses every conversation (ValueError: `no chat template: ...`)."""
    from kern_runtime.providers import ProviderError, find

    try:
        return find(manifest).render
    except ProviderError as exc:
        message = f"no chat template: {exc}"

        def none(messages: Sequence[Mapping[str, str]]) -> str:
            raise ValueError(message)

        return none
