"""kern_manifest.digest: sha256 over canonical JSON, stable under key order and whitespace."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from helpers.manifests import full, put, tiny
from hypothesis import given, settings
from hypothesis import strategies as st

from kern_manifest import ManifestRejected, canonical_json, digest, digest_text, parse_manifest


def _shuffled(node: Any, rng: random.Random) -> Any:
    if isinstance(node, dict):
        items = list(node.items())
        rng.shuffle(items)
        return {k: _shuffled(v, rng) for k, v in items}
    if isinstance(node, list):
        return [_shuffled(v, rng) for v in node]
    return node


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32), st.sampled_from([None, 0, 1, 2, 7, "\t"]), st.booleans())
def test_digest_invariant_under_key_order_and_whitespace(
    seed: int, indent: int | str | None, doc_full: bool
) -> None:
    doc = full() if doc_full else tiny()
    text = json.dumps(
        _shuffled(doc, random.Random(seed)),
        indent=indent,
        separators=None if indent is not None else (" , ", " : "),
    )
    assert digest_text(text) == digest_text(json.dumps(doc))


def test_digest_is_sha256_hex_of_canonical_json() -> None:
    import hashlib

    m = parse_manifest(json.dumps(tiny()))
    assert digest(m) == hashlib.sha256(canonical_json(m)).hexdigest()
    assert b"\n" not in canonical_json(m) and b", " not in canonical_json(m)
    assert json.loads(canonical_json(m))["model"] == "tiny-lm"


def test_digest_ignores_spelled_out_defaults_and_number_spelling() -> None:
    doc = tiny()
    spelled = tiny()
    spelled["buffers"]["h"]["placement"] = "device"
    spelled["programs"]["decode"]["calls"][1]["args"][4] = {"f32": 0.000001}
    assert digest_text(json.dumps(spelled)) == digest_text(json.dumps(doc))
    assert digest_text(json.dumps(doc).replace("1e-06", "1.0e-6")) == digest_text(json.dumps(doc))


@pytest.mark.parametrize(
    ("pointer", "value"),
    [
        ("/model", "tiny-lm-2"),
        ("/vars/tokens/max", 65),
        ("/buffers/h/shape/1", 512),
        ("/ops/embed/impl/launches/0/block/0", 128),
        ("/programs/decode/calls/0/label", "embed0"),
        ("/programs/decode/calls/1/args/4/f32", 1e-5),
    ],
)
def test_any_change_of_meaning_changes_the_digest(pointer: str, value: Any) -> None:
    base = digest_text(json.dumps(tiny()))
    assert digest_text(json.dumps(put(tiny(), pointer, value))) != base


def test_call_order_matters() -> None:
    doc = tiny()
    calls = doc["programs"]["decode"]["calls"]
    calls[0], calls[1] = calls[1], calls[0]
    assert digest_text(json.dumps(doc)) != digest_text(json.dumps(tiny()))


def test_digest_of_garbage_is_a_typed_error() -> None:
    with pytest.raises(ManifestRejected):
        digest_text(b"\x00\x01")
