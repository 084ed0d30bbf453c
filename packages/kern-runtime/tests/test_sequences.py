"""Pool decisions executed on arenas, against a recording fake of the driver shell (no GPU)."""

from __future__ import annotations

import json
from contextlib import ExitStack
from typing import Any

import pytest

import kern_pool
from kern_manifest import parse_manifest
from kern_runtime import ApiError, sequences
from kern_runtime.sequences import Sequences, pool_layout

from .helpers import manifests

MIB = 1 << 20
PAGE = 16 * 4096
HOST_BASE = 1 << 50


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

    def host_alloc(self, nbytes: int) -> int:
        self.calls.append(("host_alloc", nbytes))
        return HOST_BASE

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


# ---- host tier: a unit is gcd(kv page 64 KiB, ssm slot 1 MiB) = 64 KiB; a page 1 unit, a slot 16


def test_host_tier_is_sized_in_units_of_a_page_and_a_slot(seqs: tuple[Sequences, FakeDriver]) -> None:
    s, fake = seqs
    host = s.enable_host(10 * MIB + 5)
    assert (host.units, host.page_units, host.slot_units) == (160, 1, 16)
    assert _of(fake, "host_alloc") == [(160 * PAGE,)]
    with pytest.raises(ApiError, match="already enabled"):
        s.enable_host(MIB)


@pytest.mark.parametrize("nbytes", [PAGE - 1, 0, -5, True, 2.5])
def test_host_tier_too_small_or_not_bytes_is_refused(seqs: tuple[Sequences, FakeDriver], nbytes: Any) -> None:
    s, fake = seqs
    with pytest.raises(ApiError, match="holds no page or slot"):
        s.enable_host(nbytes)
    assert not _of(fake, "host_alloc")
    with pytest.raises(ApiError, match="no host tier"):
        s.host  # noqa: B018


def test_park_copies_pages_then_slot_to_their_units(seqs: tuple[Sequences, FakeDriver]) -> None:
    s, fake = seqs
    s.enable_host(64 * MIB)
    lease = s.lease(48)
    cp = s.checkpoint(lease, 20)  # one whole page and a partial one, and the slot
    fake.calls.clear()
    parked = s.park(cp)
    kv, ssm = s.arenas["kv"], s.arenas["ssm"]
    units = parked.units
    assert len(units) == 2 and parked.slot_unit is not None and parked.length == 20
    want = [(HOST_BASE + u * PAGE, kv.base + p * PAGE, PAGE, "stream") for p, u in zip(cp.pages, units, strict=True)]
    assert cp.state_slot is not None
    want.append((HOST_BASE + parked.slot_unit * PAGE, ssm.base + cp.state_slot * MIB, MIB, "stream"))
    assert _of(fake, "copy_dtoh_async") == want
    assert s.host.used == 2 + 16


def test_parking_a_longer_turn_of_the_chain_copies_only_new_pages(seqs: tuple[Sequences, FakeDriver]) -> None:
    s, fake = seqs
    s.enable_host(64 * MIB)
    lease = s.lease(48)
    first = s.park(s.checkpoint(lease, 16))  # one whole page (and the slot)
    fake.calls.clear()
    later_cp = s.checkpoint(lease, 48)  # three whole pages of the same chain
    later = s.park(later_cp)
    pages = [c for c in _of(fake, "copy_dtoh_async") if c[2] == PAGE]
    assert len(pages) == 2, "the first page is parked already"
    assert later.units[0] == first.units[0]


def test_wake_fills_fresh_pages_and_slot_from_the_host(seqs: tuple[Sequences, FakeDriver]) -> None:
    s, fake = seqs
    s.enable_host(64 * MIB)
    lease = s.lease(48)
    cp = s.checkpoint(lease, 32)
    parked = s.park(cp)
    cp.release()
    lease.release()
    fake.calls.clear()
    woken = s.wake(parked, 32)
    kv, ssm = s.arenas["kv"], s.arenas["ssm"]
    assert woken.length == 32 and len(woken.pages) == 2 and woken.state_slot is not None
    assert parked.slot_unit is not None
    want = [(kv.base + p * PAGE, HOST_BASE + u * PAGE, PAGE, "stream") for u, p in zip(parked.units, woken.pages, strict=True)]
    want.append((ssm.base + woken.state_slot * MIB, HOST_BASE + parked.slot_unit * PAGE, MIB, "stream"))
    assert _of(fake, "copy_htod_async") == want
    again = s.restore(woken, 32, 64)
    assert again.pages[:2] == woken.pages


def test_a_full_host_tier_keeps_nothing_and_copies_nothing(seqs: tuple[Sequences, FakeDriver]) -> None:
    s, fake = seqs
    s.enable_host(4 * PAGE)  # room for pages, not for a 16-unit slot
    cp = s.checkpoint(s.lease(32), 32)
    fake.calls.clear()
    with pytest.raises(kern_pool.HostFull):
        s.park(cp)
    assert not _of(fake, "copy_dtoh_async") and s.host.used == 0


def test_park_and_wake_need_the_host_tier(seqs: tuple[Sequences, FakeDriver]) -> None:
    s, _fake = seqs
    cp = s.checkpoint(s.lease(32), 32)
    with pytest.raises(ApiError, match="no host tier"):
        s.park(cp)


def test_lease_slot_zeroes_only_its_slot(seqs: tuple[Sequences, FakeDriver]) -> None:
    s, fake = seqs
    fake.calls.clear()
    lease = s.lease_slot()
    assert lease.pages == () and lease.state_slot is not None and not lease.paged
    assert _of(fake, "memset_async") == [(s.arenas["ssm"].base + lease.state_slot * MIB, MIB, "stream")]


def test_retire_keeps_the_tokens_in_place_without_device_work(seqs: tuple[Sequences, FakeDriver]) -> None:
    s, fake = seqs
    lease = s.lease(48)
    pages, slot = lease.pages, lease.state_slot
    fake.calls.clear()
    cp = s.retire(lease, 20)
    assert fake.calls == [] and not lease.live
    assert cp.pages == pages[:2] and cp.state_slot == slot and cp.length == 20
    with pytest.raises(kern_pool.ApiError):
        s.retire(lease, 20)
