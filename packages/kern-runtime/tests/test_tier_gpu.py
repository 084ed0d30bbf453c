"""Sequence memory on a GPU: stamped pages through checkpoint, fork, lease_from, the host tier's
transfer stream, remaps while graphs replay, and a pool sized from free memory; byte for byte."""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import kern_pool
import kern_runtime as kr
from kern_runtime import _driver as drv

from .helpers import build, manifests
from .test_weights import _st_bytes

pytestmark = pytest.mark.gpu

UNIT = 16
TOKEN = 4096  # kv bytes per token in manifests.pooled: read as 8 layers of 512 bytes
LAYERS = 8


@pytest.fixture(scope="module")
def kdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("kernels")
    build.build_cuda(out)
    return out


@pytest.fixture(scope="module")
def sha(kdir: Path) -> str:
    return build.sha256(kdir / "rt_test.cubin")


@pytest.fixture
def rt(kdir: Path, sha: str, tmp_path: Path) -> Iterator[kr.Runtime]:
    m = build.write_manifest(tmp_path / "p.json", manifests.pooled(sha))
    with kr.Runtime.load(m, kdir, capacity=kr.Capacity(tokens=1024, seqs=4)) as runtime:
        runtime.load_weights(kr.Safetensors.parse(_st_bytes({})))
        yield runtime


