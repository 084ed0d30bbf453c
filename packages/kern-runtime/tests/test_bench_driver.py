"""kern bench's `Driver` on a recording fake runtime: what it writes and runs, and what it
refuses (no GPU). The bench's rows over it run on the GPU in tools/tests/test_bench_gpu.py."""

from __future__ import annotations

from typing import Any

import pytest

import kern_runtime as kr
from kern_runtime.bench.driver import Driver

from .helpers.manifests import parsed, serving
from .helpers.recording import FakeRuntime


def _roles(**domains: Any) -> kr.ServingRoles:
    m = serving()
    for name, domain in domains.items():
        m["buffers"][name]["domain"] = domain
    return kr.serving_roles(parsed(m))


def _driver(capacity: int = 64, **domains: Any) -> tuple[Driver, FakeRuntime]:
    rt = FakeRuntime()
    return Driver(rt, _roles(**domains), capacity), rt  # type: ignore[arg-type]


def test_the_block_table_holds_pages_0_on() -> None:
    _, rt = _driver(capacity=100, bt={"index_into": "kv", "stride": 16})
    assert rt.inputs["bt"].tolist() == [*range(7), *[0] * 57]


def test_prefill_runs_chunks_then_stages_the_last_token() -> None:
    s, rt = _driver(capacity=64, bt={"index_into": "kv", "stride": 16})
    rt.calls.clear()
    prompt = list(range(10, 30))  # 20 tokens: 19 through the chunk program in chunks of 8
    s.prefill(prompt, chunk=8)
    runs = [c for c in rt.calls if c[0] == "run"]
    assert runs == [
        ("run", "chunk", {"tokens": 8}),
        ("run", "chunk", {"tokens": 8}),
        ("run", "chunk", {"tokens": 3}),
    ]
    slots = [c[2] for c in rt.calls if c[:2] == ("write", "sl")]
    assert slots[1:3] == [list(range(8, 16)), [16, 17, 18]]  # 16-token pages 0, 1, 2, ...
    assert (rt.inputs["ids"].tolist(), rt.inputs["pos"].tolist(), rt.inputs["len"].tolist()) == (
        [29],
        [19],
        [20],
    )


def test_chunks_are_capped_by_the_chunk_var() -> None:
    s, rt = _driver(capacity=512, bt={"index_into": "kv", "stride": 16})
    s.prefill(list(range(300)), chunk=4096)
    assert [c[2] for c in rt.calls if c[:2] == ("run", "chunk")] == [
        {"tokens": 256},
        {"tokens": 43},
    ]


def test_steps_issue_the_step_and_feed_the_token_back() -> None:
    s, rt = _driver(capacity=8)
    s.prefill([1, 2, 3], chunk=16)
    rt.calls.clear()
    assert [s.step(), s.step()] == [100, 101]
    assert ("issue", "step", {"tokens": 1}) in rt.calls
    assert (rt.inputs["ids"].tolist(), rt.inputs["pos"].tolist()) == ([101], [4])


def test_rewind_restages_the_last_prompt_token() -> None:
    s, rt = _driver(capacity=16)
    with pytest.raises(kr.PromptError, match="prefill a prompt first"):
        s.rewind()
    s.prefill([7, 8, 9], chunk=16)
    s.step()
    s.step()
    s.rewind()
    assert (
        s.seen,
        rt.inputs["ids"].tolist(),
        rt.inputs["pos"].tolist(),
        rt.inputs["len"].tolist(),
    ) == (2, [9], [2], [3])


def test_a_device_fed_manifest_runs_its_seed_program_and_is_not_fed_by_the_host() -> None:
    m = serving()
    m["programs"]["start"] = {"calls": []}
    rt = FakeRuntime()
    s = Driver(rt, kr.serving_roles(parsed(m)), 8)  # type: ignore[arg-type]
    s.prefill([1, 2], chunk=4)
    assert rt.calls[-1] == ("run", "start", {})
    n = len(rt.calls)
    s.step()
    assert [c[0] for c in rt.calls[n:]] == ["issue"]


