"""Tensor-parallel Qwen3 (tiny shape) on GPUs: the TP-1 manifest's greedy tokens equal the plain
manifest's, in process and through `kern-run --tp 1` (one prompt, and turns over the group); on two
GPUs (`gpus(2)`), TP-2's equal TP-1's."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

TOOLS = Path(__file__).resolve().parents[1]
STEPS = 48
pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from helpers.qwen3_options import plan_of

    import kern_qwen3 as gen
    from kern_mining.build import build_kernels
    from kern_qwen3 import QWEN3_TINY_CONFIG, random_checkpoint

    tmp = tmp_path_factory.mktemp("tp")
    hashes = {m: sha for m, (_p, sha) in build_kernels(TOOLS / "kernels-src", tmp / "kernels").items()}
    entries = gen.entry_modules(TOOLS / "kernels-src")
    shape = gen.shape_from_config(QWEN3_TINY_CONFIG)
    out: dict[str, Any] = {"kernels": tmp / "kernels", "tmp": tmp}
    out["ckpt"], _ = random_checkpoint(QWEN3_TINY_CONFIG, seed=5, name="tiny", root=tmp)
    docs = {"plain": gen.generate(shape, hashes, entries, model="tiny", plan=plan_of()),
            "tp1": gen.generate_tp(shape, hashes, entries, model="tiny-tp1", tp=1, plan=plan_of()),
            "tp2": gen.generate_tp(shape, hashes, entries, model="tiny-tp2", tp=2, plan=plan_of())}
    for name, doc in docs.items():
        out[name] = tmp / f"{name}.json"
        out[name].write_text(json.dumps(doc))
    return out


def _prompt(n: int) -> list[int]:
    return [(7 * i * i + 3 * i + 11) % 4000 for i in range(n)]


def _plain(built: dict[str, Any], prompt: Sequence[int]) -> list[int]:
    """The plain manifest's greedy tokens on an Engine (the first from the decode step)."""
    import kern_runtime as kr

    with kr.Engine.open(built["plain"], built["kernels"], kr.weight_files([built["ckpt"]]), gpu=0, tokens=1024,
                        config=kr.EngineConfig(chunk=256)) as eng:
        seq = eng.sequence()
        eng.prefill(seq, prompt, STEPS)
        return [eng.step(seq) for _ in range(STEPS)]


def _tp(built: dict[str, Any], name: str, n: int, prompt: Sequence[int]) -> list[tuple[list[int], list[Any]]]:
    """Every rank's tokens and each step's logits (one thread per rank, GPU r for rank r)."""
    import kern_runtime as kr

    roles = kr.serving_roles(kr.read_manifest(built[name]))
    runtimes = []
    try:
        for r in range(n):
            rt = kr.Runtime.load(built[name], built["kernels"], gpu=r, capacity=kr.Capacity(tokens=1024, seqs=1),
                                 ranks={"tp": r})
            rt.load_weights(kr.Safetensors.open(kr.weight_files([built["ckpt"]])))
            runtimes.append(rt)
        kr.connect_local(runtimes)

        def one(rt: kr.Runtime) -> tuple[list[int], list[Any]]:
            from qwen3_checks import engine_greedy

            rt.make_current()
            return engine_greedy(rt, roles, prompt, STEPS, chunk=256, logit_steps=STEPS)

        with ThreadPoolExecutor(max_workers=n) as pool:
            return list(pool.map(one, runtimes))
    finally:
        for rt in runtimes:
            rt.close()


@pytest.mark.parametrize("n", [1, 37, 709])
def test_tp1_tokens_equal_the_plain_manifests(built: dict[str, Any], n: int) -> None:
    ((got, _),) = _tp(built, "tp1", 1, _prompt(n))
    assert got == _plain(built, _prompt(n))


def test_kern_run_tp1_prints_the_plain_ids(built: dict[str, Any]) -> None:
    want = _plain(built, _prompt(37))
    proc = subprocess.run(
        [sys.executable, "-m", "kern_cli.run", "--manifest", str(built["tp1"]), "--kernels", str(built["kernels"]),
         "--weights", str(built["ckpt"]), "--prompt-ids", ",".join(map(str, _prompt(37))), "--steps", str(STEPS),
         "--output", "ids", "--tp", "1"],
        capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [" ".join(map(str, want))]


def test_kern_run_tp1_turns_run_over_the_group_and_reuse_the_prefix(built: dict[str, Any]) -> None:
    """Three turns of one conversation over the TP-1 group (`kern_runtime.Ranks`): the first turn's
    ids are those of the same prompt given alone, and the later turns reuse the conversation's
    prefix on the group."""
    first = "it is a good day"  # NOTE: words whose ids are all below the tiny vocabulary (4,096)
    turns = built["tmp"] / "turns.txt"
    turns.write_text(f"{first}\nand then more\nwe go on\n")
    common = ["--manifest", str(built["tp1"]), "--kernels", str(built["kernels"]), "--weights", str(built["ckpt"]),
              "--steps", "24", "--output", "ids", "--tp", "1"]

    def run(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "kern_cli.run", *common, *extra], capture_output=True, text=True,
                              check=False)

    many, one = run("--turns", str(turns)), run("--prompt", first)
    assert many.returncode == 0, many.stderr
    assert one.returncode == 0, one.stderr
    answers = many.stdout.splitlines()
    assert len(answers) == 3 and answers[0] == one.stdout.strip()
    reports = [line for line in many.stderr.splitlines() if ": turn " in line]
    assert len(reports) == 3 and "reused 0 tokens" in reports[0]
    assert all("reused 0 tokens" not in line for line in reports[1:]), many.stderr


def test_kern_run_tp2_with_one_visible_gpu_is_one_line(built: dict[str, Any]) -> None:
    import os

    proc = subprocess.run(
        [sys.executable, "-m", "kern_cli.run", "--manifest", str(built["tp2"]), "--kernels", str(built["kernels"]),
         "--weights", str(built["ckpt"]), "--prompt-ids", "1,2,3", "--steps", "2", "--tp", "2"],
        capture_output=True, text=True, check=False, env={**os.environ, "CUDA_VISIBLE_DEVICES": "0"})
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr
    assert proc.stderr.strip() == "kern-run: --tp 2 from --gpu 0 needs 2 GPUs; this machine shows 1"


@pytest.mark.gpus(2)
@pytest.mark.parametrize("n", [1, 37, 709])
def test_tp2_tokens_equal_tp1(built: dict[str, Any], n: int) -> None:
    """Equal tokens, or a first divergence at a near-tie of TP-1 (its top-1 logit minus its logit of
    TP-2's token <= NEAR_TIE_ULPS bf16 ulps): TP-2 sums o and down in another order."""
    from qwen3_checks import NEAR_TIE_ULPS, bf16_ulp

    ((tp1, logits),) = _tp(built, "tp1", 1, _prompt(n))
    (a, _), (b, _) = _tp(built, "tp2", 2, _prompt(n))
    assert a == b
    if a != tp1:
        j = next(i for i, (x, y) in enumerate(zip(a, tp1, strict=True)) if x != y)
        top = float(logits[j][tp1[j]])
        gap = (top - float(logits[j][a[j]])) / bf16_ulp(top)
        assert gap <= NEAR_TIE_ULPS, f"TP-2 diverges from TP-1 at step {j} ({a[j]} vs {tp1[j]}), gap {gap:.2f} ulps"
