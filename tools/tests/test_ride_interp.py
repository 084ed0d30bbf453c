"""Prompt tokens riding on the batched decode step (examples/qwen3-tiny-batch.json, 8 rows) on the
float32 Qwen3 interpreter. The engine: `begin` leases a prompt (its cached prefix reused) without
computing it, `ride` runs its tokens as rows of the step beside decode rows, and the first token
of a prompt ridden in steps of any size, alone or beside other rows, seeded or greedy, is the
same; bad rides change nothing. Serving: requests riding in one step, across several, after a
cached system prompt, cancelled part way, parked on a small pool, or failing, get the tokens they
get alone through the same Serving (and with riding off), and the pool ends idle."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.interp_engine import interp_engine as engine

import kern_pool
import kern_runtime as kr
from kern_interp import qwen3 as interp
from kern_interp.backend import InterpBackend
from kern_pool import Finish, Queued, SchedConfig
from kern_qwen3 import QWEN3_TINY_CONFIG, random_checkpoint
from kern_runtime import Sampled, Sampling
from kern_runtime.serving import Done, Event, Request, Serving, ServingConfig, Token

ROOT = Path(__file__).resolve().parents[2]
STEPS = 6


@pytest.fixture(scope="module")
def manifest() -> dict[str, Any]:
    return kr.read_manifest(ROOT / "examples" / "qwen3-tiny-batch.json")


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    path, _ = random_checkpoint(dict(QWEN3_TINY_CONFIG), seed=5, name="ride", root=tmp_path_factory.mktemp("ckpt"))
    return interp.read_checkpoint(path)


def tokens(seed: int, n: int) -> list[int]:
    return [int(x) for x in np.random.default_rng(seed).integers(0, 4000, size=n)]


SYSTEM = tokens(1, 29)
GREEDY = Sampling()


def prompts(n: int) -> list[list[int]]:
    """A shared system prompt and a question of 1 + 2i tokens each."""
    return [SYSTEM + tokens(20 + i, 1 + 2 * i) for i in range(n)]


def ride_all(e: kr.Engine, seq: kr.Sequence, prompt: list[int], width: int, ask: Sampling = GREEDY) -> Sampled:
    """`prompt` begun on `seq` and ridden `width` rows a step; its first token's result."""
    e.begin(seq, prompt, STEPS)
    while True:
        [got] = e.ride([seq], [ask], [min(width, len(seq.tokens) - seq.kv)])
        if got is not None:
            return got


def decoded(e: kr.Engine, seq: kr.Sequence, ask: Sampling, steps: int) -> list[Sampled]:
    return [e.decode([seq], [ask])[0] for _ in range(steps)]


# ---- the engine ----------------------------------------------------------------------------------


@pytest.mark.parametrize("width", [1, 3, 8])
def test_a_prompt_ridden_in_steps_of_any_width_gives_the_prefill_paths_tokens(
        manifest: dict[str, Any], weights: dict[str, np.ndarray], width: int) -> None:
    prompt = tokens(3, 19)
    with engine(manifest, weights) as e:
        want = e.turn(e.sequence(), prompt, STEPS).tokens
    with engine(manifest, weights) as e:
        seq = e.sequence()
        first = ride_all(e, seq, prompt, width)
        assert seq.kv == len(prompt) and seq.tokens == [*prompt, first.token] and first.logprob is None
        got = [first.token] + [s.token for s in decoded(e, seq, Sampling(), STEPS - 1)]
    assert got == want


