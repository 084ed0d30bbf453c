"""Host-side logic of tools/gpu/qwen3_checks.py: bf16 ulps, the near-tie rule, the recorder."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("qwen3_checks", TOOLS / "gpu" / "qwen3_checks.py")
assert _spec is not None and _spec.loader is not None
checks = importlib.util.module_from_spec(_spec)
sys.modules["qwen3_checks"] = checks
_spec.loader.exec_module(checks)


def test_bf16_ulp() -> None:
    assert checks.bf16_ulp(1.0) == 2**-7
    assert checks.bf16_ulp(1.99) == 2**-7
    assert checks.bf16_ulp(-4.5) == 2**-5
    assert checks.bf16_ulp(0.3) == 2**-9


def test_identical_tokens_pass() -> None:
    c = checks.Check("x")
    checks.compare_greedy(c, [1, 2, 3], [1, 2, 3], [9.0, 9.0, 9.0])
    assert c.status == "PENDING" and "identical" in c.detail


def test_divergence_at_near_tie_passes_with_the_gap_reported() -> None:
    c = checks.Check("x")
    checks.compare_greedy(c, [1, 5, 7], [1, 6, 8], [30.0, 1.0, 30.0])
    assert c.status == "PENDING"
    assert c.data == {"diverge_at": 1, "gap_ulps": 1.0, "kern": 5, "transformers": 6}


def test_divergence_without_a_tie_fails() -> None:
    c = checks.Check("x")
    checks.compare_greedy(c, [1, 5], [1, 6], [30.0, 12.0])
    assert c.status == "FAIL" and "step 1" in c.detail


def test_recorder_keeps_going_after_an_error(tmp_path: Path) -> None:
    rec = checks.Recorder(tmp_path)
    with rec.check("boom"):
        raise RuntimeError("first line\nsecond")
    with rec.check("fine") as c:
        c.detail = "ok"
    rows = json.loads((tmp_path / "summary.json").read_text())
    assert [(r["name"], r["status"], r["detail"]) for r in rows] == [
        ("boom", "ERROR", "RuntimeError: first line"), ("fine", "PASS", "ok")]
    assert "Traceback" in (tmp_path / "logs" / "boom.log").read_text()
    assert checks.summarize(rec) == 1


def test_prompts_are_fixed_and_in_vocab() -> None:
    a, b = checks.prompts(4096), checks.prompts(4096)
    assert a == b and sorted(a) == [1, 37, 709]
    assert all(0 <= t < 4096 for p in a.values() for t in p)


def test_recorder_keeps_rows_of_an_earlier_run(tmp_path: Path) -> None:
    first = checks.Recorder(tmp_path)
    with first.check("tiny.load"):
        pass
    with first.check("shared"):
        raise RuntimeError("old")
    second = checks.Recorder(tmp_path)
    with second.check("shared") as c:
        c.detail = "new"
    rows = json.loads((tmp_path / "summary.json").read_text())
    assert [(r["name"], r["status"]) for r in rows] == [("tiny.load", "PASS"), ("shared", "PASS")]
