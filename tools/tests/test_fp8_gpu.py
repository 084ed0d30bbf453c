"""The FP8 manifest (kern-qwen3 --weights qwen-fp8) on the GPU over seeded random Qwen FP8
checkpoints: greedy tokens (near-tie rule) and first-step logits against transformers running the
same weights dequantised (`kern_qwen3.dequantised_checkpoint`), on the tiny shape (plain and fast
forms) and the 4B shape; graph == eager and the chunkings agree; the manifest that quantises a bf16
checkpoint at load computes the FP8 checkpoint's logits bit for bit; the first-step logits' distance
from the bf16 fast manifest over the unquantised weights is printed (the quantisation's own error)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers.gpu_deps import gpu_import
from helpers.qwen3_options import generate

pytestmark = pytest.mark.gpu

TOOLS = Path(__file__).resolve().parents[1]
FAST_FP8: dict[str, Any] = {"weights": "qwen-fp8", "gemv": ["lm_head"], "fuse": True, "pdl": True}
FORMS: dict[str, dict[str, Any]] = {"plain": {"weights": "qwen-fp8"}, "fast": FAST_FP8,
                                    "dynamic": {**FAST_FP8, "weights": "fp8-dynamic"}}
FROM_BF16: dict[str, Any] = {**FAST_FP8, "weights": "bf16-to-fp8"}


def _prompt(n: int, vocab: int = 4000) -> list[int]:
    return [(7 * i * i + 3 * i + 11) % vocab for i in range(n)]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The kernels, the tiny FP8 manifests of both forms, the tiny FP8 checkpoint and its
    dequantised bf16 twin."""
    import kern_qwen3 as gen
    from kern_mining.build import build_kernels
    from kern_qwen3 import (
        QWEN3_TINY_CONFIG,
        dequantised_checkpoint,
        random_checkpoint,
        random_fp8_checkpoint,
    )

    tmp = tmp_path_factory.mktemp("fp8")
    hashes = {m: sha for m, (_p, sha) in build_kernels(TOOLS / "kernels-src", tmp / "kernels").items()}
    entries = gen.entry_modules(TOOLS / "kernels-src")
    shape = gen.shape_from_config(QWEN3_TINY_CONFIG)
    manifests = {}
    for form, kw in {**FORMS, "from-bf16": FROM_BF16}.items():
        m = generate(shape, hashes, entries, model="qwen3-tiny-fp8", feed="device", **kw)
        manifests[form] = tmp / f"qwen3-tiny-fp8-{form}.json"
        manifests[form].write_text(json.dumps(m))
    fp8, _ = random_fp8_checkpoint(QWEN3_TINY_CONFIG, layout="qwen-fp8", seed=5, name="tiny", root=tmp)
    deq, _ = dequantised_checkpoint(QWEN3_TINY_CONFIG, seed=5, name="tiny", root=tmp)
    dyn, _ = random_fp8_checkpoint(QWEN3_TINY_CONFIG, layout="fp8-dynamic", seed=5, name="tiny", root=tmp)
    dyn_deq, _ = dequantised_checkpoint(QWEN3_TINY_CONFIG, layout="fp8-dynamic", seed=5, name="tiny", root=tmp)
    bf16, _ = random_checkpoint(QWEN3_TINY_CONFIG, seed=5, name="tiny", root=tmp)
    return {"tmp": tmp, "kernels": tmp / "kernels", "manifests": manifests, "fp8": fp8, "deq": deq, "bf16": bf16,
            "dynamic": dyn, "dynamic_deq": dyn_deq, "hashes": hashes, "entries": entries}


def _loaded(built: dict[str, Any], form: str) -> Any:
    import qwen3_checks as checks

    ckpt = {"from-bf16": built["bf16"], "dynamic": built["dynamic"]}.get(form, built["fp8"])
    return checks.load(built["manifests"][form], built["kernels"], ckpt, gpu=0, tokens=4096)


