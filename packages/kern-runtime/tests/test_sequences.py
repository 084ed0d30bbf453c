"""Pool decisions executed on arenas, against a recording fake of the driver shell (no GPU)."""

from __future__ import annotations

import json
import re
import threading
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import pytest

import kern_pool
from kern_manifest import parse_manifest
from kern_runtime import ApiError, _hosttier, memory, sequences  # pyright: ignore[reportPrivateUsage]
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
        self.gate = threading.Event()  # NOTE: event_synchronize waits on it (a plan's stream event)
        self.gate.set()
        self.landed = True  # NOTE: what event_query answers
        self.events = 0
        self.destroyed: set[object] = set()

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

    def stream_create(self) -> str:
        self.calls.append(("stream_create",))
        return "transfer"

    def device_pci_bus_id(self, dev: object) -> str:
        return "ffff:ff:ff.f"  # NOTE: no such sysfs entry: no NUMA preference

    def event_create(self, timing: bool = True) -> str:
        self.events += 1
        self.calls.append(("event_create", timing))
        return f"event{self.events - 1}"

    def event_synchronize(self, event: object) -> None:
        self.gate.wait(5)
        self.calls.append(("event_synchronize", event))

    def event_query(self, event: object) -> bool:
        assert event not in self.destroyed, f"{event} queried after cuEventDestroy (the driver fails)"
        self.calls.append(("event_query", event))
        return self.landed

    def event_destroy(self, event: object) -> None:
        assert event not in self.destroyed, f"{event} destroyed twice"
        self.destroyed.add(event)
        self.calls.append(("event_destroy", event))

    def __getattr__(self, name: str) -> Any:
        return lambda *args: self.calls.append((name, *args))


@pytest.fixture
def seqs(monkeypatch: pytest.MonkeyPatch) -> tuple[Sequences, FakeDriver]:
    fake = FakeDriver()
    for module in (sequences, _hosttier, memory):
        monkeypatch.setattr(module, "drv", fake)
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
    assert len(lease.pages) == 2 and lease.state_slot is not None and lease.pages[1] == lease.pages[0] + 1
    want = [(kv.base + lease.pages[0] * PAGE, 2 * PAGE, "stream")]  # consecutive pages: one memset
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


def _at(fake: FakeDriver, name: str) -> int:
    return next(i for i, c in enumerate(fake.calls) if c[0] == name)


def test_a_remap_lands_on_a_thread_after_the_stream_event_then_is_zeroed(seqs: tuple[Sequences, FakeDriver]) -> None:
    s, fake = seqs
    for _ in range(3):
        s.lease(32)
    assert s.pool.remaps == 0
    fake.calls.clear()
    lease = s.lease(32)  # a fourth slot: the plan unmaps free pages, maps slot chunks
    assert s.pool.remaps == 1 and s.pool.pending is None and not s.remapping
    assert "stream_synchronize" not in [c[0] for c in fake.calls], "the caller's thread never drains the stream"
    assert fake.calls[1] == ("event_record", "event0", "stream")
    assert _at(fake, "event_record") < _at(fake, "event_synchronize")
    ssm = s.arenas["ssm"]
    assert lease.state_slot is not None
    zero = fake.calls.index(("memset_async", ssm.base + lease.state_slot * MIB, MIB, "stream"))
    assert zero > _at(fake, "event_synchronize")
    assert ("event_destroy", "event0") in fake.calls


def test_without_wait_a_remap_in_flight_is_remapping_and_lands_at_the_next_lease(
    seqs: tuple[Sequences, FakeDriver],
) -> None:
    s, fake = seqs
    held = [s.lease(32) for _ in range(3)]
    fake.gate.clear()  # the stream event has not passed: the thread waits
    with pytest.raises(kern_pool.Remapping):
        s.lease(32, wait=False)
    assert s.remapping and s.pool.pending is not None
    with pytest.raises(kern_pool.Remapping):
        s.lease(16, wait=False)  # at most one plan: the same one is still in flight
    assert s.pool.remaps == 1 and [c[0] for c in fake.calls].count("event_record") == 1
    assert "vmm_unmap" not in [c[0] for c in fake.calls]
    fake.gate.set()
    flight = s._flight  # pyright: ignore[reportPrivateUsage]
    assert flight is not None
    flight.thread.join(5)
    assert s.remapping, "landed but not collected until the next call"
    extra = s.lease(32, wait=False)
    assert not s.remapping and extra.state_slot is not None and s.pool.remaps == 1
    for h in [*held, extra]:
        h.release()


