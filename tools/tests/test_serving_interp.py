"""kern_runtime.serving on the float32 Qwen3 interpreter (examples/qwen3-tiny.json, row by row):
requests sharing a system prompt, batched with chunked prefill, give the tokens each gives alone;
with leases grown a few steps at a time on a small pool the newest requests are parked to the host
tier and resume with the same tokens; cancellation, stop ids and strings, queue-full refusals, a
decoder that samples per row and an engine failure mid-step. On examples/qwen3-tiny-batch.json
(8 rows) the `Batched` decoder: more rows than the step holds, greedy and seeded rows with
logprobs give what each gives alone."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
from helpers.interp_engine import interp_engine as engine

import kern_runtime as kr
from kern_interp import qwen3 as interp
from kern_interp.backend import InterpBackend
from kern_interp.serve import ByteTokenizer
from kern_pool import Finish, Outcome, Plan, Queued, Refusal, Refused, SchedConfig
from kern_qwen3 import QWEN3_TINY_CONFIG, random_checkpoint
from kern_runtime import Sampled, Sampling
from kern_runtime.serving import (
    Batched,
    Done,
    Event,
    Request,
    RowByRow,
    Serving,
    ServingConfig,
    Token,
    decoder_for,
)

if TYPE_CHECKING:
    from starlette.testclient import TestClient

ROOT = Path(__file__).resolve().parents[2]
STEPS = 10


@pytest.fixture(scope="module")
def manifest() -> dict[str, Any]:
    return kr.read_manifest(ROOT / "examples" / "qwen3-tiny.json")


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    path, _ = random_checkpoint(dict(QWEN3_TINY_CONFIG), seed=3, name="serve", root=tmp_path_factory.mktemp("ckpt"))
    return interp.read_checkpoint(path)


def prompts(n: int) -> list[list[int]]:
    system = [int(x) for x in np.random.default_rng(1).integers(0, 4000, size=37)]
    return [system + [int(x) for x in np.random.default_rng(10 + i).integers(0, 4000, size=2 + 3 * i)]
            for i in range(n)]


def alone(manifest: dict[str, Any], weights: dict[str, np.ndarray], ps: list[list[int]]) -> list[list[int]]:
    out = []
    for p in ps:
        with engine(manifest, weights) as e:
            out.append(e.turn(e.sequence(), p, STEPS).tokens)
    return out


class Client:
    """A request's events, collected; `wait` until its Done."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.events: list[Event] = []
        self.done: Done | None = None
        self.ended = threading.Event()
        self.first = threading.Event()

    def __call__(self, ev: Event) -> None:
        self.events.append(ev)
        if isinstance(ev, Token):
            self.tokens.append(ev.token)
            self.first.set()
        else:
            self.done = ev
            self.ended.set()

    def wait(self) -> Done:
        assert self.ended.wait(60), "no Done"
        assert self.done is not None
        return self.done


def run(srv: Serving, reqs: list[Request], clients: list[Client]) -> list[Done]:
    for r in reqs:
        assert isinstance(srv.submit(r), Queued)
    srv.start()
    return [c.wait() for c in clients]


def requests(ps: list[list[int]], **kw: Any) -> tuple[list[Request], list[Client]]:
    clients = [Client() for _ in ps]
    return [Request(p, STEPS, c, **kw) for p, c in zip(ps, clients, strict=True)], clients


def idle(srv: Serving) -> None:
    g = srv.snapshot()
    assert g["queue_depth"] == g["running_rows"] == g["open_sequences"] == g["leased_pages"] == 0


def test_batched_requests_sharing_a_prefix_get_their_tokens_alone(manifest: dict[str, Any],
                                                                  weights: dict[str, np.ndarray]) -> None:
    ps = prompts(9)
    want = alone(manifest, weights, ps)
    e = engine(manifest, weights)
    srv = Serving(e, config=ServingConfig(SchedConfig(rows=4, step_tokens=12, chunk=12)))
    reqs, clients = requests(ps)
    done = run(srv, reqs, clients)
    srv.close()
    assert [c.tokens for c in clients] == want
    assert all(d.finish is Finish.LENGTH and d.generated == STEPS for d in done)
    assert srv.stats.hits >= 7 and sum(d.cached > 0 for d in done) >= 7  # the system prompt, reused
    assert srv.stats.steps > 0 and srv.stats.generated == 9 * STEPS and srv.stats.ttft.count == 9
    assert srv.stats.tpot.count == 9 * (STEPS - 1) and sum(srv.stats.tpot.counts) == 9 * (STEPS - 1)
    idle(srv)
    e.close()


