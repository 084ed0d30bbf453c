"""The serving scheduler: exact plans for the rules one by one, and a state machine that executes
its plans on a model engine (cached prefixes, page-counted leases) and checks the invariants: pages
never over-reserved, one prefill at a time, rows bounded, FCFS admission, every request ends with
the tokens the model gives it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kern_pool import (
    Admit,
    ApiError,
    Ask,
    Chunk,
    Finish,
    Grow,
    Outcome,
    Plan,
    Queued,
    Refusal,
    Refused,
    Retire,
    SchedConfig,
    Scheduler,
    run_chunks,
    run_rides,
)


def token(rid: int, n: int) -> int:
    """The model's n-th token for request rid."""
    return (rid * 31 + n * 7) % 50


@dataclass
class Model:
    """Executes plans: the chunks in turn, each up to its budget and the step's budget left past
    the cached prefix (the next only after a finished prefill), decode rows emit `token`."""

    sched: Scheduler
    cached: dict[int, int] = field(default_factory=dict[int, int])
    kv: dict[int, int] = field(default_factory=dict[int, int])
    out: dict[int, list[int]] = field(default_factory=dict[int, list[int]])
    ended: dict[int, Finish] = field(default_factory=dict[int, Finish])
    totals: dict[int, int] = field(default_factory=dict[int, int])
    stop_at: dict[int, int] = field(default_factory=dict[int, int])
    admitted: list[int] = field(default_factory=list[int])
    plans: list[Plan] = field(default_factory=list[Plan])
    limits: dict[int, int] = field(default_factory=dict[int, int])
    """max_tokens of the requests run piped."""
    sampled: set[int] = field(default_factory=set[int])
    """The riders whose last prompt token rode on the step executed last."""
    rode: list[int] = field(default_factory=list[int])
    """The rows the riders of each step took."""

    def step(self) -> Plan:
        plan = self.sched.plan()
        self.land(plan, self.execute(plan), self.device(plan, []))
        return plan

    def execute(self, plan: Plan) -> dict[int, int]:
        """The plan's retirements, parks, chunks and the admissions they start; how far each chunk
        that ran got."""
        for r in plan.retire:
            self.ended[r.id] = r.why
            self.kv.pop(r.id, None)
        for rid in plan.park:
            del self.kv[rid]

        def start(a: Admit) -> None:
            self.admitted.append(a.id)
            self.totals[a.id] = a.tokens
            self.kv[a.id] = 0

        def chunk(rid: int, budget: int) -> tuple[int, int, bool]:
            begin = max(self.kv[rid], min(self.cached.get(rid, 0), self.totals[rid] - 1))
            self.kv[rid] = min(self.totals[rid] - 1, begin + budget)
            return self.kv[rid] - begin, self.kv[rid], self.kv[rid] == self.totals[rid] - 1

        for rid in plan.decode:  # NOTE: a request decodes only once its prompt is in its KV
            assert self.kv[rid] == self.totals[rid] - 1
        self.sampled = set()
        return self.ride(plan, start) if plan.rides else run_chunks(plan, start, chunk)

    def ride(self, plan: Plan, start: Callable[[Admit], None]) -> dict[int, int]:
        """The plan's rides in turn (`run_rides`), each past the cached prefix: a rider that took
        its last prompt token samples from that row; how far each got (that token not counted)."""

        def rest(rid: int) -> int:
            self.kv[rid] = max(self.kv[rid], min(self.cached.get(rid, 0), self.totals[rid] - 1))
            return self.totals[rid] - self.kv[rid]

        took = run_rides(plan, start, rest)
        assert sum(took.values()) <= plan.rows  # the riders' rows never pass the plan's
        self.rode.append(sum(took.values()))
        for rid, n in took.items():
            if self.kv[rid] + n == self.totals[rid]:
                self.sampled.add(rid)
            self.kv[rid] = min(self.totals[rid] - 1, self.kv[rid] + n)
        return {rid: self.kv[rid] for rid in took}

    def device(self, plan: Plan, flight: list[Plan]) -> dict[int, int]:
        """The tokens the model gives the plan's rows, `flight` steps of them issued before."""
        rows = (*plan.decode, *sorted(self.sampled)) if plan.rides else plan.decode
        return {rid: token(rid, len(self.out.get(rid, [])) + sum(rid in p.decode for p in flight)) for rid in rows}

    def land(self, plan: Plan, done: dict[int, int], tokens: dict[int, int]) -> None:
        """The step's read-back committed: the stale rows' tokens dropped."""
        stale = set(self.sched.stale(plan))
        live = {rid: t for rid, t in tokens.items() if rid not in stale}
        stopped = [rid for rid in live if self.stop_at.get(rid) == len(self.out.get(rid, [])) + 1]
        for rid, t in live.items():
            self.out.setdefault(rid, []).append(t)
        self.sched.commit(plan, Outcome(done, live, stopped))
        self.plans.append(plan)

    def piped(self, steps: int) -> list[Plan]:
        """`steps` steps as an engine that issues a step before reading the last one runs them:
        what `ahead` gives while a step is in flight is issued (a step of the same rows) or
        executed (admissions and their chunks) at once; every plan lands in order. Returns the
        plans landed."""
        flight: list[tuple[Plan, dict[int, int], dict[int, int]]] = []
        landed: list[Plan] = []
        for _ in range(steps):
            if not flight:
                plan = self.sched.plan()
                flight.append((plan, self.execute(plan), self.device(plan, [])))
                continue
            nxt = self.sched.ahead(flight[-1][0])
            if nxt is not None and not nxt.decode:
                assert nxt.admits and nxt.chunks and not nxt.retire
                flight.append((nxt, self.execute(nxt), {}))
            elif nxt is not None:
                assert not self.sched.stale(nxt)
                for rid in nxt.decode:  # never past max_tokens
                    assert self.sched.generated(rid) + sum(rid in f[0].decode for f in flight) < self.limits[rid]
                flight.append((nxt, {}, self.device(nxt, [f[0] for f in flight])))
            landed.append(self._land_first(flight))
        while flight:
            landed.append(self._land_first(flight))
        return landed

    def _land_first(self, flight: list[tuple[Plan, dict[int, int], dict[int, int]]]) -> Plan:
        plan, done, tokens = flight.pop(0)
        self.land(plan, done, tokens)
        if flight and plan.decode and not self.sched.stale(flight[0][0]):
            # NOTE: ahead: what plan() gives once the step before lands (admissions: their part)
            nxt, now = flight[0][0], self.sched.plan()
            assert now == nxt if nxt.decode else (now.admits, now.chunks, now.budget) == (nxt.admits, nxt.chunks, nxt.budget)
        return plan

    def drain(self, limit: int = 10_000) -> None:
        for _ in range(limit):
            if self.step().idle and not self.sched.queued and not self.sched.running:
                return
        raise AssertionError("the scheduler did not drain")