def test_settle_waits_for_the_plan_in_flight(seqs: tuple[Sequences, FakeDriver]) -> None:
    s, _fake = seqs
    for _ in range(3):
        s.lease(32)
    with pytest.raises(kern_pool.Remapping):
        s.lease(32, wait=False)
    s.settle()
    assert not s.remapping and s.pool.slots_free >= 1
    s.settle()  # nothing in flight: a no-op


def test_a_failed_remap_is_raised_on_the_caller_s_thread(seqs: tuple[Sequences, FakeDriver], monkeypatch: pytest.MonkeyPatch) -> None:
    s, fake = seqs
    for _ in range(3):
        s.lease(32)

    def broken(*_args: Any) -> None:
        raise RuntimeError("unmap failed")

    monkeypatch.setattr(fake, "event_synchronize", broken)
    with pytest.raises(RuntimeError, match="unmap failed"):
        s.lease(32)


def test_pool_config_for_all_free_memory_leaves_the_headroom() -> None:
    m = parse_manifest(json.dumps(manifests.pooled("ab" * 32)))
    free = kern_pool.HEADROOM + 640 * MIB + 5
    config = sequences.pool_config_for(m, kern_pool.Capacity(None, 2), free)
    assert config is not None and config.chunks == 640 * MIB // config.chunk and config.first_slots == 4
    assert config.row_pages == 64
    fixed = sequences.pool_config_for(m, kern_pool.Capacity(100, 1))
    assert fixed is not None and fixed.chunks == 96 * 4096 // config.chunk + 1 + 3 * MIB // config.chunk + 1
    with pytest.raises(ApiError, match=r"^1073741829 free device bytes cannot hold the pool: "):
        sequences.pool_config_for(m, kern_pool.Capacity(None, 1), kern_pool.HEADROOM + 5)
    with pytest.raises(ApiError, match="pass free_bytes"):
        sequences.pool_config_for(m, kern_pool.Capacity(None, 1))
    assert sequences.pool_config_for(parse_manifest(json.dumps(manifests.chain("ab" * 32, calls=2))), kern_pool.Capacity(None, 1), 1 << 40) is None


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
    kv = s.arenas["kv"]
    pages = [c for c in _of(fake, "copy_dtoh_async") if c[2] != MIB]
    assert later.units[0] == first.units[0] and later.units[1:] == (later.units[1], later.units[1] + 1)
    want = (HOST_BASE + later.units[1] * PAGE, kv.base + later_cp.pages[1] * PAGE, 2 * PAGE, "stream")
    assert pages == [want], "the first page is parked already; the two new ones go as one copy"


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
    assert parked.units == (parked.units[0], parked.units[0] + 1) and woken.pages[1] == woken.pages[0] + 1
    want = [(kv.base + woken.pages[0] * PAGE, HOST_BASE + parked.units[0] * PAGE, 2 * PAGE, "stream")]
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


# ---- the transfer stream -------------------------------------------------------------------


