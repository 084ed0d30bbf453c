"""Chunk sizing, budgets and configuration checks."""

from __future__ import annotations

from typing import Any

import pytest

from kern_pool import (
    CHUNK_CAP,
    GRANULE,
    HEADROOM,
    ApiError,
    Capacity,
    ConfigError,
    LineTable,
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
        {"unit": 0},
        {"row_pages": 0},
        {"chunk": 0},
        {"chunks": -1},
        {"first_slots": 1},
        {"per_seq": (SeqState("s", 8),), "first_slots": 100},
        {"unit": True},
        {"unit": 4.0},
        {"chunks": "16"},
        {"paged": [PagedState("kv", 1)]},
        {"paged": ("kv",)},
        {"chunks": 0},
        {"chunk": 1, "chunks": 3},  # a 4-byte page needs 4 one-byte chunks: holds nothing
        {"per_seq": (SeqState("s", 64),), "chunks": 16},  # one page, but no slot fits
        {"per_seq": (SeqState("s", 8),), "line_tables": (LineTable("lt", "kv", 1, 4),)},
        {"per_seq": (SeqState("s", 8),), "line_tables": (LineTable("lt", "s", 3, 4),)},
        {"per_seq": (SeqState("s", 8),), "line_tables": (LineTable("lt", "s", 1, 4), LineTable("lt", "s", 2, 4))},
        {"per_seq": (SeqState("s", 8),), "line_tables": [LineTable("lt", "s", 1, 4)]},
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
    for bad in ((-1, 0), (0, -1), (1.0, 0), (True, 0)):
        with pytest.raises(ApiError, match=r"^pages and slots must be ints >= 0"):
            cfg.chunks_for(*bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("make", "line"),
    [
        (lambda: PagedState("a", 0), r"^state 'a': bytes_per_token must be an int >= 1, got 0$"),
        (lambda: PagedState("a", True), r"^state 'a': bytes_per_token must be an int >= 1, got True$"),
        (lambda: PagedState("", 1), r"^PagedState.name must be a non-empty str, got ''$"),
        (lambda: SeqState("s", -1), r"^state 's': bytes_per_seq must be an int >= 1, got -1$"),
        (lambda: SeqState(3, 8), r"^SeqState.name must be a non-empty str, got 3$"),
        (lambda: Capacity(-1), r"^Capacity.tokens must be an int >= 0, got -1$"),
        (lambda: Capacity("16"), r"^Capacity.tokens must be an int >= 0, got '16'$"),
        (lambda: Capacity(16, -2), r"^Capacity.seqs must be an int >= 0, got -2$"),
        (lambda: Capacity(16.0, 1), r"^Capacity.tokens must be an int >= 0, got 16.0$"),
        (lambda: LineTable("lt", "s", 0, 4), r"^line table 'lt': lines must be an int >= 1, got 0$"),
        (lambda: LineTable("lt", "s", 1, 4, width=0), r"^line table 'lt': width must be an int >= 1, got 0$"),
        (lambda: chunk_bytes(True), r"^smallest pooled object must be a positive int of bytes, got True$"),
    ],
)
def test_bad_parts_raise_one_line(make: Any, line: str) -> None:
    with pytest.raises(ConfigError, match=line):
        make()


KV = PagedState("kv", MiB)
SSM = SeqState("ssm", 4 * MiB)


@pytest.mark.parametrize(
    ("kwargs", "line"),
    [
        ({"unit": 17, "capacity": Capacity(16)}, r"^Capacity.tokens 16 is less than one page of 17 tokens: the pool would hold no page$"),
        ({"capacity": Capacity(0, 0)}, r"^Capacity.seqs is 0: a pool for no live sequence holds nothing$"),
        ({"capacity": Capacity(0, 1)}, r"^Capacity.tokens 0 is less than one page of 16 tokens"),
        ({"capacity": Capacity(None), "free_bytes": HEADROOM}, r"^1073741824 free bytes leave no [0-9]+-byte chunk past"),
        ({"capacity": Capacity(None), "free_bytes": -5}, r"^free_bytes must be an int >= 0, got -5$"),
        ({"capacity": (16, 1)}, r"^capacity must be a Capacity, got tuple$"),
        ({"unit": 0}, r"^unit must be an int >= 1, got 0$"),
        ({"row_pages": "8"}, r"^row_pages must be an int >= 1, got '8'$"),
    ],
)
def test_capacities_that_hold_nothing_raise_one_line(kwargs: dict[str, Any], line: str) -> None:
    base: dict[str, Any] = {"unit": 16, "row_pages": 8, "capacity": Capacity(64)}
    with pytest.raises(ConfigError, match=line):
        pool_config((KV,), (SSM,), **(base | kwargs))


def test_capacity_defaults_to_one_sequence_and_the_smallest_pool_holds_one() -> None:
    assert Capacity(16) == Capacity(tokens=16, seqs=1)
    cfg = pool_config((KV,), (SSM,), unit=16, row_pages=8, capacity=Capacity(16))
    assert cfg.pages_max >= 1 and cfg.slots_max >= 3
