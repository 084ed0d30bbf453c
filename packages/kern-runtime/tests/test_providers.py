"""Model families through the `kern.providers` entry points (the Qwen3 provider is installed in the
workspace), and the driver shell's device count."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

import kern_runtime as kr
from kern_runtime import _driver as drv  # pyright: ignore[reportPrivateUsage]
from kern_runtime import providers

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def _manifest(name: str) -> dict[str, Any]:
    return json.loads((EXAMPLES / name).read_text())


@pytest.mark.parametrize("name", ["qwen3-tiny.json", "qwen3-4b.json", "qwen3-4b-fast.json", "qwen3-tiny-batch.json"])
def test_the_qwen3_provider_knows_the_qwen3_manifests(name: str) -> None:
    from kern_qwen3.provider import QWEN3

    found = providers.find(_manifest(name))
    assert found is QWEN3 and found.name == "qwen3"
    assert isinstance(found, kr.Provider)


def test_the_qwen3_entry_point_is_installed() -> None:
    from kern_qwen3.provider import QWEN3

    assert QWEN3 in providers.installed()
    typed: kr.Provider = QWEN3  # NOTE: pyright checks the registration against the protocol here
    assert typed.stop_texts == ("<|im_end|>", "<|endoftext|>")


def test_a_manifest_of_an_unknown_family_is_one_line() -> None:
    with pytest.raises(kr.ProviderError) as info:
        providers.find(_manifest("tiny.json"))
    line = str(info.value)
    assert line == "no installed model provider knows model 'tiny-lm' (installed families: qwen3)"
    assert isinstance(info.value, kr.ApiError)


@dataclass(frozen=True)
class _Family:
    name: str
    prefixes: tuple[str, ...]
    stop_texts: tuple[str, ...] = ()
    special_texts: tuple[str, ...] = ()
    errors: tuple[type[Exception], ...] = ()
    generator: str = "gen"

    def render(self, messages: Sequence[Mapping[str, str]]) -> str:
        return ""

    def random_checkpoint(self, manifest: Mapping[str, Any], progress: Any) -> tuple[Path, str, bool]:
        return Path(), "", False

    def prefill_flops(self, config: Mapping[str, Any], tokens: int) -> float:
        return 0.0


def test_names_are_cut_short_and_two_claims_are_refused() -> None:
    long = _Family("f" * 300, ("llama",))
    with pytest.raises(kr.ProviderError, match=r"^no installed model provider knows model 'x{48}\.\.\.\(500 chars\)' "
                       r"\(installed families: f{48}\.\.\.\(300 chars\)\)$"):
        providers.find({"model": "x" * 500}, [long])
    with pytest.raises(kr.ProviderError, match=r"^no installed model provider knows model '' \(installed families: none\)$"):
        providers.find({}, [])
    with pytest.raises(kr.ProviderError, match=r"^model 'llama-3' is claimed by several providers: a, b$"):
        providers.find({"model": "llama-3"}, [replace(long, name="b"), replace(long, name="a")])
    assert providers.find({"model": "Llama-3"}, [long]) is long


def test_device_count_goes_through_the_driver_shell(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_lib(_flags: int) -> object:
        raise RuntimeError("libcuda.so.1 not found")

    monkeypatch.setattr(drv, "_initialized", False)
    monkeypatch.setattr(drv.cu, "cuInit", no_lib)
    with pytest.raises(kr.NoDriverError, match=r"libcuda\.so\.1 not found"):
        kr.device_count()
