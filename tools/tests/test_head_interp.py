"""The head program on the float32 Qwen3 interpreter: the chunks prefill every prompt token and the
head gives the first generated token, which equals the first decode step's (logits within 1e-5),
and whole greedy turns equal the turns whose first token the first step computes, in every manifest
variant the generator writes (plain, GEMV, fused, folded, PDL, host- and device-fed, with a batched
step), for prompts whose last chunk crosses pages and chunk boundaries (a last chunk of one row
too); multi-turn conversations continued from resident, parked-then-woken and forked prefixes give
the numpy Qwen3's greedy tokens over the whole conversation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.qwen3_options import generate as _generate

import kern_qwen3 as gen
import kern_runtime as kr
from kern_interp import qwen3 as interp
from kern_interp.backend import InterpBackend

ROOT = Path(__file__).resolve().parents[2]
CONFIG = interp.UNTIED_CONFIG
CHUNK = 16
STEPS = 6
FAST: dict[str, Any] = {"gemv": list(gen.GEMV_GEMMS), "fuse": True, "pdl": True, "fold_norm": True,
                        "defer_norm": True}
VARIANTS: dict[str, dict[str, Any]] = {
    "plain-device": {"feed": "device"},
    "plain-host": {"feed": "host"},
    "gemv-device": {"feed": "device", "gemv": list(gen.GEMV_DEFAULT)},
    "fast-device": {"feed": "device", **FAST},
    "fast-host": {"feed": "host", **FAST},
    "fused-pdl-host": {"feed": "host", "gemv": list(gen.GEMV_GEMMS), "fuse": True, "pdl": True},
    "fast-rows": {"feed": "device", **FAST, "rows": 4},
    "plain-rows": {"feed": "device", "rows": 4},
}
ENTRIES = {e: "m" for e in (*gen.ENTRIES, *gen.DEVICE_FEED_ENTRIES, *gen.GEMV_ENTRIES, *gen.FUSED_ENTRIES,
                             *gen.DEFER_ENTRIES.values(), *gen.ROWS_ENTRIES)}


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    return interp.untied_weights(tmp_path_factory.mktemp("ckpt"))


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def manifest(request: pytest.FixtureRequest) -> dict[str, Any]:
    return _generate(gen.shape_from_config(CONFIG), {"m": "0" * 64}, ENTRIES, model="t", chunk=128,
                     **VARIANTS[request.param])


def _engine(manifest: dict[str, Any], weights: dict[str, np.ndarray], **backend: Any) -> kr.Engine:
    be = InterpBackend(manifest, weights, **backend)
    return kr.Engine(be, kr.serving_roles(be.machine.model), kr.EngineConfig(chunk=CHUNK, park="host_pages" in backend))


def _logits(eng: kr.Engine) -> np.ndarray:
    return np.asarray(eng.backend.read_output("logits"), dtype=np.float32).copy()


def _close(a: np.ndarray, b: np.ndarray, tol: float = 1e-5) -> bool:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b)) < tol


def _stepped(eng: kr.Engine, seq: kr.Sequence, prompt: list[int], steps: int) -> tuple[list[int], np.ndarray]:
    """Today's path: prefill, then `steps` decode steps (the first computes the last prompt token);
    the tokens and the first step's logits."""
    pre = eng.prefill(seq, prompt, steps)
    assert pre.first is None
    out = [eng.step(seq)]
    first = _logits(eng)
    out += [eng.step(seq) for _ in range(steps - 1)]
    return out, first


