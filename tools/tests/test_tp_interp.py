"""The TP-N Qwen3 manifest on the host: every rank on the float32 interpreter, the collectives by
their definitions, against the independent numpy Qwen3 (and so against the plain manifest, which
the same reference checks in test_qwen3_interp.py): the split, the rank windows of the weights and
the placement of the allreduces and the gather; and `kern_runtime.Ranks`, an engine per rank on
threads of their own whose collectives meet (`kern_interp.collectives.Group`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import tp_interp
from helpers.qwen3_options import plan_of
from helpers.tinytok import TinyTok

import kern_qwen3 as gen
import kern_runtime as kr
from kern_interp import qwen3 as interp
from kern_interp.ranks import rank_backends

ENTRIES = {e: "m" for e in (*gen.ENTRIES, *gen.DEVICE_FEED_ENTRIES, *gen.GEMV_ENTRIES, *gen.FUSED_ENTRIES,
                             *gen.DEFER_ENTRIES.values())}
STEPS = 8
TIED = {**interp.UNTIED_CONFIG, "tie_word_embeddings": True}


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    return interp.untied_weights(tmp_path_factory.mktemp("ckpt"))


def _tp(config: dict[str, Any], n: int, **kw: Any) -> dict[str, Any]:
    return gen.generate_tp(gen.shape_from_config(config), {"m": "0" * 64}, ENTRIES, model="t", tp=n,
                           plan=plan_of(chunk=128, **kw))


@pytest.mark.parametrize(("n", "prompt", "chunk"), [(1, 37, 512), (2, 1, 512), (2, 37, 16), (2, 200, 97)])
@pytest.mark.parametrize("feed", ["host", "device"])
def test_tp_manifest_matches_reference(weights: dict[str, np.ndarray], n: int, prompt: int, chunk: int,
                                       feed: str) -> None:
    world = tp_interp.World(_tp(interp.UNTIED_CONFIG, n, feed=feed), weights, capacity=512)
    tokens, first = interp.greedy(world, interp.random_prompt(prompt), STEPS, chunk)
    want_tokens, want_first = interp.reference_greedy(interp.UNTIED_CONFIG, weights, interp.random_prompt(prompt),
                                                      STEPS)
    assert np.linalg.norm(first - want_first) / np.linalg.norm(want_first) < 1e-4
    assert tokens == want_tokens
    assert world.collectives > 0


def test_tied_tp2_gathers_the_embedding_bands(weights: dict[str, np.ndarray]) -> None:
    tied = {k: v for k, v in weights.items() if k != "lm_head.weight"}
    world = tp_interp.World(_tp(TIED, 2), tied, capacity=256)
    tokens, first = interp.greedy(world, interp.random_prompt(37), STEPS, 512)
    want_tokens, want_first = interp.reference_greedy(TIED, tied, interp.random_prompt(37), STEPS)
    assert np.linalg.norm(first - want_first) / np.linalg.norm(want_first) < 1e-4
    assert tokens == want_tokens


def test_fast_tp2_matches_reference(weights: dict[str, np.ndarray]) -> None:
    fast = {"feed": "device", "fuse": True, "gemv": ("qkv", "o", "gate_up", "down"), "fold_norm": True,
            "defer_norm": True}
    world = tp_interp.World(_tp(interp.UNTIED_CONFIG, 2, **fast), weights, capacity=256)
    tokens, _ = interp.greedy(world, interp.random_prompt(37), STEPS, 512)
    assert tokens == interp.reference_greedy(interp.UNTIED_CONFIG, weights, interp.random_prompt(37), STEPS)[0]


def test_a_missing_allreduce_is_caught(weights: dict[str, np.ndarray]) -> None:
    m = _tp(interp.UNTIED_CONFIG, 2)
    decode = m["programs"]["decode"]["calls"]
    m["programs"]["decode"]["calls"] = [c for c in decode if c["label"] != "l1.down.allreduce"]
    world = tp_interp.World(m, weights, capacity=256)
    _, first = interp.greedy(world, interp.random_prompt(37), 1, 512)
    _, want_first = interp.reference_greedy(interp.UNTIED_CONFIG, weights, interp.random_prompt(37), 1)
    assert np.linalg.norm(first - want_first) / np.linalg.norm(want_first) > 1e-2


@pytest.mark.parametrize("feed", ["host", "device"])
def test_the_engine_over_interpreter_ranks_matches_reference(weights: dict[str, np.ndarray], feed: str) -> None:
    m = _tp(interp.UNTIED_CONFIG, 2, feed=feed)
    backends, group = rank_backends(m, weights, pages=32, chunk_pages=8)
    ranks = kr.Ranks(backends, kr.serving_roles(interp.model_of(m)), kr.EngineConfig(chunk=64))
    seq = ranks.sequence()
    prompt = interp.random_prompt(37)
    first = ranks.turn(seq, prompt, STEPS)
    assert first.tokens == interp.reference_greedy(interp.UNTIED_CONFIG, weights, prompt, STEPS)[0]
    assert group.calls > 0
    follow = [*seq.tokens, 3, 4]
    second = ranks.turn(seq, follow, 4)  # the first turn's KV reused on both ranks
    assert second.prefill.reused > 0
    assert second.tokens == interp.reference_greedy(interp.UNTIED_CONFIG, weights, follow, 4)[0]
    ranks.close()
    assert all(b.pool.pages_used == 0 for b in backends)


def test_kern_run_tp2_turns_run_over_interpreter_ranks(weights: dict[str, np.ndarray], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """`kern-run --tp 2 --turns FILE` end to end, the two ranks on interpreters (`loading.open_ranks`
    replaced): each turn's ids are the reference's greedy continuation of the whole conversation,
    and the second turn reuses the first's KV."""
    import kern_cli.run as run
    from kern_runtime import loading

    path = tmp_path / "tp2.json"
    path.write_text(json.dumps(_tp(interp.UNTIED_CONFIG, 2)))
    (tmp_path / "w.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")  # NOTE: an empty safetensors file
    (tmp_path / "turns.txt").write_text("a tiny prompt\nand more\n")
    opened: list[tuple[int, int]] = []

    def open_ranks(load: Any, tokens: int, files: Any, tp: int, roles: kr.ServingRoles, config: kr.EngineConfig,
                   log: Any, progress: Any = None) -> kr.Ranks:
        opened.append((tp, load.gpu))
        backends, _ = rank_backends(json.loads(path.read_text()), weights, pages=64, chunk_pages=8)
        return kr.Ranks(backends, roles, config)

    monkeypatch.setattr(loading, "count_gpus", lambda: 2)
    monkeypatch.setattr(loading, "tokenizer", lambda name: TinyTok())
    monkeypatch.setattr(loading, "check_kernels", lambda *a: None)
    monkeypatch.setattr(loading, "ensure_kernels", lambda *a: None)
    monkeypatch.setattr(loading, "open_ranks", open_ranks)
    monkeypatch.chdir(tmp_path)
    assert run.main(["--manifest", str(path), "--weights", "w.safetensors", "--turns", "turns.txt", "--steps", "5",
                     "--chunk", "16", "--output", "ids", "--tp", "2"]) == 0
    out = capsys.readouterr()
    tok = TinyTok()
    first_prompt = tok.encode("a tiny prompt")
    first = interp.reference_greedy(interp.UNTIED_CONFIG, weights, first_prompt, 5)[0]
    second_prompt = [*first_prompt, *first, *tok.encode("\nand more")]
    second = interp.reference_greedy(interp.UNTIED_CONFIG, weights, second_prompt, 5)[0]
    assert out.out == f"{' '.join(map(str, first))}\n{' '.join(map(str, second))}\n"
    assert opened == [(2, 0)]
    reports = [line for line in out.err.splitlines() if ": turn " in line]
    assert reports[0].startswith("kern-run: turn 1: reused 0 tokens from cache")
    assert reports[1].startswith(f"kern-run: turn 2: reused {len(first_prompt) + len(first) - 1} tokens from cache")