def sched(rows: int = 4, queued: int = 8, step_tokens: int = 16, chunk: int = 8, grow: int = 0,
          pages: int = 16, unit: int = 4, row_tokens: int = 64, ride: int = 0) -> Scheduler:
    return Scheduler(SchedConfig(rows, queued, step_tokens, chunk, grow, ride), pages=pages, unit=unit,
                     row_tokens=row_tokens)


# ---- exact plans -------------------------------------------------------------------------------


def test_one_request_prefills_in_chunks_then_decodes_to_max_tokens() -> None:
    s = sched(step_tokens=6, chunk=4)
    assert s.submit(Ask(0, 10, 3)) == Queued(0, 0)
    m = Model(s)
    assert m.step() == Plan(admits=(Admit(0, 10, 12, False),), chunks=(Chunk(0, 4),), budget=6)
    assert m.kv[0] == 4
    assert m.step() == Plan(chunks=(Chunk(0, 4),), budget=6)
    assert m.step() == Plan(chunks=(Chunk(0, 4),), budget=6)  # the model stops at the 9 prompt tokens with KV
    assert m.kv[0] == 9
    assert [m.step().decode for _ in range(3)] == [(0,), (0,), (0,)]
    assert m.step() == Plan(retire=(Retire(0, Finish.LENGTH, True),))
    assert m.out[0] == [token(0, i) for i in range(3)] and not s.running and not s.queued


def test_decode_rows_take_the_budget_first_and_the_chunk_gets_the_rest() -> None:
    s = sched(rows=4, step_tokens=5, chunk=8, pages=64)
    for i in range(3):
        s.submit(Ask(i, 2, 20))
    m = Model(s)
    first = m.step()  # 0, 1 and 2 admitted and prefilled (1 token each) in one step
    assert [a.id for a in first.admits] == m.admitted == [0, 1, 2] and first.budget == 5
    s.submit(Ask(3, 40, 2))
    plan = m.step()
    assert plan == Plan(admits=(Admit(3, 40, 41, False),), chunks=(Chunk(3, 2),), decode=(0, 1, 2), budget=2)
    assert plan.tokens == 5


def test_the_chunk_keeps_one_token_when_decode_rows_fill_the_budget() -> None:
    s = sched(rows=4, step_tokens=2, chunk=8, pages=64)
    for i in range(3):
        s.submit(Ask(i, 2, 20))
    m = Model(s)
    assert len(m.step().admits) == 2  # a budget of 2: each admission takes at least one token
    assert m.step() == Plan(admits=(Admit(2, 2, 21, False),), chunks=(Chunk(2, 1),), decode=(0, 1), budget=1)
    m.step()
    s.submit(Ask(3, 10, 2))
    assert m.step().chunks == (Chunk(3, 1),)


def test_one_prefill_at_a_time_and_fcfs() -> None:
    s = sched(rows=4, step_tokens=4, chunk=4, pages=64)
    s.submit(Ask(0, 9, 2))
    s.submit(Ask(1, 2, 2))
    m = Model(s)
    assert m.step().admits == (Admit(0, 9, 10, False), Admit(1, 2, 3, False))
    assert m.admitted == [0] and s.queued == 1  # 0's prefill did not finish in the step: 1 waits
    assert m.step() == Plan(chunks=(Chunk(0, 4),), budget=4)  # 0 finishes with the whole budget
    assert m.step() == Plan(admits=(Admit(1, 2, 3, False),), chunks=(Chunk(1, 3),), decode=(0,), budget=3)


def test_a_burst_with_cached_prefixes_is_admitted_and_prefilled_in_one_step() -> None:
    s = sched(rows=8, step_tokens=16, chunk=8, pages=64)
    for i in range(6):
        s.submit(Ask(i, 10, 3))
    m = Model(s, cached=dict.fromkeys(range(6), 8))  # one token each past the cached prefix
    plan = m.step()
    assert [a.id for a in plan.admits] == [c.id for c in plan.chunks] == m.admitted == list(range(6))
    assert all(c.budget == 8 for c in plan.chunks) and plan.budget == 16
    assert s.running == 6 and not s.queued and all(m.kv[i] == 9 for i in range(6))
    assert m.step().decode == tuple(range(6))  # every first token on the second step
    m.drain()
    assert all(m.out[i] == [token(i, n) for n in range(3)] for i in range(6))


