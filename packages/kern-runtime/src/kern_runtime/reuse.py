"""The engine's pure decisions: where a new prompt's cached prefix comes from, and how much room
its lease needs. No device, no clock: the same arguments give the same answer (CPU-tested).

A prompt's KV can come from three places: the prefix index (a resident checkpoint: `restore`, or
a parked copy: `wake`, then `restore`), or a live sequence sharing its first tokens (`fork`).
The longest wins; at equal length a resident entry beats a live sequence (neither costs more than
a partial page, the index keeps its own stamps), and both beat a parked copy (host-to-device).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from kern_pool import Tier, common_prefix

__all__ = ["Reuse", "Source", "lease_tokens", "pick_reuse", "shared_prefix"]


class Source(Enum):
    """Where a prompt's reused KV comes from."""

    FRESH = "fresh"
    """Nothing reused: a fresh lease, the whole prompt prefilled."""
    RESIDENT = "resident"
    """A resident checkpoint of the prefix index: `restore` (lease_from) at the hit's length."""
    PARKED = "parked"
    """A parked copy of the prefix index: `wake` at the hit's length, then `restore`."""
    FORK = "fork"
    """A live sequence: `fork` its lease at the shared length."""
    CONTINUE = "continue"
    """The sequence's own live lease holds the prefix and has room: prefill the rest in place."""


@dataclass(frozen=True, slots=True)
class Reuse:
    """A decision: reuse the first `length` tokens from `source` (`live`: the live sequence's id
    for FORK and CONTINUE)."""

    source: Source
    length: int
    live: int | None = None


def shared_prefix(kept: Sequence[int], prompt: Sequence[int], stateful: bool) -> int:
    """Tokens of `kept` (a live sequence's tokens with KV) that `prompt` can reuse: the common
    prefix with every prompt token but the last; a stateful sequence only as a whole (its state is
    the state at its end)."""
    n = min(common_prefix(kept, prompt), max(len(prompt) - 1, 0))
    if stateful and n != len(kept):
        return 0
    return n


def pick_reuse(hit: tuple[int, Tier] | None, live: Sequence[tuple[int, int]],
               own: tuple[int, int] | None = None) -> Reuse:
    """The reuse for a prompt.

    Args:
        hit: the prefix index's hit as (length, tier), or None.
        live: (sequence id, shared length) of live sequences that could be forked.
        own: (sequence id, shared length) when the prompt's own sequence holds a live lease with
            room for it; continuing in place wins whenever it covers at least as much.
    """
    best = Reuse(Source.FRESH, 0)
    if hit is not None and hit[0] > 0:
        best = Reuse(Source.RESIDENT if hit[1] is Tier.RESIDENT else Source.PARKED, hit[0])
    for seq, length in live:
        if length > best.length or (length == best.length and length > 0 and best.source is Source.PARKED):
            best = Reuse(Source.FORK, length, seq)
    if own is not None and own[1] > 0 and own[1] >= best.length:
        best = Reuse(Source.CONTINUE, own[1], own[0])
    return best


def lease_tokens(prompt: int, room: int) -> int:
    """Tokens a turn's lease holds: the prompt, then `room` decode steps, the first of which
    computes the last prompt token (so `prompt + room - 1`, at least the prompt)."""
    return max(prompt, prompt + room - 1)
