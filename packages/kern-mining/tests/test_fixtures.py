"""Real captures committed under tests/fixtures/<name>/ (written by tools/capture/gpu_capture.py:
launches.jsonl.gz, modules.jsonl, expected.json). Each must analyze to its expected requests and
token counts; the timed requests are the last windows (earlier ones are warm-up)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kern_mining.analyze import analyze_dir

FIXTURES = sorted(
    p for p in (Path(__file__).parent / "fixtures").glob("*") if (p / "expected.json").is_file()
)


@pytest.mark.parametrize("fixture", FIXTURES, ids=[p.name for p in FIXTURES])
def test_a_real_capture_analyzes_to_its_requests_and_tokens(fixture: Path) -> None:
    expected = json.loads((fixture / "expected.json").read_text())["windows"]
    analysis = analyze_dir(fixture)
    found = [[f.tokens for f in w.forwards] for w in analysis.windows]
    assert found[-len(expected) :] == expected
    assert analysis.tokens_reference is not None
    assert {e.layout for e in analysis.abi} <= {"flat", "packed", "unknown"}