def test_the_budget_is_split_in_turn_and_one_prefill_is_left_unfinished() -> None:
    s = sched(rows=8, step_tokens=10, chunk=8, pages=64)
    for i in range(4):
        s.submit(Ask(i, 5, 2))  # 4 tokens to prefill each
    m = Model(s)
    first = m.step()
    assert len(first.admits) == 4 and m.admitted == [0, 1, 2]  # 4 + 4 + 2 of the 10 tokens
    assert (m.kv[0], m.kv[1], m.kv[2]) == (4, 4, 2) and s.queued == 1
    second = m.step()  # 2 finishes (2 tokens), then 3 is admitted with what the 2 rows leave
    assert second.chunks == (Chunk(2, 8), Chunk(3, 8)) and second.admits == (Admit(3, 5, 6, False),)
    assert second.decode == (0, 1) and second.budget == 8
    assert m.kv[2] == m.kv[3] == 4 and m.admitted == [0, 1, 2, 3]


def test_a_prefill_that_does_not_finish_within_the_budget_admits_nobody() -> None:
    s = sched(rows=8, step_tokens=6, chunk=4, pages=64)
    s.submit(Ask(0, 12, 2))
    m = Model(s)
    m.step()
    s.submit(Ask(1, 2, 2))
    assert m.step() == Plan(chunks=(Chunk(0, 4),), budget=6)  # 7 tokens left, 4 a chunk
    assert m.step() == Plan(chunks=(Chunk(0, 4), Chunk(1, 4)), admits=(Admit(1, 2, 3, False),), budget=6)
    assert m.kv == {0: 11, 1: 1}


def test_a_burst_stops_at_the_first_head_that_does_not_fit() -> None:
    s = sched(rows=8, step_tokens=32, pages=6, unit=4)
    s.submit(Ask(0, 4, 5))  # 8 tokens: 2 pages
    s.submit(Ask(1, 4, 5))  # 2 pages
    s.submit(Ask(2, 8, 5))  # 3 pages: 1 and 2 leave 2
    s.submit(Ask(3, 1, 1))  # 1 page would fit, but 2 is ahead of it
    m = Model(s)
    assert [a.id for a in m.step().admits] == [0, 1]
    assert m.step().admits == ()
    m.drain()
    assert m.admitted == [0, 1, 2, 3] and s.reserved == 0


def test_a_burst_takes_the_free_rows_only() -> None:
    s = sched(rows=3, step_tokens=32, pages=64)
    for i in range(5):
        s.submit(Ask(i, 2, 2))
    m = Model(s)
    assert [a.id for a in m.step().admits] == [0, 1, 2] and s.queued == 2
    m.drain()
    assert m.admitted == list(range(5))


def test_cancelling_requests_admitted_together() -> None:
    s = sched(rows=4, step_tokens=16, pages=16, unit=4)
    for i in range(4):
        s.submit(Ask(i, 3, 6))
    m = Model(s)
    m.step()
    assert m.admitted == [0, 1, 2, 3] and s.reserved == 8
    s.cancel(1)
    s.cancel(2)
    plan = m.step()
    assert plan.retire == (Retire(1, Finish.CANCELLED, True), Retire(2, Finish.CANCELLED, True))
    assert plan.decode == (0, 3) and s.reserved == 4
    m.drain()
    assert m.out[0] == [token(0, n) for n in range(6)] and m.out[3] == [token(3, n) for n in range(6)]
    assert 1 not in m.out and 2 not in m.out and m.ended[1] is m.ended[2] is Finish.CANCELLED
    assert s.reserved == 0 and not s.running and not s.queued


def test_a_listed_head_cancelled_before_its_turn_is_retired_from_the_queue() -> None:
    s = sched(rows=4, step_tokens=4, chunk=4, pages=64)
    s.submit(Ask(0, 9, 2))
    s.submit(Ask(1, 2, 2))
    m = Model(s)
    assert len(m.step().admits) == 2 and m.admitted == [0]  # 1 listed, not reached
    s.cancel(1)
    assert m.step().retire == (Retire(1, Finish.CANCELLED, False),)
    m.drain()
    assert m.admitted == [0] and m.ended[1] is Finish.CANCELLED and s.reserved == 0


def test_a_burst_that_outgrows_the_pool_parks_and_resumes_with_its_tokens() -> None:
    s = sched(rows=4, pages=6, unit=4, grow=2, step_tokens=16)
    for i in range(4):
        s.submit(Ask(i, 3, 8))
    m = Model(s)
    assert m.step().admits and m.admitted == [0, 1, 2, 3]  # 4 leases of 4 tokens: a page each
    parks: list[int] = []
    for _ in range(300):
        plan = m.step()
        parks += plan.park
        assert s.reserved <= 6 and not (plan.park and plan.admits)
        if plan.idle and not s.queued and not s.running:
            break
    assert parks and 0 not in parks
    assert [a.id for p in m.plans for a in p.admits if a.resume]
    assert all(m.out[i] == [token(i, n) for n in range(8)] for i in range(4))


def test_prefill_outcomes_out_of_the_plans_order_raise() -> None:
    s = sched(rows=4, step_tokens=16, pages=64)
    for i in range(3):
        s.submit(Ask(i, 5, 2))
    plan = s.plan()
    assert [c.id for c in plan.chunks] == [0, 1, 2]
    with pytest.raises(ApiError, match="run in the order"):
        s.commit(plan, Outcome({1: 4}))
    with pytest.raises(ApiError, match="unfinished prefill"):
        s.commit(plan, Outcome({0: 3, 1: 4}))
    assert s.running == 0 and s.queued == 3  # nothing changed
    s.commit(plan, Outcome({0: 4, 1: 2}))
    assert s.running == 2 and s.queued == 1