def test_park_of_a_room_runs_on_the_transfer_stream_after_the_compute_stream(seqs: tuple[Sequences, FakeDriver]) -> None:
    s, fake = seqs
    host = s.reserve_host(8, 2)
    assert (host.units, host.page_units, host.slot_units) == (8 + 2 * 16, 1, 16)
    lease = s.lease(48)
    cp = s.checkpoint(lease, 32)
    lease.release()
    room = s.room(cp)
    assert isinstance(room, kern_pool.Room)
    fake.calls.clear()
    fake.landed = False
    parked = s.park_room(room)
    order = [c for c in fake.calls if c[0] in ("event_record", "stream_wait_event", "copy_dtoh_async")]
    assert order[0] == ("event_record", "event0", "stream") and order[1] == ("stream_wait_event", "transfer", "event0")
    assert all(c[-1] == "transfer" for c in order[2:-1]) and order[-1][0] == "event_record"
    assert [c[0] for c in order[2:-1]] == ["copy_dtoh_async", "copy_dtoh_async"]  # two pages as one copy, the slot
    assert not any(c[0] == "stream_wait_event" and c[1] == "stream" for c in fake.calls), "compute never waits"
    assert cp.live and s.pool.pages_used == 2, "held until the copies land"
    s.lease(16).release()  # a call that reaps: still in flight
    assert cp.live
    fake.landed = True
    s.synchronize_transfers()
    assert not cp.live and s.pool.pages_used == 0 and parked.live and s.host.used == 2 + 16


def test_a_full_room_hands_the_checkpoint_back(seqs: tuple[Sequences, FakeDriver]) -> None:
    s, _fake = seqs
    s.reserve_host(1, 0)
    cp = s.checkpoint(s.lease(32), 32)
    assert s.room(cp) is cp and s.host.used == 0


def test_wake_with_tokens_is_a_waking_that_awakes_once_landed(seqs: tuple[Sequences, FakeDriver]) -> None:
    s, fake = seqs
    s.reserve_host(8, 2)
    lease = s.lease(48)
    parked = s.park_now(s.checkpoint(lease, 20))
    lease.release()
    assert s.pool.pages_used == 0, "park_now lets the checkpoint go at once"
    fake.calls.clear()
    fake.landed = False
    waking = s.wake_async(parked, 20, 64)
    assert isinstance(waking, sequences.Waking) and waking.length == 20
    copies = [c for c in fake.calls if c[0] == "copy_htod_async"]
    assert copies and all(c[-1] == "transfer" for c in copies)
    kv = s.arenas["kv"]
    zeroed = _of(fake, "memset_async")
    assert s.pool.pages_used == 4 and len(zeroed) == 1
    start, nbytes, _ = zeroed[0]
    assert nbytes == 2 * PAGE, "the two pages no copy fills are zeroed (one run), before the transfer"
    assert _at(fake, "memset_async") < _at(fake, "stream_wait_event")
    assert not s.landed(waking) and s.awake(waking) is waking
    fake.landed = True
    got = s.awake(waking)
    assert isinstance(got, kern_pool.Lease) and got.prefix == 20 and got.sealed == 1 and not waking.live
    assert (start, got.pages[3]) == (kv.base + got.pages[2] * PAGE, got.pages[2] + 1)
    with pytest.raises(ApiError, match="awake or released"):
        s.awake(waking)
    got.release()
    parked.release()
    assert (s.pool.pages_used, s.host.used) == (0, 0)


def _woken_then_synchronized(s: Sequences) -> tuple[kern_pool.Parked, sequences.Waking]:
    """32 parked tokens woken on the transfer stream, then a synchronize that reaps the transfer."""
    s.reserve_host(8, 2)
    lease = s.lease(32)
    parked = s.park_now(s.checkpoint(lease, 32))
    lease.release()
    waking = s.wake_async(parked, 32, 32)
    s.synchronize_transfers()
    return parked, waking


def test_a_waking_landed_by_a_synchronize_still_awakes(seqs: tuple[Sequences, FakeDriver]) -> None:
    """Runtime.synchronize reaps every landed transfer (its event destroyed); awake must not query it."""
    s, _ = seqs
    parked, waking = _woken_then_synchronized(s)
    assert s.landed(waking)
    got = s.awake(waking)
    assert isinstance(got, kern_pool.Lease) and got.prefix == 32
    got.release()
    parked.release()
    assert (s.pool.pages_used, s.host.used) == (0, 0)


def test_a_waking_released_after_a_synchronize_gives_its_pages_back(seqs: tuple[Sequences, FakeDriver]) -> None:
    s, _ = seqs
    parked, waking = _woken_then_synchronized(s)
    waking.release()
    parked.release()
    assert (s.pool.pages_used, s.host.used) == (0, 0)


