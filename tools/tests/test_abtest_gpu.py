"""`kern test` on the GPU over the tiny Qwen3 (kernels built from tools/kernels-src, seeded random
weights): the fast manifest against the base one passes within the noise band, the reference-precision (f32) manifest
against the bf16 one passes on logit evidence, and a cubin whose argmax picks the lowest logit
fails; `kern test` exits by its verdict."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

TOOLS = Path(__file__).resolve().parents[1]
CAPACITY = 1024
STRICTER = ("bit-identical", "values identical", "logits identical", "within the noise band")
"""The rungs at or above the noise band."""


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The base, fast and f32 tiny manifests, and the base one with a broken argmax module, their
    cubins in one kernels directory, and the tiny checkpoint."""
    from helpers.qwen3_options import generate as _generate

    import kern_qwen3 as gen
    from kern_mining.build import build_kernels
    from kern_qwen3 import QWEN3_TINY_CONFIG, random_checkpoint

    tmp = tmp_path_factory.mktemp("abtest")
    kernels = tmp / "kernels"
    hashes = {m: sha for m, (_p, sha) in build_kernels(TOOLS / "kernels-src", kernels).items()}
    entries = gen.entry_modules(TOOLS / "kernels-src")
    shape = gen.shape_from_config(QWEN3_TINY_CONFIG)
    manifests = {
        "base": _generate(shape, hashes, entries, model="qwen3-tiny", feed="device"),
        "fast": _generate(shape, hashes, entries, model="qwen3-tiny-fast", feed="device", gemv=gen.GEMV_GEMMS,
                          fuse=True, pdl=True, fold_norm=True, defer_norm=True),
        "f32": _generate(shape, hashes, entries, model="qwen3-tiny-f32", feed="device", precision="f32"),
        "argmin": _generate(shape, {**hashes, "sampling": _argmin_cubin(tmp, kernels)}, entries,
                            model="qwen3-tiny", feed="device"),
    }
    paths = {}
    for name, m in manifests.items():
        paths[name] = tmp / f"{name}.json"
        paths[name].write_text(json.dumps(m))
    ckpt, _ = random_checkpoint(QWEN3_TINY_CONFIG, seed=5, name="tiny", root=tmp)
    return {"paths": paths, "kernels": kernels, "ckpt": ckpt}


def _argmin_cubin(tmp: Path, kernels: Path) -> str:
    """sampling.cu with every logit negated as the argmax reads it (so it picks the lowest), built
    beside the good cubins; its sha256."""
    from kern_mining.build import build_kernels

    src = tmp / "argmin-src"
    shutil.copytree(TOOLS / "kernels-src", src)
    path = src / "sampling.cu"
    text = path.read_text()
    for old in ("ArgBest{v[e], i + e}", "ArgBest{to_f(logits[i]), i}"):
        assert text.count(old) == 1, old
        text = text.replace(old, old.replace("ArgBest{", "ArgBest{-"))
    path.write_text(text)
    ((cubin, sha),) = build_kernels(src, tmp / "argmin-kernels", modules=["sampling"]).values()
    shutil.copy(cubin, kernels / cubin.name)
    return sha


def _ab_test(built: dict[str, Any], a: str, b: str, **options: Any) -> Any:
    import kern_runtime as kr
    from kern_runtime import abtest as ab

    o = ab.AbOptions(runs=8, decode_steps=8, capacity=CAPACITY, **{"perf": False, **options})
    paths = built["paths"]
    pair = ab.check_pair(kr.read_manifest(paths[a]), kr.read_manifest(paths[b]), o.capacity)
    loader = ab.GpuLoader(pair.a, pair.b, built["kernels"], kr.weight_files([built["ckpt"]]), 0)
    return ab.ab_test(loader, pair, o)


@pytest.mark.gpu
def test_fast_against_base_passes(built: dict[str, Any]) -> None:
    from kern_runtime import abtest as ab

    result = _ab_test(built, "base", "fast", perf=True, iters=10)
    text = ab.report_of(result).text()
    assert result.verdict.outcome is ab.Outcome.PASS, text
    # NOTE: its fused and folded kernels round at other points than base's (on an H100 its KL max was
    # 1.4x the noise pass's, one argmax flip at a 0.0078 margin): inside the band, not bit for bit.
    assert result.noise is not None and result.evidence.flips == 0, text
    assert result.verdict.reason.startswith(STRICTER), text
    assert result.states["kv"].compared and result.states["kv"].outside == 0, text
    assert set(result.timing) == {"A", "B"} and result.timing["B"].tpot_ms > 0, text
    assert any(line.startswith("perf decode call by call") for line in text.splitlines()), text


@pytest.mark.gpu
def test_f32_against_bf16_passes_on_logit_evidence(built: dict[str, Any]) -> None:
    from kern_runtime import abtest as ab

    result = _ab_test(built, "base", "f32")
    text = ab.report_of(result).text()
    assert result.verdict.outcome is ab.Outcome.PASS, text
    assert not result.states["kv"].compared, text  # NOTE: f32 pages are twice the size: laid out apart
    assert not result.evidence.logits_identical and result.evidence.kl_max <= result.evidence.logit_kl, text


@pytest.mark.gpu
def test_a_swapped_argmax_fails(built: dict[str, Any]) -> None:
    from kern_runtime import abtest as ab

    result = _ab_test(built, "base", "argmin")
    text = ab.report_of(result).text()
    assert result.verdict.outcome is ab.Outcome.FAIL, text
    assert result.verdict.reason.startswith("next token: B's is off its top logit"), text
    assert result.evidence.logits_identical, text


@pytest.mark.gpu
@pytest.mark.parametrize(("b", "code", "verdict"), [("base", 0, "PASS bit-identical"), ("argmin", 1, "FAIL next token")])
def test_kern_test_exits_by_its_verdict(built: dict[str, Any], b: str, code: int, verdict: str) -> None:
    paths = built["paths"]
    proc = subprocess.run(
        [sys.executable, "-m", "kern_cli.main", "test", str(paths["base"]), str(paths[b]), "--kernels",
         str(built["kernels"]), "--weights", str(built["ckpt"]), "--capacity", str(CAPACITY), "--runs", "4",
         "--decode-steps", "4", "--iters", "5"],
        capture_output=True, text=True, check=False)
    assert proc.returncode == code, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-1].startswith(verdict), proc.stdout
    assert any(line.startswith("perf step graph TPOT") for line in lines), proc.stdout
