"""A lab plan's manifest run by the float32 numpy interpreter of tools/tests/helpers/qwen3_interp.py
against the independent numpy Qwen3: the deferred fold of a prefetched gate_up pick
(gemv_defer_p4.cu's kern_gemv_bf16_p4_silu_d) in the fused PDL decode step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import qwen3_interp as interp

import kern_lab as lab
import kern_qwen3 as gen
from kern_lab.variants import DEFER
from kern_qwen3 import QWEN3_TINY_CONFIG, random_checkpoint

TOOLS = Path(__file__).resolve().parents[2]
# NOTE: an untied variant with GQA group 2 and a 3rd layer exercises lm_head and layer offsets.
CONFIG: dict[str, Any] = {**QWEN3_TINY_CONFIG, "num_hidden_layers": 3, "tie_word_embeddings": False,
                          "max_position_embeddings": 1024}
ENTRIES = lab.lab_entry_modules(lab_src=TOOLS / "lab" / "kernels-src", product_src=TOOLS / "kernels-src")
STEPS = 12


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    path, _ = random_checkpoint(CONFIG, seed=11, name="interp", root=tmp_path_factory.mktemp("ckpt"))
    return interp.read_checkpoint(path)


def _prompt(n: int) -> list[int]:
    return [int(x) for x in np.random.default_rng(n).integers(0, CONFIG["vocab_size"], size=n)]


@pytest.mark.parametrize("feed", ["host", "device"])
@pytest.mark.parametrize(("n", "chunk"), [(1, 512), (37, 1), (200, 97)])
def test_deferred_prefetched_gate_up_matches_reference(weights: dict[str, np.ndarray], feed: str, n: int,
                                                       chunk: int) -> None:
    plan = gen.Plan(chunk=128, feed=feed, gemv=gen.GEMV_GEMMS, fuse=True,
                    picks={**gen.GEMV_PICK, "gate_up": "kern_gemv_bf16_p4_silu"},
                    table=dict(lab.LAB_GEMV_ENTRIES), passes=(DEFER, gen.PDL))
    hashes = dict.fromkeys(set(ENTRIES.values()), "0" * 64)
    m = gen.generate(gen.shape_from_config(CONFIG), hashes, ENTRIES, model="t", plan=plan)
    decode = {c["op"] for c in m["programs"]["decode"]["calls"]}
    assert any(op.startswith("gemv_p4_silu_d") for op in decode)
    machine = interp.Interp(m, weights, capacity=512)
    tokens, first = interp.greedy(machine, _prompt(n), STEPS, chunk)
    want_tokens, want_first = interp.reference_greedy(CONFIG, weights, _prompt(n), STEPS)
    assert np.linalg.norm(first - want_first) / np.linalg.norm(want_first) < 1e-4
    assert tokens == want_tokens
    assert not machine.mem["attn_count"].any()
