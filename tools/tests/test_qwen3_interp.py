"""The generated Qwen3 manifest, run by a float32 numpy interpreter of its calls (kernels by their
documented semantics), against an independent numpy Qwen3: checks the generator's wiring (argument
order, offsets, KV layout, block table, chunked prefill, host and device step feeding) on the host."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from kern_cli.checkpoint import QWEN3_TINY_CONFIG, random_checkpoint

TOOLS = Path(__file__).resolve().parents[1]


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


gen = _load("gen_qwen3", TOOLS / "gen_qwen3.py")
interp = _load("qwen3_interp", TOOLS / "tests" / "helpers" / "qwen3_interp.py")

# NOTE: an untied variant with GQA group 2 and a 3rd layer exercises lm_head and layer offsets.
CONFIG: dict[str, Any] = {**QWEN3_TINY_CONFIG, "num_hidden_layers": 3, "tie_word_embeddings": False,
                          "max_position_embeddings": 1024}
ENTRIES = {e: "m" for e in gen.ENTRIES + gen.DEVICE_FEED_ENTRIES}
STEPS = 12


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    path, _ = random_checkpoint(CONFIG, seed=11, name="interp", root=tmp_path_factory.mktemp("ckpt"))
    return interp.read_checkpoint(path)


def _prompt(n: int) -> list[int]:
    return [int(x) for x in np.random.default_rng(n).integers(0, CONFIG["vocab_size"], size=n)]


@pytest.fixture(scope="module")
def references(weights: dict[str, np.ndarray]) -> dict[int, tuple[list[int], np.ndarray]]:
    return {n: interp.reference_greedy(CONFIG, weights, _prompt(n), STEPS) for n in (1, 37, 200)}


@pytest.mark.parametrize("feed", ["host", "device"])
@pytest.mark.parametrize(("n", "chunk"), [(1, 512), (37, 512), (37, 1), (200, 64), (200, 97)])
def test_manifest_matches_reference(weights: dict[str, np.ndarray], references: dict[int, Any], feed: str,
                                    n: int, chunk: int) -> None:
    m = gen.generate(gen.shape_from_config(CONFIG), {"m": "0" * 64}, ENTRIES, model="t", chunk=128, feed=feed)
    machine = interp.Interp(m, weights, capacity=512)
    tokens, first = interp.greedy(machine, _prompt(n), STEPS, chunk)
    want_tokens, want_first = references[n]
    assert np.linalg.norm(first - want_first) / np.linalg.norm(want_first) < 1e-4
    assert tokens == want_tokens
