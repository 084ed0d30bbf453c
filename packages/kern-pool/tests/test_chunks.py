"""Chunk sizing, budgets and configuration checks."""

from __future__ import annotations

import pytest

from kern_pool import (
    CHUNK_CAP,
    GRANULE,
    HEADROOM,
    Capacity,
    ConfigError,
    PagedState,
    PoolConfig,
    SeqState,
    chunk_bytes,
    pool_config,
)

MiB = 1 << 20


@pytest.mark.parametrize(
    ("smallest", "chunk"),
    [
        (1, CHUNK_CAP),  # under two granules: an object cannot span two chunks anyway
        (int(2.25 * MiB), CHUNK_CAP),  # qwen3-4b page
        (4 * MiB, 2 * MiB),
        (5 * MiB, 2 * MiB),  # half is 2.5 MiB, rounded down to the granule
        (49 * MiB, 24 * MiB),  # qwen3.8 page
        (147 * MiB, CHUNK_CAP),  # half is 73.5 MiB: capped
    ],
)
def test_chunk_bytes(smallest: int, chunk: int) -> None:
    assert chunk_bytes(smallest) == chunk
    assert chunk % GRANULE == 0


def test_chunk_bytes_rejects_nothing() -> None:
    with pytest.raises(ConfigError):
        chunk_bytes(0)


def test_budget_rounds_tokens_down_and_each_state_up() -> None:
    kv = PagedState("kv", 49 * MiB // 16)  # 49 MiB pages of 16 tokens
    draft = PagedState("draft", 9 * MiB // 16)  # 9 MiB pages: the smallest object -> 4 MiB chunks
    ssm = SeqState("ssm", 30 * MiB)
    cfg = pool_config((kv, draft), (ssm,), unit=16, row_pages=64, capacity=Capacity(tokens=100, seqs=2))
    assert cfg.chunk == 4 * MiB
    # 100 tokens -> 96 (6 pages): kv 294 MiB -> 74 chunks, draft 54 MiB -> 14; 4 slots 120 MiB -> 30
    assert cfg.chunks == 74 + 14 + 30
    assert cfg.first_slots == 4
    summed = -(-(96 * (kv.bytes_per_token + draft.bytes_per_token)) // cfg.chunk)
    assert summed == 87 < 74 + 14  # rounding the sum once would starve one state's last page
    assert cfg.pages_max >= 6 and cfg.slots_max >= 4


def test_budget_without_tokens_takes_free_memory_minus_headroom() -> None:
    kv = PagedState("kv", MiB)
    cfg = pool_config((kv,), (), unit=16, row_pages=8, capacity=Capacity(None, 4), free_bytes=HEADROOM + 640 * MiB)
    assert cfg.chunk == 8 * MiB
    assert cfg.chunks == 80
    assert cfg.first_slots == 0
    with pytest.raises(ConfigError, match="free_bytes"):
        pool_config((kv,), (), unit=16, row_pages=8, capacity=Capacity(None, 4))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"paged": (), "per_seq": ()},
        {"paged": (PagedState("a", 1), PagedState("a", 2))},
        {"paged": (PagedState("a", 0),)},
        {"per_seq": (SeqState("s", -1),)},
        {"unit": 0},
        {"row_pages": 0},
        {"chunk": 0},
        {"chunks": -1},
        {"first_slots": 1},
        {"per_seq": (SeqState("s", 8),), "first_slots": 100},
    ],
)
def test_bad_configs_raise(kwargs: dict[str, object]) -> None:
    base: dict[str, object] = {
        "paged": (PagedState("kv", 1),),
        "per_seq": (),
        "unit": 4,
        "row_pages": 4,
        "chunk": 4,
        "chunks": 16,
    }
    with pytest.raises(ConfigError):
        PoolConfig(**(base | kwargs))  # type: ignore[arg-type]


def test_capacity_limits() -> None:
    cfg = PoolConfig((PagedState("kv", 3),), (SeqState("s", 10),), unit=2, row_pages=4, chunk=8, chunks=13)
    # 6-byte pages in 8-byte chunks: n pages take ceil(6n / 8) chunks
    assert cfg.pages_max == 17
    assert cfg.slots_max == 10
    assert cfg.chunks_for(4, 1) == 3 + 2
