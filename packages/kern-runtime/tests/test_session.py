"""Session on a recording fake runtime: what it writes and runs, and what it refuses (no GPU).
The same calls on the H200 are checked by tools/tests/test_qwen3_gpu.py."""

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


class FakeRuntime:
    """The slice of Runtime a Session uses; records every call, answers next tokens 100, 101, ..."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.inputs: dict[str, np.ndarray] = {}
        self.next = 100
        self.closed = False

    def write_input(self, name: str, array: Any) -> None:
        self.inputs[name] = np.asarray(array).copy()
        self.calls.append(("write", name, self.inputs[name].tolist()))

    def run(self, program: str, vars: dict[str, int]) -> None:
        self.calls.append(("run", program, dict(vars)))

    def issue(self, program: str, vars: dict[str, int]) -> None:
        self.calls.append(("issue", program, dict(vars)))

    def read_output(self, name: str) -> np.ndarray:
        self.next += 1
        return np.array([self.next - 1], dtype=np.int64)

    def summary(self) -> str:
        return "fake runtime"

    def load_weights(self, *args: object, **kw: object) -> None:
        self.calls.append(("load_weights",))

    def close(self) -> None:
        self.closed = True


def _roles(**domains: Any) -> kr.ServingRoles:
    m = serving()
    for name, domain in domains.items():
        m["buffers"][name]["domain"] = domain
    return kr.serving_roles(parsed(m))


def _session(capacity: int = 64, pages: list[int] | None = None, **domains: Any) -> tuple[kr.Session, FakeRuntime]:
    rt = FakeRuntime()
    return kr.Session(rt, _roles(**domains), capacity, pages=pages), rt  # type: ignore[arg-type]


def test_block_table_holds_the_pages_then_page_0() -> None:
    s, rt = _session(capacity=100, bt={"index_into": "kv", "stride": 16})
    assert rt.inputs["bt"].tolist() == [*range(7), *[0] * 57] == s.table.tolist()
    s, rt = _session(capacity=32, pages=[5, 9], bt={"index_into": "kv", "stride": 16})
    assert rt.inputs["bt"].tolist()[:3] == [5, 9, 0]


def test_prefill_runs_chunks_then_stages_the_last_token() -> None:
    s, rt = _session(capacity=64, pages=[3, 1, 2, 0], bt={"index_into": "kv", "stride": 16})
    rt.calls.clear()
    prompt = list(range(10, 30))  # 20 tokens: 19 through the chunk program in chunks of 8
    s.prefill(prompt, chunk=8)
    runs = [c for c in rt.calls if c[0] == "run"]
    assert runs == [("run", "chunk", {"tokens": 8}), ("run", "chunk", {"tokens": 8}), ("run", "chunk", {"tokens": 3})]
    first_slots = next(c[2] for c in rt.calls if c[:2] == ("write", "sl"))
    assert first_slots == [3 * 16 + i for i in range(8)]  # positions 0..7 on page 3
    assert (rt.inputs["ids"].tolist(), rt.inputs["pos"].tolist(), rt.inputs["len"].tolist()) == ([29], [19], [20])
    assert rt.inputs["sl"].tolist() == [1 * 16 + 3]  # position 19: page 1, offset 3
    assert s.seen == 19


def test_chunks_are_capped_by_the_chunk_var() -> None:
    s, rt = _session(capacity=512, bt={"index_into": "kv", "stride": 16})
    s.prefill(list(range(300)), chunk=4096)
    assert [c[2] for c in rt.calls if c[:2] == ("run", "chunk")] == [{"tokens": 256}, {"tokens": 43}]


def test_steps_issue_the_step_and_feed_the_token_back() -> None:
    s, rt = _session(capacity=8)
    s.prefill([1, 2, 3], chunk=16)
    rt.calls.clear()
    assert s.generate([1, 2, 3], 2, chunk=16) == [100, 101]
    assert ("issue", "step", {"tokens": 1}) in rt.calls
    assert (rt.inputs["ids"].tolist(), rt.inputs["pos"].tolist()) == ([101], [4])
    assert s.step(eager=True) == 102 and rt.calls[-5][:2] == ("run", "step")


def test_rewind_restages_the_last_prompt_token() -> None:
    s, rt = _session(capacity=16)
    with pytest.raises(kr.SessionError, match="prefill a prompt first"):
        s.rewind()
    s.prefill([7, 8, 9], chunk=16)
    s.step()
    s.step()
    s.rewind()
    assert (s.seen, rt.inputs["ids"].tolist(), rt.inputs["pos"].tolist(), rt.inputs["len"].tolist()) == (2, [9], [2], [3])


def test_a_device_fed_manifest_runs_its_seed_program_and_is_not_fed_by_the_host() -> None:
    m = serving()
    m["programs"]["start"] = {"calls": []}
    rt = FakeRuntime()
    s = kr.Session(rt, kr.serving_roles(parsed(m)), 8)  # type: ignore[arg-type]
    s.prefill([1, 2], chunk=4)
    assert rt.calls[-1] == ("run", "start", {})
    n = len(rt.calls)
    s.step()
    assert [c[0] for c in rt.calls[n:]] == ["issue"]


def test_the_last_step_at_capacity_stages_nothing_and_the_next_is_refused() -> None:
    s, rt = _session(capacity=4)
    s.prefill([1, 2, 3], chunk=4)
    s.step()
    n = len(rt.calls)
    s.step()
    assert [c[0] for c in rt.calls[n:]] == ["issue"]
    with pytest.raises(kr.SessionError, match="reached the capacity of 4 tokens"):
        s.step()


@pytest.mark.parametrize(
    ("prompt", "chunk", "word"),
    [
        ([], 4, "the prompt is empty"),
        ([1, -2], 4, "prompt id -2 is outside"),
        ([1, 4096], 4, r"prompt id 4096 is outside the model's token ids 0\.\.4095"),
        (list(range(17)), 4, "the prompt has 17 tokens; capacity is 16"),
        ([1, 2], 0, "chunk must be at least 1"),
    ],
)
def test_bad_prefills_run_nothing(prompt: list[int], chunk: int, word: str) -> None:
    s, rt = _session(capacity=16, ids={"min": 0, "max": 4095})
    n = len(rt.calls)
    with pytest.raises(kr.SessionError, match=word):
        s.prefill(prompt, chunk)
    assert len(rt.calls) == n


def test_capacity_and_pages_that_do_not_fit() -> None:
    with pytest.raises(kr.SessionError, match="capacity 101 exceeds the model's reach of 100 positions"):
        _session(capacity=101, pos={"min": 0, "max": 99}, bt={"index_into": "kv", "stride": 16})
    with pytest.raises(kr.SessionError, match="exceeds the model's reach of 64 positions"):
        _session(capacity=65)
    with pytest.raises(kr.SessionError, match="65 pages do not fit the block table of 64"):
        _session(capacity=64, pages=list(range(65)))
    with pytest.raises(kr.SessionError, match="31 pages hold 496 tokens; capacity 512 needs 32"):
        _session(capacity=512, pages=list(range(31)), bt={"index_into": "kv", "stride": 16})
    with pytest.raises(kr.SessionError, match="at least 1 token"):
        kr.check_capacity(_roles(), 0)
    assert issubclass(kr.SessionError, kr.ApiError)


def test_read_f32_widens_bf16() -> None:
    s, rt = _session()
    rt.read_output = lambda name: np.array([0x3F80, 0xC000], dtype=np.uint16)  # type: ignore[method-assign]
    assert s.read_f32("nt").tolist() == [1.0, -2.0]


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


def test_open_sizes_the_pool_in_whole_pages(paged_manifest: Manifest, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """capacity 100 at 16-token pages: the runtime is asked for 112 tokens (7 pages)."""
    seen: dict[str, Any] = {}
    rt = FakeRuntime()

    def load(manifest: Manifest, kernels: Path, *, gpu: int, capacity: kr.Capacity) -> FakeRuntime:
        seen.update(manifest=manifest, gpu=gpu, capacity=capacity)
        return rt

    monkeypatch.setattr(kr.Runtime, "load", staticmethod(load))
    monkeypatch.setattr(kr.Safetensors, "open", staticmethod(lambda paths: None))
    logs: list[str] = []
    with kr.Session.open(paged_manifest, tmp_path, [tmp_path / "w.safetensors"], gpu=2, capacity=100,
                         log=logs.append) as s:
        assert seen == {"manifest": paged_manifest, "gpu": 2, "capacity": kr.Capacity(tokens=112, seqs=1)}
        assert seen["manifest"] is paged_manifest
        assert s.table.tolist()[:8] == [0, 1, 2, 3, 4, 5, 6, 0] and logs == ["fake runtime"]
        assert ("load_weights",) in rt.calls
    assert rt.closed


def test_open_refuses_a_capacity_before_loading(paged_manifest: Manifest, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kr.Runtime, "load", staticmethod(lambda *a, **k: pytest.fail("loaded")))
    with pytest.raises(kr.SessionError, match="reach of 1024 positions"):
        kr.Session.open(paged_manifest, tmp_path, [], gpu=0, capacity=1025)


def test_open_closes_the_runtime_when_weights_fail(paged_manifest: Manifest, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    rt = FakeRuntime()

    def bad_weights(*args: object, **kw: object) -> None:
        raise kr.WeightArtifactError("tensor w: shape differs")

    rt.load_weights = bad_weights  # type: ignore[method-assign]
    monkeypatch.setattr(kr.Runtime, "load", staticmethod(lambda *a, **k: rt))
    monkeypatch.setattr(kr.Safetensors, "open", staticmethod(lambda paths: None))
    with pytest.raises(kr.WeightArtifactError):
        kr.Session.open(paged_manifest, tmp_path, [], gpu=0, capacity=64)
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
    except kr.SessionError as exc:
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