def test_a_small_pool_parks_the_newest_and_they_resume_with_the_same_tokens(
        manifest: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
    ps = prompts(6)
    want = alone(manifest, weights, ps)
    e = engine(manifest, weights, pages=8, host=64)
    srv = Serving(e, config=ServingConfig(SchedConfig(rows=6, step_tokens=16, chunk=16, grow=3)))
    reqs, clients = requests(ps)
    run(srv, reqs, clients)
    srv.close()
    assert [c.tokens for c in clients] == want
    assert srv.stats.parks > 0 and e.counters.parks > 0
    idle(srv)
    assert srv.snapshot()["host_units_used"] > 0
    e.close()


def test_cancel_stop_ids_and_stop_strings(manifest: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
    ps = prompts(3)
    want = alone(manifest, weights, ps)
    e = engine(manifest, weights)
    srv = Serving(e, text=lambda ids: " ".join(f"<{i}>" for i in ids))
    c0, c1, c2 = Client(), Client(), Client()
    r0 = Request(ps[0], 500, c0)
    r1 = Request(ps[1], STEPS, c1, stop_ids=frozenset({want[1][3]}))
    r2 = Request(ps[2], STEPS, c2, stop_text=(f"<{want[2][4]}>",))
    for r in (r0, r1, r2):
        assert isinstance(srv.submit(r), Queued)
    srv.start()
    assert c0.first.wait(60)
    assert srv.cancel(r0.id)
    d0, d1, d2 = c0.wait(), c1.wait(), c2.wait()
    srv.close()
    assert d0.finish is Finish.CANCELLED and 0 < d0.generated < 500
    assert d1.finish is Finish.STOP and c1.tokens == want[1][: want[1].index(want[1][3]) + 1]
    assert d2.finish is Finish.STOP and c2.tokens == want[2][: want[2].index(want[2][4]) + 1]
    assert not srv.cancel(r0.id)
    idle(srv)
    e.close()


def test_queue_full_and_never_fits_refusals(manifest: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
    e = engine(manifest, weights, pages=16)
    srv = Serving(e, config=ServingConfig(SchedConfig(queued=2)))
    p = prompts(1)[0]
    assert isinstance(srv.submit(Request(p, 2, Client())), Queued)
    assert isinstance(srv.submit(Request(p, 2, Client())), Queued)
    assert srv.submit(Request(p, 2, Client())) == Refused(2, Refusal.QUEUE_FULL)
    assert srv.submit(Request(p, 16 * 16, Client())) == Refused(3, Refusal.NEVER_FITS)
    with pytest.raises(kr.ApiError, match="greedily"):
        srv.submit(Request(p, 2, Client(), sampling=Sampling(temperature=0.5)))
    with pytest.raises(kr.ApiError, match="at least one prompt token"):
        srv.submit(Request([], 2, Client()))
    srv.close()
    assert srv.stats.refused == 1
    idle(srv)
    e.close()


class Seeded:
    """A sampling double: one engine step per row, but the token is a function of the row's seed
    and how many tokens it generated, whatever rows share the step."""

    def __init__(self, engine: kr.Engine) -> None:
        self.rows = RowByRow(engine)
        self.widths: list[int] = []

    @property
    def sampling(self) -> bool:
        return True

    @property
    def top_n(self) -> int:
        return 1

    def decode(self, seqs: Sequence[kr.Sequence], sampling: Sequence[Sampling]) -> list[Sampled]:
        self.widths.append(len(seqs))
        self.rows.decode(seqs, sampling)
        out = []
        for seq, s in zip(seqs, sampling, strict=True):
            rng = np.random.default_rng([s.seed, len(seq.tokens)])
            out.append(Sampled(int(rng.integers(0, 4000)), -1.0, ((1, -2.0),) if s.logprobs > 0 else ()))
        return out


def test_each_row_gets_its_own_sampling(manifest: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
    ps = prompts(5)

    def sampled(batch: list[int]) -> list[list[int]]:
        e = engine(manifest, weights)
        dec = Seeded(e)
        srv = Serving(e, dec, ServingConfig(SchedConfig(rows=5)))
        reqs, clients = requests([ps[i] for i in batch])
        for r, i in zip(reqs, batch, strict=True):
            r.sampling = Sampling(temperature=0.7, seed=100 + i, logprobs=1)
        run(srv, reqs, clients)
        srv.close()
        e.close()
        assert all(isinstance(ev, Token) and ev.top == ((1, -2.0),) for c in clients for ev in c.events[:-1])
        if len(batch) > 1:
            assert max(dec.widths) > 1
        return [c.tokens for c in clients]

    together = sampled(list(range(5)))
    assert together == [sampled([i])[0] for i in range(5)]


class Failing(RowByRow):
    """Fails the `at`-th decode call."""

    def __init__(self, engine: kr.Engine, at: int) -> None:
        super().__init__(engine)
        self.calls, self.at = 0, at

    def decode(self, seqs: Sequence[kr.Sequence], sampling: Sequence[Sampling]) -> list[Sampled]:
        self.calls += 1
        if self.calls == self.at:
            raise kr.EngineError("injected")
        return super().decode(seqs, sampling)


def test_an_engine_failure_ends_the_requests_of_that_step_and_serving_goes_on(
        manifest: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
    ps = prompts(2)
    want = alone(manifest, weights, ps)
    e = engine(manifest, weights)
    srv = Serving(e, Failing(e, 3), ServingConfig(SchedConfig(rows=1)))
    reqs, clients = requests(ps)
    d0, d1 = run(srv, reqs, clients)
    assert d0.finish is None and d0.error == "EngineError: injected"
    assert d1.finish is Finish.LENGTH and clients[1].tokens == want[1]
    srv.close()
    assert srv.stats.failed == 1
    idle(srv)
    e.close()


@contextlib.contextmanager
def app_client(e: kr.Engine, srv: Serving) -> Iterator[TestClient]:
    """`srv` (serving `e`) started behind kern serve's app with a byte tokenizer; a client of that
    app; `srv` and `e` closed after."""
    from starlette.testclient import TestClient

    from kern_serve.app import Model, make_app

    srv.start()
    tok = ByteTokenizer()
    app = make_app(Model("tiny", srv, tok.encode, tok.decode, lambda ms: "".join(m["content"] for m in ms),
                         frozenset(), None, 1 << 16, 0))
    try:
        with TestClient(app) as client:
            yield client
    finally:
        srv.close()
        e.close()


def test_the_app_with_a_sampling_decoder_answers_logprobs(manifest: dict[str, Any],
                                                          weights: dict[str, np.ndarray]) -> None:
    e = engine(manifest, weights)
    with app_client(e, Serving(e, Seeded(e))) as client:
        body = {"model": "tiny", "prompt": "hello", "max_tokens": 3, "temperature": 0.5, "seed": 9, "logprobs": 1}
        a = client.post("/v1/completions", json=body).json()["choices"][0]
        b = client.post("/v1/completions", json=body).json()["choices"][0]
        assert a == b and len(a["logprobs"]["tokens"]) == 3
        assert a["logprobs"]["token_logprobs"] == [-1.0] * 3 and a["logprobs"]["top_logprobs"][0] == {"\x01": -2.0}
        assert a["logprobs"]["text_offset"][0] == 0
        other = client.post("/v1/completions", json={**body, "seed": 10}).json()["choices"][0]
        assert other["text"] != a["text"]
        chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                "temperature": 1.0, "logprobs": True, "top_logprobs": 1}
        content = client.post("/v1/chat/completions", json=chat).json()["choices"][0]["logprobs"]["content"]
        assert [c["logprob"] for c in content] == [-1.0, -1.0] and content[0]["top_logprobs"][0]["logprob"] == -2.0


def test_a_greedy_engine_refuses_sampling_with_400(manifest: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
    e = engine(manifest, weights)
    srv = Serving(e)
    assert isinstance(srv.decoder, RowByRow)
    with app_client(e, srv) as client:
        base = {"model": "tiny", "prompt": "hello", "max_tokens": 2}
        for extra, param in (({"temperature": 0.7}, "temperature"), ({"logprobs": 1}, "logprobs")):
            err = client.post("/v1/completions", json={**base, **extra}).json()["error"]
            assert (err["code"], err["param"]) == ("unsupported_parameter", param)
        assert client.post("/v1/completions", json=base).status_code == 200


@pytest.fixture(scope="module")
def batch_manifest() -> dict[str, Any]:
    return kr.read_manifest(ROOT / "examples" / "qwen3-tiny-batch.json")


def sampled_alone(e: kr.Engine, p: list[int], ask: Sampling) -> list[Sampled]:
    seq = e.sequence()
    e.prefill(seq, p, STEPS)
    out = [e.decode([seq], [ask])[0] for _ in range(STEPS)]
    e.finish(seq)
    e.release(seq)
    return out


def test_the_batched_decoder_gives_each_row_its_tokens_alone(batch_manifest: dict[str, Any],
                                                             weights: dict[str, np.ndarray]) -> None:
    ps = prompts(10)
    asks = [Sampling() if i % 3 == 0 else Sampling(temperature=0.8, top_k=50, top_p=0.9, seed=i, logprobs=i % 3)
            for i in range(10)]
    with engine(batch_manifest, weights) as e:
        want = [sampled_alone(e, p, a) for p, a in zip(ps, asks, strict=True)]
    assert [s.token for s in want[0]] == alone(manifest=batch_manifest, weights=weights, ps=ps[:1])[0]
    e = engine(batch_manifest, weights)
    srv = Serving(e, config=ServingConfig(SchedConfig(rows=10, step_tokens=64, chunk=64), ride=False))
    assert isinstance(srv.decoder, Batched) and isinstance(decoder_for(e), Batched) and srv.decoder.top_n == 20
    with pytest.raises(kr.ApiError, match="top-N bound of 20"):
        srv.submit(Request(ps[0], 2, Client(), sampling=Sampling(logprobs=21)))
    steps: list[int] = []
    step = e.decode

    def counted(seqs: Sequence[kr.Sequence], sampling: Sequence[Sampling]) -> list[Sampled]:
        steps.append(len(seqs))
        return step(seqs, sampling)

    e.decode = counted  # type: ignore[method-assign]
    reqs, clients = requests(ps)
    for r, a in zip(reqs, asks, strict=True):
        r.sampling = a
    run(srv, reqs, clients)
    srv.close()
    assert max(steps) == 8  # the step's most rows: 10 running rows take two calls
    for c, w, a in zip(clients, want, asks, strict=True):
        toks = [ev for ev in c.events if isinstance(ev, Token)]
        assert [t.token for t in toks] == [s.token for s in w]
        if a.logprobs < 0:
            assert all(t.logprob is None and t.top == () for t in toks)
        else:
            assert [t.logprob for t in toks] == pytest.approx([s.logprob for s in w], abs=1e-5)
            assert all(len(t.top) == a.logprobs for t in toks)
    idle(srv)
    e.close()


LONG = 14


def text(ids: Sequence[int]) -> str:
    return " ".join(f"<{i}>" for i in ids)


def serving(e: kr.Engine, pipeline: bool, ride: bool = False) -> Serving:
    """Serving with the prompts prefilled apart (`ride`: riding on the batched step)."""
    return Serving(e, config=ServingConfig(SchedConfig(rows=8, step_tokens=64, chunk=64), pipeline=pipeline, ride=ride),
                   text=text)


def served(e: kr.Engine, reqs: list[Request], clients: list[Client], pipeline: bool, ride: bool = False) -> Serving:
    srv = serving(e, pipeline, ride)
    run(srv, reqs, clients)
    srv.close()
    return srv


def mixed(i: int) -> Sampling:
    return [Sampling(), Sampling(temperature=0.9, top_k=40, seed=50 + i, logprobs=2), Sampling(logprobs=0)][i % 3]


@pytest.mark.parametrize("ride", [False, True])
def test_pipelined_serving_gives_the_tokens_of_serving_step_by_step(
        batch_manifest: dict[str, Any], weights: dict[str, np.ndarray], ride: bool) -> None:
    """Seven rows of greedy and seeded requests, each ending its own way (max_tokens, a stop id, a
    stop string, a cancellation from its sink) while a step past it is in flight: the clients get
    the same events pipelined as step by step, the dropped tokens are counted nowhere, and the
    engine is idle after; with the prompts prefilled apart or riding on the batched step."""
    ps = prompts(7)
    e = engine(batch_manifest, weights)
    reqs, clients = requests(ps)
    for i, r in enumerate(reqs):
        r.max_tokens, r.sampling = LONG, mixed(i)
    served(e, reqs, clients, pipeline=False, ride=ride)
    e.close()
    streams = [c.tokens for c in clients]

    def once(pipeline: bool) -> tuple[list[Client], Serving]:
        e = engine(batch_manifest, weights)
        reqs, clients = requests(ps)
        for i, r in enumerate(reqs):
            r.max_tokens, r.sampling = LONG - i % 3, mixed(i)
        reqs[1].stop_ids = frozenset({streams[1][10]})
        reqs[4].stop_ids = frozenset({streams[4][9]})
        reqs[2].stop_text = (f"<{streams[2][11]}>",)
        victim, sink = reqs[5], reqs[5].sink

        def cancelling(ev: Event) -> None:
            sink(ev)
            if isinstance(ev, Token) and len(clients[5].tokens) == 8:
                srv.cancel(victim.id)

        victim.sink = cancelling
        srv = serving(e, pipeline, ride)
        run(srv, reqs, clients)
        srv.close()
        idle(srv)
        e.close()
        return clients, srv

    (piped, p), (plain, q) = once(True), once(False)
    for a, b in zip(piped, plain, strict=True):
        assert a.done == b.done, (a.done, b.done)
        assert a.tokens == b.tokens
        ta = [ev for ev in a.events if isinstance(ev, Token)]
        tb = [ev for ev in b.events if isinstance(ev, Token)]
        assert [t.top and [x for x, _ in t.top] for t in ta] == [t.top and [x for x, _ in t.top] for t in tb]
        assert [t.logprob for t in ta] == pytest.approx([t.logprob for t in tb], abs=1e-5)
    assert [c.tokens for c in plain][3] == streams[3][: LONG]
    assert len(plain[1].tokens) <= 11 and plain[1].tokens[-1] == streams[1][10]
    assert [c.done.finish for c in plain if c.done] == [Finish.LENGTH, Finish.STOP, Finish.STOP, Finish.LENGTH,
                                                        Finish.STOP, Finish.CANCELLED, Finish.LENGTH]
    assert len(plain[5].tokens) == 8
    assert p.stats.ahead > 0 and q.stats.ahead == q.stats.stale == 0
    assert (p.stats.stale > 0 or ride) and (p.stats.ridden == q.stats.ridden > 0) == ride
    assert p.stats.generated == q.stats.generated == sum(len(c.tokens) for c in plain)
    assert p.stats.tpot.count == q.stats.tpot.count and p.stats.finished == q.stats.finished


def test_no_step_is_issued_past_max_tokens(batch_manifest: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
    """Requests that end by length only: pipelined, nothing is dropped, and each sequence's KV
    ends where the step-by-step loop's does (the index holds the same entries)."""
    ps = prompts(5)

    def once(pipeline: bool) -> tuple[list[list[int]], Serving, list[int]]:
        e = engine(batch_manifest, weights)
        reqs, clients = requests(ps)
        for i, r in enumerate(reqs):
            r.max_tokens, r.sampling = 6 + 2 * i, mixed(i)
        srv = served(e, reqs, clients, pipeline)
        hits = [hit.length if (hit := e.prefix.lookup([*p, *c.tokens, 0])) is not None else 0
                for p, c in zip(ps, clients, strict=True)]
        e.close()
        return [c.tokens for c in clients], srv, hits

    (a, p, ha), (b, q, hb) = once(True), once(False)
    assert a == b and ha == hb and all(h == len(x) + len(t) - 1 for h, x, t in zip(ha, ps, a, strict=True))
    assert p.stats.ahead > 0 and p.stats.stale == 0 and q.stats.ahead == 0


def test_a_request_that_stopped_with_a_step_in_flight_continues_from_what_its_kv_holds(
        batch_manifest: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
    """The row's sequence retires with the tokens its KV holds (the stop token too, written by
    the step past it); a follow-up turn reusing that entry samples what a fresh engine samples,
    with the same logprobs."""
    ps = prompts(3)
    ask = Sampling(temperature=1.0, seed=11)

    def once(stop: frozenset[int], pipeline: bool) -> tuple[kr.Engine, list[Client], Serving]:
        e = engine(batch_manifest, weights)
        reqs, clients = requests(ps)
        for r in reqs:
            r.max_tokens, r.sampling = LONG, ask
        reqs[0].stop_ids = stop
        return e, clients, served(e, reqs, clients, pipeline)

    e, clients, _ = once(frozenset(), False)
    e.close()
    toks = clients[0].tokens
    stop = next(t for j, t in enumerate(toks) if j >= 5 and t not in toks[:j])
    e, clients, srv = once(frozenset({stop}), True)
    assert srv.stats.stale > 0 and clients[0].tokens == toks[: toks.index(stop) + 1]
    said = [*ps[0], *clients[0].tokens]
    hit = e.prefix.lookup([*said, 7])
    assert hit is not None and hit.length == len(said)
    follow = [*said, 7, 8, 9]
    probe = Sampling(temperature=1.0, seed=5, logprobs=0)

    def continued(eng: kr.Engine) -> tuple[kr.Prefilled, list[Sampled]]:
        seq = eng.sequence()
        pre = eng.prefill(seq, follow, 5)
        return pre, [eng.decode([seq], [probe])[0] for _ in range(5)]

    pre, again = continued(e)
    e.close()
    assert pre.reused == len(said)
    with engine(batch_manifest, weights) as fresh:
        base, want = continued(fresh)
    assert base.reused == 0 and [s.token for s in again] == [s.token for s in want]
    assert [s.logprob for s in again] == pytest.approx([s.logprob for s in want], abs=1e-4)


def test_one_client_pipelines_on_the_one_row_step(batch_manifest: dict[str, Any],
                                                 weights: dict[str, np.ndarray]) -> None:
    ps = prompts(1)
    want = alone(batch_manifest, weights, ps)
    e = engine(batch_manifest, weights)
    reqs, clients = requests(ps)
    srv = served(e, reqs, clients, pipeline=True)
    be = e.backend
    assert isinstance(be, InterpBackend)
    assert [c.tokens for c in clients] == want and srv.stats.ahead == STEPS - 1 and srv.stats.stale == 0
    assert ("issue", "decode_rows") not in be.calls
    e.close()


def test_a_sink_that_raises_cancels_its_request_and_serving_goes_on(
        batch_manifest: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
    ps = prompts(3)
    e = engine(batch_manifest, weights)
    reqs, clients = requests(ps)
    sink = reqs[1].sink

    def broken(ev: Event) -> None:
        sink(ev)
        if isinstance(ev, Token) and len(clients[1].tokens) == 4:
            raise RuntimeError("the client's loop is closed")

    reqs[1].sink = broken
    srv = served(e, reqs, clients, pipeline=True)
    assert [c.wait().finish for c in clients] == [Finish.LENGTH, Finish.CANCELLED, Finish.LENGTH]
    assert len(clients[1].tokens) == 4 and srv.stats.failed == 0 and srv.stats.generated == 2 * STEPS + 4
    idle(srv)
    e.close()


def test_an_arrival_is_admitted_behind_the_step_in_flight(batch_manifest: dict[str, Any],
                                                           weights: dict[str, np.ndarray]) -> None:
    """A request submitted (from a sink, so at a known step) while a run of steps is in flight is
    admitted and prefilled behind the step in flight (the first row's, on the one-row step): its
    first token comes with the same token of the first row as in turn, and both get the tokens
    they get in turn."""
    ps = prompts(2)

    def seen(pipeline: bool) -> tuple[int, list[int], list[int]]:
        e = engine(batch_manifest, weights)
        srv = serving(e, pipeline)
        a, b = Client(), Client()
        later = Request(ps[1], 3, b)
        at: list[int] = []

        def first(ev: Event) -> None:
            a(ev)
            if isinstance(ev, Token) and len(a.tokens) == 5:
                assert isinstance(srv.submit(later), Queued)

        def second(ev: Event) -> None:
            if not b.tokens and isinstance(ev, Token):
                at.append(len(a.tokens))
            b(ev)

        later.sink = second
        run(srv, [Request(ps[0], 20, first)], [a])
        b.wait()
        srv.close()
        idle(srv)
        e.close()
        return at[0], a.tokens, b.tokens

    (at, a, b), (at_piped, a_piped, b_piped) = seen(False), seen(True)
    assert (at, at_piped) == (7, 7)  # A decodes while B is admitted and prefilled, then both
    assert (a, b) == (a_piped, b_piped) and (len(a), len(b)) == (20, 3)


def test_a_failure_behind_a_step_in_flight_ends_the_requests_of_both(
        batch_manifest: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
    """The prefill of an arrival, run behind the first row's step in flight, raises: both requests
    end with the error (as they do when the step and the chunk are one plan), the pipeline's step
    is dropped, and a later request is served with its tokens alone."""
    ps = prompts(3)
    want = alone(batch_manifest, weights, ps[2:])
    e = engine(batch_manifest, weights)
    srv = serving(e, True)
    a, b, c = Client(), Client(), Client()
    prefill = e.prefill

    def failing(seq: kr.Sequence, prompt: Sequence[int], room: int, *, first: bool = False) -> kr.Prefilled:
        if list(prompt) == ps[1]:
            raise kr.EngineError("injected")
        return prefill(seq, prompt, room, first=first)

    e.prefill = failing  # type: ignore[method-assign]

    def first(ev: Event) -> None:
        a(ev)
        if isinstance(ev, Token) and len(a.tokens) == 4:
            assert isinstance(srv.submit(Request(ps[1], 5, b)), Queued)

    run(srv, [Request(ps[0], 20, first)], [a])
    b.wait()
    assert a.done is not None and a.done.error == b.wait().error == "EngineError: injected"
    assert srv.stats.ahead > 0 and srv.stats.failed == 2 and len(a.tokens) == 4  # its step in flight: dropped
    run(srv, [Request(ps[2], STEPS, c)], [c])
    srv.close()
    assert c.tokens == want[0]
    idle(srv)
    e.close()


def recorded(srv: Serving) -> list[tuple[Plan, Outcome]]:
    """Every plan the scheduler commits, with its outcome, in order."""
    log: list[tuple[Plan, Outcome]] = []
    commit = srv.sched.commit

    def record(plan: Plan, outcome: Outcome) -> None:
        log.append((plan, outcome))
        commit(plan, outcome)

    srv.sched.commit = record  # type: ignore[method-assign]
    return log


def finished(plan: Plan, outcome: Outcome, rid: int) -> bool:
    """Whether `rid`'s prefill is done after `plan` ran."""
    total = next((a.tokens for a in plan.admits if a.id == rid), None)
    return total is None or outcome.prefilled[rid] == total - 1


@pytest.mark.parametrize(("batch", "pipeline"), [(False, False), (True, False), (True, True)])
def test_a_burst_is_admitted_and_prefilled_in_one_step_with_the_tokens_alone(
        manifest: dict[str, Any], batch_manifest: dict[str, Any], weights: dict[str, np.ndarray],
        batch: bool, pipeline: bool) -> None:
    """Six requests arriving together, sharing the system prompt: the first step admits and
    prefills them all (each after the first reuses the system prompt the one before it
    prefilled), the second gives every first token, and each gets its tokens alone."""
    m = batch_manifest if batch else manifest
    ps = prompts(6)
    want = alone(m, weights, ps)
    e = engine(m, weights)
    srv = Serving(e, config=ServingConfig(SchedConfig(rows=8, step_tokens=128, chunk=128), pipeline=pipeline,
                                          ride=False))
    log = recorded(srv)
    reqs, clients = requests(ps)
    done = run(srv, reqs, clients)
    srv.close()
    assert [c.tokens for c in clients] == want
    (first, got), (second, _) = log[0], log[1]
    assert [a.id for a in first.admits] == list(got.prefilled) == [r.id for r in reqs]
    assert all(finished(first, got, r.id) for r in reqs) and second.decode == tuple(r.id for r in reqs)
    assert sum(d.cached > 0 for d in done) == 5 and srv.stats.hits == 5 and srv.stats.failed == 0
    assert (srv.stats.ahead > 0) == pipeline
    idle(srv)
    e.close()


@pytest.mark.parametrize(("batch", "pipeline"), [(False, False), (True, False), (True, True)])
def test_first_tokens_from_the_head_are_sent_as_each_prefill_ends(
        manifest: dict[str, Any], batch_manifest: dict[str, Any], weights: dict[str, np.ndarray],
        batch: bool, pipeline: bool) -> None:
    """ServingConfig.head: in a burst of greedy requests the first plan's chunks bring every first
    token (the head program after each prompt), each sent before the next prompt's chunk runs and
    before the plan lands; the scheduler counts them as a finished prefill and a token, the second
    plan decodes every row's second token, and each request gets its tokens alone. On the batched
    step a request with logprobs takes its first token from the step, as without `head`."""
    m = batch_manifest if batch else manifest
    ps = prompts(6)
    want = alone(m, weights, ps)
    e = engine(m, weights)
    srv = Serving(e, config=ServingConfig(SchedConfig(rows=8, step_tokens=128, chunk=128), pipeline=pipeline,
                                          head=True))
    log = recorded(srv)
    order: list[tuple[str, int]] = []
    heads = 5 if batch else 6
    reqs, clients = requests(ps[:heads])
    chunk = srv._chunk  # pyright: ignore[reportPrivateUsage]

    def noted(rid: int, budget: int) -> tuple[int, int, bool]:
        order.append(("chunk", rid))
        return chunk(rid, budget)

    srv._chunk = noted  # type: ignore[method-assign]  # pyright: ignore[reportPrivateUsage]

    def first_noted(c: Client) -> Callable[[Event], None]:
        def sink(ev: Event) -> None:
            if isinstance(ev, Token) and not c.tokens:
                order.append(("first", ev.token))
            c(ev)
        return sink

    for r, c in zip(reqs, clients, strict=True):
        r.sink = first_noted(c)
    scored = Client()
    if batch:
        reqs.append(Request(ps[5], STEPS, scored, sampling=Sampling(logprobs=0)))
        clients.append(scored)
    done = run(srv, reqs, clients)
    srv.close()
    assert [c.tokens for c in clients] == want and all(d.finish is Finish.LENGTH for d in done)
    (first, got), (second, _) = log[0], log[1]
    ids = [r.id for r in reqs]
    assert [a.id for a in first.admits] == list(got.prefilled) == ids and all(finished(first, got, i) for i in ids)
    assert sorted(got.tokens) == ids[:heads] and [got.tokens[i] for i in ids[:heads]] == [w[0] for w in want[:heads]]
    assert order[: 2 * heads] == [x for i in range(heads) for x in (("chunk", ids[i]), ("first", want[i][0]))]
    assert second.decode == tuple(ids)
    if batch:
        assert order[2 * heads] == ("chunk", ids[5])
        assert isinstance(scored.events[0], Token) and scored.events[0].logprob is not None
    idle(srv)
    e.close()


def test_a_first_token_from_the_head_may_end_its_request(manifest: dict[str, Any],
                                                         weights: dict[str, np.ndarray]) -> None:
    """With `head`, a request of one token ends on its head token, one whose stop id is that token
    stops there, and one whose client is gone when it is sent is cancelled; the others are served
    and the pool is idle after."""
    ps = prompts(4)
    want = alone(manifest, weights, ps)
    e = engine(manifest, weights)
    srv = Serving(e, config=ServingConfig(SchedConfig(rows=8, step_tokens=128, chunk=128), head=True))
    clients = [Client() for _ in ps]

    def gone(ev: Event) -> None:
        clients[2](ev)
        if isinstance(ev, Token):
            raise ConnectionError("client gone")

    reqs = [Request(ps[0], 1, clients[0]), Request(ps[1], STEPS, clients[1], stop_ids=frozenset({want[1][0]})),
            Request(ps[2], STEPS, gone), Request(ps[3], STEPS, clients[3])]
    done = run(srv, reqs, clients)
    srv.close()
    assert [d.finish for d in done] == [Finish.LENGTH, Finish.STOP, Finish.CANCELLED, Finish.LENGTH]
    assert [c.tokens for c in clients] == [want[0][:1], want[1][:1], want[2][:1], want[3]]
    idle(srv)
    e.close()


def test_the_step_budget_is_split_in_turn_and_one_prefill_carries_over(
        manifest: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
    """A budget of 48 tokens: the first request's 38, then the next ones' remainders past the
    system prompt (4, then 7 with 6 left) while the budget lasts; the one it runs out on finishes
    first thing next step, and the next heads follow it in that step."""
    ps = prompts(6)
    want = alone(manifest, weights, ps)
    e = engine(manifest, weights)
    srv = Serving(e, config=ServingConfig(SchedConfig(rows=8, step_tokens=48, chunk=48)))
    log = recorded(srv)
    reqs, clients = requests(ps)
    run(srv, reqs, clients)
    srv.close()
    assert [c.tokens for c in clients] == want
    (first, got), (second, then) = log[0], log[1]
    assert got.prefilled == {0: 38, 1: 41, 2: 43} and not finished(first, got, 2)
    assert [c.id for c in second.chunks] == [2, 3, 4, 5] and second.decode == (0, 1) and second.budget == 46
    assert then.prefilled == {2: 44, 3: 47, 4: 50, 5: 53}  # 1 + 10 + 10 + 10 tokens of the 46
    assert srv.stats.hits == 5 and srv.stats.failed == 0
    idle(srv)
    e.close()


def test_a_burst_takes_the_free_rows_and_the_rest_follow_in_turn(
        manifest: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
    ps = prompts(7)
    want = alone(manifest, weights, ps)
    e = engine(manifest, weights)
    srv = Serving(e, config=ServingConfig(SchedConfig(rows=3, step_tokens=256, chunk=256)))
    log = recorded(srv)
    reqs, clients = requests(ps)
    run(srv, reqs, clients)
    srv.close()
    assert [c.tokens for c in clients] == want
    assert list(log[0][1].prefilled) == [0, 1, 2]
    starts = [rid for p, o in log for rid in o.prefilled if any(a.id == rid for a in p.admits)]
    assert starts == list(range(7))  # first come, first served
    idle(srv)
    e.close()


def test_cancelling_a_request_admitted_in_a_burst(manifest: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
    """Of five requests admitted together, one is cancelled by its sink after its second token and
    one before its first step: the others get their tokens alone, the engine ends idle."""
    ps = prompts(5)
    want = alone(manifest, weights, ps)
    e = engine(manifest, weights)
    srv = Serving(e, config=ServingConfig(SchedConfig(rows=8, step_tokens=128, chunk=128)))
    log = recorded(srv)
    reqs, clients = requests(ps)
    sink = reqs[1].sink

    def cancelling(ev: Event) -> None:
        sink(ev)
        if isinstance(ev, Token) and len(clients[1].tokens) == 2:
            srv.cancel(reqs[1].id)

    reqs[1].sink = cancelling
    for r in reqs:
        assert isinstance(srv.submit(r), Queued)
    srv.cancel(reqs[3].id)
    srv.start()
    done = [c.wait() for c in clients]
    srv.close()
    assert [a.id for a in log[0][0].admits] == [0, 1, 2, 4]
    assert done[1].finish is done[3].finish is Finish.CANCELLED and clients[3].tokens == []
    assert clients[1].tokens == want[1][:2]
    assert [clients[i].tokens for i in (0, 2, 4)] == [want[i] for i in (0, 2, 4)]
    idle(srv)
    e.close()


def test_a_burst_on_a_small_pool_parks_and_resumes_with_the_tokens_alone(
        manifest: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
    ps = prompts(6)
    want = alone(manifest, weights, ps)
    e = engine(manifest, weights, pages=8, host=64)
    srv = Serving(e, config=ServingConfig(SchedConfig(rows=6, step_tokens=128, chunk=128, grow=3)))
    log = recorded(srv)
    reqs, clients = requests(ps)
    run(srv, reqs, clients)
    srv.close()
    assert [c.tokens for c in clients] == want
    assert len(log[0][1].prefilled) > 1 and srv.stats.parks > 0 and e.counters.parks > 0
    resumed = [rid for p, o in log for a in p.admits if a.resume and (rid := a.id) in o.prefilled]
    assert resumed
    idle(srv)
    e.close()


def test_a_burst_is_admitted_behind_the_step_in_flight(batch_manifest: dict[str, Any],
                                                        weights: dict[str, np.ndarray]) -> None:
    """Three requests submitted together while the first row's steps are in flight are admitted
    and prefilled behind the step in flight in one plan: their first tokens come on one step, the
    same as in turn, and every request gets its tokens alone."""
    ps = prompts(4)
    want = alone(batch_manifest, weights, ps)

    def seen(pipeline: bool) -> tuple[list[list[int]], list[int], list[tuple[Plan, Outcome]]]:
        e = engine(batch_manifest, weights)
        srv = serving(e, pipeline)
        log = recorded(srv)
        clients = [Client() for _ in ps]
        at: list[int] = []
        later = [Request(p, STEPS, c) for p, c in zip(ps[1:], clients[1:], strict=True)]

        def first(ev: Event) -> None:
            clients[0](ev)
            if isinstance(ev, Token) and len(clients[0].tokens) == 3:
                for r in later:
                    assert isinstance(srv.submit(r), Queued)

        def noting(c: Client) -> Callable[[Event], None]:
            def sink(ev: Event) -> None:
                if not c.tokens and isinstance(ev, Token):
                    at.append(len(clients[0].tokens))
                c(ev)
            return sink

        for r, c in zip(later, clients[1:], strict=True):
            r.sink = noting(c)
        run(srv, [Request(ps[0], STEPS, first)], clients[:1])
        for c in clients[1:]:
            c.wait()
        srv.close()
        idle(srv)
        e.close()
        return [c.tokens for c in clients], at, log

    (plain, at, _), (piped, at_piped, log) = seen(False), seen(True)
    assert plain == piped == want and at == at_piped and len(set(at)) == 1
    (plan, got), = [(p, o) for p, o in log if 1 in o.prefilled]
    assert plan.decode == () and [a.id for a in plan.admits] == list(got.prefilled) == [1, 2, 3]  # behind


def test_a_failing_prefill_in_a_burst_ends_the_requests_it_started_and_the_rest_are_served(
        manifest: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
    """Three arrivals admitted together, the second one's prefill raising: the first (started in
    that step) and the second end with the error, the third (never reached) is served next with
    its tokens alone."""
    ps = prompts(3)
    want = alone(manifest, weights, ps[2:])
    e = engine(manifest, weights)
    prefill = e.prefill

    def failing(seq: kr.Sequence, prompt: Sequence[int], room: int, *, first: bool = False) -> kr.Prefilled:
        if list(prompt) == ps[1]:
            raise kr.EngineError("injected")
        return prefill(seq, prompt, room, first=first)

    e.prefill = failing  # type: ignore[method-assign]
    srv = Serving(e, config=ServingConfig(SchedConfig(rows=8, step_tokens=128, chunk=128)))
    reqs, clients = requests(ps)
    done = run(srv, reqs, clients)
    srv.close()
    assert done[0].error == done[1].error == "EngineError: injected" and done[0].finish is done[1].finish is None
    assert done[2].finish is Finish.LENGTH and clients[2].tokens == want[0]
    assert srv.stats.failed == 2
    idle(srv)
    e.close()


class _OnContext(InterpBackend):
    """The interpreter as a backend on a CUDA context: records the threads that made it current."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.current: list[str] = []

    def make_current(self) -> None:
        self.current.append(threading.current_thread().name)


def test_the_engine_thread_makes_a_bound_backend_current_before_it_drives_it(
        manifest: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
    """A backend on a CUDA context (`kern_runtime.Bound`, as `Runtime`) is made current on the
    engine thread before its first step: a fresh thread has no current context, and a first call
    there that creates an event or host memory fails without it."""
    be = _OnContext(manifest, weights, pages=64, chunk_pages=8, host_pages=0)
    assert isinstance(be, kr.Bound) and not isinstance(InterpBackend(manifest, weights, pages=8), kr.Bound)
    e = kr.Engine(be, kr.serving_roles(manifest), kr.EngineConfig(chunk=64))
    srv = Serving(e, config=ServingConfig(SchedConfig(rows=4, step_tokens=12, chunk=12)))
    reqs, clients = requests(prompts(2))
    run(srv, reqs, clients)
    srv.close()
    assert be.current == ["kern-engine"]
    e.close()