def test_a_waking_released_early_waits_for_its_copies(seqs: tuple[Sequences, FakeDriver]) -> None:
    s, fake = seqs
    s.reserve_host(8, 2)
    lease = s.lease(32)
    parked = s.park_now(s.checkpoint(lease, 32))
    lease.release()
    fake.landed = False
    waking = s.wake_async(parked, 32, 32)
    parked.release()  # the Waking still holds the host copy it reads
    assert s.host.used == 2 + 16
    fake.calls.clear()
    waking.release()
    assert fake.calls[0] == ("event_synchronize", "event1")
    assert (s.pool.pages_used, s.host.used) == (0, 0)


def _sliced(monkeypatch: pytest.MonkeyPatch, slices: Any) -> tuple[Sequences, FakeDriver]:
    """The `seqs` fixture's pool with the kv pages declared as `slices` slices."""
    fake = FakeDriver()
    for module in (sequences, _hosttier, memory):
        monkeypatch.setattr(module, "drv", fake)
    m = parse_manifest(json.dumps(manifests.pooled("ab" * 32)))
    paged, per_seq, unit, row = pool_layout(m)
    config = kern_pool.pool_config(paged, per_seq, unit=unit, row_pages=row, capacity=kern_pool.Capacity(256, 1))
    return Sequences(ExitStack(), "dev", "stream", config, slices=slices), fake


def _staged(s: Sequences, fake: FakeDriver) -> tuple[kern_pool.Parked, kern_pool.Lease]:
    """48 parked tokens (three pages and the slot) woken by wake_now, the copies in flight."""
    s.reserve_host(8, 2)
    lease = s.lease(48)
    parked = s.park_now(s.checkpoint(lease, 48))
    lease.release()
    fake.landed = False
    fake.calls.clear()
    return parked, s.wake_now(parked, 48, 64)


def test_wake_now_stages_the_slot_then_each_slice_of_every_page_on_the_transfer_stream(
        monkeypatch: pytest.MonkeyPatch) -> None:
    s, fake = _sliced(monkeypatch, {"kv": 4})
    parked, woken = _staged(s, fake)
    kv, ssm = s.arenas["kv"], s.arenas["ssm"]
    page, unit = woken.pages[0], parked.units[0]
    assert woken.pages[:3] == (page, page + 1, page + 2) and parked.units == (unit, unit + 1, unit + 2)
    assert woken.state_slot is not None and parked.slot_unit is not None
    order = [c for c in fake.calls if c[0] in ("event_record", "stream_wait_event", "copy_htod_async", "copy_2d_async")]
    assert order[:2] == [("event_record", "event0", "stream"), ("stream_wait_event", "transfer", "event0")]
    width = PAGE // 4
    want: list[tuple[Any, ...]] = [
        ("copy_htod_async", ssm.base + woken.state_slot * MIB, HOST_BASE + parked.slot_unit * PAGE, MIB, "transfer"),
        ("event_record", "event1", "transfer"),
    ]
    for i in range(4):  # slice i of the three pages: one 2-D copy, rows a page apart on both sides
        want += [("copy_2d_async", kv.base + page * PAGE + i * width, PAGE, True,
                  HOST_BASE + unit * PAGE + i * width, PAGE, False, width, 3, "transfer"),
                 ("event_record", f"event{2 + i}", "transfer")]
    assert order[2:] == [*want, ("event_record", "event6", "transfer")]
    assert not any(c[0] == "stream_wait_event" and c[1] == "stream" for c in fake.calls), "compute does not wait"
    assert s.pending and woken.prefix == 48


