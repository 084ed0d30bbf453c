"""Yardsticks measured on the device itself, for floors that benchmarks set beside their timings."""

from __future__ import annotations

from contextlib import ExitStack

import numpy as np

from . import _driver as drv
from . import memory
from .errors import ApiError

__all__ = ["copy_rate", "device_count"]

_SEED_BYTES = 1 << 20


def device_count() -> int:
    """NVIDIA devices visible to this process, through the driver shell.

    Raises:
        NoDriverError: no libcuda on this machine.
        CudaError: cuInit or cuDeviceGetCount fails (no device usable by this driver).
    """
    return drv.device_count()


def _fill_random(ptr: int, nbytes: int, stream: object) -> None:
    """Random bytes in the first MiB, then doubled device-side until `nbytes` hold them."""
    seed = np.random.default_rng(0).integers(0, 256, size=min(_SEED_BYTES, nbytes), dtype=np.uint8)
    drv.copy_htod(ptr, seed.ctypes.data, seed.nbytes)
    done = seed.nbytes
    while done < nbytes:
        n = min(done, nbytes - done)
        drv.copy_dtod_async(ptr + done, ptr, n, stream)
        done += n
    drv.stream_synchronize(stream)


def copy_rate(gpu: int = 0, *, nbytes: int = 1 << 31, reps: int = 20) -> float:
    """Device-to-device copy rate of `gpu` in bytes per second, counting each byte read and each
    byte written (the rate a kernel that streams its operands once can reach): a buffer of
    `nbytes` random bytes copied `reps` times between CUDA events, after 3 untimed copies.

    Raises:
        ApiError: `gpu` does not exist, or a size or count below 1.
        NoDriverError: no NVIDIA driver. CudaError: the copies failed (e.g. out of memory).
    """
    if nbytes < 1 or reps < 1:
        raise ApiError(f"copy_rate needs nbytes >= 1 and reps >= 1, got {nbytes} and {reps}")
    drv.init()
    if not 0 <= gpu < drv.device_count():
        raise ApiError(f"gpu {gpu} does not exist ({drv.device_count()} devices)")
    dev = drv.device(gpu)
    with ExitStack() as stack:
        drv.primary_context(dev)
        stack.callback(drv.release_primary_context, dev)
        stream = drv.stream_create()
        stack.callback(drv.stream_destroy, stream)
        src, dst = memory.device(stack, nbytes), memory.device(stack, nbytes)
        start, end = drv.event_create(), drv.event_create()
        stack.callback(drv.event_destroy, start)
        stack.callback(drv.event_destroy, end)
        _fill_random(src.ptr, nbytes, stream)
        for _ in range(3):
            drv.copy_dtod_async(dst.ptr, src.ptr, nbytes, stream)
        drv.event_record(start, stream)
        for _ in range(reps):
            drv.copy_dtod_async(dst.ptr, src.ptr, nbytes, stream)
        drv.event_record(end, stream)
        drv.stream_synchronize(stream)
        seconds = drv.event_elapsed_ms(start, end) / 1e3
    return 2 * nbytes * reps / seconds
