"""Device, VMM and pinned host memory owned by one Runtime.

Every allocation registers its release on the owner's ExitStack, so a failed load unwinds
everything it allocated and `close()` releases in reverse order.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import kern_pool
from kern_manifest import State

from . import _driver as drv

__all__ = ["ALIGN", "Allocation", "align_up", "state_size"]

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