@pytest.mark.parametrize("n", [1, 37, 709])
def test_quantising_at_load_computes_the_fp8_checkpoint_s_logits(built: dict[str, Any], n: int) -> None:
    import numpy as np
    import qwen3_checks as checks

    with _loaded(built, "fast") as stored:
        want = checks.kern_generate(stored, _prompt(n), chunk=512, eager=False, logits=True)
    with _loaded(built, "from-bf16") as at_load:
        got = checks.kern_generate(at_load, _prompt(n), chunk=512, eager=False, logits=True)
    assert got.tokens == want.tokens
    assert got.logits is not None and want.logits is not None
    assert np.array_equal(got.logits, want.logits)  # NOTE: the same e4m3 bytes and scales, the same kernels


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("n", [1, 37, 709])
def test_graph_eager_and_chunks_agree(built: dict[str, Any], form: str, n: int) -> None:
    import qwen3_checks as checks

    with _loaded(built, form) as target:
        base = checks.kern_generate(target, _prompt(n), chunk=512, eager=False).tokens
        assert len(base) == checks.STEPS
        assert checks.kern_generate(target, _prompt(n), chunk=512, eager=True).tokens == base
        assert checks.kern_generate(target, _prompt(n), chunk=97, eager=False).tokens == base


def _against_transformers(rec: Any, name: str, target: Any, deq: Path, ps: dict[int, list[int]]) -> None:
    import numpy as np
    import qwen3_checks as checks

    ref = checks.references(rec, name, deq, ps)
    assert ref is not None, rec.checks[-1].detail
    for n, p in ps.items():
        got = checks.kern_generate(target, p, chunk=512, eager=False, logits=True)
        c = checks.Check(f"{name}.p{n}")
        checks.compare_greedy(c, got.tokens, ref.tokens[n], ref.gaps_ulps[n])
        r = ref.logits32[n]
        rel = float(np.linalg.norm(got.logits - r) / np.linalg.norm(r))
        print(f"{name}, prompt {n}: {c.detail}; first-step logits relative L2 {rel:.3e} against transformers "
              "float32 over the dequantised weights")
        assert c.status != "FAIL", c.detail
        assert rel <= checks.LOGIT_REL_TOL


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::UserWarning")
def test_tiny_fp8_matches_transformers_over_the_dequantised_weights(built: dict[str, Any], form: str) -> None:
    gpu_import("torch")
    gpu_import("transformers")
    import qwen3_checks as checks

    rec = checks.Recorder(built["tmp"] / f"out-{form}")
    deq = built["dynamic_deq"] if form == "dynamic" else built["deq"]
    with _loaded(built, form) as target:
        _against_transformers(rec, f"tiny-fp8-{form}", target, deq, {n: _prompt(n) for n in (1, 37, 709)})


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::UserWarning")
def test_4b_fp8_matches_transformers_over_the_dequantised_weights(built: dict[str, Any]) -> None:
    """The shipped 4B FP8 manifest (its pinned cubins in kernels/) over the seeded random Qwen3-4B
    FP8 checkpoint, 64 greedy tokens of prompts 37 and 709 against transformers over the same weights
    dequantised; the first-step logits' relative L2 from the bf16 fast manifest over the weights
    before quantisation is printed beside (what FP8 itself costs, not a bound)."""
    gpu_import("torch")
    gpu_import("transformers")
    import numpy as np
    import qwen3_checks as checks

    from kern_qwen3 import (
        QWEN3_4B_CONFIG,
        dequantised_checkpoint,
        random_checkpoint,
        random_fp8_checkpoint,
    )

    root = TOOLS.parent
    manifest, kernels = root / "examples" / "qwen3-4b-fp8.json", root / "kernels"
    fp8, _ = random_fp8_checkpoint(QWEN3_4B_CONFIG, layout="qwen-fp8", seed=0)
    deq, _ = dequantised_checkpoint(QWEN3_4B_CONFIG, seed=0)
    ps = {n: _prompt(n, 150000) for n in (37, 709)}
    rec = checks.Recorder(built["tmp"] / "out-4b")
    firsts = {}
    with checks.load(manifest, kernels, fp8, gpu=0, tokens=4096) as target:
        _against_transformers(rec, "4b-fp8", target, deq, ps)
        firsts = {n: checks.kern_generate(target, p, chunk=512, eager=False, logits=True).logits for n, p in ps.items()}
    bf16, _ = random_checkpoint(QWEN3_4B_CONFIG, seed=0)
    with checks.load(root / "examples" / "qwen3-4b-fast.json", kernels, bf16, gpu=0, tokens=4096) as fast:
        for n, p in ps.items():
            base = checks.kern_generate(fast, p, chunk=512, eager=False, logits=True).logits
            rel = float(np.linalg.norm(firsts[n] - base) / np.linalg.norm(base))
            print(f"4b, prompt {n}: FP8 first-step logits relative L2 {rel:.3e} from the bf16 fast manifest over the "
                  "unquantised weights")
