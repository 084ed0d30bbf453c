"""The serving scheduler: exact plans for the rules one by one, and a state machine that executes
its plans on a model engine (cached prefixes, page-counted leases) and checks the invariants: pages
never over-reserved, one prefill at a time, rows bounded, FCFS admission, every request ends with
the tokens the model gives it."""

from __future__ import annotations

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
)


def token(rid: int, n: int) -> int:
    """The model's n-th token for request rid."""
    return (rid * 31 + n * 7) % 50


@dataclass
class Model:
    """Executes plans: prefill up to the budget past the cached prefix, decode rows emit `token`."""

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

    def step(self) -> Plan:
        plan = self.sched.plan()
        self.land(plan, self.execute(plan), self.device(plan, []))
        return plan

    def execute(self, plan: Plan) -> int | None:
        """The plan's retirements, parks, admission and chunk; how far the chunk got."""
        for r in plan.retire:
            self.ended[r.id] = r.why
            self.kv.pop(r.id, None)
        for rid in plan.park:
            del self.kv[rid]
        if plan.admit is not None:
            self.admitted.append(plan.admit.id)
            self.totals[plan.admit.id] = plan.admit.tokens
            self.kv[plan.admit.id] = 0
        if plan.chunk is None:
            return None
        c = plan.chunk
        start = max(self.kv[c.id], min(self.cached.get(c.id, 0), self.totals[c.id] - 1))
        self.kv[c.id] = min(self.totals[c.id] - 1, start + c.budget)
        return self.kv[c.id]

    def device(self, plan: Plan, flight: list[Plan]) -> dict[int, int]:
        """The tokens the model gives the plan's rows, `flight` steps of them issued before."""
        return {rid: token(rid, len(self.out.get(rid, [])) + sum(rid in p.decode for p in flight))
                for rid in plan.decode}

    def land(self, plan: Plan, done: int | None, tokens: dict[int, int]) -> None:
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
        executed (an admission and its chunk) at once; every plan lands in order. Returns the
        plans landed."""
        flight: list[tuple[Plan, int | None, dict[int, int]]] = []
        landed: list[Plan] = []
        for _ in range(steps):
            if not flight:
                plan = self.sched.plan()
                flight.append((plan, self.execute(plan), self.device(plan, [])))
                continue
            nxt = self.sched.ahead(flight[-1][0])
            if nxt is not None and not nxt.decode:
                assert nxt.admit is not None and nxt.chunk is not None and not nxt.retire
                flight.append((nxt, self.execute(nxt), {}))
            elif nxt is not None:
                assert not self.sched.stale(nxt)
                for rid in nxt.decode:  # never past max_tokens
                    assert self.sched.generated(rid) + sum(rid in f[0].decode for f in flight) < self.limits[rid]
                flight.append((nxt, None, self.device(nxt, [f[0] for f in flight])))
            landed.append(self._land_first(flight))
        while flight:
            landed.append(self._land_first(flight))
        return landed

    def _land_first(self, flight: list[tuple[Plan, int | None, dict[int, int]]]) -> Plan:
        plan, done, tokens = flight.pop(0)
        self.land(plan, done, tokens)
        if flight and plan.decode and not self.sched.stale(flight[0][0]):
            # NOTE: ahead: what plan() gives once the step before lands (an admission: its part)
            nxt, now = flight[0][0], self.sched.plan()
            assert now == nxt if nxt.decode else (now.admit, now.chunk) == (nxt.admit, nxt.chunk)
        return plan

    def drain(self, limit: int = 10_000) -> None:
        for _ in range(limit):
            if self.step().idle and not self.sched.queued and not self.sched.running:
                return
        raise AssertionError("the scheduler did not drain")


def sched(rows: int = 4, queued: int = 8, step_tokens: int = 16, chunk: int = 8, grow: int = 0,
          pages: int = 16, unit: int = 4, row_tokens: int = 64) -> Scheduler:
    return Scheduler(SchedConfig(rows, queued, step_tokens, chunk, grow), pages=pages, unit=unit,
                     row_tokens=row_tokens)


# ---- exact plans -------------------------------------------------------------------------------


def test_one_request_prefills_in_chunks_then_decodes_to_max_tokens() -> None:
    s = sched(step_tokens=6, chunk=4)
    assert s.submit(Ask(0, 10, 3)) == Queued(0, 0)
    m = Model(s)
    assert m.step() == Plan(admit=Admit(0, 10, 12, False), chunk=Chunk(0, 4))
    assert m.kv[0] == 4
    assert m.step() == Plan(chunk=Chunk(0, 4))
    assert m.step() == Plan(chunk=Chunk(0, 4))  # the model stops at the 9 prompt tokens with KV
    assert m.kv[0] == 9
    assert [m.step().decode for _ in range(3)] == [(0,), (0,), (0,)]
    assert m.step() == Plan(retire=(Retire(0, Finish.LENGTH, True),))
    assert m.out[0] == [token(0, i) for i in range(3)] and not s.running and not s.queued


def test_decode_rows_take_the_budget_first_and_the_chunk_gets_the_rest() -> None:
    s = sched(rows=4, step_tokens=5, chunk=8, pages=64)
    for i in range(3):
        s.submit(Ask(i, 2, 20))
    m = Model(s)
    m.step()  # 0 admitted, prefilled (1 token)
    m.step()  # 0 decodes, 1 admitted
    m.step()  # 0, 1 decode, 2 admitted
    s.submit(Ask(3, 40, 2))
    plan = m.step()
    assert plan.decode == (0, 1, 2) and plan.admit == Admit(3, 40, 41, False) and plan.chunk == Chunk(3, 2)
    assert plan.tokens == 5


def test_the_chunk_keeps_one_token_when_decode_rows_fill_the_budget() -> None:
    s = sched(rows=4, step_tokens=2, chunk=8, pages=64)
    for i in range(3):
        s.submit(Ask(i, 2, 20))
    m = Model(s)
    for _ in range(3):
        m.step()
    s.submit(Ask(3, 10, 2))
    assert m.step().chunk == Chunk(3, 1)


def test_one_prefill_at_a_time_and_fcfs() -> None:
    s = sched(rows=4, step_tokens=4, chunk=4, pages=64)
    s.submit(Ask(0, 9, 2))
    s.submit(Ask(1, 2, 2))
    m = Model(s)
    assert m.step().admit == Admit(0, 9, 10, False)
    assert m.step().admit is None  # 0 is still prefilling (8 tokens, 4 a chunk): 1 waits
    assert m.step() == Plan(admit=Admit(1, 2, 3, False), chunk=Chunk(1, 3), decode=(0,))


def test_a_head_that_does_not_fit_holds_the_queue() -> None:
    s = sched(rows=4, pages=4, unit=4)
    s.submit(Ask(0, 8, 5))  # 12 tokens: 3 pages
    s.submit(Ask(1, 8, 5))
    s.submit(Ask(2, 1, 1))  # 1 page would fit beside 0, but 1 is ahead of it
    m = Model(s)
    m.step()
    for _ in range(4):
        assert m.step().admit is None
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
    assert plan.admit is None and plan.decode == ()
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
    resumed = [p.admit for p in m.plans if p.admit is not None and p.admit.resume]
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
        s.commit(plan, Outcome(4, {3: 1}))
    s2 = sched()
    s2.submit(Ask(0, 5, 1))
    with pytest.raises(ApiError, match="outside"):
        s2.commit(s2.plan(), Outcome(9))


def test_plans_are_pure() -> None:
    s = sched()
    s.submit(Ask(0, 5, 2))
    assert s.plan() == s.plan()
    assert s.queued == 1 and s.running == 0


def running_two(max_tokens: int = 6, stop: frozenset[int] = frozenset()) -> tuple[Scheduler, Model]:
    s = sched(rows=2, pages=64)
    s.submit(Ask(0, 2, max_tokens, stop))
    s.submit(Ask(1, 2, max_tokens, stop))
    m = Model(s)
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
    assert s2.ahead(Plan(decode=(0, 1), chunk=Chunk(2, 1))) is None  # only a plain step goes ahead
    s3 = sched(rows=3, pages=64)
    s3.submit(Ask(0, 2, 6))
    m3 = Model(s3)
    while s3.plan() != Plan(decode=(0,)):
        m3.step()
    assert s3.ahead(Plan(decode=(0,))) == Plan(decode=(0,))
    s3.submit(Ask(1, 2, 6))
    side = s3.ahead(Plan(decode=(0,)))  # a free row and pages: the arrival is admitted behind the step
    assert side == Plan(admit=Admit(1, 2, 7, False), chunk=Chunk(1, 8))
    assert s3.ahead(side) is None  # nothing goes ahead of an admission
    m3.land(Plan(decode=(0,)), None, m3.device(Plan(decode=(0,)), []))
    m3.land(side, m3.execute(side), {})
    assert s3.plan() == Plan(decode=(0, 1))
    s3.submit(Ask(2, 2, 6))
    s3.cancel(0)
    assert s3.ahead(Plan(decode=(0, 1))) is None  # a retirement is due


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
    m.land(first, None, m.device(first, []))
    assert s.stale(second) == ()
    third = s.ahead(second)
    assert third == second
    m.land(second, None, m.device(second, []))
    assert m.out[0][-1] == stop and s.stale(third) == (0,) and s.ahead(third) is None
    with pytest.raises(ApiError, match="had ended"):
        s.commit(third, Outcome(None, m.device(third, [])))
    s.commit(third, Outcome(None, {1: token(1, 3)}))
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
          grow=st.integers(0, 4), pages=st.integers(2, 12), unit=st.integers(1, 4))
    def setup(self, rows: int, queued: int, step: int, chunk: int, grow: int, pages: int, unit: int) -> None:
        self.s = sched(rows, queued, step, chunk, grow, pages, unit, row_tokens=pages * unit)
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
        if plan.chunk is not None:
            assert 1 <= plan.chunk.budget <= cfg.chunk
            assert plan.tokens <= max(cfg.step_tokens, len(plan.decode) + 1)
        fresh = [rid for rid in self.m.admitted if rid not in {p.admit.id for p in self.m.plans
                                                                  if p.admit is not None and p.admit.resume}]
        assert fresh == sorted(fresh)  # first admissions in submission order

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
            assert self.s is not None and self.s.reserved == 0


TestMachine = Machine.TestCase
TestMachine.settings = settings(max_examples=150, stateful_step_count=30, deadline=None,
                                suppress_health_check=[HealthCheck.too_slow])
