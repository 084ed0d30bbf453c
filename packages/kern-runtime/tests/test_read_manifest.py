"""`read_manifest`, the one way a manifest is read: parsed and verified once per process, its
typed model passed along to the serving roles, `Engine.open` and `Runtime.load`
(no GPU: the runtime's load stops before the driver)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.manifest_reads import counted_reads

import kern_manifest as km
import kern_runtime as kr
from kern_runtime import _rt_load, loading

from .helpers.manifests import parsed, serving

ROOT = Path(__file__).resolve().parents[3]
TINY = ROOT / "examples" / "qwen3-tiny.json"


class _Loaded(Exception):
    """Raised in place of the runtime's load: the spec it was given."""


@pytest.fixture
def counts(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    """kern_manifest's parse and verify calls from a cold start (no text read before)."""
    with counted_reads(monkeypatch) as seen:
        yield seen


@pytest.fixture
def stopped_load(monkeypatch: pytest.MonkeyPatch) -> None:
    def load(spec: Any, kernels_dir: Path, over: Any) -> Any:
        raise _Loaded(spec)

    monkeypatch.setattr(_rt_load, "load", load)


def _spec_of(info: pytest.ExceptionInfo[_Loaded]) -> Any:
    return info.value.args[0]


def test_a_file_is_the_verified_model(counts: dict[str, int]) -> None:
    model = kr.read_manifest(TINY)
    assert isinstance(model, km.Manifest) and model.model == "qwen3-tiny"
    assert kr.read_manifest(str(TINY)) is model
    assert counts == {"parse": 1, "check": 1}


def test_constants_are_expanded(tmp_path: Path) -> None:
    doc = json.loads(TINY.read_text())
    blocks = next(n for n, b in doc["buffers"].items() if b.get("fill") == "blocks")
    position = next(n for n, b in doc["buffers"].items() if b.get("fill") == "position")
    doc["constants"] = {"BLOCKS": doc["buffers"][blocks]["shape"][-1], "TOP": 99}
    doc["buffers"][blocks]["shape"][-1] = "BLOCKS"
    doc["buffers"][position]["domain"]["max"] = "TOP"
    (tmp_path / "m.json").write_text(json.dumps(doc))
    roles = kr.serving_roles(kr.read_manifest(tmp_path / "m.json"))
    assert roles.blocks_len == doc["constants"]["BLOCKS"] and roles.position_max == 99


def test_errors_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(kr.InputFileError, match=r"missing\.json: No such file"):
        kr.read_manifest(tmp_path / "missing.json")
    m = serving()
    m["buffers"]["len"]["dtype"] = "int33"
    m["buffers"]["ids"]["dtype"] = "int34"
    (tmp_path / "bad.json").write_text(json.dumps(m))
    with pytest.raises(kr.ManifestParseError, match=r"bad\.json: /buffers/\w+/dtype.*\(and 1 more: kern manifest verify"):
        kr.read_manifest(tmp_path / "bad.json")
    (tmp_path / "meaningless.json").write_text(json.dumps(serving()))
    with pytest.raises(kr.ManifestVerifyError, match=r"meaningless\.json: /programs/load/calls: program with no "
                                                     r"calls .*\(and \d+ more: kern manifest verify") as info:
        kr.read_manifest(tmp_path / "meaningless.json")
    assert "\n" not in str(info.value)
    assert issubclass(kr.InputFileError, kr.ApiError)


def test_an_open_parses_and_verifies_once(counts: dict[str, int], stopped_load: None) -> None:
    with pytest.raises(_Loaded) as info:
        kr.Engine.open(TINY, ROOT / "kernels", [], gpu=0, tokens=64)
    assert counts == {"parse": 1, "check": 1}
    assert _spec_of(info).manifest is kr.read_manifest(TINY)
    assert counts == {"parse": 1, "check": 1}


def test_the_checked_inputs_model_is_the_one_loaded(counts: dict[str, int], stopped_load: None) -> None:
    load = loading.LoadOptions(TINY, ROOT / "kernels", None, (), 0, None)
    inputs = loading.check_inputs(load)
    with pytest.raises(_Loaded) as info:
        kr.Engine.open(inputs.manifest, load.kernels, [], gpu=0, tokens=64, roles=inputs.roles)
    assert _spec_of(info).manifest is inputs.manifest
    assert counts == {"parse": 1, "check": 1}


def test_a_model_from_elsewhere_is_verified_at_load_once(counts: dict[str, int], stopped_load: None) -> None:
    model = km.parse_manifest(TINY.read_bytes())
    for _ in range(2):
        with pytest.raises(_Loaded):
            kr.Runtime.load(model, ROOT / "kernels")
    assert counts == {"parse": 1, "check": 1}
    with pytest.raises(kr.ManifestVerifyError, match="program with no calls"):
        kr.Runtime.load(parsed(serving()), ROOT / "kernels")
