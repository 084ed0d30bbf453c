"""Repository-wide pytest hooks: `gpu` tests run wherever a CUDA device exists."""

from __future__ import annotations

import functools

import pytest
from hypothesis import HealthCheck, settings

# NOTE: CI runs on 2 shared cores; a property's speed is not what it asserts. Tests that set their
# own @settings inherit these two fields.
settings.register_profile("kern", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("kern")


@functools.cache
def _cuda_device_count() -> int:
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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda_device_count() > 0:
        return
    skip = pytest.mark.skip(reason="no CUDA device on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