def test_a_call_waits_only_for_its_slices_and_pool_work_for_all_of_them(monkeypatch: pytest.MonkeyPatch) -> None:
    s, fake = _sliced(monkeypatch, {"kv": 4})
    _staged(s, fake)
    fake.calls.clear()
    s.await_slices([("kv", 2)])
    assert fake.calls == [("stream_wait_event", "stream", "event4")]
    s.await_slices([("kv", 2), ("ssm", 0)])
    assert fake.calls[1:] == [("stream_wait_event", "stream", "event1")], "a slice waited for is not waited again"
    fake.calls.clear()
    s.lease(16)  # its zeroing on the compute stream waits for the whole staged wake first
    assert fake.calls[0] == ("stream_wait_event", "stream", "event6") and fake.calls[1][0] == "memset_async"
    assert not s.pending
    fake.calls.clear()
    s.await_slices([("kv", 0)])
    s.await_staged()
    assert fake.calls == []


def test_a_landed_staged_wake_destroys_its_slice_events_once(monkeypatch: pytest.MonkeyPatch) -> None:
    s, fake = _sliced(monkeypatch, {"kv": 2})
    parked, woken = _staged(s, fake)
    assert s.pending
    fake.landed = True
    s.synchronize_transfers()
    assert not s.pending and {"event1", "event2", "event3", "event4"} <= fake.destroyed
    fake.calls.clear()
    s.await_staged()
    s.lease(16).release()
    assert not _of(fake, "stream_wait_event")
    woken.release()
    parked.release()
    assert (s.pool.pages_used, s.host.used) == (0, 0)


def test_staged_steps_wait_for_their_own_slices_just_before_they_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """A program's calls over a staged wake: the wait for slice s comes right before the first
    call touching it, calls touching nothing pending wait for nothing, and a later wake's slices
    are waited for afresh."""
    s, fake = _sliced(monkeypatch, {"kv": 4})
    _staged(s, fake)

    @dataclass
    class Call:
        position: int

        def run(self) -> None:
            fake.calls.append(("run", self.position))

    touch = {1: (("kv", 0),), 2: (("kv", 0),), 4: (("kv", 3),), 5: (("kv", 1), ("ssm", 0))}
    fake.calls.clear()
    for call in s.staged([Call(i) for i in range(7)], touch):
        call.run()
    assert fake.calls == [
        ("run", 0),
        ("stream_wait_event", "stream", "event2"), ("run", 1),
        ("run", 2),
        ("run", 3),
        ("stream_wait_event", "stream", "event5"), ("run", 4),
        ("stream_wait_event", "stream", "event3"), ("stream_wait_event", "stream", "event1"), ("run", 5),
        ("run", 6),
    ]
    assert s.pending, "slice 2 was touched by no call: still pending"
    fake.calls.clear()
    list(s.staged([Call(i) for i in range(7)], touch))
    assert not _of(fake, "stream_wait_event")


def test_a_staged_wake_queues_behind_a_park_in_flight_without_the_compute_stream_waiting(
        seqs: tuple[Sequences, FakeDriver]) -> None:
    s, fake = seqs
    s.reserve_host(8, 2)
    lease = s.lease(32)
    room = s.room(s.checkpoint(lease, 32))
    assert isinstance(room, kern_pool.Room)
    fake.landed = False
    parked = s.park_room(room)
    fake.calls.clear()
    woken = s.wake_now(parked, 32, 48)
    copies = _of(fake, "copy_htod_async")
    assert copies and all(c[-1] == "transfer" for c in copies), "after the park, on the same stream"
    assert not any(c[0] == "stream_wait_event" and c[1] == "stream" for c in fake.calls)
    assert woken.prefix == 32 and s.pending