def test_a_head_that_does_not_fit_holds_the_queue() -> None:
    s = sched(rows=4, pages=4, unit=4)
    s.submit(Ask(0, 8, 5))  # 12 tokens: 3 pages
    s.submit(Ask(1, 8, 5))
    s.submit(Ask(2, 1, 1))  # 1 page would fit beside 0, but 1 is ahead of it
    m = Model(s)
    assert m.step().admits == (Admit(0, 8, 12, False),)
    for _ in range(4):
        assert m.step().admits == ()
    m.drain()
    assert m.admitted == [0, 1, 2]


def test_rows_limit() -> None:
    s = sched(rows=2, pages=64)
    for i in range(3):
        s.submit(Ask(i, 1, 5))
    m = Model(s)
    for _ in range(4):
        m.step()
    assert s.running == 2 and m.admitted == [0, 1]
    m.drain()
    assert m.admitted == [0, 1, 2]


def test_queue_full_and_never_fits_are_refusals() -> None:
    s = sched(queued=2, pages=4, unit=4, row_tokens=64)
    assert s.submit(Ask(0, 1, 1)) == Queued(0, 0)
    assert s.submit(Ask(1, 1, 1)) == Queued(1, 1)
    assert s.submit(Ask(2, 1, 1)) == Refused(2, Refusal.QUEUE_FULL)
    assert s.submit(Ask(3, 16, 2)) == Refused(3, Refusal.NEVER_FITS)  # 17 tokens: 5 pages of 4
    assert 2 not in s and 3 not in s
    big = sched(pages=100, unit=4, row_tokens=16)
    assert big.submit(Ask(0, 10, 8)) == Refused(0, Refusal.NEVER_FITS)  # 17 positions, a row holds 16
    assert big.submit(Ask(1, 10, 7)) == Queued(1, 0)


def test_bad_submissions_and_configs_raise() -> None:
    s = sched()
    s.submit(Ask(0, 1, 1))
    with pytest.raises(ApiError, match="already scheduled"):
        s.submit(Ask(0, 1, 1))
    with pytest.raises(ApiError, match="at least 1"):
        s.submit(Ask(1, 0, 1))
    with pytest.raises(ApiError, match=r"SchedConfig\.rows"):
        Scheduler(SchedConfig(rows=0), pages=1, unit=1, row_tokens=1)
    with pytest.raises(ApiError, match=r"SchedConfig\.grow"):
        Scheduler(SchedConfig(grow=-1), pages=1, unit=1, row_tokens=1)
    with pytest.raises(ApiError, match="pages"):
        Scheduler(SchedConfig(), pages=0, unit=1, row_tokens=1)


def test_stop_ids_and_stop_strings_retire() -> None:
    s = sched(pages=64)
    s.submit(Ask(0, 1, 10, frozenset({token(0, 2)})))
    s.submit(Ask(1, 1, 10))
    m = Model(s, stop_at={1: 4})
    m.drain()
    assert m.out[0] == [token(0, i) for i in range(3)] and m.ended[0] is Finish.STOP
    assert len(m.out[1]) == 4 and m.ended[1] is Finish.STOP


def test_cancel_a_waiting_and_a_running_request() -> None:
    s = sched(rows=1, pages=64)
    s.submit(Ask(0, 1, 10))
    s.submit(Ask(1, 1, 10))
    m = Model(s)
    m.step()
    m.step()
    assert s.cancel(1) and s.cancel(0) and not s.cancel(7)
    plan = m.step()
    assert plan.retire == (Retire(0, Finish.CANCELLED, True), Retire(1, Finish.CANCELLED, False))
    assert plan.admits == () and plan.decode == ()
    assert not s.running and not s.queued and s.reserved == 0


def test_a_cached_prefix_is_not_prefilled_again() -> None:
    s = sched(step_tokens=4, chunk=4, pages=64)
    s.submit(Ask(0, 30, 1))
    m = Model(s, cached={0: 24})
    m.step()
    assert m.kv[0] == 28  # 24 cached, 4 computed
    m.step()
    assert m.kv[0] == 29
    assert m.step().decode == (0,)


def test_growth_parks_the_newest_and_it_resumes_with_its_tokens() -> None:
    # 4 pages of 4 tokens; two requests of 4 prompt tokens, 8 steps each, 2 steps reserved at a time
    s = sched(rows=4, pages=4, unit=4, grow=2, step_tokens=8)
    s.submit(Ask(0, 4, 8))
    s.submit(Ask(1, 4, 8))
    m = Model(s)
    parks: list[int] = []
    grows: list[Grow] = []
    for _ in range(200):
        plan = m.step()
        parks += plan.park
        grows += plan.grow
        assert s.reserved <= 4
        if plan.idle and not s.queued and not s.running:
            break
    assert parks and set(parks) == {1}  # the newer one is parked, never the older
    resumed = [a for p in m.plans for a in p.admits if a.resume]
    assert resumed and all(a.id == 1 and a.tokens > 4 for a in resumed)
    assert m.out[0] == [token(0, i) for i in range(8)] and m.out[1] == [token(1, i) for i in range(8)]
    assert grows[0] == Grow(0, 7)  # 5 tokens with KV after the first 2 steps, 2 more steps


def test_a_lone_request_that_cannot_grow_parks_itself_and_waits() -> None:
    # 2 running: the older one grows, the newer one (the grower's victim) resumes after the older ends
    s = sched(rows=2, pages=3, unit=4, grow=4, step_tokens=8)
    s.submit(Ask(0, 3, 6))
    s.submit(Ask(1, 3, 6))
    m = Model(s)
    m.drain()
    assert m.out[0] == [token(0, i) for i in range(6)] and m.out[1] == [token(1, i) for i in range(6)]


