"""The engine's memory fuzz (helpers/enginefuzz.py) on the CPU: kern_runtime.Engine over the float32
interpreter of examples/qwen3-tiny-batch.json (8 rows), a small pool and host tier so that turns
evict, park and wake; seeded. The GPU run is test_enginefuzz_gpu.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.enginefuzz import EngineFuzz

import kern_runtime as kr
from kern_interp import qwen3 as interp
from kern_interp.backend import InterpBackend
from kern_qwen3 import QWEN3_TINY_CONFIG, random_checkpoint

ROOT = Path(__file__).resolve().parents[2]
OPS = 150


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    path, _ = random_checkpoint(dict(QWEN3_TINY_CONFIG), seed=3, name="fuzz", root=tmp_path_factory.mktemp("ckpt"))
    return interp.read_checkpoint(path)


def _pages(be: InterpBackend) -> Any:
    def read(pages: list[int]) -> np.ndarray:
        kv = be.machine.kv
        return np.stack([kv[p * be.page:(p + 1) * be.page].view(np.uint8) for p in pages])
    return read


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_engine_memory_fuzz_on_the_interpreter(weights: dict[str, np.ndarray], seed: int) -> None:
    manifest = kr.read_manifest(ROOT / "examples" / "qwen3-tiny-batch.json")
    be = InterpBackend(manifest, weights, pages=48, chunk_pages=8, host_pages=40)
    roles = kr.serving_roles(manifest)
    eng = kr.Engine(be, roles, kr.EngineConfig(chunk=16, park=True))
    cfg = QWEN3_TINY_CONFIG
    fuzz = EngineFuzz(eng, _pages(be), seed, vocab=cfg["vocab_size"], layers=cfg["num_hidden_layers"],
                      page_tokens=roles.page_tokens, rows=8)
    ops = fuzz.run(OPS)
    eng.close()
    assert (be.pool.pages_used, be.pool.slots_used, be.host.used) == (0, 0, 0)
    for op in ("turn-fresh", "turn-resident", "turn-parked", "turn-fork", "decode-rows", "evict", "branch"):
        assert ops.get(op, 0) > 0, f"seed {seed}: no {op} in {OPS} operations: {ops}"
