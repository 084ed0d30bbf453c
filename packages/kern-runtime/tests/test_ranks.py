"""generate_ranks: the same generation on every rank at once, tokens checked equal."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

import kern_runtime as kr

from .helpers.manifests import parsed, serving


class RankRuntime:
    """The slice of Runtime a rank's Session uses; answers next tokens from `tokens` and waits at a
    barrier on its first step, as a collective would (so the ranks must run at once)."""

    def __init__(self, tokens: list[int], barrier: threading.Barrier) -> None:
        self.tokens = list(tokens)
        self.barrier = barrier
        self.calls: list[str] = []
        self.current = 0

    def make_current(self) -> None:
        self.current = threading.get_ident()

    def capture_graph(self, program: str, vars: dict[str, int]) -> None:
        self.calls.append(f"capture {program}")

    def write_input(self, name: str, array: Any) -> None:
        pass

    def run(self, program: str, vars: dict[str, int]) -> None:
        self.calls.append(f"run {program}")

    def issue(self, program: str, vars: dict[str, int]) -> None:
        assert self.current == threading.get_ident(), "a rank issued from a thread it was not made current on"
        if not any(c.startswith("issue") for c in self.calls):
            self.barrier.wait(timeout=10)
        self.calls.append(f"issue {program}")

    def read_output(self, name: str) -> np.ndarray:
        return np.array([self.tokens.pop(0)], dtype=np.int64)

    def synchronize(self) -> None:
        pass


def _roles() -> kr.ServingRoles:
    return kr.serving_roles(parsed(serving()))


def _ranks(*streams: list[int]) -> list[RankRuntime]:
    barrier = threading.Barrier(len(streams))
    return [RankRuntime(s, barrier) for s in streams]


def test_every_rank_runs_at_once_and_rank_0s_tokens_come_back() -> None:
    ranks = _ranks([5, 6, 7], [5, 6, 7])
    run = kr.generate_ranks(ranks, _roles(), 64, [1, 2, 3, 4], 3, chunk=2)  # type: ignore[arg-type]
    assert run.tokens == [5, 6, 7] and run.prefill_s >= 0 and run.decode_s >= 0
    for rt in ranks:
        assert rt.calls[0] == "capture step" and rt.calls.count("issue step") == 3
        assert rt.calls.count("run chunk") == 2  # 3 tokens in chunks of 2


def test_eager_ranks_capture_no_graph() -> None:
    ranks = _ranks([5], [5])
    kr.generate_ranks(ranks, _roles(), 64, [1, 2], 1, chunk=8, eager=True)  # type: ignore[arg-type]
    assert all("capture step" not in rt.calls and "run step" in rt.calls for rt in ranks)


def test_ranks_that_disagree_are_refused() -> None:
    with pytest.raises(kr.RanksDisagreeError, match=r"ranks \[1\] generated other tokens than rank 0"):
        kr.generate_ranks(_ranks([5, 6], [5, 9]), _roles(), 64, [1, 2], 2, chunk=8)  # type: ignore[arg-type]


def test_a_bad_prompt_runs_no_rank() -> None:
    ranks = _ranks([5], [5])
    with pytest.raises(kr.SessionError, match="the prompt is empty"):
        kr.generate_ranks(ranks, _roles(), 64, [], 1, chunk=8)  # type: ignore[arg-type]
    with pytest.raises(kr.SessionError, match="capacity 100000 exceeds"):
        kr.generate_ranks(ranks, _roles(), 100_000, [1], 1, chunk=8)  # type: ignore[arg-type]
    assert all(rt.calls == [] for rt in ranks)
