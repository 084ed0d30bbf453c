"""kern-pool throughput: prefix lookup+insert over 4k-token prompts; lease, retire, checkpoint.

Each measurement runs beside a simple peer in the same process: a chained block-hash dict (the
way hash-based prefix caches find shared blocks) for the index, and plain free lists of page ids
(a deque taking ids one by one, and a Python list taking a slice) for leases. Run:
`uv run python -m bench pool` (or `uv run nox -s bench -- pool`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from kern_pool import PagedState, Pool, PoolConfig, Prefix, SeqState
from kern_pool.sim import SplitMix64

PROMPT = 4096
UNIT = 16
PROMPTS = 1200
SYSTEMS = 8
SYSTEM_LEN = 2048
TOPICS = 32
TOPIC_LEN = 1024
LEASES = 200_000


class _Value:
    """A stored stand-in: the index only reads length and statefulness."""

    __slots__ = ("length",)
    stateful = False

    def __init__(self, length: int) -> None:
        self.length = length

    def release(self) -> None:
        return None


def _prompts() -> list[list[int]]:
    """4k-token prompts: one of 8 system prompts, one of 32 topic blocks, a unique tail."""
    rng = SplitMix64(7)
    systems = [rng.tokens(SYSTEM_LEN) for _ in range(SYSTEMS)]
    topics = [rng.tokens(TOPIC_LEN) for _ in range(TOPICS)]
    out: list[list[int]] = []
    for _ in range(PROMPTS):
        head = systems[rng.next() % SYSTEMS] + topics[rng.next() % TOPICS]
        out.append(head + rng.tokens(PROMPT - len(head)))
    return out


def _best(fn: Callable[[], float], repeats: int = 3) -> float:
    return min(fn() for _ in range(repeats))


def _prefix_seconds(prompts: list[list[int]]) -> float:
    tree: Prefix[_Value, _Value] = Prefix(UNIT)
    start = time.perf_counter()
    for p in prompts:
        tree.lookup(p)
        tree.insert(p, _Value(len(p)))
    return time.perf_counter() - start


def _hash_seconds(prompts: list[list[int]]) -> float:
    blocks: dict[int, int] = {}
    start = time.perf_counter()
    for p in prompts:
        parent, hits = 0, 0
        for i in range(0, len(p) - UNIT + 1, UNIT):
            parent = hash((parent, tuple(p[i : i + UNIT])))
            if parent in blocks:
                hits += 1
            else:
                blocks[parent] = i
    return time.perf_counter() - start


def _lease_seconds(tokens: int) -> float:
    cfg = PoolConfig((PagedState("kv", 1),), (SeqState("ssm", 16),), unit=UNIT, row_pages=512, chunk=16, chunks=40_000, first_slots=64)
    pool, _ = Pool.create(cfg)
    start = time.perf_counter()
    for _ in range(LEASES):
        pool.lease(tokens).release()
    return time.perf_counter() - start


def _retire_seconds(tokens: int, checkpoint: bool) -> float:
    """lease, then retire (or checkpoint at the last whole page and release both), N / 10 times."""
    cfg = PoolConfig((PagedState("kv", 1),), (SeqState("ssm", 16),), unit=UNIT, row_pages=512, chunk=16, chunks=40_000, first_slots=64)
    pool, _ = Pool.create(cfg)
    start = time.perf_counter()
    for _ in range(LEASES // 10):
        lease = pool.lease(tokens)
        if checkpoint:
            cp, _copies = pool.checkpoint(lease, tokens - 1)
            lease.release()
        else:
            cp = pool.retire(lease, tokens)
        cp.release()
    return (time.perf_counter() - start) * 10


def _list_seconds(tokens: int) -> float:
    free = list(range(30_000))
    slots = list(range(64))
    pages = -(-tokens // UNIT)
    start = time.perf_counter()
    for _ in range(LEASES):
        held = free[-pages:]
        del free[-pages:]
        slot = slots.pop()
        free += held
        slots.append(slot)
    return time.perf_counter() - start


def _free_list_seconds(tokens: int) -> float:
    free = deque(range(30_000))
    slots = deque(range(64))
    pages = -(-tokens // UNIT)
    start = time.perf_counter()
    for _ in range(LEASES):
        held = [free.popleft() for _ in range(pages)]
        slot = slots.popleft()
        free.extendleft(reversed(held))
        slots.appendleft(slot)
    return time.perf_counter() - start


def run() -> list[dict[str, object]]:
    """Rows: name, value, unit, target, peer (the peer measured in this same run)."""
    prompts = _prompts()
    tokens = float(PROMPTS * PROMPT)
    prefix = tokens / _best(lambda: _prefix_seconds(prompts))
    hashed = tokens / _best(lambda: _hash_seconds(prompts))
    rows: list[dict[str, object]] = [
        {
            "name": "prefix lookup+insert, 4k-token prompts sharing prefixes",
            "value": round(prefix),
            "unit": "tokens/s",
            "target": 1_000_000,
            "peer": round(hashed),
            "peer_is": "chained 16-token block hashes in a dict",
        }
    ]
    for lease_tokens, target in ((UNIT, 200_000), (1024, None)):
        ours = LEASES / _best(lambda t=lease_tokens: _lease_seconds(t))
        peer = LEASES / _best(lambda t=lease_tokens: _free_list_seconds(t))
        listed = LEASES / _best(lambda t=lease_tokens: _list_seconds(t))
        for peer_value, peer_is, short in (
            (peer, "deque free list of page and slot ids", "deque"),
            (listed, "list free list, slices", "list"),
        ):
            rows.append(
                {
                    "name": f"lease+release, {lease_tokens} tokens + 1 slot (peer: {short})",
                    "value": round(ours),
                    "unit": "pairs/s",
                    "target": target,
                    "peer": round(peer_value),
                    "peer_is": peer_is,
                }
            )
    peer = LEASES / _best(lambda: _free_list_seconds(1024))
    for checkpoint, what in ((False, "lease+retire+release"), (True, "lease+checkpoint+release both")):
        ours = LEASES / _best(lambda c=checkpoint: _retire_seconds(1024, c))
        rows.append(
            {
                "name": f"{what}, 1024 tokens + 1 slot (peer: deque lease+release)",
                "value": round(ours),
                "unit": "rounds/s",
                "target": None,
                "peer": round(peer),
                "peer_is": "deque free list lease+release of 64 pages + 1 slot",
            }
        )
    return rows
