"""Mining on the GPU, end to end: capture transformers' Qwen3 (random weights, eager), a plain
PyTorch loop and the donor (our kernels in a PyTorch process) with the CUPTI injection library,
and analyze each capture with no model knowledge: every request, every forward and the right
token counts (tools/capture/gpu_capture.py, donor_capture.py; the fixtures they write are the
ones committed under packages/kern-mining/tests/fixtures and tools/tests/fixtures)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.gpu_deps import gpu_import

CAPTURE = Path(__file__).resolve().parents[1] / "capture"


def _run(script: str, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(CAPTURE / script), str(out), *args],
                          capture_output=True, text=True, timeout=600, check=False)


@pytest.mark.gpu
@pytest.mark.parametrize("workload", ["qwen3", "torch_loop"])
def test_capture_of_a_process_nobody_here_wrote(tmp_path: Path, workload: str) -> None:
    gpu_import("transformers")
    result = _run("gpu_capture.py", tmp_path, "--only", workload)
    summary = json.loads((tmp_path / "summary.json").read_text())[workload]
    assert summary.get("requests_and_tokens_exact") is True, (summary, result.stdout[-2000:])
    assert summary["slowdown_timed"] > 0 and summary["abi_census"]
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.gpu
def test_capture_of_the_donor_mines_the_generator_facts(tmp_path: Path) -> None:
    gpu_import("torch")
    result = _run("donor_capture.py", tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert all(v == "ok" for v in summary["steps"].values()), summary["steps"]
    assert summary["check"] == {k: [] for k in summary["check"]}, summary["check"]
    assert result.returncode == 0, result.stdout[-2000:]
