"""kern-pool throughput: prefix lookup+insert over 4k-token prompts; lease, retire, checkpoint;
the host tier's decisions for a 6 GiB park (what a park or wake spends on the host before any copy).

Each measurement runs beside a simple peer in the same process: a chained block-hash dict (the
way hash-based prefix caches find shared blocks) for the index, and plain free lists of page ids
(a deque taking ids one by one, and a Python list taking a slice) for leases. Run:
`uv run python -m bench pool` (or `uv run nox -s bench -- pool`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from kern_pool import Host, PagedState, Pool, PoolConfig, Prefix, Room, SeqState, fold
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


PARK_PAGES = 2731  # 43,696 tokens of Qwen3-4B's KV: 6.0 GiB, tools/gpu/bench_tier.py's checkpoint


def _host_ms() -> dict[str, float]:
    """Best of 5, ms: Host.room, Host.park of that room, Host.restore (the wake of a lease), and
    folding the park's copies into runs, for one checkpoint of PARK_PAGES pages."""
    pages = 2 * PARK_PAGES + 64
    cfg = PoolConfig((PagedState("kv", 1),), (), unit=UNIT, row_pages=pages, chunk=64 * UNIT, chunks=pages // 64 + 2)
    pool, _ = Pool.create(cfg)
    host = Host(pool, PARK_PAGES + 1, page_units=1, slot_units=1)
    cp = pool.retire(pool.lease(PARK_PAGES * UNIT), PARK_PAGES * UNIT)
    best: dict[str, float] = {}
    for _ in range(5):
        t0 = time.perf_counter()
        room = host.room(cp.clone())
        t1 = time.perf_counter()
        assert isinstance(room, Room)
        parked, copies = host.park(room)
        t2 = time.perf_counter()
        fold(copies.pages, 1, 1)
        t3 = time.perf_counter()
        lease, _wake = host.restore(parked, PARK_PAGES * UNIT, PARK_PAGES * UNIT + UNIT)
        t4 = time.perf_counter()
        for name, seconds in (("room", t1 - t0), ("park", t2 - t1), ("fold", t3 - t2), ("restore", t4 - t3)):
            best[name] = min(best.get(name, float("inf")), seconds * 1e3)
        lease.release()
        parked.release()
    cp.release()
    return best


def _pairs_seconds() -> float:
    pages, units = list(range(PARK_PAGES)), list(range(PARK_PAGES))
    start = time.perf_counter()
    pairs = list(zip(pages, units, strict=True))
    assert len(pairs) == PARK_PAGES
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
    floor = _best(_pairs_seconds, 5) * 1e3
    for name, ms in _host_ms().items():
        rows.append(
            {
                "name": f"host tier {name} decision, {PARK_PAGES}-page (6 GiB) checkpoint",
                "value": round(ms, 3),
                "unit": "ms",
                "target": None,
                "peer": round(floor, 3),
                "peer_is": f"a list of {PARK_PAGES} (page, unit) pairs built in Python: one tuple per page",
            }
        )
    return rows
