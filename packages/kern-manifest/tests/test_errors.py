"""kern_manifest.errors: one printable line per problem, folded followers, capped listings."""

from __future__ import annotations

import json
import pickle
from typing import Any

import pytest
from helpers.manifests import tiny

from kern_manifest import (
    MAX_NAME,
    PROBLEM_LIMIT,
    SHOWN,
    ManifestRejected,
    ManifestVerify,
    load_manifest,
    name_list,
    parse_manifest,
    printable,
    problem_lines,
    short,
)


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain name", "plain name"),
        ("a\x1b[31mred", "a\\x1b[31mred"),
        ("two\nlines\r\tend", "two\\nlines\\r\\tend"),
        ("bell\x07 del\x7f", "bell\\x07 del\\x7f"),
        ("rtl\u202eoverride", "rtl\\u202eoverride"),
        ("surrogate\ud800", "surrogate\\ud800"),
        ("emoji \U0001f600 and \U000e0001", "emoji \U0001f600 and \\U000e0001"),
        ("ünïcödé", "ünïcödé"),
    ],
)
def test_printable_escapes_only_what_a_terminal_would_act_on(text: str, shown: str) -> None:
    assert printable(text) == shown
    assert printable(shown) == shown


def test_a_line_is_always_printable() -> None:
    problem = ManifestVerify("/buffers/a\x1b[2J", "unused buffer 'x'\n", "remove\u202eit")
    assert problem.line() == "/buffers/a\\x1b[2J: unused buffer 'x'\\n (remove\\u202eit)"
    assert problem.pointer == "/buffers/a\x1b[2J"
    assert str(problem) == problem.line()


@pytest.mark.parametrize(
    ("follows", "tail"),
    [(0, ""), (1, " (and 1 problem that follows from it)"), (7, " (and 7 problems that follow from it)")],
)
def test_followers_fold_into_their_root(follows: int, tail: str) -> None:
    problem = ManifestVerify("/vars/n/max", "var max 0 < 1", "use max >= 1", follows)
    assert problem.line() == "/vars/n/max: var max 0 < 1 (use max >= 1)" + tail
    again = pickle.loads(pickle.dumps(problem))
    assert again.line() == problem.line() and again.follows == follows


def _rejected(count: int) -> ManifestRejected:
    doc = tiny()
    for i in range(count):
        doc[f"f{i}"] = 1
    with pytest.raises(ManifestRejected) as info:
        parse_manifest(json.dumps(doc))
    return info.value


def test_200000_unknown_fields_list_the_first_50_then_a_count() -> None:
    rejected = _rejected(200_000)
    assert len(rejected.problems) == 200_000
    lines = rejected.lines()
    assert PROBLEM_LIMIT == 50 and len(lines) == 51
    assert lines[0] == "/f0: unknown field 'f0' (remove it: unknown fields are rejected (see docs/manifest.md))"
    assert lines[49] == "/f49: unknown field 'f49' (remove it: unknown fields are rejected (see docs/manifest.md))"
    assert lines[50] == "... and 199950 more problems"
    assert rejected.line() == (
        "manifest rejected: 200000 problems "
        "(/f0: unknown field 'f0' (remove it: unknown fields are rejected (see docs/manifest.md)))"
    )


@pytest.mark.parametrize(("count", "limit", "tail"), [(3, 3, None), (4, 3, "... and 1 more problem"), (2, 1, "... and 1 more problem")])
def test_problem_lines_cap(count: int, limit: int, tail: str | None) -> None:
    problems = [ManifestVerify(f"/p{i}", "bad", "") for i in range(count)]
    lines = problem_lines(problems, limit)
    assert lines[:limit] == [f"/p{i}: bad" for i in range(min(count, limit))]
    assert lines[limit:] == ([] if tail is None else [tail])


def test_problem_lines_refuses_a_limit_below_1() -> None:
    with pytest.raises(ValueError, match="limit must be at least 1, got 0"):
        problem_lines([], 0)


# ---------------------------------------------------------------------------------- short names


def test_short_keeps_a_name_of_up_to_shown_characters_and_cuts_a_longer_one() -> None:
    assert short("x" * SHOWN) == "x" * SHOWN
    assert short("y" * (SHOWN + 1)) == "y" * SHOWN + f"...({SHOWN + 1} chars)"
    assert short("z" * 10_000_000) == "z" * SHOWN + "...(10000000 chars)"


def test_a_line_cuts_each_pointer_token_and_the_pointer_stays_whole() -> None:
    long = "b" * 10_000
    problem = ManifestVerify(f"/buffers/{long}/shape", f"unused buffer {short(long)!r}", "remove it")
    assert problem.pointer == f"/buffers/{long}/shape"
    cut = "b" * SHOWN + "...(10000 chars)"
    assert problem.line() == f"/buffers/{cut}/shape: unused buffer '{cut}' (remove it)"


def _lines_of(doc: dict[str, object]) -> list[str]:
    with pytest.raises(ManifestRejected) as info:
        load_manifest(json.dumps(doc))
    return info.value.lines()


def test_a_long_buffer_name_referenced_under_its_old_name_gives_short_lines() -> None:
    """Every line that echoes a name (problem, pointer, declared list) stays short."""
    doc = tiny()
    new = "B" * MAX_NAME
    doc["buffers"][new] = doc["buffers"].pop("h")
    for n in range(12):
        doc["buffers"][chr(ord("a") + n) * MAX_NAME] = {"dtype": "u8", "shape": [4], "kind": "workspace"}
    lines = _lines_of(doc)
    assert len(lines) > 12
    assert max(map(len, lines)) < 1100
    cut = "B" * SHOWN + f"...({MAX_NAME} chars)"
    assert f"/buffers/{cut}: unused buffer '{cut}' (remove it or reference it)" in lines
    unknown = [line for line in lines if "unknown buffer 'h'" in line]
    assert unknown and all(f"(declared: {cut}, " in line and "(+8 more)" in line for line in unknown)


@pytest.mark.parametrize(
    ("section", "value", "where"),
    [("ops", {"params": [], "impl": {"launches": []}}, "/ops/O"), ("vars", {"max": 4}, "/vars/V"), ("", 1, "/F"),
     ("model", None, "/model")],
)
def test_a_10_mb_name_is_refused_in_one_short_line(section: str, value: Any, where: str) -> None:
    doc = tiny()
    name = where[-1] * 10_000_000
    if section == "model":
        doc["model"] = name
    else:
        (doc[section] if section else doc)[name] = value
    (line,) = _lines_of(doc)
    assert len(line) < 250
    assert line.startswith(where)
    assert "longer than 256 characters" in line or "unknown field" in line


def test_name_list_sorts_cuts_and_bounds() -> None:
    assert name_list([]) == ""
    assert name_list(["b", "a"]) == "a, b"
    many = [f"n{i:02}" for i in range(15)] + ["x" * 100]
    assert name_list(many) == ", ".join(f"n{i:02}" for i in range(12)) + " (+4 more)"
    assert name_list(["y" * 100]) == "y" * SHOWN + "...(100 chars)"
