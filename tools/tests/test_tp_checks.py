"""tools/gpu/tp_checks.py on the host: a host with too few GPUs is `blocked` (exit 2, nothing run),
the collectives-alone manifest verifies, and the near-tie rule of its token comparison."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tp_checks

import kern_manifest as km


def test_too_few_gpus_is_blocked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kern_runtime import loading

    monkeypatch.setattr(loading, "count_gpus", lambda: 1)
    assert tp_checks.main([str(tmp_path), "--tp", "2"]) == 2
    assert json.loads((tmp_path / "tp_checks.json").read_text()) == {"blocked": True, "gpus": 1, "tp": 2}
    assert "needs 2 GPUs; this host shows 1: blocked" in (tmp_path / "tp_checks.log").read_text()


@pytest.mark.parametrize("n", [1, 2, 8])
def test_collectives_alone_manifest_verifies(n: int) -> None:
    doc = tp_checks.collectives_manifest(n, 2560, 36, 151936)
    km.load_manifest(json.dumps(doc))
    ops = [c["op"] for c in doc["programs"]["step"]["calls"]]
    assert ops.count("allreduce") == 72 and ops[-1] == "allgather"


def test_near_tie_rule() -> None:
    logits = [np.array([0.0, 1.0, 1.0 + 2**-7], dtype=np.float32)]
    assert tp_checks.compare([2], [2], logits) == {"ok": True, "identical": True}
    near = tp_checks.compare([1], [2], logits)
    assert near["ok"] and near["gap_ulps"] == 1.0
    far = tp_checks.compare([0], [2], logits)
    assert not far["ok"] and far["diverge_at"] == 0
