"""Wire-only `constants`: named numbers that stand in for numeric positions, expanded at parse."""

from __future__ import annotations

import json
from typing import Any

import pytest
from helpers.manifests import full, problems, put

from kern_manifest import ManifestParse, ManifestRejected, digest, manifest_to_json, parse_manifest

Json = dict[str, Any]

# (pointer, the number at it in full(), the constant standing for it): integers, a float, a shape
# dim, a grid expression's operand, a domain bound, an i32 launch arg, block dims, a pack size.
USES = [
    ("/buffers/emb/shape/0", 1000, "VOCAB"),
    ("/buffers/emb/shape/1", 256, "HIDDEN"),
    ("/buffers/x/shape/1", 256, "HIDDEN"),
    ("/buffers/lens/domain/max/mul/1", 2, "TWO"),
    ("/buffers/next/domain/max", 999, "TOP_ID"),
    ("/states/kv/bytes_per_token", 1024, "KV_BYTES"),
    ("/vars/tokens/max", 64, "MAX_TOKENS"),
    ("/ops/embed/impl/launches/0/block/0", 256, "HIDDEN"),
]


def _uses_constants() -> tuple[Json, Json]:
    """full() and the same document with constants standing for the numbers of USES."""
    plain = full()
    doc = full()
    table: dict[str, int | float] = {}
    for pointer, number, name in USES:
        _assert_at(doc, pointer, number)
        put(doc, pointer, name)
        table[name] = number
    doc["constants"] = table
    return plain, doc


def _assert_at(doc: Json, pointer: str, value: Any) -> None:
    node: Any = doc
    for part in pointer.split("/")[1:]:
        node = node[int(part)] if isinstance(node, list) else node[part]
    assert node == value, pointer


def test_constants_expand_to_the_same_manifest() -> None:
    """The model holds numbers: field for field, digest for digest, the document without constants;
    re-serialized it has no `constants` and numbers where the names were."""
    plain, doc = _uses_constants()
    a, b = parse_manifest(json.dumps(plain)), parse_manifest(json.dumps(doc))
    assert a == b and digest(a) == digest(b)
    out = manifest_to_json(b)
    assert "constants" not in out and out["buffers"]["emb"]["shape"] == [1000, 256]
    assert problems(doc) == []


def test_constants_in_call_literals() -> None:
    """An f32 and two i32 call literals (the load and decode programs of full()) by name."""
    doc = full()
    doc["constants"] = {"THETA": 10000.0, "WIDTH": 256, "ROWS": 64}
    for pointer, number, name in [("/programs/load/calls/0/args/1/f32", 10000.0, "THETA"),
                                  ("/programs/decode/calls/0/args/3/i32", 256, "WIDTH"),
                                  ("/programs/decode/calls/7/args/3/i32", 64, "ROWS")]:
        _assert_at(doc, pointer, number)
        put(doc, pointer, name)
    assert parse_manifest(json.dumps(doc)) == parse_manifest(json.dumps(full()))


@pytest.mark.parametrize(("table", "pointer", "message"), [
    ([1, 2], "/constants", "constants is an array"),
    ({"HID": "256"}, "/constants/HID", "is a string"),
    ({"HID": True}, "/constants/HID", "is a boolean"),
    ({"HID": None}, "/constants/HID", "is null"),
    ({"tokens": 8}, "/constants/tokens", "is also a var"),
    ({"2X": 8}, "/constants/2X", "constant name"),
    ({"A-B": 8}, "/constants/A-B", "constant name"),
])
def test_bad_constants_are_typed_parse_errors(table: Any, pointer: str, message: str) -> None:
    doc = full()
    doc["constants"] = table
    with pytest.raises(ManifestRejected) as info:
        parse_manifest(json.dumps(doc))
    hits = [p for p in info.value.problems if p.pointer == pointer]
    assert hits and all(isinstance(p, ManifestParse) and message in p.message and p.hint for p in hits)


def test_a_name_that_is_not_a_constant_stays_an_error_where_it_is_used() -> None:
    doc = full()
    doc["constants"] = {"HIDDEN": 256}
    put(doc, "/buffers/emb/shape/1", "HIDEN")  # a typo: an unknown var in an expression position
    put(doc, "/ops/embed/impl/launches/0/block/0", "HIDEN")  # and in an integer position
    found = problems(doc)
    pointers = {p.pointer for p in found}
    assert "/ops/embed/impl/launches/0/block/0" in pointers
    assert all(p.message and p.hint for p in found)
    doc2 = full()
    doc2["constants"] = {"F": 2.5}
    put(doc2, "/ops/embed/impl/launches/0/block/0", "F")  # a float constant where an integer goes
    with pytest.raises(ManifestRejected) as info:
        parse_manifest(json.dumps(doc2))
    assert [p.pointer for p in info.value.problems] == ["/ops/embed/impl/launches/0/block/0"]


def test_schema_version_cannot_be_a_constant() -> None:
    doc = full()
    doc["constants"] = {"V": 5}
    doc["schema_version"] = "V"
    with pytest.raises(ManifestRejected) as info:
        parse_manifest(json.dumps(doc))
    assert [p.pointer for p in info.value.problems] == ["/schema_version"]


def test_names_stay_names() -> None:
    """A constant named like a buffer does not rewrite the buffer's references (names are not
    numeric positions)."""
    doc = full()
    doc["constants"] = {"x": 7}
    m = parse_manifest(json.dumps(doc))
    assert "x" in m.buffers and m == parse_manifest(json.dumps(full()))
