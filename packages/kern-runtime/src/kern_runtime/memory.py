"""Device, VMM and pinned host memory owned by one Runtime.

Every allocation registers its release on the owner's ExitStack, so a failed load unwinds
everything it allocated and `close()` releases in reverse order. Pinned blocks that copies to and
from one GPU use are allocated with the calling thread's memory policy preferring the GPU's NUMA
node (`numa_node`, `preferring_node`), restored afterwards.
"""

from __future__ import annotations

import ctypes
import os
import platform
from collections.abc import Generator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import kern_pool
from kern_manifest import State

from . import _driver as drv

__all__ = [
    "ALIGN",
    "Allocation",
    "Mempolicy",
    "Shared",
    "align_up",
    "host_near",
    "map_imported",
    "numa_node",
    "preferring_node",
    "shareable",
    "state_size",
]

ALIGN = 256


def align_up(n: int, a: int) -> int:
    """The smallest multiple of `a` that is >= n."""
    return -(-n // a) * a


def state_size(state: State, tokens: int, seqs: int, unit: int, granularity: int) -> tuple[int, int, str]:
    """(bytes, physical chunk, note) of one state's VMM arena.

    A paged state holds `tokens` tokens rounded up to whole chunks; a per-seq state `seqs + 2`
    slots; a fixed state its bytes. Chunk sizes follow kern_pool (`unit` tokens per page).
    """
    if state.bytes_per_token is not None:
        chunk = align_up(kern_pool.chunk_bytes(state.bytes_per_token * unit), granularity)
        nbytes = align_up(tokens * state.bytes_per_token, chunk)
        held = nbytes // state.bytes_per_token // unit * unit
        return nbytes, chunk, f"paged, {held} tokens"
    if state.bytes_per_seq is not None:
        chunk = align_up(kern_pool.chunk_bytes(state.bytes_per_seq), granularity)
        return align_up((seqs + 2) * state.bytes_per_seq, chunk), chunk, f"per-seq, {seqs + 2} slots"
    fixed = state.bytes or 0
    return fixed, align_up(max(fixed, 1), granularity), "fixed"


@dataclass(frozen=True, slots=True)
class Allocation:
    """One allocation: base address, usable bytes and where it lives ("device" | "vmm" | "host")."""

    ptr: int
    nbytes: int
    where: str


def device(stack: ExitStack, nbytes: int) -> Allocation:
    ptr = drv.mem_alloc(align_up(max(nbytes, 1), ALIGN))
    stack.callback(drv.mem_free, ptr)
    return Allocation(ptr, nbytes, "device")


def host(stack: ExitStack, nbytes: int) -> Allocation:
    ptr = drv.host_alloc(align_up(max(nbytes, 1), ALIGN))
    stack.callback(drv.host_free, ptr)
    return Allocation(ptr, nbytes, "host")


def vmm(stack: ExitStack, dev: Any, nbytes: int, chunk: int) -> Allocation:
    """Reserve an address range once, back it with physical chunks, map and grant access."""
    gran = drv.vmm_granularity(dev)
    chunk = align_up(chunk, gran)
    total = align_up(max(nbytes, 1), chunk)
    base = drv.vmm_reserve(total, gran)
    stack.callback(drv.vmm_free_address, base, total)
    for off in range(0, total, chunk):
        handle = drv.vmm_create(chunk, dev)
        stack.callback(drv.vmm_release, handle)
        drv.vmm_map(base + off, chunk, handle)
        stack.callback(drv.vmm_unmap, base + off, chunk)
    drv.vmm_set_access(base, total, dev)
    return Allocation(base, total, "vmm")


@dataclass(frozen=True, slots=True)
class Shared:
    """A VMM allocation whose chunks can be exported: the allocation, the handle kind, and each
    chunk's (offset, bytes, driver handle)."""

    alloc: Allocation
    kind: str
    chunks: tuple[tuple[int, int, Any], ...]


def shareable(stack: ExitStack, dev: Any, nbytes: int, chunk: int, kind: str) -> Shared:
    """`vmm` with chunks made exportable as `kind` ("fabric" or "posix_fd")."""
    gran = drv.vmm_granularity(dev)
    chunk = align_up(chunk, gran)
    total = align_up(max(nbytes, 1), chunk)
    base = drv.vmm_reserve(total, gran)
    stack.callback(drv.vmm_free_address, base, total)
    chunks: list[tuple[int, int, Any]] = []
    for off in range(0, total, chunk):
        handle = drv.vmm_create_shareable(chunk, dev, kind)
        stack.callback(drv.vmm_release, handle)
        drv.vmm_map(base + off, chunk, handle)
        stack.callback(drv.vmm_unmap, base + off, chunk)
        chunks.append((off, chunk, handle))
    drv.vmm_set_access(base, total, dev)
    return Shared(Allocation(base, total, "vmm"), kind, tuple(chunks))


def map_imported(stack: ExitStack, dev: Any, handles: list[tuple[int, int, Any]], total: int) -> int:
    """Maps imported chunk handles (offset, bytes, handle) into one fresh address range readable
    and writable by `dev`; returns its base. Released (unmapped, handles dropped) on `stack`."""
    base = drv.vmm_reserve(total, drv.vmm_granularity(dev))
    stack.callback(drv.vmm_free_address, base, total)
    for off, size, handle in handles:
        stack.callback(drv.vmm_release, handle)
        drv.vmm_map(base + off, size, handle)
        stack.callback(drv.vmm_unmap, base + off, size)
    drv.vmm_set_access(base, total, dev)
    return base


# -- NUMA placement of pinned blocks ---------------------------------------------------------------

MPOL_DEFAULT = 0
MPOL_PREFERRED = 1
_MASK_WORDS = 16  # NOTE: 1024 nodes; get_mempolicy needs maxnode >= the kernel's node count
_SYSCALLS = {"x86_64": (239, 238), "aarch64": (236, 237)}  # (get_mempolicy, set_mempolicy)


def numa_node(pci_bus_id: str, root: Path = Path("/sys")) -> int | None:
    """The NUMA node sysfs reports for a PCI device, or None (no file, no node, -1)."""
    path = root / "bus" / "pci" / "devices" / pci_bus_id / "numa_node"
    try:
        node = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


class Mempolicy(Protocol):
    """The calling thread's memory policy: `get() -> (mode, node mask)`, `set(mode, mask)`;
    either returns False where the system refuses."""

    def get(self) -> tuple[int, int] | None: ...

    def set(self, mode: int, mask: int) -> bool: ...


class _Syscalls:
    """get_mempolicy / set_mempolicy through libc's syscall() (glibc has no wrapper)."""

    def __init__(self) -> None:
        self._nums = _SYSCALLS.get(platform.machine())
        self._libc = ctypes.CDLL(None, use_errno=True) if self._nums and os.name == "posix" else None

    def get(self) -> tuple[int, int] | None:
        if self._libc is None or self._nums is None:
            return None
        mode = ctypes.c_int(0)
        mask = (ctypes.c_ulong * _MASK_WORDS)()
        nbits = ctypes.c_ulong(_MASK_WORDS * 64 + 1)
        rc = self._libc.syscall(ctypes.c_long(self._nums[0]), ctypes.byref(mode), mask, nbits, None, ctypes.c_ulong(0))
        if rc != 0:
            return None
        return mode.value, sum(int(w) << (64 * i) for i, w in enumerate(mask))

    def set(self, mode: int, mask: int) -> bool:
        if self._libc is None or self._nums is None:
            return False
        words = (ctypes.c_ulong * _MASK_WORDS)(*[(mask >> (64 * i)) & (2**64 - 1) for i in range(_MASK_WORDS)])
        nbits = ctypes.c_ulong(_MASK_WORDS * 64 + 1 if mask else 0)
        rc = self._libc.syscall(ctypes.c_long(self._nums[1]), ctypes.c_int(mode), words if mask else None, nbits)
        return rc == 0


@contextmanager
def preferring_node(node: int | None, policy: Mempolicy | None = None) -> Generator[bool]:
    """Within the block the calling thread's allocations prefer NUMA `node`; the policy it had
    is restored after. Yields whether the preference was set (None, or a system that refuses,
    leaves the policy alone)."""
    if node is None or not 0 <= node < _MASK_WORDS * 64:
        yield False
        return
    pol = _Syscalls() if policy is None else policy
    saved = pol.get()
    if saved is None or not pol.set(MPOL_PREFERRED, 1 << node):
        yield False
        return
    try:
        yield True
    finally:
        mode, mask = saved
        pol.set(mode, mask if mode != MPOL_DEFAULT else 0)


def host_near(stack: ExitStack, dev: Any, nbytes: int, root: Path = Path("/sys")) -> Allocation:
    """One pinned block (`cuMemHostAlloc`) whose pages the GPU's NUMA node holds when sysfs names
    one; released on `stack`."""
    try:
        node = numa_node(drv.device_pci_bus_id(dev), root)
    except ValueError:  # NOTE: an address sysfs would not spell: no preference
        node = None
    with preferring_node(node):
        ptr = drv.host_alloc(align_up(max(nbytes, 1), ALIGN))
    stack.callback(drv.host_free, ptr)
    return Allocation(ptr, nbytes, "host")
