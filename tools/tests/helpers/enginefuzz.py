"""The engine's memory fuzz on the Qwen3 tiny shape: a seeded random sequence of `Engine`
operations (turns of random lengths on new, continued and branched sequences, prompts sharing
another sequence's prefix, batched decode steps, evict (park or drop), release) on any backend
(the interpreter on the CPU, the runtime on a GPU), then close.

The KV the model writes cannot be stamped, so the shadow is what was computed: position t of a
sequence is keyed by its tokens [0, t] (a rolling hash), and every time a position is computed
its bytes (every layer's K and V row, as the page layout [layer][k|v][P][NKV][D] holds them) are
recorded as a version of that key. After every operation each live sequence's positions that it
reused or had before must equal a recorded version of their key byte for byte (a page lost,
moved or overwritten, or a copy landing late, shows up there), new positions are recorded. At the
end the engine closes and the backend's pages, slots and host units are all back.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import kern_runtime as kr

__all__ = ["EngineFuzz"]


@dataclass
class _Track:
    seq: Any
    checked: int = 0
    """Positions of the current lease already checked or recorded."""
    keys: list[int] = field(default_factory=list[int])


class EngineFuzz:
    """`read_pages(pages) -> uint8 [len(pages), page bytes]` reads the backend's KV pages."""

    def __init__(self, eng: kr.Engine, read_pages: Callable[[list[int]], np.ndarray], seed: int, *,
                 vocab: int, layers: int, page_tokens: int, rows: int) -> None:
        self.eng = eng
        self.read_pages = read_pages
        self.rng = random.Random(seed)
        self.vocab = vocab
        self.layers = layers
        self.unit = page_tokens
        self.rows = rows
        self.tracks: list[_Track] = []
        self.versions: dict[int, set[bytes]] = {}
        self.ops: dict[str, int] = {}

    # ---- the shadow --------------------------------------------------------------------------

    def _keys(self, t: _Track, n: int) -> list[int]:
        tokens = t.seq.tokens
        while len(t.keys) < min(n, len(tokens)):
            i = len(t.keys)
            t.keys.append(hash((t.keys[-1] if i else 0, tokens[i])))
        return t.keys[:n]

    def _rows(self, lease: Any, n: int) -> list[bytes]:
        """Each position's bytes (every layer's K and V rows) among the lease's first n."""
        pages = list(lease.pages[: -(-n // self.unit)])
        raw = self.read_pages(pages)
        cells = raw.reshape(len(pages), self.layers, 2, self.unit, -1)
        return [hashlib.blake2b(cells[p // self.unit, :, :, p % self.unit, :].tobytes(), digest_size=16).digest()
                for p in range(n)]

    def check(self) -> None:
        for t in self.tracks:
            lease, kv = t.seq.lease, t.seq.kv
            if lease is None or kv == 0:
                continue
            keys = self._keys(t, kv)
            for p, digest in enumerate(self._rows(lease, kv)):
                if p < t.checked:
                    if digest not in self.versions.get(keys[p], ()):
                        raise AssertionError(f"sequence {t.seq.id}: position {p} of {kv} (page "
                                             f"{lease.pages[p // self.unit]}) holds KV no computation of its "
                                             f"tokens wrote; operations so far {self.ops}")
                else:
                    self.versions.setdefault(keys[p], set()).add(digest)
            t.checked = kv

    # ---- operations --------------------------------------------------------------------------

    def _count(self, name: str) -> None:
        self.ops[name] = self.ops.get(name, 0) + 1

    def _ids(self, n: int) -> list[int]:
        return [self.rng.randrange(self.vocab) for _ in range(n)]

    def _prompt(self, t: _Track) -> list[int]:
        tokens = t.seq.tokens
        if tokens:
            return [*tokens, *self._ids(self.rng.randint(1, 40))]
        others = [o.seq.tokens for o in self.tracks if len(o.seq.tokens) > 1]
        if others and self.rng.random() < 0.6:
            shared = self.rng.choice(others)
            return [*shared[: self.rng.randint(1, len(shared))], *self._ids(self.rng.randint(1, 30))]
        return self._ids(self.rng.randint(1, 90))

    def op_turn(self) -> None:
        t = self.rng.choice(self.tracks) if self.tracks and self.rng.random() < 0.6 else self._new()
        prompt = self._prompt(t)
        steps = self.rng.randint(1, 8)
        pre = self.eng.prefill(t.seq, prompt, steps)
        if pre.source is not kr.Source.CONTINUE:
            t.checked = pre.reused
        t.keys = t.keys[: pre.reused]
        self._count(f"turn-{pre.source.name.lower()}")
        self.check()
        for _ in range(self.rng.randint(0, steps)):
            self.eng.step(t.seq)
        self.check()
        if self.rng.random() < 0.7:
            self.eng.finish(t.seq)

    def _new(self) -> _Track:
        t = _Track(self.eng.sequence())
        self.tracks.append(t)
        return t

    def op_branch(self) -> None:
        src = [t for t in self.tracks if t.seq.tokens]
        if src:
            s = self.rng.choice(src)
            self.tracks.append(_Track(self.eng.branch(s.seq, self.rng.randint(1, len(s.seq.tokens)))))
            self._count("branch")

    def op_decode(self) -> None:
        ready = [t for t in self.tracks if t.seq.lease is not None and t.seq.kv < t.seq.room]
        if len(ready) < 2:
            return
        rows = self.rng.sample(ready, min(len(ready), self.rng.randint(2, self.rows)))
        self.eng.decode([t.seq for t in rows], [kr.Sampling()] * len(rows))
        self._count("decode-rows")

    def op_evict(self) -> None:
        if self.eng.evict():
            self._count("evict")

    def op_release(self) -> None:
        if self.tracks:
            t = self.tracks.pop(self.rng.randrange(len(self.tracks)))
            self.eng.release(t.seq)
            self._count("release")

    OPS: tuple[tuple[str, int], ...] = (("turn", 8), ("branch", 2), ("decode", 3), ("evict", 2), ("release", 2))

    def run(self, ops: int, max_live: int = 8) -> dict[str, int]:
        names, weights = zip(*self.OPS, strict=True)
        for _ in range(ops):
            while len(self.tracks) > max_live:
                self.op_release()
            getattr(self, f"op_{self.rng.choices(names, weights)[0]}")()
            self.check()
        self.finale()
        return self.ops

    def finale(self) -> None:
        """Everything resident parked or dropped, then a turn over a parked prefix (a staged wake
        right before close: its copies may still hold the parked copy)."""
        for t in self.tracks:
            if t.seq.lease is not None:
                self.eng.finish(t.seq)
        while self.eng.evict():
            self._count("evict")
        parked = [t for t in self.tracks if len(t.seq.tokens) > 1]
        if parked:
            src = self.rng.choice(parked)
            t = _Track(self.eng.branch(src.seq, len(src.seq.tokens)))
            self.tracks.append(t)
            pre = self.eng.prefill(t.seq, [*t.seq.tokens, *self._ids(3)], 2)
            t.checked = pre.reused
            self._count(f"turn-{pre.source.name.lower()}")
            self.check()