def test_touched_slices_from_state_offsets(monkeypatch: pytest.MonkeyPatch) -> None:
    s, _ = _sliced(monkeypatch, {"kv": 4})
    assert s.slices == {"kv": 4}
    assert s.touched("kv", 0) == (("kv", 0),)
    assert s.touched("kv", 3 * PAGE // 4 + 16) == (("kv", 3),)
    assert s.touched("kv", None) == (("kv", 0), ("kv", 1), ("kv", 2), ("kv", 3))
    assert s.touched("ssm", 1 << 19) == (("ssm", 0),)
    m = parse_manifest(json.dumps(manifests.pooled("ab" * 32)))
    assert s.call_slices(m.programs["stamp"].calls) == {0: (("kv", 2),), 1: (("ssm", 0),)}


def test_unsliced_pages_are_one_slice(seqs: tuple[Sequences, FakeDriver]) -> None:
    s, _ = seqs
    assert s.slices == {"kv": 1} and s.touched("kv", PAGE - 16) == (("kv", 0),)


@pytest.mark.parametrize(("slices", "text"), [
    ({"ssm": 2}, "'ssm', which is not a paged state"),
    ({"kv": 3}, "3 slices do not divide state 'kv'"),
    ({"kv": 0}, "0 slices do not divide"),
    ({"kv": True}, "True slices do not divide"),
])
def test_slices_that_do_not_cut_a_page_are_refused(monkeypatch: pytest.MonkeyPatch, slices: Any, text: str) -> None:
    with pytest.raises(ApiError, match=re.escape(text)):
        _sliced(monkeypatch, slices)


def test_copy_out_and_in_perform_another_runtime_s_decision_and_check_ids(seqs: tuple[Sequences, FakeDriver]) -> None:
    s, fake = seqs
    s.reserve_host(4, 1)
    kv = s.arenas["kv"]
    fake.calls.clear()
    s.copy_out(kern_pool.Copies(((kern_pool.PageId(1), kern_pool.HostUnit(2)),), None))
    assert _of(fake, "copy_dtoh_async") == [(HOST_BASE + 2 * PAGE, kv.base + PAGE, PAGE, "stream")]
    s.copy_in(kern_pool.Copies(((kern_pool.HostUnit(3), kern_pool.PageId(0)),), None))
    assert _of(fake, "copy_htod_async") == [(kv.base, HOST_BASE + 3 * PAGE, PAGE, "stream")]
    fake.calls.clear()
    pages = s.pool.pages_max
    for copies, text in (
        (kern_pool.Copies(((kern_pool.PageId(pages), kern_pool.HostUnit(0)),), None), f"page {pages} is outside"),
        (kern_pool.Copies(((kern_pool.PageId(0), kern_pool.HostUnit(20)),), None), "host unit 20 .page. is outside"),
        (kern_pool.Copies((), (kern_pool.SlotId(0), kern_pool.HostUnit(5))), "host unit 5 .slot. is outside"),
    ):
        with pytest.raises(ApiError, match=text):
            s.copy_out(copies)
    assert not _of(fake, "copy_dtoh_async")


@pytest.mark.parametrize(("pages", "slots", "text"), [(0, 0, "holds nothing"), (-1, 1, "pages must be an int >= 0"), (1, 1.5, "slots must be")])
def test_reserve_host_refuses_counts_that_hold_nothing(seqs: tuple[Sequences, FakeDriver], pages: Any, slots: Any, text: str) -> None:
    s, fake = seqs
    with pytest.raises(ApiError, match=text):
        s.reserve_host(pages, slots)
    assert not _of(fake, "host_alloc")


def test_two_paged_states_fold_into_2d_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeDriver()
    for module in (sequences, _hosttier, memory):
        monkeypatch.setattr(module, "drv", fake)
    paged = (kern_pool.PagedState("k", 4096), kern_pool.PagedState("v", 8192))
    config = kern_pool.pool_config(paged, (), unit=16, row_pages=8, capacity=kern_pool.Capacity(128, 1))
    s = Sequences(ExitStack(), "dev", "stream", config)
    host = s.reserve_host(8, 0)
    assert (host.units, host.page_units) == (8, 1)
    lease = s.lease(48)
    fake.calls.clear()
    s.park(s.checkpoint(lease, 48))
    k, v = s.arenas["k"], s.arenas["v"]
    row = 3 * PAGE  # a host page: k's 64 KiB, then v's 128 KiB
    assert _of(fake, "copy_2d_async") == [
        (HOST_BASE, row, False, k.base, PAGE, True, PAGE, 3, "stream"),
        (HOST_BASE + PAGE, row, False, v.base, 2 * PAGE, True, 2 * PAGE, 3, "stream"),
    ]