def test_outcomes_for_rows_the_plan_did_not_decode_raise() -> None:
    s = sched()
    s.submit(Ask(0, 5, 1))
    plan = s.plan()
    with pytest.raises(ApiError, match="did not decode"):
        s.commit(plan, Outcome({0: 4}, {3: 1}))
    s2 = sched()
    s2.submit(Ask(0, 5, 1))
    with pytest.raises(ApiError, match="outside"):
        s2.commit(s2.plan(), Outcome({0: 9}))


def test_plans_are_pure() -> None:
    s = sched()
    s.submit(Ask(0, 5, 2))
    assert s.plan() == s.plan()
    assert s.queued == 1 and s.running == 0


def running_two(max_tokens: int = 6, stop: frozenset[int] = frozenset()) -> tuple[Scheduler, Model]:
    s = sched(rows=2, pages=64)
    s.submit(Ask(0, 2, max_tokens, stop))
    m = Model(s)
    m.step()
    s.submit(Ask(1, 2, max_tokens, stop))  # a step later: 0 is one token ahead of 1
    while s.plan() != Plan(decode=(0, 1)):
        m.step()
    return s, m


def test_ahead_is_a_step_of_the_same_rows_while_nothing_else_happens() -> None:
    s, _ = running_two()
    plan = s.plan()
    assert s.ahead(plan) == plan and s.plan() == plan  # nothing changed
    s.submit(Ask(2, 2, 4))
    assert s.ahead(plan) == plan  # both rows taken: the arrival waits either way
    s.cancel(0)
    assert s.ahead(plan) is None
    s2, _ = running_two()
    s2.submit(Ask(2, 2, 4))
    assert s2.ahead(Plan(decode=(0, 1), chunks=(Chunk(2, 1),), budget=1)) is None  # only a plain step goes ahead
    s3 = sched(rows=3, pages=64)
    s3.submit(Ask(0, 2, 6))
    m3 = Model(s3)
    while s3.plan() != Plan(decode=(0,)):
        m3.step()
    assert s3.ahead(Plan(decode=(0,))) == Plan(decode=(0,))
    s3.submit(Ask(1, 2, 6))
    side = s3.ahead(Plan(decode=(0,)))  # a free row and pages: the arrival is admitted behind the step
    assert side == Plan(admits=(Admit(1, 2, 7, False),), chunks=(Chunk(1, 8),), budget=15)
    assert s3.ahead(side) is None  # nothing goes ahead of an admission
    m3.land(Plan(decode=(0,)), {}, m3.device(Plan(decode=(0,)), []))
    m3.land(side, m3.execute(side), {})
    assert s3.plan() == Plan(decode=(0, 1))
    s3.submit(Ask(2, 2, 6))
    s3.cancel(0)
    assert s3.ahead(Plan(decode=(0, 1))) is None  # a retirement is due


def test_a_burst_is_admitted_behind_the_step_in_flight() -> None:
    s = sched(rows=4, step_tokens=16, chunk=8, pages=64)
    s.submit(Ask(0, 2, 6))
    m = Model(s)
    while s.plan() != Plan(decode=(0,)):
        m.step()
    for i in range(1, 4):
        s.submit(Ask(i, 3, 6))
    step = Plan(decode=(0,))
    side = s.ahead(step)
    assert side == Plan(admits=tuple(Admit(i, 3, 8, False) for i in range(1, 4)),
                        chunks=tuple(Chunk(i, 8) for i in range(1, 4)), budget=15)
    m.land(step, {}, m.device(step, []))
    m.land(side, m.execute(side), {})
    assert m.admitted == [0, 1, 2, 3] and s.plan() == Plan(decode=(0, 1, 2, 3))


def test_no_step_goes_ahead_past_max_tokens_or_the_lease() -> None:
    s, m = running_two(max_tokens=3)
    assert s.ahead(s.plan()) is not None  # 1 generated: the in-flight step makes 2, the next 3
    m.step()
    assert s.ahead(s.plan()) is None  # the in-flight step makes 3 = max_tokens
    g = sched(rows=1, grow=2, pages=64)
    g.submit(Ask(0, 2, 8))
    mg = Model(g)
    while g.plan() != Plan(decode=(0,)):
        mg.step()
    assert g.ahead(Plan(decode=(0,))) == Plan(decode=(0,))  # the lease holds two steps
    mg.step()
    assert g.ahead(Plan(decode=(0,))) is None  # the in-flight step spends it: the next one grows


def test_a_row_that_stops_with_a_step_in_flight_is_stale_there() -> None:
    stop = token(0, 3)
    s, m = running_two(stop=frozenset({stop}))
    while len(m.out[0]) < 2:
        m.step()
    assert (len(m.out[0]), len(m.out[1])) == (2, 1)
    first = s.plan()
    second = s.ahead(first)
    assert second == first
    m.land(first, {}, m.device(first, []))
    assert s.stale(second) == ()
    third = s.ahead(second)
    assert third == second
    m.land(second, {}, m.device(second, []))
    assert m.out[0][-1] == stop and s.stale(third) == (0,) and s.ahead(third) is None
    with pytest.raises(ApiError, match="had ended"):
        s.commit(third, Outcome({}, m.device(third, [])))
    s.commit(third, Outcome({}, {1: token(1, 3)}))
    assert s.generated(0) == 4 and s.generated(1) == 4
    assert s.plan().retire == (Retire(0, Finish.STOP, True),)


