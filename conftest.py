"""Repository-wide pytest hooks: `gpu` tests run wherever a CUDA device exists.

The device count and the skip reason live in tools/tests/helpers/gpu_deps.py, beside `gpu_import`,
which fails a gpu test whose modules are missing on a machine with a device.
"""

from __future__ import annotations

import pytest
from helpers.gpu_deps import NO_DEVICE, cuda_device_count
from hypothesis import HealthCheck, settings

# NOTE: CI runs on 2 shared cores; a property's speed is not what it asserts. Tests that set their
# own @settings inherit these two fields.
settings.register_profile("kern", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("kern")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if cuda_device_count() > 0:
        return
    skip = pytest.mark.skip(reason=NO_DEVICE)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