def test_riders_and_decode_rows_share_a_step_with_their_tokens_alone(
        manifest: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
    """A decoding sequence, then two prompts riding beside it (3 rows each a step): each row's tokens
    are those it gets alone in the riding path."""
    pa, pb, pc = tokens(4, 11), tokens(5, 9), tokens(6, 13)

    def alone(p: list[int]) -> list[int]:
        with engine(manifest, weights) as e:
            seq = e.sequence()
            first = ride_all(e, seq, p, 8)
            return [first.token] + [s.token for s in decoded(e, seq, Sampling(logprobs=0), STEPS - 1)]

    want = [alone(p) for p in (pa, pb, pc)]
    with engine(manifest, weights) as e:
        a, b, c = e.sequence(), e.sequence(), e.sequence()
        out: dict[int, list[int]] = {a.id: [ride_all(e, a, pa, 8).token], b.id: [], c.id: []}
        e.begin(b, pb, STEPS)
        e.begin(c, pc, STEPS)
        ask = Sampling(logprobs=0)
        while len(out[c.id]) < STEPS:
            live = [s for s in (a, b, c) if len(out[s.id]) < STEPS]
            counts = [min(3, len(s.tokens) - s.kv) for s in live]
            for s, got in zip(live, e.ride(live, [ask] * len(live), counts), strict=True):
                if got is not None:
                    out[s.id].append(got.token)
        assert [out[s.id] for s in (a, b, c)] == want


def test_a_cached_prefix_is_reused_and_only_the_rest_rides(manifest: dict[str, Any],
                                                           weights: dict[str, np.ndarray]) -> None:
    first, second = prompts(2)
    with engine(manifest, weights) as fresh:
        seq = fresh.sequence()
        want = ride_all(fresh, seq, second, 8).token
    with engine(manifest, weights) as e:
        one = e.sequence()
        ride_all(e, one, first, 8)
        e.finish(one)
        seq = e.sequence()
        pre = e.begin(seq, second, STEPS)
        unit = e.backend.pool.unit  # NOTE: the index keeps whole pages of the system prompt
        assert pre.reused == seq.kv == len(SYSTEM) // unit * unit > 0 and pre.prefilled == len(second) - pre.reused
        got = None
        while got is None:
            [got] = e.ride([seq], [Sampling()], [min(8, len(seq.tokens) - seq.kv)])
        assert got.token == want


def test_a_seeded_rider_draws_the_same_alone_and_beside_other_rows(manifest: dict[str, Any],
                                                                   weights: dict[str, np.ndarray]) -> None:
    ask = Sampling(temperature=0.9, top_k=40, seed=17, logprobs=2)
    prompt = tokens(8, 14)
    with engine(manifest, weights) as e:
        seq = e.sequence()
        want = [ride_all(e, seq, prompt, 5, ask), *decoded(e, seq, ask, 3)]
    with engine(manifest, weights) as e:
        other, seq = e.sequence(), e.sequence()
        ride_all(e, other, tokens(9, 6), 8)
        e.begin(seq, prompt, STEPS)
        got: list[Sampled] = []
        while len(got) < 4:
            n = min(7, len(seq.tokens) - seq.kv)
            _, mine = e.ride([other, seq], [Sampling(temperature=1.0, seed=3), ask], [1, n])
            if mine is not None:
                got.append(mine)
    assert [s.token for s in got] == [s.token for s in want]
    assert [s.logprob for s in got] == pytest.approx([s.logprob for s in want], abs=1e-5)
    assert [[t for t, _ in s.top] for s in got] == [[t for t, _ in s.top] for s in want]


def test_bad_rides_change_nothing(manifest: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
    with engine(manifest, weights) as e:
        seq, other = e.sequence(), e.sequence()
        e.begin(seq, tokens(2, 12), STEPS)
        e.begin(other, tokens(3, 5), STEPS)
        calls = len(e.backend.calls)  # type: ignore[attr-defined]
        for counts, match in (([0, 1], "at least 1"), ([13, 1], "past its 12 tokens"), ([6, 3], "exceed the batched"),
                              ([1], "one row count per sequence")):
            with pytest.raises(kr.EngineError, match=match):
                e.ride([seq, other], [Sampling(), Sampling()], counts)
        with pytest.raises(kr.EngineError, match="twice"):
            e.ride([seq, seq], [Sampling(), Sampling()], [1, 1])
        assert (seq.kv, other.kv) == (0, 0) and len(e.backend.calls) == calls  # type: ignore[attr-defined]
        assert e.ride([seq, other], [Sampling(), Sampling()], [7, 1]) == [None, None] and (seq.kv, other.kv) == (7, 1)
    one = kr.read_manifest(ROOT / "examples" / "qwen3-tiny.json")
    with engine(one, weights) as e, pytest.raises(kr.EngineError, match="no batched decode step"):
        e.begin(e.sequence(), tokens(2, 4), 2)
    with engine(manifest, weights) as e, pytest.raises(kern_pool.ApiError, match="ride_max must be"):
        Serving(e, config=ServingConfig(ride_max=-1))


# ---- serving -------------------------------------------------------------------------------------


class Client:
    """A request's events, collected; `wait` until its Done."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.events: list[Event] = []
        self.done: Done | None = None
        self.ended = threading.Event()

    def __call__(self, ev: Event) -> None:
        self.events.append(ev)
        if isinstance(ev, Token):
            self.tokens.append(ev.token)
        else:
            self.done = ev
            self.ended.set()

    def wait(self) -> Done:
        assert self.ended.wait(120), "no Done"
        assert self.done is not None
        return self.done


def serving(e: kr.Engine, riding: bool = True, rows: int = 8, **kw: Any) -> Serving:
    """Serving with prompts riding (`riding`), `kw` for its SchedConfig (`ride`: rows a step)."""
    sched = SchedConfig(rows=rows, step_tokens=64, chunk=64, **kw)
    return Serving(e, config=ServingConfig(sched, ride=riding))


def requests(ps: list[list[int]], max_tokens: int = STEPS, ask: Sampling = GREEDY) -> tuple[list[Request], list[Client]]:
    clients = [Client() for _ in ps]
    return [Request(p, max_tokens, c, sampling=ask) for p, c in zip(ps, clients, strict=True)], clients


def run(srv: Serving, reqs: list[Request], clients: list[Client]) -> list[Done]:
    for r in reqs:
        assert isinstance(srv.submit(r), Queued)
    srv.start()
    return [c.wait() for c in clients]


def one_by_one(srv: Serving, ps: list[list[int]], ask: Sampling = GREEDY, max_tokens: int = STEPS) -> list[list[Token]]:
    """Each prompt served alone, one after another, through `srv`."""
    out: list[list[Token]] = []
    for p in ps:
        reqs, clients = requests([p], max_tokens, ask)
        run(srv, reqs, clients)
        out.append([ev for ev in clients[0].events if isinstance(ev, Token)])
    return out


def idle(srv: Serving, e: kr.Engine) -> None:
    g = srv.snapshot()
    assert g["queue_depth"] == g["running_rows"] == g["open_sequences"] == g["leased_pages"] == 0
    held = sum(len(s.lease.pages) for s in e.sequences if s.lease is not None)
    assert held == 0 and not srv.sched.running and not srv.sched.reserved


def test_riding_requests_get_their_tokens_alone_and_with_riding_off(manifest: dict[str, Any],
                                                                      weights: dict[str, np.ndarray]) -> None:
    """Nine requests sharing a 29-token system prompt: the first rides over several steps, the rest
    ride their questions after the cached prompt, several in a step; every request's greedy tokens
    are those it gets alone through the same Serving and with riding off."""
    ps = prompts(9)
    e = engine(manifest, weights)
    srv = serving(e)
    alone = [[t.token for t in ts] for ts in one_by_one(srv, ps)]
    srv.close()
    e.close()
    for ride in (True, False):
        e = engine(manifest, weights)
        srv = serving(e, ride)
        rides: list[tuple[int, ...]] = []
        commit = srv.sched.commit

        def record(plan: Any, outcome: Any, commit: Any = commit, rides: list[tuple[int, ...]] = rides) -> None:
            rides.append(tuple(outcome.prefilled) if plan.rides else ())  # the riders that rode
            commit(plan, outcome)

        srv.sched.commit = record  # type: ignore[method-assign]
        reqs, clients = requests(ps)
        done = run(srv, reqs, clients)
        srv.close()
        assert [c.tokens for c in clients] == alone, ride
        assert all(d.finish is Finish.LENGTH for d in done) and srv.stats.hits >= 7
        assert srv.stats.ttft.count == 9 and srv.stats.generated == 9 * STEPS
        if ride:
            assert rides[:4] == [(0,)] * 3 + [(0, 1)]  # 30 tokens over 4 steps, the next behind them
            # NOTE: a ride that ends on a prompt's next to last token leaves the last to a decode row
            assert 0 <= sum(len(p) for p in ps) - sum(d.cached for d in done) - srv.stats.ridden <= len(ps)
        else:
            assert srv.stats.ridden == 0 and not any(rides)
        idle(srv, e)
        e.close()


def test_a_request_cancelled_while_its_prompt_rides_leaves_and_the_rest_are_served(
        manifest: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
    """Three rows a step: A decodes, B's 40-token prompt rides two tokens a step and is cancelled
    by A's sink on A's third token, part way; C (behind B) and A get their tokens alone, B none,
    B's lease goes back and the KV it had went to the prefix index."""
    pa, pb, pc = tokens(30, 3), tokens(31, 40), tokens(32, 5)
    e = engine(manifest, weights)
    srv = serving(e, ride=3)
    alone = one_by_one(srv, [pa, pc])
    srv.close()
    e.close()
    e = engine(manifest, weights)
    srv = serving(e, ride=3)
    (ra, rb, rc), (ca, cb, cc) = requests([pa, pb, pc], max_tokens=12)
    ra.max_tokens = rc.max_tokens = STEPS
    sink = ra.sink

    def cancelling(ev: Event) -> None:
        sink(ev)
        if isinstance(ev, Token) and len(ca.tokens) == 3:
            srv.cancel(rb.id)

    ra.sink = cancelling
    run(srv, [ra, rb, rc], [ca, cb, cc])
    srv.close()
    assert cb.done is not None and cb.done.finish is Finish.CANCELLED and cb.tokens == []
    assert [ca.tokens, cc.tokens] == [[t.token for t in ts] for ts in alone]
    hit = e.prefix.lookup(pb)
    assert hit is not None and 0 < hit.length < len(pb) - 1  # part of B's prompt had ridden
    idle(srv, e)
    e.close()


def test_seeded_riders_sample_the_same_alone_and_batched(manifest: dict[str, Any],
                                                         weights: dict[str, np.ndarray]) -> None:
    ask = Sampling(temperature=0.8, top_p=0.9, seed=23, logprobs=1)
    ps = prompts(6)
    e = engine(manifest, weights)
    srv = serving(e)
    alone = one_by_one(srv, ps, ask)
    srv.close()
    e.close()
    e = engine(manifest, weights)
    srv = serving(e)
    reqs, clients = requests(ps, ask=ask)
    run(srv, reqs, clients)
    srv.close()
    for c, want in zip(clients, alone, strict=True):
        got = [ev for ev in c.events if isinstance(ev, Token)]
        assert [t.token for t in got] == [t.token for t in want]
        assert [t.logprob for t in got] == pytest.approx([t.logprob for t in want], abs=1e-5)
    idle(srv, e)
    e.close()


def test_riders_on_a_small_pool_park_and_resume_with_their_tokens(manifest: dict[str, Any],
                                                                  weights: dict[str, np.ndarray]) -> None:
    ps = [SYSTEM + tokens(60 + i, 10 + 3 * i) for i in range(6)]
    e = engine(manifest, weights, pages=8, host=64)
    srv = serving(e, rows=6, grow=3)
    alone = [[t.token for t in ts] for ts in one_by_one(srv, ps, max_tokens=10)]
    srv.close()
    e.close()
    e = engine(manifest, weights, pages=8, host=64)
    srv = serving(e, rows=6, grow=3)
    reqs, clients = requests(ps, max_tokens=10)
    run(srv, reqs, clients)
    srv.close()
    assert [c.tokens for c in clients] == alone
    assert srv.stats.parks > 0 and srv.stats.ridden > 0
    idle(srv, e)
    e.close()


def test_a_long_rest_prefills_apart_and_its_last_token_rides(manifest: dict[str, Any],
                                                             weights: dict[str, np.ndarray]) -> None:
    ps = [tokens(40, 30), tokens(41, 4)]
    e = engine(manifest, weights)
    srv = Serving(e, config=ServingConfig(SchedConfig(rows=8, step_tokens=64, chunk=64), ride=True, ride_max=10))
    reqs, clients = requests(ps)
    run(srv, reqs, clients)
    srv.close()
    be = e.backend
    assert isinstance(be, InterpBackend)
    assert be.calls.count(("run", "prefill")) == 1 and srv.stats.ridden == 1 + 4
    e.close()
    with engine(manifest, weights) as plain:
        assert clients[0].tokens == plain.turn(plain.sequence(), ps[0], STEPS).tokens


def test_a_failing_ride_step_ends_its_requests_and_serving_goes_on(manifest: dict[str, Any],
                                                                   weights: dict[str, np.ndarray]) -> None:
    ps = [tokens(50, 3), tokens(51, 3), tokens(52, 4)]
    e = engine(manifest, weights)
    srv = serving(e)
    alone = one_by_one(srv, ps[2:])
    srv.close()
    e.close()
    e = engine(manifest, weights)
    ride = e.ride
    failed: list[bool] = []

    def failing(seqs: Sequence[kr.Sequence], sampling: Sequence[Sampling], counts: Sequence[int]) -> list[Sampled | None]:
        if not failed:
            failed.append(True)
            raise kr.EngineError("injected")
        return ride(seqs, sampling, counts)

    e.ride = failing  # type: ignore[method-assign]
    srv = serving(e)
    reqs, clients = requests(ps[:2])
    done = run(srv, reqs, clients)
    assert [d.error for d in done] == ["EngineError: injected"] * 2 and srv.stats.failed == 2
    reqs, clients = requests(ps[2:])
    run(srv, reqs, clients)
    srv.close()
    assert clients[0].tokens == [t.token for t in alone[0]]
    idle(srv, e)
    e.close()