def test_piped_steps_give_every_request_the_tokens_of_plain_steps() -> None:
    def run(piped: bool) -> tuple[dict[int, list[int]], dict[int, Finish]]:
        s = sched(rows=3, step_tokens=6, chunk=4, pages=64)
        for i in range(6):
            s.submit(Ask(i, 3 + i, 4 + i % 3, frozenset({token(i, 2)}) if i == 4 else frozenset()))
        m = Model(s, stop_at={1: 3}, limits={i: 4 + i % 3 for i in range(6)})
        if piped:
            while s.queued or s.running:
                m.piped(50)
        else:
            m.drain()
        return m.out, m.ended

    assert run(True) == run(False)


# ---- the state machine ---------------------------------------------------------------------------


class Machine(RuleBasedStateMachine):
    """Random submissions, cancellations and steps; the invariants hold after every step and every
    request ends with its model tokens (or cancelled, with a prefix of them)."""

    def __init__(self) -> None:
        super().__init__()
        self.s: Scheduler | None = None
        self.m: Model | None = None
        self.next = 0
        self.asks: dict[int, Ask] = {}
        self.cancelled: set[int] = set()

    @precondition(lambda self: self.s is None)
    @rule(rows=st.integers(1, 5), queued=st.integers(1, 6), step=st.integers(1, 12), chunk=st.integers(1, 8),
          grow=st.integers(0, 4), pages=st.integers(2, 12), unit=st.integers(1, 4), ride=st.sampled_from([0, 0, 1, 3, 8]))
    def setup(self, rows: int, queued: int, step: int, chunk: int, grow: int, pages: int, unit: int,
              ride: int) -> None:
        self.s = sched(rows, queued, step, chunk, grow, pages, unit, row_tokens=pages * unit, ride=ride)
        self.m = Model(self.s)

    @precondition(lambda self: self.s is not None)
    @rule(prompt=st.integers(1, 12), max_tokens=st.integers(1, 8), cached=st.integers(0, 12),
          stop=st.sampled_from([None, 0, 7]))
    def submit(self, prompt: int, max_tokens: int, cached: int, stop: int | None) -> None:
        assert self.s is not None and self.m is not None
        ask = Ask(self.next, prompt, max_tokens, frozenset() if stop is None else frozenset({stop}))
        self.next += 1
        answer = self.s.submit(ask)
        if isinstance(answer, Queued):
            self.asks[ask.id] = ask
            self.m.limits[ask.id] = max_tokens
            self.m.cached[ask.id] = cached
        else:
            assert ask.id not in self.s

    @precondition(lambda self: self.s is not None)
    @rule(n=st.integers(2, 6), prompt=st.integers(1, 12), cached=st.integers(0, 12))
    def burst(self, n: int, prompt: int, cached: int) -> None:
        """`n` arrivals sharing a cached prefix between two steps."""
        for k in range(n):
            self.submit(prompt + k % 3, 1 + k % 4, cached, None)

    @precondition(lambda self: self.asks)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        assert self.s is not None
        rid = data.draw(st.sampled_from(sorted(self.asks)))
        if rid in self.s:
            self.s.cancel(rid)
            self.cancelled.add(rid)

    @precondition(lambda self: self.s is not None)
    @rule(n=st.integers(1, 6))
    def step(self, n: int) -> None:
        assert self.m is not None
        for _ in range(n):
            self.check(self.m.step())

    @precondition(lambda self: self.s is not None)
    @rule(n=st.integers(1, 8))
    def piped(self, n: int) -> None:
        assert self.m is not None
        for plan in self.m.piped(n):
            self.check(plan)

    def check(self, plan: Plan) -> None:
        assert self.s is not None and self.m is not None
        cfg = self.s.config
        assert self.s.reserved <= self.s.pages
        assert self.s.running <= cfg.rows and len(plan.decode) <= cfg.rows
        assert sum(1 for rid, kv in self.m.kv.items() if kv < self.m.totals[rid] - 1) <= 1
        for c in plan.chunks:
            assert 1 <= c.budget <= min(cfg.chunk, plan.budget)
        if plan.chunks:
            assert plan.tokens <= max(cfg.step_tokens, len(plan.decode) + 1)
        if not plan.rides:
            assert [c.id for c in plan.chunks[len(plan.chunks) - len(plan.admits):]] == [a.id for a in plan.admits]
            assert len(plan.chunks) - len(plan.admits) <= 1 and len(plan.admits) <= plan.budget
        assert not (plan.admits and plan.park)
        self.check_rides(plan)
        resumed = {a.id for p in self.m.plans for a in p.admits if a.resume}
        fresh = [rid for rid in self.m.admitted if rid not in resumed]
        assert fresh == sorted(fresh)  # first admissions in submission order

    def check_rides(self, plan: Plan) -> None:
        """Riding: the rows of an engine call never pass the step's most rows nor the token budget,
        the riders' rows never pass the plan's, the admissions ride after the one riding already,
        (and `Model.execute`: no request decodes before its prompt has ridden)."""
        assert self.s is not None and self.m is not None
        ride, d = self.s.config.ride, len(plan.decode)
        if not ride:
            assert not plan.rides and not plan.rows
            return
        assert not plan.chunks and not plan.budget
        if not plan.rides:
            return
        assert 1 <= plan.rows <= ride - d % ride and plan.rows <= max(1, self.s.config.step_tokens - d)
        # NOTE: the riders' rows against the plan's are checked where the model executes it
        # (`Model.ride`): run piped, the step executed last need not be this plan
        assert not {r.id for r in plan.rides} & set(plan.decode)
        assert [r.id for r in plan.rides[len(plan.rides) - len(plan.admits):]] == [a.id for a in plan.admits]
        assert len(plan.rides) - len(plan.admits) <= 1 and len(plan.admits) <= plan.rows

    @invariant()
    def ends_right(self) -> None:
        if self.m is None:
            return
        for rid, why in self.m.ended.items():
            ask = self.asks[rid]
            out = self.m.out.get(rid, [])
            assert out == [token(rid, i) for i in range(len(out))]
            if why is Finish.LENGTH:
                assert len(out) == ask.max_tokens
            elif why is Finish.STOP:
                assert out[-1] in ask.stop
            else:
                assert rid in self.cancelled

    def teardown(self) -> None:
        if self.m is not None:
            self.m.drain()
            assert set(self.m.ended) == set(self.asks)
            assert self.s is not None and self.s.reserved == 0 and not self.s.running and not self.s.queued
            assert not self.m.kv


