"""Pool decisions executed on arenas, against a recording fake of the driver shell (no GPU)."""

from __future__ import annotations

import json
from contextlib import ExitStack
from typing import Any

import pytest

import kern_pool
from kern_manifest import parse_manifest
from kern_runtime import sequences
from kern_runtime.sequences import Sequences, pool_layout

from .helpers import manifests

MIB = 1 << 20
PAGE = 16 * 4096


class FakeDriver:
    """Records the calls Sequences makes; addresses are plain integers."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self._next = 1 << 40

    def vmm_granularity(self, dev: object) -> int:
        return 2 * MIB

    def vmm_reserve(self, nbytes: int, align: int) -> int:
        base, self._next = self._next, self._next + (1 << 36)
        self.calls.append(("reserve", base, nbytes))
        return base

    def vmm_create(self, nbytes: int, dev: object) -> int:
        self.calls.append(("create", nbytes))
        return len([c for c in self.calls if c[0] == "create"]) - 1

    def __getattr__(self, name: str) -> Any:
        return lambda *args: self.calls.append((name, *args))


@pytest.fixture
def seqs(monkeypatch: pytest.MonkeyPatch) -> tuple[Sequences, FakeDriver]:
    fake = FakeDriver()
    monkeypatch.setattr(sequences, "drv", fake)
    m = parse_manifest(json.dumps(manifests.pooled("ab" * 32)))
    paged, per_seq, unit, row = pool_layout(m)
    assert (unit, row) == (16, 64)
    config = kern_pool.pool_config(paged, per_seq, unit=unit, row_pages=row, capacity=kern_pool.Capacity(256, 1))
    stack = ExitStack()
    return Sequences(stack, "dev", "stream", config), fake


def _of(fake: FakeDriver, name: str) -> list[tuple[Any, ...]]:
    return [c[1:] for c in fake.calls if c[0] == name]


def test_initial_plan_maps_grants_and_zeroes(seqs: tuple[Sequences, FakeDriver]) -> None:
    s, fake = seqs
    kv, ssm = s.arenas["kv"], s.arenas["ssm"]
    chunk = s.config.chunk
    assert {m[0] for m in _of(fake, "vmm_map")} == {kv.base + p * chunk for p in kv.mapped} | {
        ssm.base + p * chunk for p in ssm.mapped
    }
    assert kv.mapped and ssm.mapped and _of(fake, "vmm_set_access")
    assert sorted(m[0] for m in _of(fake, "memset_async")) == sorted(
        [kv.base + p * chunk for p in kv.mapped] + [ssm.base + p * chunk for p in ssm.mapped]
    )
    assert s.spans["kv"] == (kv.base, kv.reserved) and kv.object_bytes == PAGE and ssm.object_bytes == MIB


def test_lease_zeroes_its_pages_and_slot(seqs: tuple[Sequences, FakeDriver]) -> None:
    s, fake = seqs
    fake.calls.clear()
    lease = s.lease(32)
    kv, ssm = s.arenas["kv"], s.arenas["ssm"]
    assert len(lease.pages) == 2 and lease.state_slot is not None
    want = [(kv.base + p * PAGE, PAGE, "stream") for p in lease.pages]
    want.append((ssm.base + lease.state_slot * MIB, MIB, "stream"))
    assert _of(fake, "memset_async") == want


def test_checkpoint_copies_the_partial_page_and_the_slot(seqs: tuple[Sequences, FakeDriver]) -> None:
    s, fake = seqs
    lease = s.lease(32)
    fake.calls.clear()
    cp = s.checkpoint(lease, 20)
    kv, ssm = s.arenas["kv"], s.arenas["ssm"]
    copies = _of(fake, "copy_dtod_async")
    assert len(copies) == 2
    (dst, src, n, _), (sdst, ssrc, sn, _) = copies
    assert src == kv.base + lease.pages[1] * PAGE and n == PAGE
    assert dst == kv.base + cp.pages[-1] * PAGE and cp.pages[0] == lease.pages[0]
    assert cp.state_slot is not None and lease.state_slot is not None
    assert (ssrc, sdst, sn) == (ssm.base + lease.state_slot * MIB, ssm.base + cp.state_slot * MIB, MIB)
    again = s.restore(cp, 20, 64)
    assert again.pages[0] == lease.pages[0] and len(again.pages) == 4


def test_pool_without_states_is_refused_by_layout() -> None:
    m = parse_manifest(json.dumps(manifests.chain("ab" * 32, calls=2)))
    assert pool_layout(m) == ((), (), 1, 0)


def test_a_fourth_slot_lands_a_remap_plan_first(seqs: tuple[Sequences, FakeDriver]) -> None:
    s, fake = seqs
    for _ in range(3):
        s.lease(32)
    assert s.pool.remaps == 0
    fake.calls.clear()
    lease = s.lease(32)
    assert s.pool.remaps == 1 and s.pool.pending is None
    assert fake.calls[0] == ("stream_synchronize", "stream")
    ssm = s.arenas["ssm"]
    assert lease.state_slot is not None
    assert (ssm.base + lease.state_slot * MIB, MIB, "stream") in _of(fake, "memset_async")
