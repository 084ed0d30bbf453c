"""Repository-wide pytest hooks: `gpu` tests run wherever a CUDA device exists; `gpus(n)` tests
(n CUDA devices) are deselected unless `--multi-gpu` is given, and then fail on a host with fewer
than n devices (a skipped multi-GPU test never reads as a pass).

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


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--multi-gpu", action="store_true",
                     help="run the gpus(n) tests; each fails on a host with fewer than n CUDA devices")


def _gpus(item: pytest.Item) -> int:
    mark = item.get_closest_marker("gpus")
    return int(mark.args[0]) if mark is not None else 0


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    need, have = _gpus(item), cuda_device_count()
    if need > have > 0:
        pytest.fail(f"needs {need} CUDA devices, this host shows {have}: run it on a host with {need} or more "
                    "(it is deselected without --multi-gpu)", pytrace=False)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--multi-gpu"):
        dropped = [item for item in items if _gpus(item)]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = [item for item in items if not _gpus(item)]
    if cuda_device_count() > 0:
        return
    skip = pytest.mark.skip(reason=NO_DEVICE)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