TestMachine = Machine.TestCase
TestMachine.settings = settings(max_examples=150, stateful_step_count=30, deadline=None,
                                suppress_health_check=[HealthCheck.too_slow])


def test_run_chunks_takes_the_budget_in_turn_and_stops_after_an_unfinished_prefill() -> None:
    """run_chunks: an admission is started when its chunk comes up, each chunk gets what the budget
    has left (its own cap too) and takes what it computed (at least one token); an unfinished
    prefill or a spent budget ends the step; the chunks that ran report their tokens with KV."""
    need = {1: 5, 2: 0, 3: 40, 4: 3}  # tokens each still has to compute (2: all cached)
    calls: list[tuple[str, int, int]] = []

    def chunk(rid: int, budget: int) -> tuple[int, int, bool]:
        computed = min(need[rid], budget)
        calls.append(("chunk", rid, budget))
        return computed, 100 + computed, computed == need[rid]

    plan = Plan(admits=(Admit(2, 10, 20, False), Admit(3, 50, 60, False), Admit(4, 10, 20, False)),
                chunks=(Chunk(1, 8), Chunk(2, 8), Chunk(3, 8), Chunk(4, 8)), budget=20)
    done = run_chunks(plan, lambda a: calls.append(("start", a.id, a.tokens)), chunk)
    assert calls == [("chunk", 1, 8), ("start", 2, 10), ("chunk", 2, 8), ("start", 3, 50), ("chunk", 3, 8)]
    assert done == {1: 105, 2: 100, 3: 108}  # 3 did not finish: 4 waits (it stays queued)
    calls.clear()
    spent = Plan(chunks=(Chunk(1, 8), Chunk(4, 8)), admits=(Admit(4, 10, 20, False),), budget=5)
    assert run_chunks(spent, lambda a: calls.append(("start", a.id, a.tokens)), chunk) == {1: 105}
    assert calls == [("chunk", 1, 5)]  # the budget is spent: no admission starts


# ---- riding ----------------------------------------------------------------------------------


def test_a_prompt_rides_on_the_step_over_several_steps_and_decodes_after_its_last_token() -> None:
    s = sched(step_tokens=16, ride=4)
    s.submit(Ask(0, 10, 3))
    m = Model(s)
    assert m.step() == Plan(admits=(Admit(0, 10, 12, False),), rides=(Chunk(0, 4),), rows=4)
    assert m.kv[0] == 4 and 0 not in m.out
    assert m.step() == Plan(rides=(Chunk(0, 4),), rows=4)
    assert m.step() == Plan(rides=(Chunk(0, 4),), rows=4)  # 2 rows: the last prompt token samples
    assert m.rode == [4, 4, 2] and m.out[0] == [token(0, 0)]
    assert [m.step().decode for _ in range(2)] == [(0,), (0,)]
    assert m.step() == Plan(retire=(Retire(0, Finish.LENGTH, True),))
    assert m.out[0] == [token(0, i) for i in range(3)] and not s.running and not s.reserved


def test_riders_take_the_rows_the_decode_rows_leave_in_fcfs_order() -> None:
    s = sched(rows=8, step_tokens=64, ride=8, pages=64)
    for i in range(2):
        s.submit(Ask(i, 2, 20))
    m = Model(s)
    first = m.step()  # two prompts of 2 tokens: 4 rows, both sample their first token
    assert [a.id for a in first.admits] == [0, 1] and first.rows == 8 and m.rode == [4]
    assert m.out == {0: [token(0, 0)], 1: [token(1, 0)]}
    for i, n in ((2, 3), (3, 5), (4, 2)):
        s.submit(Ask(i, n, 4))
    plan = m.step()  # 6 rows left: 2's 3 tokens, then 3 takes the last 3 of its 5
    assert plan == Plan(admits=tuple(Admit(i, n, n + 3, False) for i, n in ((2, 3), (3, 5), (4, 2))),
                        decode=(0, 1), rides=(Chunk(2, 6), Chunk(3, 6), Chunk(4, 6)), rows=6)
    assert m.admitted == [0, 1, 2, 3] and m.kv[3] == 3 and 3 not in m.out and s.queued == 1
    plan = m.step()  # 3 finishes its ride (2 rows); 4 rides behind it
    assert plan.decode == (0, 1, 2) and [r.id for r in plan.rides] == [3, 4] and plan.rows == 5
    assert m.out[3] == [token(3, 0)] and m.out[4] == [token(4, 0)] and m.rode[-1] == 4
    assert m.step().decode == (0, 1, 2, 3, 4)


