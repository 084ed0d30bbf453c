"""Ranks, the engine over a tensor-parallel group: every turn on every rank's engine at once,
tokens and prefills checked equal, errors from the lowest rank, a clean close. The same group on
the Qwen3 interpreter, with its collectives met across the rank threads:
tools/tests/test_tp_interp.py."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

import kern_runtime as kr
from kern_pool.cache import Source

from .helpers.manifests import parsed, serving
from .helpers.pool_backend import PoolBackend


class RankBackend(PoolBackend):
    """A rank: made current on the thread that drives it, waiting at a barrier on its first issue
    as a collective would (so the ranks must run at once); `token`: every next token (None: counted)."""

    def __init__(self, barrier: threading.Barrier, token: int | None = None, start: int = 1000) -> None:
        super().__init__()
        self.barrier = barrier
        self.token = token
        self.next = start
        self.current = 0
        self.closed_on = 0

    def make_current(self) -> None:
        self.current = threading.get_ident()

    def issue(self, program: str, vars: Mapping[str, int]) -> None:
        assert self.current == threading.get_ident(), "a rank issued from a thread it was not made current on"
        if not any(p == program for p, _ in self.runs):
            self.barrier.wait(timeout=10)
        super().issue(program, vars)

    def read_output(self, name: str, count: int | None = None) -> np.ndarray:
        if self.token is None:
            return super().read_output(name, count)
        return np.array([self.token], dtype=np.int64)

    def synchronize(self) -> None:
        self.closed_on = threading.get_ident()


def _roles() -> kr.ServingRoles:
    m = serving()
    m["buffers"]["bt"]["domain"] = {"index_into": "kv", "stride": 16}
    return kr.serving_roles(parsed(m))


def _group(*ranks: dict[str, Any], closer: Any = None, meet: bool = True) -> tuple[kr.Ranks, list[RankBackend]]:
    barrier = threading.Barrier(len(ranks) if meet else 1)
    backends = [RankBackend(barrier, **kw) for kw in ranks]
    return kr.Ranks(backends, _roles(), kr.EngineConfig(chunk=16), closer=closer), backends


def test_every_rank_runs_the_turn_at_once_and_rank_0s_tokens_come_back() -> None:
    group, backends = _group({}, {})
    seen: list[int] = []
    turn = group.turn(group.sequence(), list(range(1, 40)), 4, on_token=seen.append)
    assert turn.tokens == [1001, 1002, 1003, 1004] == seen
    assert (turn.prefill.source, turn.prefill.prefilled) == (Source.FRESH, 39)
    assert backends[0].runs == backends[1].runs and backends[0].runs.count(("step", {"tokens": 1})) == 4
    assert backends[0].current != backends[1].current
    group.close()
    assert all(b.pool.pages_used == 0 for b in backends)


def test_a_second_turn_reuses_the_first_on_every_rank() -> None:
    group, backends = _group({"token": 7}, {"token": 7})
    seq = group.sequence()
    group.turn(seq, list(range(1, 40)), 3)
    turn = group.turn(seq, [*seq.tokens, 5, 6], 2)
    assert turn.prefill.reused > 0 and turn.tokens == [7, 7]
    assert backends[0].pool.pages_used == backends[1].pool.pages_used > 0
    group.release(seq)
    group.close()
    assert all(b.pool.pages_used == 0 for b in backends)


def test_ranks_that_generate_other_tokens_are_refused() -> None:
    group, _ = _group({}, {"start": 2000})
    with pytest.raises(kr.RanksDisagreeError, match=r"ranks \[1\] generated other tokens than rank 0"):
        group.turn(group.sequence(), [1, 2, 3], 2)
    group.close()


def test_ranks_that_prefill_otherwise_are_refused() -> None:
    group, backends = _group({"token": 7}, {"token": 7}, meet=False)
    seq = group.sequence()
    backends[0].make_current()
    group.engines[0].turn(seq.seqs[0], list(range(1, 40)), 2)  # only rank 0 keeps this prefix
    with pytest.raises(kr.RanksDisagreeError, match=r"ranks \[1\] prefilled otherwise than rank 0"):
        group.turn(seq, [*range(1, 40), 7, 5], 2)
    group.close()


def test_a_bad_prompt_fails_every_rank_before_any_program_runs() -> None:
    group, backends = _group({}, {})
    with pytest.raises(kr.PromptError, match="the prompt is empty"):
        group.turn(group.sequence(), [], 2)
    with pytest.raises(kr.EngineError, match="at least 1 step"):
        group.turn(group.sequence(), [1, 2], 0)
    assert all(b.runs == [] and b.pool.pages_used == 0 for b in backends)
    group.close()


def test_close_closes_every_engine_on_its_rank_thread_then_runs_the_closer_once() -> None:
    closed: list[int] = []
    group, backends = _group({}, {}, closer=lambda: closed.append(1))
    seq = group.sequence()
    group.turn(seq, [1, 2, 3], 2)
    group.close()
    group.close()
    assert closed == [1]
    assert all(b.closed_on == b.current for b in backends)
    with pytest.raises(kr.EngineError, match="the group is closed"):
        group.turn(seq, [1, 2], 1)


def test_a_sequence_of_another_group_and_an_empty_group_are_refused() -> None:
    group, _ = _group({}, {})
    other, _ = _group({}, {}, {})
    with pytest.raises(kr.EngineError, match="a sequence of 3 ranks is not this group's"):
        group.turn(other.sequence(), [1, 2], 1)
    with pytest.raises(kr.ApiError, match="at least one rank"):
        kr.Ranks([], _roles())
    group.close()
    other.close()
