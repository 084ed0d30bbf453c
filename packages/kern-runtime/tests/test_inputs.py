"""The row's input rules (kern_runtime.inputs: prompt, capacity, block table, weight files, widen)
and `Runtime.open` (load, summary, weights; closed when they fail) on fakes (no GPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kern_runtime as kr
from kern_manifest import Manifest

from .helpers.manifests import parsed, serving
from .helpers.recording import FakeRuntime


def _roles(**domains: Any) -> kr.ServingRoles:
    m = serving()
    for name, domain in domains.items():
        m["buffers"][name]["domain"] = domain
    return kr.serving_roles(parsed(m))


def test_capacity_and_pages_that_do_not_fit() -> None:
    with pytest.raises(kr.PromptError, match="capacity 101 exceeds the model's reach of 100 positions"):
        kr.check_capacity(_roles(pos={"min": 0, "max": 99}, bt={"index_into": "kv", "stride": 16}), 101)
    with pytest.raises(kr.PromptError, match="exceeds the model's reach of 64 positions"):
        kr.check_capacity(_roles(), 65)
    with pytest.raises(kr.PromptError, match="65 pages do not fit the block table of 64"):
        kr.block_table(_roles(), 64, list(range(65)))
    with pytest.raises(kr.PromptError, match="31 pages hold 496 tokens; capacity 512 needs 32"):
        kr.block_table(_roles(bt={"index_into": "kv", "stride": 16}), 512, list(range(31)))
    with pytest.raises(kr.PromptError, match="at least 1 token"):
        kr.check_capacity(_roles(), 0)
    assert issubclass(kr.PromptError, kr.ApiError)


def test_block_table_holds_the_pages_then_page_0() -> None:
    roles = _roles(bt={"index_into": "kv", "stride": 16})
    assert kr.block_table(roles, 100).tolist() == [*range(7), *[0] * 57]
    assert kr.block_table(roles, 32, [5, 9]).tolist()[:3] == [5, 9, 0]


def test_widen_is_exact_for_bf16() -> None:
    assert kr.widen(np.array([0x3F80, 0xC000], dtype=np.uint16)).tolist() == [1.0, -2.0]
    assert kr.widen(np.array([0.5], dtype=np.float16)).tolist() == [0.5]


def test_weight_files(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "b.safetensors").write_bytes(b"")
    (tmp_path / "d" / "a.safetensors").write_bytes(b"")
    (tmp_path / "f.safetensors").write_bytes(b"")
    files = kr.weight_files([tmp_path / "d", tmp_path / "f.safetensors"])
    assert [f.name for f in files] == ["a.safetensors", "b.safetensors", "f.safetensors"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(kr.InputFileError, match=r"empty: directory holds no \.safetensors"):
        kr.weight_files([tmp_path / "empty"])
    with pytest.raises(kr.InputFileError, match="nope: no such file"):
        kr.weight_files([tmp_path / "nope"])


@pytest.fixture
def paged_manifest() -> Manifest:
    m = serving()
    m["states"] = {"kv": {"bytes_per_token": 64}}
    m["buffers"]["bt"]["domain"] = {"index_into": "kv", "stride": 16}
    return parsed(m)


def test_runtime_open_loads_logs_and_fills_the_weights(paged_manifest: Manifest, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}
    rt = FakeRuntime()

    def load(manifest: Manifest, kernels: Path, *, gpu: int, capacity: kr.Capacity) -> FakeRuntime:
        seen.update(manifest=manifest, gpu=gpu, capacity=capacity)
        return rt

    monkeypatch.setattr(kr.Runtime, "load", staticmethod(load))
    monkeypatch.setattr(kr.Safetensors, "open", staticmethod(lambda paths: None))
    logs: list[str] = []
    got = kr.Runtime.open(paged_manifest, tmp_path, [tmp_path / "w.safetensors"], gpu=2,
                          capacity=kr.Capacity(tokens=112, seqs=1), log=logs.append)
    assert got is rt and seen == {"manifest": paged_manifest, "gpu": 2, "capacity": kr.Capacity(tokens=112, seqs=1)}
    assert ("load_weights",) in rt.calls and logs == ["fake runtime"] and not rt.closed


def test_runtime_open_closes_the_runtime_when_weights_fail(paged_manifest: Manifest, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    rt = FakeRuntime()

    def bad_weights(*args: object, **kw: object) -> None:
        raise kr.WeightArtifactError("tensor w: shape differs")

    rt.load_weights = bad_weights  # type: ignore[method-assign]
    monkeypatch.setattr(kr.Runtime, "load", staticmethod(lambda *a, **k: rt))
    monkeypatch.setattr(kr.Safetensors, "open", staticmethod(lambda paths: None))
    with pytest.raises(kr.WeightArtifactError):
        kr.Runtime.open(paged_manifest, tmp_path, [], gpu=0, capacity=kr.Capacity(tokens=64, seqs=1))
    assert rt.closed


def _reference_check(top: int | None, capacity: int, prompt: Any) -> str | None:
    """check_prompt as min and max over the ids judged it: its message, or None when accepted."""
    if not prompt:
        return "the prompt is empty"
    if min(prompt) < 0 or (top is not None and max(prompt) > top):
        bad = next(t for t in prompt if t < 0 or (top is not None and t > top))
        return f"prompt id {bad} is outside the model's token ids 0..{top}"
    if len(prompt) > capacity:
        return f"the prompt has {len(prompt)} tokens; capacity is {capacity}"
    return None


def _checked(roles: kr.ServingRoles, capacity: int, prompt: Any) -> str | None:
    try:
        kr.check_prompt(roles, capacity, prompt)
    except kr.PromptError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize(
    ("prompt", "expect"),
    [
        ([0, 4095], None),
        ((7,) * 9, None),
        ([True, False, 3], None),
        ([np.int64(5), np.uint16(4095)], None),
        ([1.5, 2.0], None),  # not ids, but inside 0..4095: the index refuses them later
        (b"\x00\x01\xff", None),  # a bytes prompt is its byte values, not raw memory
        ([1, -2, -3], "prompt id -2 is outside"),
        ([np.int64(-1)], "prompt id -1 is outside"),
        ([4096], "prompt id 4096 is outside"),
        ([3, 2**64], f"prompt id {2**64} is outside"),
        ([-(2**70), 5], f"prompt id {-(2**70)} is outside"),
        ([1.5, 4096.5], "prompt id 4096.5 is outside"),
        ((), "the prompt is empty"),
        (list(range(17)), "the prompt has 17 tokens; capacity is 16"),
    ],
)
def test_check_prompt_judges_ids_as_min_and_max_do(prompt: Any, expect: str | None) -> None:
    roles = _roles(ids={"min": 0, "max": 4095})
    got = _checked(roles, 16, prompt)
    assert got == _reference_check(4095, 16, prompt)
    assert (got is None) if expect is None else (got is not None and got.startswith(expect))


def test_check_prompt_without_a_token_bound_refuses_only_negative_ids() -> None:
    roles = _roles()
    assert roles.token_max is None
    assert _checked(roles, 8, [2**64 + 1, 0]) is None and _checked(roles, 8, [2**63, 1]) is None
    assert _checked(roles, 8, [5, -1]) == "prompt id -1 is outside the model's token ids 0..None"


def test_check_prompt_refuses_what_comparisons_refuse() -> None:
    roles = _roles(ids={"min": 0, "max": 4095})
    with pytest.raises(TypeError):
        kr.check_prompt(roles, 16, [1, "2"])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        kr.check_prompt(roles, 16, "ab")  # type: ignore[arg-type]


@given(st.lists(st.one_of(st.integers(-3, 5000), st.integers(2**63 - 2, 2**64 + 2), st.booleans()), max_size=40),
       st.sampled_from([list, tuple]))
@settings(max_examples=300, deadline=None)
def test_check_prompt_agrees_with_min_and_max(ids: list[int], kind: type) -> None:
    roles = _roles(ids={"min": 0, "max": 4095})
    prompt = kind(ids)
    assert _checked(roles, 30, prompt) == _reference_check(4095, 30, prompt)