def test_riding_rows_stay_within_the_steps_rows_and_the_token_budget() -> None:
    s = sched(rows=12, step_tokens=64, ride=4, pages=256, row_tokens=256)
    m = Model(s)
    for i in range(5):
        s.submit(Ask(i, 1, 50))
    assert m.step().rows == 4 and m.admitted == [0, 1, 2, 3]  # four one-token prompts fill the call
    s.submit(Ask(5, 30, 2))
    assert m.step().rows == 4  # four decode rows fill a call: the riders get a call of their own
    plan = m.step()
    assert len(plan.decode) == 5 and plan.rows == 3  # 5 % 4 = 1 row taken in the second call
    tight = sched(rows=8, step_tokens=3, ride=8, pages=64)
    for i in range(3):
        tight.submit(Ask(i, 1, 10))
    t = Model(tight)
    assert t.step().rows == 3 and t.admitted == [0, 1, 2]
    tight.submit(Ask(3, 9, 2))
    assert t.step() == Plan(admits=(Admit(3, 9, 10, False),), decode=(0, 1, 2), rides=(Chunk(3, 1),), rows=1)


def test_a_cached_prefix_does_not_ride() -> None:
    s = sched(step_tokens=16, ride=8, pages=64)
    s.submit(Ask(0, 20, 2))
    m = Model(s, cached={0: 15})
    m.step()
    assert m.rode == [5] and m.out[0] == [token(0, 0)]  # tokens 15..19: the last one samples


def test_a_rider_cancelled_part_way_retires_and_the_next_head_rides() -> None:
    s = sched(step_tokens=16, ride=4, pages=64)
    s.submit(Ask(0, 10, 3))
    s.submit(Ask(1, 3, 2))
    m = Model(s)
    m.step()
    assert m.kv[0] == 4 and s.queued == 1
    s.cancel(0)
    plan = m.step()
    assert plan.retire == (Retire(0, Finish.CANCELLED, True),) and plan.admits == (Admit(1, 3, 4, False),)
    assert m.rode[-1] == 3 and m.out == {1: [token(1, 0)]} and 0 not in m.kv
    m.drain()
    assert m.out[1] == [token(1, 0), token(1, 1)] and not s.reserved and not s.running


def test_a_ride_plan_never_goes_ahead() -> None:
    s = sched(rows=4, step_tokens=16, ride=4, pages=64)
    s.submit(Ask(0, 1, 10))
    m = Model(s, limits={0: 10})
    m.step()
    plain = s.plan()
    assert plain == Plan(decode=(0,)) and s.ahead(plain) == plain
    s.submit(Ask(1, 3, 2))
    assert s.ahead(plain) is None  # the next step's rows change: it waits for this one's tokens
    assert s.ahead(s.plan()) is None


def test_a_token_for_a_rider_that_has_not_reached_its_last_token_raises() -> None:
    s = sched(step_tokens=16, ride=4)
    s.submit(Ask(0, 10, 3))
    plan = s.plan()
    with pytest.raises(ApiError, match="ride reached 4 of its 10 tokens: a first token comes only from its last"):
        s.commit(plan, Outcome({0: 4}, {0: 7}))
    with pytest.raises(ApiError, match="at least 0"):
        SchedConfig(ride=-1).check()


def test_a_chunk_that_finishes_a_prefill_may_bring_the_first_token() -> None:
    """The engine's head program computes a prompt's first token at the end of its prefill: the
    outcome counts the prompt but its last token as prefilled and the token beside it, and the
    request decodes from the next step as if a step had computed that token; a token for a chunk
    whose prefill did not finish is refused, nothing changed."""
    s = sched(step_tokens=16, chunk=8)
    s.submit(Ask(0, 5, 3))
    s.submit(Ask(1, 12, 3))
    plan = s.plan()
    assert [c.id for c in plan.chunks] == [0, 1]
    with pytest.raises(ApiError, match="prefill reached 8 of its 12 tokens: a first token comes only from its last"):
        s.commit(plan, Outcome({0: 4, 1: 8}, {0: 70, 1: 71}))
    s.commit(plan, Outcome({0: 4, 1: 8}, {0: 70}))
    nxt = s.plan()
    assert nxt.decode == (0,) and [c.id for c in nxt.chunks] == [1]
    s.commit(nxt, Outcome({1: 11}, {0: 72, 1: 73}, stopped=(1,)))
    last = s.plan()
    assert last.decode == (0,) and [r.id for r in last.retire] == [1] and last.retire[0].why is Finish.STOP
    s.commit(last, Outcome({}, {0: 74}))
    assert [r.why for r in s.plan().retire] == [Finish.LENGTH]


def test_a_chunk_cancelled_while_it_ran_is_stale() -> None:
    s = sched(step_tokens=16, chunk=8)
    s.submit(Ask(0, 5, 3))
    plan = s.plan()
    s.cancel(0)
    assert s.stale(plan) == (0,)


def test_run_rides_shares_the_rows_in_turn_and_stops_after_an_unfinished_ride() -> None:
    rest = {1: 3, 2: 1, 3: 9, 4: 2}
    calls: list[tuple[str, int]] = []

    def left(rid: int) -> int:
        calls.append(("rest", rid))
        return rest[rid]

    plan = Plan(admits=(Admit(2, 5, 9, False), Admit(3, 20, 30, False), Admit(4, 5, 9, False)),
                rides=(Chunk(1, 8), Chunk(2, 8), Chunk(3, 8), Chunk(4, 8)), rows=8)
    took = run_rides(plan, lambda a: calls.append(("start", a.id)), left)
    assert took == {1: 3, 2: 1, 3: 4}  # 3 takes the last 4 rows: 4 waits (it stays queued)
    assert calls == [("rest", 1), ("start", 2), ("rest", 2), ("start", 3), ("rest", 3)]
    assert run_rides(Plan(rides=(Chunk(1, 3), Chunk(2, 3)), admits=(Admit(2, 5, 9, False),), rows=3),
                     lambda a: calls.append(("start", a.id)), left) == {1: 3}
