"""Real captures committed under tests/fixtures/<name>/ (written by tools/capture/gpu_capture.py
on the H200: launches.jsonl.gz, modules.jsonl, expected.json), and the donor's capture under
tools/tests/fixtures/donor. Each must analyze to its requests
and token counts: the warm-up request first, then the timed ones, every forward exact. Windows
that hold no forward (a request's host-side preamble cut off by a load gap) are reported as
skipped and are not requests."""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path

import pytest

from kern_mining.analyze import analyze_dir

# NOTE: the donor's capture (tools/donor on the H200) is committed with the tools that mine it.
DONORS = Path(__file__).resolve().parents[3] / "tools" / "tests" / "fixtures"
FIXTURES = sorted(
    p
    for p in [*(Path(__file__).parent / "fixtures").glob("*"), *DONORS.glob("donor*")]
    if (p / "expected.json").is_file()
)


def test_the_real_captures_are_committed() -> None:
    assert {p.name for p in FIXTURES} >= {"qwen3", "torch_loop", "donor"}


@pytest.mark.parametrize("fixture", FIXTURES, ids=[p.name for p in FIXTURES])
def test_a_real_capture_analyzes_to_its_requests_and_tokens(fixture: Path) -> None:
    expected = json.loads((fixture / "expected.json").read_text())
    analysis = analyze_dir(fixture)
    found = [[f.tokens for f in w.forwards] for w in analysis.windows]
    assert found == expected["warmup"] + expected["windows"]
    ref = analysis.tokens_reference
    assert ref is not None and ref.scale == 1
    assert {e.layout for e in analysis.abi} <= {"flat", "packed", "unknown"}
    assert all(w.reason == "no core kernel" for w in analysis.skipped_windows)


@pytest.mark.parametrize("fixture", FIXTURES, ids=[p.name for p in FIXTURES])
def test_a_real_capture_is_cut_into_forwards_that_tile_each_window(fixture: Path) -> None:
    analysis = analyze_dir(fixture)
    for w in analysis.windows:
        assert w.forwards[0].first == w.first and w.forwards[-1].last == w.last
        assert all(a.last + 1 == b.first for a, b in pairwise(w.forwards))