def _token(pos: int, salt: int) -> np.ndarray:
    """The bytes of one token: layer l holds the u32 (salt << 24 | pos << 4 | l), 128 times."""
    vals = np.array([(salt << 24) | (pos << 4) | layer for layer in range(LAYERS)], np.uint32)
    return np.repeat(vals, TOKEN // 4 // LAYERS).view(np.uint8)


def _stamp(rt: kr.Runtime, lease: kern_pool.Lease, start: int, stop: int, salt: int) -> None:
    for pos, index in zip(range(start, stop), lease.kv_indices(start, stop), strict=True):
        rt.write_state("kv", index * TOKEN, _token(pos, salt))


def _check(rt: kr.Runtime, pages: tuple[int, ...], length: int, salt: int) -> None:
    for pos in range(length):
        index = pages[pos // UNIT] * UNIT + pos % UNIT
        got = rt.read_state("kv", index * TOKEN, TOKEN)
        np.testing.assert_array_equal(got, _token(pos, salt), err_msg=f"position {pos}")


def _slot(rt: kr.Runtime, slot: int | None) -> np.ndarray:
    assert slot is not None
    return rt.read_state("ssm", slot << 20, 1 << 20)


def _awake(rt: kr.Runtime, waking: kr.Waking) -> kern_pool.Lease:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        got = rt.awake(waking)
        if isinstance(got, kern_pool.Lease):
            return got
        time.sleep(0.001)
    raise AssertionError("the wake's copies did not land in 10 s")


def test_stamps_survive_checkpoint_fork_lease_from_park_zeroing_and_wake(rt: kr.Runtime) -> None:
    rt.reserve_host(16, 4)
    state = np.random.default_rng(3).integers(0, 255, 1 << 20, dtype=np.uint8)
    lease = rt.lease(48)
    _stamp(rt, lease, 0, 40, salt=1)
    rt.write_state("ssm", (lease.state_slot or 0) << 20, state)
    cp = rt.checkpoint(lease, 40)  # inside page 2: the partial page is copied
    child = rt.fork(lease, 40, 64)
    _check(rt, child.pages, 40, salt=1)
    np.testing.assert_array_equal(_slot(rt, child.state_slot), state)
    _stamp(rt, child, 40, 50, salt=2)  # the child writes its own copy of page 2
    _check(rt, cp.pages, 40, salt=1)
    resumed = rt.lease_from(cp, 40, 64)
    _check(rt, resumed.pages, 40, salt=1)
    np.testing.assert_array_equal(_slot(rt, resumed.state_slot), state)
    for h in (child, resumed, lease):
        h.release()
    room = rt.room(cp)
    assert isinstance(room, kern_pool.Room)
    old = cp.pages
    parked = rt.park(room)
    rt.synchronize()
    assert not cp.live, "the runtime lets the checkpoint go once its copies landed"
    assert rt.pool.pages_used == 0 and rt.pool.slots_used == 0
    for p in old:
        rt.write_state("kv", p * UNIT * TOKEN, np.zeros(UNIT * TOKEN, np.uint8))
    waking = rt.wake(parked, 40, 64)
    woken = _awake(rt, waking)
    assert woken.prefix == 40 and woken.sealed == 2
    _check(rt, woken.pages, 40, salt=1)
    np.testing.assert_array_equal(_slot(rt, woken.state_slot), state)
    assert not rt.read_state("kv", woken.pages[3] * UNIT * TOKEN, UNIT * TOKEN).any()
    now = rt.wake_now(parked, 40, 48)
    _check(rt, now.pages, 40, salt=1)
    again = rt.wake(parked, 40)  # the synchronous form: a device checkpoint
    assert isinstance(again, kern_pool.Checkpoint)
    _check(rt, again.pages, 40, salt=1)
    used = rt.host.used
    same = rt.park_now(again)  # woken at the parked length: parks as the same copy, no copy
    assert rt.host.used == used and same.units == parked.units and not again.live
    for h in (woken, now, same, parked):
        h.release()
    assert (rt.pool.pages_used, rt.pool.slots_used, rt.host.used) == (0, 0, 0)


def test_a_waking_dropped_early_and_a_longer_park_of_the_same_sequence(rt: kr.Runtime) -> None:
    rt.reserve_host(16, 4)
    lease = rt.lease(64)
    _stamp(rt, lease, 0, 60, salt=5)
    first = rt.park_now(rt.checkpoint(lease, 32))
    used = rt.host.used
    longer = rt.park_now(rt.checkpoint(lease, 60))
    assert rt.host.used == used + 2 + 16, "only pages 2, 3 and the slot are new"
    assert longer.units[:2] == first.units[:2]
    lease.release()
    rt.wake(longer, 60, 64).release()  # dropped before it landed: waits, then gives back
    assert rt.pool.pages_used == 0
    woken = rt.wake_now(longer, 60, 64)
    _check(rt, woken.pages, 60, salt=5)
    for h in (woken, first, longer):
        h.release()


def test_remaps_while_graphs_replay_never_touch_a_live_sequence(kdir: Path, sha: str, tmp_path: Path) -> None:
    m = build.write_manifest(tmp_path / "r.json", manifests.remapping(sha))
    slot_bytes = 32 << 20
    with kr.Runtime.load(m, kdir, capacity=kr.Capacity(tokens=32768, seqs=1)) as rt:
        rt.load_weights(kr.Safetensors.parse(_st_bytes({})))
        lease = rt.lease(32)
        _stamp(rt, lease, 0, 32, salt=7)
        state = np.random.default_rng(9).integers(0, 255, slot_bytes, dtype=np.uint8)
        rt.write_state("ssm", (lease.state_slot or 0) * slot_bytes, state)
        held = [rt.lease_slot(), rt.lease_slot()]  # slots 0..2 exist from the start
        for round_ in (1, 2):  # slot 3 shares slot 2's chunk; slot 4 takes a chunk from the pages
            for _ in range(30):
                rt.issue("spin", {})
            with pytest.raises(kern_pool.Remapping):
                rt.lease_slot(wait=False)  # a plan starts on the background thread
            assert rt.remapping and rt.pool.remaps == round_
            for _ in range(30):
                rt.issue("spin", {})
            rt.settle()
            assert not rt.remapping
            fresh = rt.lease_slot(wait=False)
            held.append(fresh)
            assert fresh.state_slot == 2 + round_ and rt.pool.remaps == round_
            assert not rt.read_state("ssm", fresh.state_slot * slot_bytes, slot_bytes).any()
            _check(rt, lease.pages, 32, salt=7)
            np.testing.assert_array_equal(rt.read_state("ssm", (lease.state_slot or 0) * slot_bytes, slot_bytes), state)
        for h in [*held, lease]:
            h.release()


def test_capacity_of_all_free_memory_leaves_the_headroom(kdir: Path, sha: str, tmp_path: Path) -> None:
    doc = copy.deepcopy(manifests.pooled(sha))
    doc["states"]["kv"]["bytes_per_token"] = 1 << 16  # 1 MiB pages: a pool of ~10^5 pages
    m = build.write_manifest(tmp_path / "f.json", doc)
    with kr.Runtime.load(m, kdir, capacity=kr.Capacity(tokens=None, seqs=2)) as rt:
        rt.synchronize()
        free = drv.mem_get_info()[0]
        chunk = rt.pool.config.chunk
        assert kern_pool.HEADROOM - (256 << 20) <= free <= kern_pool.HEADROOM + chunk + (256 << 20), free
        assert rt.pool.config.first_slots == 4 and rt.pool.pages_free * (1 << 20) >= 8 << 30
        lease = rt.lease(64 * UNIT)
        assert not rt.read_state("kv", lease.pages[-1] * (1 << 20), 1 << 20).any()
        lease.release()


def test_two_paged_states_park_and_wake_through_2d_copies(kdir: Path, sha: str, tmp_path: Path) -> None:
    """A second paged state makes a host page two states side by side: runs move as 2-D copies."""
    m = build.write_manifest(tmp_path / "two.json", manifests.two_paged(sha))
    sizes = {"kv": UNIT * TOKEN, "kv2": UNIT * 8192}
    with kr.Runtime.load(m, kdir, capacity=kr.Capacity(tokens=512, seqs=1)) as rt:
        rt.load_weights(kr.Safetensors.parse(_st_bytes({})))
        host = rt.reserve_host(8, 1)
        assert (host.page_units, host.slot_units) == (3, 16)
        lease = rt.lease(80)
        rng = np.random.default_rng(11)
        data = {(s, p): rng.integers(0, 255, n, dtype=np.uint8) for s, n in sizes.items() for p in lease.pages}
        for (s, p), d in data.items():
            rt.write_state(s, p * sizes[s], d)
        cp = rt.retire(lease, 80)
        room = rt.room(cp)
        assert isinstance(room, kern_pool.Room)
        parked = rt.park(room)
        rt.synchronize()
        for (s, p), d in data.items():
            rt.write_state(s, p * sizes[s], np.zeros_like(d))
        woken = rt.wake_now(parked, 80, 96)
        old = sorted({p for _, p in data})
        for (s, p), d in data.items():
            np.testing.assert_array_equal(rt.read_state(s, woken.pages[old.index(p)] * sizes[s], sizes[s]), d, err_msg=f"{s} page {p}")
        woken.release()
        parked.release()


def test_a_call_right_after_a_staged_wake_lands_after_its_own_slice(kdir: Path, sha: str, tmp_path: Path) -> None:
    """kv pages as two slices. The stamp program's first call writes bytes [32768, 33792) of page
    0, in slice 1, right after `wake_now` queued 64 MiB of copies (slice 0 of every page first).
    Eagerly and from a graph captured before the wake, its bytes must land after that slice's
    copy (without the wait the copy lands last), and every other byte must be the parked one."""
    doc = copy.deepcopy(manifests.pooled(sha))
    pages = 1024
    doc["states"]["kv"]["slices"] = 2
    doc["buffers"]["bt"]["shape"] = [1, pages]  # a row of 1,024 pages: one lease of 64 MiB
    m = build.write_manifest(tmp_path / "sliced.json", doc)
    size = pages * UNIT * TOKEN
    with kr.Runtime.load(m, kdir, capacity=kr.Capacity(tokens=2 * pages * UNIT, seqs=2)) as rt:
        rt.load_weights(kr.Safetensors.parse(_st_bytes({})))
        rt.reserve_host(pages, 2)
        graph = rt.capture_graph("stamp", {})
        rng = np.random.default_rng(21)
        data = rng.integers(0, 255, size, dtype=np.uint8)
        state = rng.integers(0, 255, 1 << 20, dtype=np.uint8)
        lease = rt.lease(pages * UNIT)
        assert lease.pages == tuple(range(pages)), "one run of pages from page 0 (the stamp writes page 0)"
        rt.write_state("kv", 0, data)
        rt.write_state("ssm", (lease.state_slot or 0) << 20, state)
        parked = rt.park_now(rt.checkpoint(lease, pages * UNIT))
        lease.release()
        want = data.copy()
        want[32768:33792] = np.arange(7, 7 + 128, dtype=np.int64).view(np.uint8)
        for form in ("eager", "graph"):
            rt.write_state("kv", 0, np.zeros(size, np.uint8))
            woken = rt.wake_now(parked, pages * UNIT, pages * UNIT)
            assert woken.pages == tuple(range(pages))
            if form == "eager":
                rt.run("stamp", {})
            else:
                rt.replay(graph, {})
            rt.synchronize()
            np.testing.assert_array_equal(rt.read_state("kv", 0, size), want, err_msg=form)
            want_slot = state.copy()
            if woken.state_slot == 0:  # the stamp's second call writes slot 0
                want_slot[1 << 19:(1 << 19) + 1024] = np.arange(9, 9 + 128, dtype=np.int64).view(np.uint8)
            np.testing.assert_array_equal(_slot(rt, woken.state_slot), want_slot, err_msg=form)
            woken.release()
        parked.release()
        assert (rt.pool.pages_used, rt.pool.slots_used, rt.host.used) == (0, 0, 0)
