"""A lab plan's manifest run by the float32 numpy interpreter of kern_interp.qwen3 (tools/interp)
against the independent numpy Qwen3: the deferred fold of a prefetched gate_up pick
(gemv_defer_p4.cu's kern_gemv_bf16_p4_silu_d) in the fused PDL decode step."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import kern_lab as lab
import kern_qwen3 as gen
from kern_interp import qwen3 as interp
from kern_lab.variants import DEFER

TOOLS = Path(__file__).resolve().parents[2]
CONFIG = interp.UNTIED_CONFIG
ENTRIES = lab.lab_entry_modules(lab_src=TOOLS / "lab" / "kernels-src", product_src=TOOLS / "kernels-src")
STEPS = 12


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    return interp.untied_weights(tmp_path_factory.mktemp("ckpt"))


_prompt = interp.random_prompt


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
