"""tools/gpu/bench_batch.py without a GPU: its measurement over an engine on the Qwen3 interpreter
(examples/qwen3-tiny-batch.json) gives every row, and the sequences it made are released."""

from __future__ import annotations

from pathlib import Path

import bench_batch
import numpy as np
import pytest

import kern_runtime as kr
from kern_interp import qwen3 as interp
from kern_interp.backend import InterpBackend
from kern_qwen3 import QWEN3_TINY_CONFIG, random_checkpoint

ROOT = Path(__file__).resolve().parents[2]


def test_measure_gives_every_row(tmp_path: Path) -> None:
    path, _ = random_checkpoint(dict(QWEN3_TINY_CONFIG), seed=3, name="bench", root=tmp_path)
    m = kr.read_manifest(ROOT / "examples" / "qwen3-tiny-batch.json")
    be = InterpBackend(m, interp.read_checkpoint(path), pages=128, chunk_pages=8)
    lines: list[str] = []
    with kr.Engine(be, kr.serving_roles(m), kr.EngineConfig(chunk=8)) as eng:
        rows = bench_batch.measure(eng, 20, [1, 3, 8], 2, lines.append, vocab=4000)
        assert eng.sequences == []
    names = [r["name"] for r in rows]
    assert names[:3] == ["one_row_ms@20", "one_row_in_turn_ms@20", "one_row_tok_s@20"]
    assert {f"rows{n}_{k}@20" for n in (1, 3, 8) for k in ("ms", "in_turn_ms", "tok_s", "vs_one_row_tok_s")} \
        <= set(names)
    assert all(np.isfinite(r["value"]) and r["value"] > 0 for r in rows)
    assert len(lines) == 4
    assert "rows8_ms@20" in bench_batch.table(rows)
    assert bench_batch.room([1, 8], 64) == 3 * (bench_batch.WARM + 128)
    with pytest.raises(SystemExit):
        bench_batch.main(["--help"])
