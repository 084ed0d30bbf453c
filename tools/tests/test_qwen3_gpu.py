"""Qwen3 tiny on the GPU: graph == eager, --chunk 512 == 1 == 97, kern-run's ids, and greedy tokens
and first-step logits against transformers (torch and transformers: the `gpu-test` group)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers.gpu_deps import gpu_import
from helpers.tiny_build import build_tiny

TOOLS = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return build_tiny(tmp_path_factory.mktemp("qwen3"))


def _loaded(tiny: dict[str, Any], ckpt: Path | None = None) -> Any:
    """The manifest's runtime (pool of 4096 tokens), `ckpt`'s weights (default the fixture's): each
    `qwen3_checks.kern_generate` is a fresh Engine over it."""
    import qwen3_checks as checks

    return checks.load(tiny["manifest"], tiny["kernels"], ckpt or tiny["ckpt"], gpu=0, tokens=4096)


def _prompt(n: int) -> list[int]:
    return [(7 * i * i + 3 * i + 11) % 4000 for i in range(n)]


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 37, 709])
@pytest.mark.parametrize("manifest", ["tiny", "tiny_f32"])
def test_graph_eager_and_chunks_agree(request: pytest.FixtureRequest, manifest: str, n: int) -> None:
    """The bf16 tiny manifest and its reference-precision (f32) twin alike (64 steps: an Engine per
    run, qwen3_checks.STEPS)."""
    import qwen3_checks as checks

    with _loaded(request.getfixturevalue(manifest)) as target:
        base = checks.kern_generate(target, _prompt(n), chunk=512, eager=False).tokens
        assert len(base) == 64
        assert checks.kern_generate(target, _prompt(n), chunk=512, eager=True).tokens == base
        assert checks.kern_generate(target, _prompt(n), chunk=1, eager=False).tokens == base
        assert checks.kern_generate(target, _prompt(n), chunk=97, eager=False).tokens == base


@pytest.mark.gpu
def test_kern_run_prints_the_same_ids(tiny: dict[str, Any]) -> None:
    """kern-run's ids are one turn of an Engine (its path: the head gives the first token)."""
    import kern_runtime as kr

    with kr.Engine.open(tiny["manifest"], tiny["kernels"], kr.weight_files([tiny["ckpt"]]), gpu=0, tokens=4096,
                        config=kr.EngineConfig(chunk=512)) as eng:
        want = eng.turn(eng.sequence(), _prompt(37), 16).tokens
    proc = subprocess.run(
        [sys.executable, "-m", "kern_cli.run", "--manifest", str(tiny["manifest"]), "--kernels", str(tiny["kernels"]),
         "--weights", str(tiny["ckpt"]), "--prompt-ids", ",".join(map(str, _prompt(37))), "--steps", "16",
         "--output", "ids"],
        capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [" ".join(map(str, want))]


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::UserWarning")
def test_tiny_matches_transformers(tiny: dict[str, Any]) -> None:
    gpu_import("torch")
    gpu_import("transformers")
    import numpy as np
    import qwen3_checks as checks

    from kern_qwen3 import QWEN3_TINY_CONFIG
    rec = checks.Recorder(tiny["tmp"] / "out")
    ckpt = checks.write_checkpoint(rec, "tiny", dict(QWEN3_TINY_CONFIG))
    assert ckpt is not None, rec.checks[-1].detail
    ps = {n: _prompt(n) for n in (1, 37, 709)}
    ref = checks.references(rec, "tiny", ckpt, ps)
    assert ref is not None, rec.checks[-1].detail
    with _loaded(tiny, ckpt) as target:
        for n, p in ps.items():
            got = checks.kern_generate(target, p, chunk=512, eager=False, logits=True)
            c = checks.Check(f"p{n}")
            checks.compare_greedy(c, got.tokens, ref.tokens[n], ref.gaps_ulps[n])
            assert c.status != "FAIL", c.detail
            r = ref.logits32[n]
            assert np.linalg.norm(got.logits - r) / np.linalg.norm(r) <= checks.LOGIT_REL_TOL


# --------------------------------------------------------------------------------------------
# Reference precision (kern-qwen3 --precision f32) against transformers in float32.


@pytest.fixture(scope="module")
def tiny_f32(tiny: dict[str, Any]) -> dict[str, Any]:
    """The f32 manifest of the tiny model, its cubins in the tiny fixture's kernels dir."""
    from helpers.qwen3_options import generate as _generate

    import kern_qwen3 as gen
    from kern_mining.build import build_kernels
    from kern_qwen3 import QWEN3_TINY_CONFIG
    hashes = {m: sha for m, (_p, sha) in build_kernels(TOOLS / "kernels-src", tiny["kernels"]).items()}
    entries = gen.entry_modules(TOOLS / "kernels-src")
    m = _generate(gen.shape_from_config(QWEN3_TINY_CONFIG), hashes, entries, model="qwen3-tiny-f32",
                     feed="device", precision="f32")
    manifest = tiny["tmp"] / "qwen3-tiny-f32.json"
    manifest.write_text(json.dumps(m))
    return {**tiny, "manifest": manifest}


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::UserWarning")
def test_f32_tiny_matches_transformers_float32(tiny_f32: dict[str, Any]) -> None:
    """Greedy tokens equal transformers float32's for 64 steps (a divergence only at a gap of at
    most 1/16 bf16 ulp), first-step logits within F32_LOGIT_REL_TOL (1e-4) relative L2 (printed)."""
    gpu_import("torch")
    gpu_import("transformers")
    import numpy as np
    import qwen3_checks as checks

    from kern_qwen3 import QWEN3_TINY_CONFIG
    rec = checks.Recorder(tiny_f32["tmp"] / "out")  # NOTE: reuses the checkpoint test_tiny_matches_transformers wrote
    ckpt = checks.write_checkpoint(rec, "tiny", dict(QWEN3_TINY_CONFIG))
    assert ckpt is not None, rec.checks[-1].detail
    ps = {n: _prompt(n) for n in (1, 37, 709)}
    ref = checks.references(rec, "tiny", ckpt, ps, f32_greedy=True)
    assert ref is not None, rec.checks[-1].detail
    with _loaded(tiny_f32, ckpt) as target:
        for n, p in ps.items():
            got = checks.kern_generate(target, p, chunk=512, eager=False, logits=True)
            r = ref.logits32[n]
            rel = float(np.linalg.norm(got.logits - r) / np.linalg.norm(r))
            print(f"f32 tiny, prompt {n}: first-step logits relative L2 error {rel:.3e} against transformers float32")
            c = checks.Check(f"p{n}")
            checks.compare_greedy(c, got.tokens, ref.tokens32[n], ref.gaps32_ulps[n], checks.F32_NEAR_TIE_ULPS)
            assert c.status != "FAIL", c.detail
            assert rel < checks.F32_LOGIT_REL_TOL
