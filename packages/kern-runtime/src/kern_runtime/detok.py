"""Incremental detokenization: the text of a growing list of token ids, each new token costing a
decode of a few ids instead of the whole list.

A decode function maps ids to text and need not be a concatenation of per-token pieces (a byte
token may end inside a UTF-8 character, a tokenizer may drop the leading space of what it
decodes). `Detok` keeps the text of the ids up to a point where the text was complete (it did not
end in U+FFFD, the replacement of an unfinished character) and decodes only a window from a few
ids before that point: the window's text less the text of its first ids is what the new ids
added. When the window's text does not extend the text of its first ids (new ids changed the text
of the ids just before them), the whole list is decoded once. So the text is the decode of the
ids (an unfinished last character included by `text(final=True)`) for every tokenizer whose text
for an id depends on at most the few ids before it (`_BACK`): byte-level BPE, a dropped leading
space, a merge across a token boundary.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["REPLACEMENT", "Detok", "stop_after"]

REPLACEMENT = "\ufffd"
"""What a UTF-8 decode with replacement gives for an unfinished character."""

_BACK = 4
"""Ids before the last complete point that a window decodes again (a tokenizer's decode of a
suffix may depend on a few ids before it)."""


class Detok:
    """The text of ids appended over time (see the module doc).

    `push(ids)` appends ids; `text()` is the text of every id pushed, without an unfinished last
    character; `text(final=True)` with it. `peek(ids)` is the text the ids pushed and `ids` would
    give, without pushing them.
    """

    def __init__(self, decode: Callable[[Sequence[int]], str]) -> None:
        self._decode = decode
        self._ids: list[int] = []
        self._text = ""
        """The text of ids[:_read], complete (it does not end in an unfinished character)."""
        self._read = 0
        self._start = 0
        """Where the window starts: at most _BACK ids before _read."""
        self._head = ""
        """The text of ids[_start:_read]."""

    @property
    def ids(self) -> tuple[int, ...]:
        """Every id pushed."""
        return tuple(self._ids)

    def push(self, ids: Sequence[int]) -> None:
        """Appends `ids` and moves the complete point as far as the text allows."""
        self._ids.extend(ids)
        added, complete = self._window(self._ids)
        if complete:
            self._advance(added)

    def text(self, *, final: bool = False) -> str:
        """The text of every id pushed; without `final`, an unfinished last character is left out
        (it may still become another character)."""
        if self._read == len(self._ids):
            return self._text
        added, complete = self._window(self._ids)
        if complete or final:
            return self._text + added
        return self._text + added.rstrip(REPLACEMENT)

    def peek(self, ids: Sequence[int]) -> str:
        """The text (unfinished last character included) of the ids pushed followed by `ids`."""
        added, _ = self._window([*self._ids, *ids])
        return self._text + added

    def _window(self, ids: list[int]) -> tuple[str, bool]:
        """(the text ids[_read:] add to the complete text, whether that text is complete)."""
        if self._read == len(ids):
            return "", True
        whole = self._decode(ids[self._start :])
        if whole.startswith(self._head):
            added = whole[len(self._head) :]
        else:
            # NOTE: this tokenizer's text of the window does not extend the text of its first ids:
            # the whole list, decoded once, says what the new ids added.
            full = self._decode(ids)
            if not full.startswith(self._text):
                # NOTE: the new ids changed text that was complete: the complete point restarts
                # at the first id (every later window decodes from there until it moves again).
                self._text, self._read, self._start, self._head = "", 0, 0, ""
            added = full[len(self._text) :]
        return added, not added.endswith(REPLACEMENT)

    def _advance(self, added: str) -> None:
        self._text += added
        self._read = len(self._ids)
        self._start = max(0, self._read - _BACK)
        self._head = self._decode(self._ids[self._start : self._read])


def stop_after(detok: Detok, committed: Sequence[int], token: int, stops: Sequence[str]) -> bool:
    """Whether the text of `committed` and then `token` holds one of `stops`, given that the text
    of every shorter prefix of `committed` held none (each was asked in turn): `detok` is brought
    up to `committed` (it holds a prefix of it), and only a string ending in what `token` adds, or
    in the unfinished character before it, is looked for."""
    have = len(detok.ids)
    if have < len(committed):
        detok.push(committed[have:])
    done = len(detok.text())  # NOTE: text past it may change with `token` (an unfinished character)
    text = detok.peek([token])
    return any(text.find(s, max(0, done - len(s) + 1)) >= 0 for s in stops)
