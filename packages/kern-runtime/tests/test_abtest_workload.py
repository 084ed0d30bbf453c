"""kern test's workload: a pure function of the seed, both manifests' serving roles and the options."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kern_runtime as kr
from kern_runtime import abtest as ab

ROOT = Path(__file__).resolve().parents[3]
TINY = kr.serving_roles(kr.read_manifest(ROOT / "examples" / "qwen3-tiny.json"))


def _roles(page: int, rows_max: int, top: int | None) -> kr.ServingRoles:
    return dataclasses.replace(TINY, page_tokens=page, chunk_max=rows_max, token_max=top)


roles = st.builds(_roles, st.sampled_from([1, 16, 64]), st.integers(1, 3000), st.integers(0, 200_000))
options = st.builds(ab.AbOptions, seed=st.integers(0, 2**32), runs=st.integers(1, 12), decode_steps=st.integers(1, 40),
                    capacity=st.integers(41, 5000))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**64 - 1), a=roles, b=roles, o=options)
def test_runs_fit_the_capacity_and_the_token_domain(seed: int, a: kr.ServingRoles, b: kr.ServingRoles,
                                                     o: ab.AbOptions) -> None:
    runs = ab.draw_workload(seed, a, b, o)
    top = ab.token_top(a, b)
    rows_max = min(a.chunk_max, b.chunk_max)
    assert len(runs) == o.runs
    for i, run in enumerate(runs):
        assert len(run.prompt) >= 1 and len(run.prompt) + len(run.decode) <= o.capacity
        assert max(1, o.decode_steps // 2) <= len(run.decode) <= o.decode_steps
        assert all(0 <= t <= top for t in (*run.prompt, *run.decode))
        assert 1 <= run.chunk <= rows_max and 1 <= run.noise_chunk <= rows_max
        assert (run.drawn == "uniform") == (i % 2 == 0)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**64 - 1), a=roles, b=roles, o=options)
def test_the_same_seed_gives_the_same_workload(seed: int, a: kr.ServingRoles, b: kr.ServingRoles,
                                               o: ab.AbOptions) -> None:
    assert ab.draw_workload(seed, a, b, o) == ab.draw_workload(seed, a, b, o)


def test_another_seed_gives_another_workload() -> None:
    o = ab.AbOptions(capacity=4096)
    assert ab.draw_workload(1, TINY, TINY, o) != ab.draw_workload(2, TINY, TINY, o)


def test_boundary_lengths_sit_on_pages_chunks_rows_max_or_the_capacity() -> None:
    o = ab.AbOptions(runs=400, decode_steps=16, capacity=4096)
    runs = ab.draw_workload(7, TINY, TINY, o)
    limit = o.capacity - o.decode_steps
    for run in runs[1::2]:
        n = len(run.prompt)
        ok = {"page-1": (n + 1) % 16 == 0, "page": n % 16 == 0, "page+1": (n - 1) % 16 == 0,
              "chunk-1": (n + 1) % run.chunk == 0, "chunk": n % run.chunk == 0, "chunk+1": (n - 1) % run.chunk == 0,
              "rows max": n == TINY.chunk_max, "capacity": n == limit}
        assert ok[run.drawn], (n, run.drawn, run.chunk)
    assert {r.drawn for r in runs[1::2]} >= {"page-1", "page", "page+1", "chunk-1", "chunk+1", "rows max", "capacity"}
    assert {r.chunk for r in runs} >= {TINY.chunk_max, 512, 16}


def test_the_noise_chunking_splits_the_prompt_another_way() -> None:
    assert ab.noise_chunk(100, 512, 2048) == 50
    assert ab.noise_chunk(100, 16, 2048) == 8
    assert ab.noise_chunk(100, 1, 2048) == 2
    assert ab.noise_chunk(1, 512, 2048) == 1  # nothing to split


def test_a_token_domain_is_needed() -> None:
    bare = dataclasses.replace(TINY, token_max=None)
    assert ab.token_top(bare, TINY) == TINY.token_max
    with pytest.raises(ab.AbTestError, match="token ids' domain"):
        ab.draw_workload(0, bare, bare, ab.AbOptions())


BATCH = kr.serving_roles(kr.read_manifest(ROOT / "examples" / "qwen3-tiny-batch.json"))


def _batch_roles(page: int, max_rows: int) -> kr.ServingRoles:
    assert BATCH.rows is not None
    return dataclasses.replace(BATCH, page_tokens=page, rows=dataclasses.replace(BATCH.rows, max_rows=max_rows))


batch_roles = st.builds(_batch_roles, st.sampled_from([1, 16, 64]), st.integers(2, 64))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**64 - 1), a=batch_roles, b=batch_roles, o=options)
def test_batches_fit_the_capacity_each_sequence_on_pages_of_its_own(seed: int, a: kr.ServingRoles,
                                                                    b: kr.ServingRoles, o: ab.AbOptions) -> None:
    assert a.rows is not None and b.rows is not None
    batches = ab.draw_batches(seed, a, b, o)
    assert len(batches) <= max(1, o.runs // 4)
    assert batches == ab.draw_batches(seed, a, b, o)
    for batch in batches:
        n, steps = len(batch.prompts), len(batch.decode[0])
        assert 2 <= n <= min(a.rows.max_rows, b.rows.max_rows) and len(batch.decode) == n
        assert len({len(p) for p in batch.prompts}) == n and all(len(d) == steps for d in batch.decode)
        assert max(1, o.decode_steps // 2) <= steps <= o.decode_steps
        assert all(0 <= t <= ab.token_top(a, b) for p in (*batch.prompts, *batch.decode) for t in p)
        for page in (a.page_tokens, b.page_tokens):
            pages = sum(-(-(len(p) + steps) // page) for p in batch.prompts)
            assert pages <= -(-o.capacity // page)


def test_batches_need_both_batched_steps_and_leave_the_runs_alone() -> None:
    o = ab.AbOptions(runs=8, capacity=4096)
    assert ab.draw_batches(1, TINY, BATCH, o) == () and ab.draw_batches(1, BATCH, TINY, o) == ()
    assert len(ab.draw_batches(1, BATCH, BATCH, o)) == 2
    assert ab.draw_workload(1, BATCH, BATCH, o) == ab.draw_workload(1, TINY, TINY, o)


def test_a_capacity_without_room_for_two_sequences_draws_no_batch() -> None:
    assert ab.draw_batches(1, BATCH, BATCH, ab.AbOptions(runs=4, decode_steps=4, capacity=34)) == ()
