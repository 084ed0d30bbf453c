"""gpu_import's decision: a module the gpu tests need is returned, fails a run on a machine with a
CUDA device when missing (one line naming the command that installs it), and skips without one."""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
from helpers.gpu_deps import GPU_TEST_COMMAND, NO_DEVICE, gpu_import

ROOT = Path(__file__).resolve().parents[2]


def _missing(name: str) -> Callable[[str], ModuleType]:
    """A fake importlib.import_module that finds no module `name`."""

    def importer(wanted: str) -> ModuleType:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    return importer


class _Devices:
    """A fake device count that records whether it was asked."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.asked = 0

    def __call__(self) -> int:
        self.asked += 1
        return self.n


def test_missing_module_on_a_machine_with_a_device_fails_with_one_line() -> None:
    with pytest.raises(pytest.fail.Exception) as info:
        gpu_import("torch", devices=_Devices(1), importer=_missing("torch"))
    assert str(info.value) == (
        "torch is missing: run the GPU tests with "
        "`uv run --locked --group gpu --group gpu-test pytest -m gpu`"
    )
    assert info.value.pytrace is False and info.value.__context__ is None


def test_missing_module_without_a_device_skips_like_the_gpu_marker() -> None:
    with pytest.raises(pytest.skip.Exception) as info:
        gpu_import("cupy", devices=_Devices(0), importer=_missing("cupy"))
    assert str(info.value) == NO_DEVICE
    assert info.value.allow_module_level


def test_present_module_is_returned_without_asking_for_a_device() -> None:
    fake = ModuleType("transformers")
    devices = _Devices(1)
    assert gpu_import("transformers", devices=devices, importer=lambda name: fake) is fake
    assert devices.asked == 0


def test_a_missing_dependency_of_an_installed_module_is_its_own_error_on_a_gpu_host() -> None:
    with pytest.raises(ModuleNotFoundError, match="sympy"):
        gpu_import("torch", devices=_Devices(1), importer=_missing("sympy"))


def test_a_broken_install_is_its_own_error_on_a_gpu_host() -> None:
    def broken(name: str) -> ModuleType:
        raise ImportError("libcudnn.so.9: cannot open shared object file")

    with pytest.raises(ImportError, match="libcudnn"):
        gpu_import("torch", devices=_Devices(1), importer=broken)
    with pytest.raises(pytest.skip.Exception):
        gpu_import("torch", devices=_Devices(0), importer=broken)


def test_the_command_names_the_groups_that_install_the_modules() -> None:
    groups = tomllib.loads((ROOT / "pyproject.toml").read_text())["dependency-groups"]
    wanted = {"torch", "transformers", "cupy-cuda13x"}
    assert wanted <= {req.split(">")[0].split("=")[0] for req in groups["gpu-test"]}
    assert "gpu" in groups
    assert GPU_TEST_COMMAND.split() == [
        "uv", "run", "--locked", "--group", "gpu", "--group", "gpu-test", "pytest", "-m", "gpu",
    ]  # fmt: skip
