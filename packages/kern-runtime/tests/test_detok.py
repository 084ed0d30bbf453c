"""kern_runtime.detok: the incremental text equals the decode of every id, whatever the tokenizer's
pieces (bytes that split characters, a dropped leading space, text that only later ids settle),
and each step decodes a few ids."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from kern_runtime.detok import REPLACEMENT, Detok, stop_after

PIECES = [b"a", b"b", b" ", b"cd", "\u00e9".encode(), "\u4e2d".encode()[:1], "\u4e2d".encode()[1:2],
          "\u4e2d".encode()[2:], "\U0001f600".encode()[:2], "\U0001f600".encode()[2:], b"\xff", b"\n", b" e"]
"""Token id i decodes to PIECES[i]: whole characters, pieces of 3- and 4-byte ones, an invalid byte."""


def byte_decode(ids: Sequence[int]) -> str:
    """A byte-level tokenizer: the ids' bytes, UTF-8 with replacement."""
    return b"".join(PIECES[i] for i in ids).decode("utf-8", errors="replace")


def strip_decode(ids: Sequence[int]) -> str:
    """A tokenizer that drops the leading space of what it decodes (as sentencepiece does)."""
    text = byte_decode(ids)
    return text[1:] if text.startswith(" ") else text


def rewrite_decode(ids: Sequence[int]) -> str:
    """A tokenizer whose text of earlier ids changes with the next ones: "ab" followed by a newline
    reads "X" (a context of two ids, within the window's)."""
    return byte_decode(ids).replace("ab\n", "X\n")


Decode = Callable[[Sequence[int]], str]


class Counting:
    """A decode that counts the ids it was given."""

    def __init__(self, decode: Decode) -> None:
        self.decode, self.ids = decode, 0

    def __call__(self, ids: Sequence[int]) -> str:
        self.ids += len(ids)
        return self.decode(ids)


ids_lists = st.lists(st.integers(0, len(PIECES) - 1), max_size=60)


@settings(max_examples=300, deadline=None)
@given(ids_lists, st.sampled_from([byte_decode, strip_decode, rewrite_decode]))
def test_text_is_the_decode_of_every_id(ids: list[int], decode: Decode) -> None:
    d = Detok(decode)
    for i, t in enumerate(ids):
        assert d.peek([t]) == decode(ids[: i + 1])
        d.push([t])
        assert d.ids == tuple(ids[: i + 1])
        whole = decode(ids[: i + 1])
        assert d.text(final=True) == whole
        assert d.text() == (whole if not whole.endswith(REPLACEMENT) else whole.rstrip(REPLACEMENT))
    assert d.text(final=True) == decode(ids)


def test_pushes_in_batches_equal_pushes_one_by_one() -> None:
    ids = [0, 5, 6, 7, 1, 8, 9, 2, 3, 10, 4]
    a, b = Detok(byte_decode), Detok(byte_decode)
    for t in ids:
        a.push([t])
    b.push(ids[:4])
    b.push(ids[4:])
    assert a.text(final=True) == b.text(final=True) == byte_decode(ids)


def test_a_step_decodes_a_few_ids_not_the_whole_text() -> None:
    counting = Counting(byte_decode)
    d = Detok(counting)
    for i in range(2000):
        d.push([i % 5])
        d.text()
    assert d.text() == byte_decode([i % 5 for i in range(2000)])
    assert counting.ids < 2000 * 16, counting.ids  # the whole text each time would be ~2,000,000


@settings(max_examples=300, deadline=None)
@given(ids_lists, st.lists(st.sampled_from(["ab", "b e", "\u4e2d", "a", "\ufffd", "\U0001f600", "cd\n"]),
                           min_size=1, max_size=3, unique=True),
       st.sampled_from([byte_decode, strip_decode]))
def test_stop_after_finds_the_first_token_whose_text_holds_a_stop(ids: list[int], stops: list[str],
                                                                   decode: Decode) -> None:
    d = Detok(decode)
    for i, t in enumerate(ids):
        want = any(s in decode(ids[: i + 1]) for s in stops)
        assert stop_after(d, ids[:i], t, stops) == want, (ids[: i + 1], stops)
        if want:
            break