@pytest.mark.parametrize("n", [2, 16, 17, 33, 47, 64])
def test_the_heads_first_token_is_the_first_steps(manifest: dict[str, Any], weights: dict[str, np.ndarray],
                                                  n: int) -> None:
    """n = 17 and 33 end in a chunk of one row (the head's row 0), 16 and 64 at a chunk's last row,
    47 inside page 2."""
    prompt = interp.random_prompt(n)
    eng = _engine(manifest, weights, pages=32)
    seq = eng.sequence()
    pre = eng.prefill(seq, prompt, STEPS, first=True)
    assert pre.first is not None and (pre.reused, pre.prefilled) == (0, n)
    head_logits = _logits(eng)
    assert seq.kv == n and seq.tokens == [*prompt, pre.first] and eng.counters.heads == 1
    got = [pre.first] + [eng.step(seq) for _ in range(STEPS - 1)]
    with pytest.raises(kr.EngineError, match="used its room"):
        eng.step(seq)
    ref = _engine(manifest, weights, pages=32)
    want, want_logits = _stepped(ref, ref.sequence(), prompt, STEPS)
    assert got == want
    assert _close(head_logits, want_logits)
    assert got == interp.reference_greedy(CONFIG, weights, prompt, STEPS)[0]
    calls = eng.backend.calls  # type: ignore[attr-defined]
    assert calls.count(("run", "prefill")) == -(-n // CHUNK) and ("run", "start") not in calls
    assert calls.count(("issue", "head")) == 1 and calls.count(("issue", "decode")) == STEPS - 1
    assert not any(eng.backend.machine.mem.get("attn_count", np.zeros(1)))  # type: ignore[attr-defined]


def test_the_interpreters_greedy_runs_the_head(manifest: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
    for n, chunk in ((37, 64), (37, 1), (200, 64), (200, 97)):
        prompt = interp.random_prompt(n)
        got, first = interp.greedy(interp.Interp(manifest, weights, capacity=512), prompt, STEPS, chunk, head=True)
        want, want_first = interp.greedy(interp.Interp(manifest, weights, capacity=512), prompt, STEPS, chunk)
        assert got == want and _close(first, want_first), (n, chunk)


def _ids(seed: int, n: int) -> list[int]:
    return [int(x) for x in np.random.default_rng(seed).integers(0, CONFIG["vocab_size"], size=n)]


def _reference(weights: dict[str, np.ndarray], prompt: list[int], tokens: list[int]) -> None:
    assert tokens == interp.reference_greedy(CONFIG, weights, prompt, len(tokens))[0]


def test_turns_continue_resident_parked_and_forked_prefixes(manifest: dict[str, Any],
                                                            weights: dict[str, np.ndarray]) -> None:
    """A conversation's turns through `Engine.turn` (the head's first token) on one engine with a
    small pool: each equals the numpy Qwen3 over the whole conversation and the same turn on an
    engine without the head (prefill, then steps)."""
    eng = _engine(manifest, weights, pages=16, host_pages=32)
    a, b = eng.sequence(), eng.sequence()
    t1 = eng.turn(a, _ids(1, 37), STEPS)  # FRESH: chunks 16 + 16 + 5
    p2 = [*a.tokens, *_ids(2, 25)]  # 42 cached tokens (inside page 2), then 26 new rows
    t2 = eng.turn(a, p2, STEPS)
    assert (t2.prefill.source, t2.prefill.reused, t2.prefill.first) == (kr.Source.RESIDENT, 42, t2.tokens[0])
    eng.turn(b, _ids(3, 180), 2)  # needs 12 pages of 16, a's entry holds 5: it is parked
    assert eng.counters.parks >= 1
    p3 = [*a.tokens, *_ids(4, 9)]
    t3 = eng.turn(a, p3, STEPS)
    assert t3.prefill.source is kr.Source.PARKED and eng.counters.wakes == 1
    c = eng.branch(a, len(p2) + 3)
    more = _ids(6, 20)
    live = eng.sequence()
    eng.prefill(live, [*c.tokens, *more[:10]], 4)  # live, sharing 10 more tokens with c than the index
    p4 = [*c.tokens, *more]
    shared = len(c.tokens) + 9  # the live sequence's KV: its prompt but the last token
    t4 = eng.turn(c, p4, STEPS)
    assert (t4.prefill.source, t4.prefill.reused) == (kr.Source.FORK, shared)
    for prompt, t in ((_ids(1, 37), t1), (p2, t2), (p3, t3), (p4, t4)):
        _reference(weights, prompt, t.tokens)
    assert eng.counters.heads == 5
    ref = _engine(manifest, weights, pages=64)
    for prompt, t in ((_ids(1, 37), t1), (p2, t2), (p3, t3), (p4, t4)):
        assert _stepped(ref, ref.sequence(), prompt, STEPS)[0] == t.tokens
    eng.close()
    assert eng.backend.pool.pages_used == 0  # type: ignore[attr-defined]


def test_one_new_token_keeps_the_first_step(manifest: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
    """A prompt whose tokens but the last are cached has no chunk to run: the first step computes
    the last token; the turn's tokens are the reference's either way."""
    eng = _engine(manifest, weights, pages=32)
    seq = eng.sequence()
    eng.turn(seq, _ids(7, 30), 4)
    prompt = list(seq.tokens)  # the pending answer token is the one new token
    t = eng.turn(seq, prompt, 4)
    assert (t.prefill.reused, t.prefill.prefilled, t.prefill.first) == (len(prompt) - 1, 1, None)
    assert eng.counters.heads == 1 and eng.counters.turns == 2
    _reference(weights, prompt, t.tokens)
    one = eng.turn(eng.sequence(), [5], 3)  # a one-token prompt: nothing to chunk
    assert one.prefill.first is None
    _reference(weights, [5], one.tokens)


def test_live_sequences_take_turns_with_the_head(manifest: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
    """The head seats its sequence on the one-row step as a step would: prefilling another sequence
    in between and stepping both in turn re-seats them, and each generates what it does alone."""
    eng = _engine(manifest, weights, pages=32)
    a, b = eng.sequence(), eng.sequence()
    pa, pb = _ids(8, 21), _ids(9, 40)
    got_a = [eng.prefill(a, pa, STEPS, first=True).first]
    got_b = [eng.prefill(b, pb, STEPS, first=True).first]
    for _ in range(STEPS - 1):
        got_a.append(eng.step(a))
        got_b.append(eng.step(b))
    _reference(weights, pa, got_a)  # type: ignore[arg-type]
    _reference(weights, pb, got_b)  # type: ignore[arg-type]


def test_a_room_of_one_is_the_heads_token(manifest: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
    eng = _engine(manifest, weights, pages=32)
    seq = eng.sequence()
    t = eng.turn(seq, _ids(10, 20), 1)
    assert t.tokens == [t.prefill.first] and t.decode_ms_per_token == 0.0 and len(seq.tokens) == 21
    assert [(len(k), r, p) for k, r, p in eng.prefix.entries()] == [(20, True, False)]
    _reference(weights, _ids(10, 20), t.tokens)
    eng.close()


def test_a_manifest_without_a_head_keeps_the_first_step(weights: dict[str, np.ndarray]) -> None:
    """The f32 manifest has no head program: `first=True` changes nothing."""
    m = _generate(gen.shape_from_config(CONFIG), {"m": "0" * 64}, {**ENTRIES, **{e: "m" for e in gen.F32_ENTRIES}},
                  model="t", chunk=64, feed="device", precision="f32")
    assert kr.serving_roles(interp.model_of(m)).head_program is None
    eng = _engine(m, weights, pages=32)
    seq = eng.sequence()
    t = eng.turn(seq, _ids(11, 20), 3)
    assert t.prefill.first is None and eng.counters.heads == 0
    _reference(weights, _ids(11, 20), t.tokens)


def test_the_shipped_tiny_manifests_have_the_head() -> None:
    for name in ("qwen3-tiny", "qwen3-tiny-batch", "qwen3-4b", "qwen3-4b-gemv", "qwen3-4b-fast", "qwen3-4b-batch"):
        roles = kr.serving_roles(kr.read_manifest(ROOT / "examples" / f"{name}.json"))
        assert (roles.head_program, roles.head_row, roles.step_program) == ("head", "head_row", "decode"), name
    assert kr.serving_roles(kr.read_manifest(ROOT / "examples" / "qwen3-4b-f32.json")).head_program is None
