"""The engine's memory fuzz (helpers/enginefuzz.py) on a GPU: kern_runtime.Engine over the runtime
of examples/qwen3-tiny-batch.json (our cubins in kernels/, a seeded random tiny checkpoint), a pool
of 768 tokens and a host tier of 64 pages so that turns evict, park and wake (staged, two slices a
page); each live sequence's KV checked byte for byte against what computing its tokens wrote,
pages and host units back to zero at close. The CPU twin is test_enginefuzz_interp.py."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.enginefuzz import EngineFuzz

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
OPS = 2000


def _pages(rt: Any, page_bytes: int) -> Callable[[list[int]], np.ndarray]:
    def read(pages: list[int]) -> np.ndarray:
        return np.stack([rt.read_state("kv", p * page_bytes, page_bytes) for p in pages])
    return read


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_engine_memory_fuzz_on_the_gpu(tmp_path: Path, seed: int) -> None:
    import kern_runtime as kr
    from kern_qwen3 import QWEN3_TINY_CONFIG, random_checkpoint

    manifest = ROOT / "examples" / "qwen3-tiny-batch.json"
    ckpt, _ = random_checkpoint(dict(QWEN3_TINY_CONFIG), seed=seed, name="fuzz", root=tmp_path)
    model = kr.read_manifest(manifest)
    roles = kr.serving_roles(model)
    t0 = time.perf_counter()
    with kr.Runtime.load(model, ROOT / "kernels", gpu=0, capacity=kr.Capacity(tokens=768, seqs=10)) as rt:
        rt.load_weights(kr.Safetensors.open(ckpt))
        rt.reserve_host(64, 0)
        eng = kr.Engine(rt, roles, kr.EngineConfig(chunk=16, park=True))
        page_bytes = roles.page_tokens * (model.states["kv"].bytes_per_token or 0)
        cfg = QWEN3_TINY_CONFIG
        fuzz = EngineFuzz(eng, _pages(rt, page_bytes), seed, vocab=cfg["vocab_size"],
                          layers=cfg["num_hidden_layers"], page_tokens=roles.page_tokens, rows=8)
        ops = fuzz.run(OPS)
        eng.close()
        counts = (rt.pool.pages_used, rt.pool.slots_used, rt.host.used)
    print(f"seed {seed}: {OPS} engine operations in {time.perf_counter() - t0:.1f} s: {dict(sorted(ops.items()))}")
    assert counts == (0, 0, 0), f"(pages, slots, host units) still used after close: {counts}"
    for op in ("turn-fresh", "turn-resident", "turn-parked", "turn-fork", "decode-rows", "evict", "branch"):
        assert ops.get(op, 0) > 0, f"seed {seed}: no {op} in {OPS} operations: {ops}"