def test_the_last_step_at_capacity_stages_nothing_and_the_next_is_refused() -> None:
    s, rt = _driver(capacity=4)
    s.prefill([1, 2, 3], chunk=4)
    s.step()
    n = len(rt.calls)
    s.step()
    assert [c[0] for c in rt.calls[n:]] == ["issue"]
    with pytest.raises(kr.PromptError, match="reached the capacity of 4 tokens"):
        s.step()


@pytest.mark.parametrize(
    ("prompt", "chunk", "word"),
    [
        ([], 4, "the prompt is empty"),
        ([1, -2], 4, "prompt id -2 is outside"),
        ([1, 4096], 4, r"prompt id 4096 is outside the model's token ids 0\.\.4095"),
        (list(range(17)), 4, "the prompt has 17 tokens; capacity is 16"),
        ([1, 2], 0, "chunk must be at least 1"),
    ],
)
def test_bad_prefills_run_nothing(prompt: list[int], chunk: int, word: str) -> None:
    s, rt = _driver(capacity=16, ids={"min": 0, "max": 4095})
    n = len(rt.calls)
    with pytest.raises(kr.PromptError, match=word):
        s.prefill(prompt, chunk)
    assert len(rt.calls) == n


def test_a_capacity_past_the_reach_writes_nothing() -> None:
    rt = FakeRuntime()
    with pytest.raises(
        kr.PromptError, match="capacity 101 exceeds the model's reach of 100 positions"
    ):
        Driver(rt, _roles(pos={"min": 0, "max": 99}, bt={"index_into": "kv", "stride": 16}), 101)  # type: ignore[arg-type]
    assert rt.calls == []


class TimedRuntime(FakeRuntime):
    """The fake with what the bench's loops also call: synchronize and per-call timing."""

    def synchronize(self) -> None:
        self.calls.append(("sync",))

    def time_calls(
        self, program: str, vars: dict[str, int], *, before: str | None = None
    ) -> tuple[list[Any], bool]:
        self.calls.append(("time_calls", program, before, self.inputs["pos"].tolist()))
        return [("l0.qkv", 0.01), ("l0.attn", 0.02)], True


def test_the_bench_loops_time_at_the_context_and_leave_the_row_rewound() -> None:
    import numpy as np

    from kern_runtime.bench import measure

    m = serving()
    m["programs"]["start"] = {"calls": []}
    m["buffers"]["bt"]["domain"] = {"index_into": "kv", "stride": 16}
    rt = TimedRuntime()
    s = Driver(rt, kr.serving_roles(parsed(m)), 512)  # type: ignore[arg-type]
    rows = measure.decode_rows(s, 40, 20, 100, 16, np.random.default_rng(0))
    assert [r["name"] for r in rows] == [
        f"decode_{k}@ctx40"
        for k in (
            "ms_per_token",
            "fixed_ms_per_token",
            "gpu_ms_per_step",
            "gpu_fixed_ms_per_step",
            "host_gap_us",
        )
    ]
    assert all(r["value"] > 0 for r in rows[:4])
    # NOTE: the rewound steps each recompute the prompt's last position, with the step seed before each
    assert (
        s.seen == 39 and rt.inputs["pos"].tolist() == [39] and rt.calls[-1] == ("run", "start", {})
    )
    runs = measure.breakdown_runs(s, 3, lambda line: None)
    assert runs == [[("l0.qkv", 0.01), ("l0.attn", 0.02)]] * 3
    assert [c for c in rt.calls if c[0] == "time_calls"] == [
        ("time_calls", "step", "start", [39])
    ] * 3
    pre = measure.prefill_rows(s, 33, 2, 100, 16, np.random.default_rng(1))
    assert [r["name"] for r in pre] == ["prefill_ms@33", "ttft_ms@33"] and pre[1]["value"] >= pre[
        0
    ]["value"]
