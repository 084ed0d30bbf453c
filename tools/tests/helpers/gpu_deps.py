"""What the gpu-marked tests need besides kern: a device, and the `gpu-test` group's modules.

`gpu_import("torch")` stands where `pytest.importorskip("torch")` would: on a machine with a CUDA
device a missing module fails the test (or its module's collection) with one line naming the
command that installs it, so a GPU run never reports green over skipped tests; on a machine
without one it skips, as the `gpu` marker does there (conftest.py).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from types import ModuleType

import pytest

__all__ = ["GPU_TEST_COMMAND", "NO_DEVICE", "cuda_device_count", "gpu_import", "missing_line"]

GPU_TEST_COMMAND = "uv run --locked --group gpu --group gpu-test pytest -m gpu"
"""Runs the gpu-marked tests with what they need (pyproject.toml's `gpu` and `gpu-test` groups)."""

NO_DEVICE = "no CUDA device on this machine"
"""The skip reason of every gpu-marked test on a machine without a CUDA device."""


@functools.cache
def cuda_device_count() -> int:
    """CUDA devices the driver reports; 0 without cuda-bindings, a driver or a device."""
    try:
        from cuda.bindings import driver
    except ImportError:
        return 0
    try:
        (err,) = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            return 0
        err, count = driver.cuDeviceGetCount()
    except Exception:  # no driver library at all (cuda-pathfinder raises)
        return 0
    return int(count) if err == driver.CUresult.CUDA_SUCCESS else 0


def missing_line(name: str) -> str:
    """The one line a GPU run fails with when `name` is not installed."""
    return f"{name} is missing: run the GPU tests with `{GPU_TEST_COMMAND}`"


def gpu_import(
    name: str,
    *,
    devices: Callable[[], int] = cuda_device_count,
    importer: Callable[[str], ModuleType] = importlib.import_module,
) -> ModuleType:
    """The module `name`; without it, a failure where a device exists and a skip where none does.

    Usable at module level (the skip is module-level) and inside a test. A module that is
    installed but fails to import on a machine with a device raises its own error.
    """
    try:
        return importer(name)
    except ImportError as exc:
        error = exc
    # NOTE: outside the except clause, so that the failure shows its one line, not the import's.
    if devices() == 0:
        pytest.skip(NO_DEVICE, allow_module_level=True)
    if isinstance(error, ModuleNotFoundError) and error.name in (name, name.partition(".")[0]):
        pytest.fail(missing_line(name), pytrace=False)
    raise error
