"""Device, VMM and pinned host memory owned by one Runtime.

Every allocation registers its release on the owner's ExitStack, so a failed load unwinds
everything it allocated and `close()` releases in reverse order.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from . import _driver as drv

__all__ = ["ALIGN", "MAX_CHUNK", "Allocation", "align_up", "chunk_bytes"]

ALIGN = 256
MAX_CHUNK = 64 << 20


def align_up(n: int, a: int) -> int:
    """The smallest multiple of `a` that is >= n."""
    return -(-n // a) * a


def chunk_bytes(smallest_object: int, granularity: int) -> int:
    """Physical chunk size for a pooled state: a multiple of the granularity, at most half the
    smallest object it holds, capped at 64 MiB; objects under two granules take the cap."""
    if smallest_object < 2 * granularity:
        return MAX_CHUNK
    half = (smallest_object // 2) // granularity * granularity
    return max(granularity, min(MAX_CHUNK, half))


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
