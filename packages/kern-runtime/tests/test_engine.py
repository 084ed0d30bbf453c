"""Engine decisions on a fake backend (kern_pool's Pool and Host, programs recorded, next tokens
counted): the reuse choice, the exact eviction order (parked while the host has room, the coldest
parked dropped when it is full), the block table from the lease, and a clean end. The same engine
on the Qwen3 interpreter: tools/tests/test_engine_interp.py."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

import kern_pool
import kern_runtime as kr
from kern_pool.cache import Reuse, Source

from .helpers.manifests import parsed, serving
from .helpers.pool_backend import PoolBackend


def _engine(park: bool = True, **kw: Any) -> tuple[kr.Engine, PoolBackend]:
    m = serving()
    m["buffers"]["bt"]["domain"] = {"index_into": "kv", "stride": 16}
    be = PoolBackend(**kw)
    return kr.Engine(be, kr.serving_roles(parsed(m)), kr.EngineConfig(chunk=16, park=park)), be


def _ids(first: int, n: int) -> list[int]:
    return [first, *range(1, n)]


def _tiers(eng: kr.Engine) -> dict[int, str]:
    """Entry length -> 'resident' / 'parked' / 'both'."""
    names = {(True, False): "resident", (False, True): "parked", (True, True): "both"}
    return {len(k): names[r, p] for k, r, p in eng.prefix.entries()}


def test_eviction_parks_the_coldest_leaf_then_drops_the_coldest_parked() -> None:
    eng, be = _engine()
    s1, s2, s3 = eng.sequence(), eng.sequence(), eng.sequence()
    for s, first in ((s1, 101), (s2, 102), (s3, 103)):
        eng.turn(s, _ids(first, 20), 5)  # KV of 24 tokens: 2 pages each
    t = eng.turn(s1, [*s1.tokens, 7, 8, 9, 10], 5)  # restored at 24, KV of 33
    assert (t.prefill.source, t.prefill.reused) == (Source.RESIDENT, 24)
    assert _tiers(eng) == {24: "resident", 33: "resident"} | {24: "resident"}
    assert be.pool.pages_used == 8
    eng.turn(eng.sequence(), _ids(104, 180), 1)  # 12 pages: s2's then s3's entries are parked
    assert (eng.counters.evictions, eng.counters.parks, eng.counters.dropped) == (2, 2, 0)
    assert be.host.used == 4 and be.pool.pages_used == 16
    eng.turn(eng.sequence(), _ids(105, 30), 3)  # 2 pages: s1's 33 goes, s2's parked copy is dropped
    assert (eng.counters.evictions, eng.counters.parks, eng.counters.dropped) == (3, 3, 1)
    entries = sorted((k[0], len(k), r, p) for k, r, p in eng.prefix.entries())
    assert entries == [(101, 24, True, False), (101, 33, False, True), (103, 24, False, True),
                       (104, 180, True, False), (105, 32, True, False)]
    t = eng.turn(s1, [*s1.tokens, 11, 12], 2)  # the parked 33 is woken; 3 pages must be made first
    assert (t.prefill.source, t.prefill.reused) == (Source.PARKED, 33)
    assert eng.counters.wakes == 1
    eng.close()
    assert be.pool.pages_used == 0 and be.host.used == 0


def test_a_parked_hit_is_woken_into_the_turn_s_lease_then_kept_resident_beside_its_parked_copy() -> None:
    eng, be = _engine()
    s = eng.sequence()
    eng.turn(s, _ids(101, 20), 5)  # KV of 24 tokens
    assert eng.evict() and _tiers(eng) == {24: "parked"} and be.pool.pages_used == 0
    be.runs.clear()
    pre = eng.prefill(s, [*s.tokens, 7, 8], 3)
    assert (pre.source, pre.reused, eng.counters.wakes) == (Source.PARKED, 24, 1)
    assert be.runs and be.runs[0][0] == "chunk", "the chunk is queued before the woken prefix is kept"
    assert _tiers(eng) == {24: "both"}, "the woken tokens are resident again, beside the parked copy"
    assert s.lease is not None and s.lease.prefix == 24
    assert be.pool.pages_used == 3, "the lease's two pages and the kept checkpoint's copy of the partial one"
    eng.release(s)  # the turn dropped: its woken prefix stays resident
    t = eng.turn(eng.sequence(), [*_ids(101, 20), *s.tokens[20:24], 9], 2)
    assert (t.prefill.source, t.prefill.reused) == (Source.RESIDENT, 24)
    eng.close()
    assert be.pool.pages_used == 0 and be.host.used == 0


def test_evict_parks_the_coldest_on_demand() -> None:
    eng, be = _engine()
    eng.turn(eng.sequence(), _ids(101, 20), 5)
    eng.turn(eng.sequence(), _ids(102, 20), 5)
    assert eng.evict()
    assert sorted((k[0], r, p) for k, r, p in eng.prefix.entries()) == [(101, False, True), (102, True, False)]
    assert eng.evict() and eng.evict() is False and eng.counters.parks == 2 and be.pool.pages_used == 0
    eng.close()
    assert be.host.used == 0


def test_without_a_host_tier_eviction_drops() -> None:
    eng, be = _engine(park=False)
    s = eng.sequence()
    eng.turn(s, _ids(101, 20), 5)
    eng.turn(eng.sequence(), _ids(102, 250), 1)  # 16 pages: the first entry is dropped
    assert (eng.counters.evictions, eng.counters.parks, eng.counters.dropped) == (1, 0, 1)
    assert _tiers(eng) == {250: "resident"} and be.host.used == 0
    eng.close()
    assert be.pool.pages_used == 0


def test_the_block_table_is_the_lease_row_and_slots_follow_it() -> None:
    eng, be = _engine()
    a = eng.sequence()
    eng.turn(a, _ids(101, 40), 1)  # pages 0, 1, 2 leased, then retired into the index
    b = eng.sequence()
    eng.prefill(b, _ids(102, 20), 3)  # 22 tokens: two fresh pages
    lease = b.lease
    assert lease is not None
    row = list(lease.pages)
    assert be.inputs["bt"] == row + [row[0]] * (64 - len(row))
    assert be.inputs["sl"] == [row[1] * 16 + 3]  # the last prompt token, position 19
    be.runs.clear()
    eng.step(b)
    assert be.runs == [("step", {"tokens": 1})] and be.inputs["pos"] == [20] and be.inputs["len"] == [21]
    eng.close()


def test_the_block_table_and_slots_follow_whichever_lease_is_seated() -> None:
    """The engine keeps the last lease it staged as an array of pages: every prefill, seat and
    step writes the seated lease's own row and slots, across a restore, re-seats and new leases."""
    eng, be = _engine()
    a, b = eng.sequence(), eng.sequence()
    eng.turn(a, _ids(101, 40), 1)

    def seated_is(seq: kr.Sequence) -> None:
        lease = seq.lease
        assert lease is not None
        pos = be.inputs["pos"][-1]
        assert be.inputs["bt"] == list(lease.table_row())
        assert be.inputs["sl"][-1] == lease.pages[pos // 16] * 16 + pos % 16

    eng.prefill(a, [*a.tokens, 5, 6, 7], 4)  # restored at 40: the index's pages, then its own
    seated_is(a)
    eng.prefill(b, _ids(102, 20), 8)
    seated_is(b)
    for seq in (a, b, a, a, b):
        eng.step(seq)
        seated_is(seq)
    assert eng.prefill(b, [*b.tokens, 8, 9], 3).source is Source.CONTINUE  # b's own lease, in place
    seated_is(b)
    eng.finish(a)
    eng.prefill(a, [*a.tokens, 4], 2)  # a new lease restored from a's retired turn
    seated_is(a)
    eng.close()
    assert be.pool.pages_used == 0


class CachingBackend(PoolBackend):
    """A PoolBackend that caches graphs (`kern_runtime.Caching`): its cache calls recorded, and
    each chunk's rows with how it was called."""

    def __init__(self) -> None:
        super().__init__()
        self.cached: list[tuple[str, int]] = []
        self.chunks: list[tuple[int, str]] = []

    def cache_graphs(self, program: str, limit: int) -> None:
        self.cached.append((program, limit))

    def run(self, program: str, vars: Mapping[str, int]) -> None:
        super().run(program, vars)
        if program == "chunk":
            self.chunks.append((vars["tokens"], "run"))

    def issue(self, program: str, vars: Mapping[str, int]) -> None:
        super().issue(program, vars)
        if program == "chunk":
            self.chunks.append((vars["tokens"], "issue"))


@pytest.mark.parametrize(("config", "cached", "modes"), [
    (kr.EngineConfig(chunk=16, chunk_graph_rows=8), [("chunk", 32)], ["run", "run", "issue"]),
    (kr.EngineConfig(chunk=16, chunk_graphs=4, chunk_graph_rows=16), [("chunk", 4)], ["issue"] * 3),
    (kr.EngineConfig(chunk=16, chunk_graphs=0), [], ["run"] * 3),
    (kr.EngineConfig(chunk=16, chunk_graph_rows=0), [], ["run"] * 3),
    (kr.EngineConfig(chunk=16, eager=True), [], ["run"] * 3),
])
def test_short_chunks_are_issued_on_a_backend_that_caches_graphs(
        config: kr.EngineConfig, cached: list[tuple[str, int]], modes: list[str]) -> None:
    """A caching backend gets the chunk program's cache at the engine's start; chunks of at most
    chunk_graph_rows rows are issued (replayed from it), longer ones run; eager, or either knob at
    0, runs every chunk."""
    m = serving()
    m["buffers"]["bt"]["domain"] = {"index_into": "kv", "stride": 16}
    be = CachingBackend()
    eng = kr.Engine(be, kr.serving_roles(parsed(m)), config)
    assert be.cached == cached
    eng.prefill(eng.sequence(), _ids(101, 41), 1)  # 40 tokens through the chunks: 16, 16, 8
    assert be.chunks == list(zip([16, 16, 8], modes, strict=True))
    eng.close()
    assert be.pool.pages_used == 0


@pytest.mark.parametrize("name", ["chunk_graphs", "chunk_graph_rows"])
@pytest.mark.parametrize("value", [-1, 1.5, None])
def test_bad_graph_knobs_are_api_errors(name: str, value: object) -> None:
    m = serving()
    m["buffers"]["bt"]["domain"] = {"index_into": "kv", "stride": 16}
    be = CachingBackend()
    with pytest.raises(kr.ApiError, match=f"EngineConfig.{name} must be an int >= 0"):
        kr.Engine(be, kr.serving_roles(parsed(m)), kr.EngineConfig(chunk=16, **{name: value}))  # type: ignore[arg-type]
    assert be.cached == []


def _head_engine(eager: bool = False) -> tuple[kr.Engine, PoolBackend]:
    """`_engine` over a manifest with a head program (`first`, reading the span_at input `row`)."""
    m = serving()
    m["buffers"]["bt"]["domain"] = {"index_into": "kv", "stride": 16}
    m["buffers"]["row"] = {"dtype": "i64", "shape": [1], "kind": "input", "fill": "span_at"}
    m["programs"]["first"] = {"batch": {"groups": 1, "rows": 1}, "graph": True,
                              "calls": [{"op": "gather", "args": [{"buf": "row"}]}]}
    be = PoolBackend()
    return kr.Engine(be, kr.serving_roles(parsed(m)), kr.EngineConfig(chunk=16, eager=eager)), be


@pytest.mark.parametrize("eager", [False, True])
def test_the_head_takes_the_last_chunk_row_and_seats_the_sequence(eager: bool) -> None:
    """prefill(first=True): chunks through the last prompt token, the last token staged, its row of
    the last chunk in the span_at input, one head run, its token appended; the row then holds the
    sequence as after a step (host-fed: the token staged at the next position), so the next step
    runs at once."""
    eng, be = _head_engine(eager)
    s = eng.sequence()
    pre = eng.prefill(s, _ids(101, 40), 3, first=True)
    assert (pre.reused, pre.prefilled, pre.first) == (0, 40, 1001)
    assert be.runs == [("chunk", {"tokens": 16}), ("chunk", {"tokens": 16}), ("chunk", {"tokens": 8}),
                       ("first", {"tokens": 1})]
    assert be.inputs["row"] == [7] and ("first" in be.eager) == eager
    assert (s.kv, s.tokens[-1], len(s.tokens), eng.counters.heads) == (40, 1001, 41, 1)
    lease = s.lease
    assert lease is not None
    assert be.inputs["ids"] == [1001] and be.inputs["pos"] == [40] and be.inputs["len"] == [41]
    assert be.inputs["sl"] == [lease.pages[2] * 16 + 8]
    be.runs.clear()
    assert eng.step(s) == 1002 and be.runs == [("step", {"tokens": 1})]
    assert eng.step(s) == 1003
    with pytest.raises(kr.EngineError, match="used its room of 42 tokens"):
        eng.step(s)
    be.runs.clear()
    t = eng.turn(s, [*s.tokens, 5], 2)  # two new tokens (the pending answer and 5): the head again
    assert (t.prefill.reused, t.prefill.first, t.tokens) == (42, 1004, [1004, 1005])
    assert be.runs[0] == ("chunk", {"tokens": 2}) and be.runs[1] == ("first", {"tokens": 1})
    assert be.inputs["row"] == [1] and eng.counters.heads == 2
    be.runs.clear()
    t = eng.turn(s, list(s.tokens), 2)  # one new token: the first step computes it
    assert t.prefill.first is None and [p for p, _ in be.runs] == ["step", "step"] and eng.counters.heads == 2
    eng.close()
    assert be.pool.pages_used == 0


def test_continue_in_place_when_the_live_lease_has_room() -> None:
    eng, be = _engine()
    s = eng.sequence()
    eng.prefill(s, _ids(101, 10), 40)
    eng.step(s)
    pre = eng.prefill(s, [*s.tokens, 5, 6], 20)
    assert (pre.source, pre.reused, pre.prefilled) == (Source.CONTINUE, 10, 3)
    assert be.pool.pages_used == 4
    pre = eng.prefill(s, [*s.tokens[:5], 9, 9], 20)  # diverges before its KV ends: from the index
    assert (pre.source, pre.reused) == (Source.FRESH, 0)  # the retired entry shares no whole page
    eng.close()
    assert be.pool.pages_used == 0


def test_a_live_lease_that_loses_to_a_longer_fork_goes_into_the_index() -> None:
    """Regression: the sequence's own live lease could continue in place, but a live sibling
    shares more; the own lease is retired into the index (it was once dropped on the floor)."""
    eng, be = _engine()
    a = eng.sequence()
    eng.prefill(a, _ids(101, 10), 40)
    for _ in range(3):
        eng.step(a)
    s = eng.branch(a, 6)
    assert eng.prefill(s, [*s.tokens, 9], 20).source is Source.FORK  # live, room for 26 tokens
    pre = eng.prefill(s, [*a.tokens[:11], 1], 5)
    assert (pre.source, pre.reused) == (Source.FORK, 11)
    assert _tiers(eng) == {6: "resident"}
    eng.close()
    assert be.pool.pages_used == 0


def test_records_have_no_dict() -> None:
    for rec in (Reuse(Source.FRESH, 0), kr.Prefilled(0, 1, Source.FRESH), kr.EngineConfig()):
        assert not hasattr(rec, "__dict__")
    with pytest.raises(AttributeError):
        kr.EngineConfig().chunk = 3  # type: ignore[misc]


# --------------------------------------------------------------------------------------------
# Random call patterns against a model whose next token is a function of the KV it reads.


class StampBackend(PoolBackend):
    """A backend whose memory holds token ids: a chunk or step writes each staged token at its
    slot; a step's next token is a hash of the tokens it reads through the block table (positions
    below seq_len). Every page copy, zeroing, park and wake moves those ids, so a reuse that shares,
    copies or wakes the wrong thing changes the tokens."""

    def __init__(self, pages: int, host: int) -> None:
        super().__init__(pages, host)
        self.kv = np.full((self.pool.pages_max, 16), -1, dtype=np.int64)
        self.hkv = np.full((max(host, 1), 16), -1, dtype=np.int64)
        self.out = 0

    def write_input(self, name: str, array: Any) -> None:
        self.inputs[name] = np.asarray(array).tolist()

    def _write(self, n: int) -> None:
        for tok, slot in zip(self.inputs["ids"][:n], self.inputs["sl"][:n], strict=True):
            self.kv[slot // 16, slot % 16] = tok

    def run(self, program: str, vars: Mapping[str, int]) -> None:
        assert program == "chunk"
        self._write(vars["tokens"])

    def issue(self, program: str, vars: Mapping[str, int]) -> None:
        self._write(1)
        n = self.inputs["len"][0]
        table = self.inputs["bt"]
        seen = tuple(int(self.kv[table[p // 16], p % 16]) for p in range(n))
        self.out = model(seen)

    def read_output(self, name: str, count: int | None = None) -> np.ndarray:
        return np.array([self.out], dtype=np.int64)

    def _fresh(self, lease: kern_pool.Lease) -> None:
        for p in lease.pages[lease.sealed :]:
            self.kv[p] = -1

    def _copy(self, copies: kern_pool.DeviceCopies) -> None:
        for src, dst in copies.pages:
            self.kv[dst] = self.kv[src]

    def lease(self, tokens: int) -> kern_pool.Lease:
        lease = self.pool.lease(tokens)
        self._fresh(lease)
        return lease

    def restore(self, cp: kern_pool.Checkpoint, length: int, tokens: int) -> kern_pool.Lease:
        lease, copies = self.pool.restore(cp, length, tokens)
        self._fresh(lease)
        self._copy(copies)
        return lease

    def checkpoint(self, lease: kern_pool.Lease, length: int) -> kern_pool.Checkpoint:
        cp, copies = self.pool.checkpoint(lease, length)
        self._copy(copies)
        return cp

    def fork(self, parent: kern_pool.Lease, length: int, tokens: int) -> kern_pool.Lease:
        lease, copies = self.pool.fork(parent, length, tokens)
        self._fresh(lease)
        self._copy(copies)
        return lease

    def park(self, cp: kern_pool.Checkpoint) -> kern_pool.Parked:
        parked, copies = self.host.park(cp)
        for page, unit in copies.pages:
            self.hkv[unit] = self.kv[page]
        return parked

    def wake_now(self, parked: kern_pool.Parked, length: int, tokens: int) -> kern_pool.Lease:
        lease, copies = self.host.restore(parked, length, tokens)
        self._fresh(lease)
        for unit, page in copies.pages:
            self.kv[page] = self.hkv[unit]
        return lease


def model(tokens: tuple[int, ...]) -> int:
    """The next token after `tokens` (a hash; ids 0..3, so prompts share prefixes often)."""
    h = 7
    for t in tokens:
        h = (h * 1000003 + t + 11) % (1 << 61)
    return h % 4


def _random_ops(pages: int, host: int, steps: int, seed: int) -> kr.Counters:
    m = serving()
    m["buffers"]["bt"]["domain"] = {"index_into": "kv", "stride": 16}
    be = StampBackend(pages, host)
    eng = kr.Engine(be, kr.serving_roles(parsed(m)), kr.EngineConfig(chunk=7, park=host > 0))
    rng = np.random.default_rng(seed)
    system = [int(x) for x in rng.integers(0, 4, size=40)]

    def words(n: int) -> list[int]:
        return [int(x) for x in rng.integers(0, 4, size=n)]

    for _ in range(steps):
        seqs = eng.sequences
        live = [s for s in seqs if s.lease is not None and s.kv < s.room]
        op = rng.integers(0, 10)
        try:
            if op <= 3 and live:
                s = live[rng.integers(0, len(live))]
                want = model(tuple(s.tokens[: s.kv + 1]))
                assert eng.step(s) == want
            elif op == 4 or not seqs:
                s = eng.sequence()
                before = list(s.tokens)
                eng.prefill(s, [*system[: rng.integers(0, 41)], *words(int(rng.integers(1, 30)))],
                            int(rng.integers(1, 25)))
            elif op == 5:
                s = seqs[rng.integers(0, len(seqs))]
                if s.tokens:
                    b = eng.branch(s, int(rng.integers(1, len(s.tokens) + 1)))
                    before = list(b.tokens)
                    s = b
                before = list(s.tokens)
                eng.prefill(s, [*s.tokens, *words(int(rng.integers(1, 20)))], int(rng.integers(1, 25)))
            elif op == 6:
                eng.finish(seqs[rng.integers(0, len(seqs))])
            elif op == 7 and len(seqs) > 3:
                eng.release(seqs[rng.integers(0, len(seqs))])
            elif op == 8:
                eng.evict()
            else:
                s = seqs[rng.integers(0, len(seqs))]
                before = list(s.tokens)
                eng.prefill(s, [*s.tokens, *words(int(rng.integers(1, 12)))], int(rng.integers(1, 25)))
        except kr.EngineError as exc:
            # NOTE: a full pool (live sequences hold it) or a conversation beyond one sequence's
            # reach; the sequence's tokens are unchanged and it holds no lease
            assert "nothing left to evict" in str(exc) or "holds at most" in str(exc), exc
            assert s.tokens == before and (s.lease is None or "holds at most" in str(exc))
            if len(s.tokens) > 300:
                eng.release(s)
    counters = eng.counters
    eng.close()
    assert be.pool.pages_used == 0 and be.host.used == 0
    return counters


@pytest.mark.parametrize(("pages", "host"), [(32, 0), (32, 8), (64, 64)])
def test_random_engine_calls_keep_every_token_and_end_clean(pages: int, host: int) -> None:
    """3,000 random calls (turns, continued and branched prompts, steps of interleaved live
    sequences, finishes, releases, evictions) on a 32- or 64-page pool with no, a small or a large
    host tier: every step's token is the model's token for the conversation (so every shared,
    copied, forked, parked and woken page held the right tokens), and closing leaves nothing."""
    c = _random_ops(pages, host, 3000, seed=pages + host)
    assert c.reused > 0 and c.evictions > 0
    if host:
        assert c.parks > 0 and c.wakes > 0
