"""The batched decode step on the GPU with the Qwen3-4B shape (seeded random checkpoint,
kern_qwen3.checkpoint; the fast options plus rows = 64, as examples/qwen3-4b-batch.json): greedy
rows of different lengths give the one-row step's tokens for 1, 7, 32 and 64 sequences (both run
kern_attn_decode_rows, but the one-row step's GEMMs are our GEMVs with the norms folded in where the
batched step's are cuBLAS at m = rows, so a row may part from it only where the one-row step's two
best logits lie within 2 bf16 steps, and nowhere else), and rows in another order give the same
tokens bit for bit; and kern_sample_rows
against its numpy statement (kern_interp.qwen3) on the step's own bf16 logits: the drawn token
is the numpy draw and inside the exact top-k / top-p mask, the same seed draws the same token
alone and batched, logprobs within bf16-derived tolerance, top-N ids exact; pipelined steps equal
steps in turn, and a prefill queued behind steps in flight changes no token. Prompts riding on the
batched step (`Engine.begin` / `Engine.ride`: each prompt's tokens as rows beside the other
prompts' rows and the decode rows) give each prompt's tokens when it rides alone, within the same
measured tie rule as the one-row comparison, and a seeded rider draws as it does alone."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from kern_interp import qwen3 as interp

pytestmark = pytest.mark.gpu

TOOLS = Path(__file__).resolve().parents[1]
ROWS = 64
STEPS = 8
TOP_N = 20
"""Logprobs the batched step returns per row in the greedy comparison: how far its logits lie
from the one-row step's is measured on them."""
DISAGREE_MAX = 0.25
"""The largest difference allowed between the two steps' logit differences (top-N tokens against
the batched top-1, same context): 8 bf16 steps at logits near 4. The one-row step runs our GEMVs
with deferred norms, the batched step cuBLAS at m = rows: they round differently at every layer."""


@pytest.fixture(scope="module")
def rt(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from helpers.qwen3_options import generate as _generate

    import kern_qwen3 as gen
    import kern_runtime as kr
    from kern_mining.build import build_kernels
    from kern_qwen3 import QWEN3_4B_CONFIG, random_checkpoint

    tmp = tmp_path_factory.mktemp("batch4b")
    hashes = {m: sha for m, (_p, sha) in build_kernels(TOOLS / "kernels-src", tmp / "kernels").items()}
    entries = gen.entry_modules(TOOLS / "kernels-src")
    m = _generate(gen.shape_from_config(QWEN3_4B_CONFIG), hashes, entries, model="qwen3-4b-batch", feed="device",
                  gemv=gen.GEMV_GEMMS, fuse=True, pdl=True, fold_norm=True, defer_norm=True, rows=ROWS)
    manifest = tmp / "qwen3-4b-batch.json"
    manifest.write_text(json.dumps(m))
    ckpt, _ = random_checkpoint(QWEN3_4B_CONFIG, seed=0, name="qwen3-4b")
    runtime = kr.Runtime.load(manifest, tmp / "kernels", gpu=0, capacity=kr.Capacity(tokens=65536, seqs=ROWS + 2))
    try:
        runtime.load_weights(kr.Safetensors.open(ckpt))
        yield SimpleNamespace(rt=runtime, roles=kr.serving_roles(kr.read_manifest(manifest)))
    finally:
        runtime.close()


def _engine(rt: Any) -> Any:
    import kern_runtime as kr

    return kr.Engine(rt.rt, rt.roles, kr.EngineConfig(chunk=256))


def _prompt(seed: int, n: int) -> list[int]:
    return [int(x) for x in np.random.default_rng(seed).integers(0, 150000, size=n)]


def _length(i: int) -> int:
    """5..604 tokens, and 1,505..2,104 for every eighth row (kern_attn_decode_rows beyond its
    1,024-token cluster combine)."""
    return 5 + (i * 37) % 600 + (1500 if i % 8 == 3 else 0)


def _f32(raw: np.ndarray) -> np.ndarray:
    raw = np.asarray(raw).reshape(-1)
    return (raw.astype(np.uint32) << 16).view(np.float32) if raw.dtype == np.uint16 else raw.astype(np.float32)


def _alone(rt: Any, prompt: list[int]) -> tuple[list[int], list[np.ndarray]]:
    eng = _engine(rt)
    try:
        seq = eng.sequence()
        eng.prefill(seq, prompt, STEPS)
        toks, logits = [], []
        for _ in range(STEPS):
            toks.append(eng.step(seq))
            logits.append(_f32(eng.backend.read_output("logits")))
        return toks, logits
    finally:
        eng.close()


def _batched(rt: Any, prompts: list[list[int]], asks: list[Any], order: list[int]) -> dict[int, list[Any]]:
    """The Sampled of each step for the sequences `order` names, batched in that order."""
    eng = _engine(rt)
    try:
        seqs = {i: eng.sequence() for i in order}
        for i in order:
            eng.prefill(seqs[i], prompts[i], STEPS)
        got: dict[int, list[Any]] = {i: [] for i in order}
        for _ in range(STEPS):
            for i, s in zip(order, eng.decode([seqs[i] for i in order], [asks[i] for i in order]), strict=True):
                got[i].append(s)
        return got
    finally:
        eng.close()


def _disagreement(top: tuple[tuple[int, float], ...], logits: np.ndarray) -> float:
    """The largest difference between the batched step's logprob differences (each top-N token
    against its top-1) and the one-row step's logit differences for the same tokens."""
    t0, l0 = top[0]
    return max(abs((lp - l0) - float(logits[t] - logits[t0])) for t, lp in top)


@pytest.mark.parametrize("n", [1, 7, 32, 64])
def test_batched_greedy_equals_one_row(rt: Any, n: int) -> None:
    """Each row's tokens are the one-row step's until a step where the one-row step's top two
    logits lie closer than the two steps disagree: the disagreement is measured in the same run
    on the batched step's top-N logprobs at every step both ran from the same context (the
    largest one over all rows, D, at most DISAGREE_MAX), and a row may part only where the one-row
    gap between its token and the batched token is at most 2 D; any other difference fails."""
    import kern_runtime as kr

    prompts = [_prompt(1000 + i, _length(i)) for i in range(n)]
    want = [_alone(rt, p) for p in prompts]
    got = _batched(rt, prompts, [kr.Sampling(logprobs=TOP_N)] * n, list(range(n)))
    worst, parted = 0.0, []
    for i, (toks, logits) in enumerate(want):
        for j, (a, sampled) in enumerate(zip(toks, got[i], strict=True)):
            worst = max(worst, _disagreement(sampled.top, logits[j]))
            if a != sampled.token:
                parted.append((i, j, float(logits[j][a] - logits[j][sampled.token])))
                break
    print(f"{n} rows: largest disagreement {worst:.4f}; parted (row, step, one-row gap) {parted}")
    assert worst <= DISAGREE_MAX
    for i, j, gap in parted:
        assert gap <= 2 * worst, f"row {i} parted at step {j} with a one-row gap {gap} > 2 x {worst}"


def test_rows_are_independent_of_their_neighbours(rt: Any) -> None:
    """The same sequences in another order (the same bucket) give the same tokens bit for bit."""
    import kern_runtime as kr

    prompts = [_prompt(1500 + i, _length(3 * i)) for i in range(7)]
    asks = [kr.Sampling(temperature=0.7 * (i % 2), seed=i, logprobs=0) for i in range(7)]
    first, second = _batched(rt, prompts, asks, list(range(7))), _batched(rt, prompts, asks, [6, 2, 4, 0, 5, 1, 3])
    assert {i: [s.token for s in v] for i, v in first.items()} == {i: [s.token for s in v] for i, v in second.items()}


def _row_logits(rt: Any, rows: int) -> np.ndarray:
    vocab = rt.roles.token_max + 1
    raw = rt.rt.read_buffer("row_logits")[: rows * vocab * 2].view(np.uint16)
    return _f32(raw).reshape(rows, vocab)


def test_sampling_against_numpy(rt: Any) -> None:
    import kern_runtime as kr

    asks = [kr.Sampling(), kr.Sampling(temperature=0.8, seed=5, logprobs=0),
            kr.Sampling(temperature=1.3, top_k=40, seed=6, logprobs=3),
            kr.Sampling(temperature=1.0, top_p=0.7, seed=7, logprobs=20),
            kr.Sampling(temperature=2.0, top_k=500, top_p=0.95, seed=8, logprobs=1),
            kr.Sampling(temperature=0.5, top_k=1, seed=9)]
    eng = _engine(rt)
    try:
        seqs = [eng.sequence() for _ in asks]
        for i, seq in enumerate(seqs):
            eng.prefill(seq, _prompt(2000 + i, 30 + 50 * i), 4)
        for _ in range(3):
            pos = [s.kv for s in seqs]
            out = eng.decode(seqs, asks)
            x = _row_logits(rt, 8)
            for i, (s, ask) in enumerate(zip(out, asks, strict=True)):
                prm = (ask.temperature, ask.top_p, ask.top_k, ask.logprobs)
                assert s.token == interp.sample_token(x[i], prm, ask.seed, pos[i])
                if ask.temperature > 0:
                    assert interp.sample_mask(x[i], ask.temperature, ask.top_k, ask.top_p)[s.token]
                ref = x[i].astype(np.float64) - x[i].max()
                ref -= np.log(np.exp(ref).sum())
                if ask.logprobs >= 0:
                    assert s.logprob == pytest.approx(ref[s.token], abs=2e-3)
                order = np.lexsort((np.arange(x.shape[1]), -x[i]))[: max(ask.logprobs, 0)]
                assert [t for t, _ in s.top] == [int(t) for t in order]
                assert [v for _, v in s.top] == pytest.approx([ref[t] for t in order], abs=2e-3)
    finally:
        eng.close()


def test_seeded_draw_alone_and_batched(rt: Any) -> None:
    import kern_runtime as kr

    asks = [kr.Sampling(temperature=1.0, top_p=0.9, seed=40 + i) for i in range(9)]
    prompts = [_prompt(3000 + i, 20 + 70 * i) for i in range(9)]

    def run(idx: list[int]) -> dict[int, list[int]]:
        eng = _engine(rt)
        try:
            seqs = {i: eng.sequence() for i in idx}
            for i in idx:
                eng.prefill(seqs[i], prompts[i], 4)
            out: dict[int, list[int]] = {i: [] for i in idx}
            for _ in range(4):
                for i, s in zip(idx, eng.decode([seqs[i] for i in idx], [asks[i] for i in idx]), strict=True):
                    out[i].append(s.token)
            return out
        finally:
            eng.close()

    together = run(list(range(9)))
    apart = {**run([3]), **run([0, 5]), **run([1, 2, 4, 6, 7, 8])}
    same = sum(together[i] == apart[i] for i in range(9))
    # NOTE: a row alone runs the GEMMs at another m (1, 2, 8 against 16) than batched: its logits
    # may differ by bf16 noise, which moves a draw only where two Gumbel scores tie that closely;
    # the draw itself depends on (seed, position, logits) only (test_sampling_against_numpy)
    assert same >= 7, (together, apart)


def test_pipelined_steps_equal_steps_in_turn(rt: Any) -> None:
    """decode_steps (step k + 1 issued before step k is read back, through Runtime.fetch_output)
    gives the tokens and logprobs of one decode per step, for 7 rows and for the one-row step."""
    import kern_runtime as kr

    prompts = [_prompt(4000 + i, _length(i)) for i in range(7)]
    cases = [[kr.Sampling(temperature=0.9, top_p=0.95, seed=i, logprobs=2) for i in range(7)], [kr.Sampling()]]
    for asks in cases:
        results = []
        for pipelined in (True, False):
            eng = _engine(rt)
            try:
                seqs = [eng.sequence() for _ in asks]
                for seq, p in zip(seqs, prompts[: len(asks)], strict=True):
                    eng.prefill(seq, p, STEPS)
                results.append(list(eng.decode_steps(seqs, asks, STEPS)) if pipelined else
                               [eng.decode(seqs, asks) for _ in range(STEPS)])
            finally:
                eng.close()
        assert results[0] == results[1]


@pytest.mark.parametrize(("top_k", "top_p"), [(5, 1.0), (0, 0.5), (40, 0.8)])
def test_masks_and_draws_over_one_logits_row(rt: Any, top_k: int, top_p: float) -> None:
    """16 rows of one prompt (the same logits on every row) and 16 seeds: each draw is numpy's and
    inside numpy's exact mask, and together they cover more than one token of it."""
    import kern_runtime as kr

    prompt = _prompt(5000 + top_k, 300)
    asks = [kr.Sampling(temperature=1.0, top_k=top_k, top_p=top_p, seed=100 + i) for i in range(16)]
    eng = _engine(rt)
    try:
        seqs = [eng.sequence() for _ in asks]
        for seq in seqs:
            eng.prefill(seq, prompt, 2)
        pos = seqs[0].kv
        out = eng.decode(seqs, asks)
        x = _row_logits(rt, 16)
    finally:
        eng.close()
    assert all(np.array_equal(x[0], x[i]) for i in range(16))
    mask = interp.sample_mask(x[0], 1.0, top_k, top_p)
    for s, ask in zip(out, asks, strict=True):
        assert mask[s.token]
        assert s.token == interp.sample_token(x[0], (1.0, top_p, top_k, -1), ask.seed, pos)
    assert len({s.token for s in out}) > 1 or mask.sum() == 1


@pytest.mark.parametrize("n", [1, 7])
def test_a_prefill_queued_behind_steps_in_flight(rt: Any, n: int) -> None:
    """Engine.pipeline with two steps in flight (the one-row step for one greedy row, else the
    batched step) and another sequence prefilled meanwhile, queued behind them on the stream: the
    steps in flight, the rows' later steps and the new sequence's steps equal, bit for bit, a run
    that prefilled it before the pipeline."""
    import kern_runtime as kr

    prompts = [_prompt(6000 + i, _length(i)) for i in range(n)]
    late = _prompt(6100, 300)
    asks = [kr.Sampling()] if n == 1 else [kr.Sampling(temperature=0.9, top_p=0.95, seed=i, logprobs=2)
                                           for i in range(n)]

    def run(behind: bool) -> tuple[list[list[Any]], list[Any]]:
        eng = _engine(rt)
        try:
            seqs = [eng.sequence() for _ in prompts]
            for seq, p in zip(seqs, prompts, strict=True):
                eng.prefill(seq, p, 6)
            other = eng.sequence()
            if not behind:
                eng.prefill(other, late, 3)
            pipe = eng.pipeline(seqs, asks)
            assert pipe is not None
            pipe.issue()
            pipe.issue()
            if behind:
                eng.prefill(other, late, 3)
                assert not pipe.open
            got = [pipe.read(), pipe.read()]
            pipe.close()
            got += [eng.decode(seqs, asks) for _ in range(4)]
            return got, [eng.decode([other], [kr.Sampling()])[0] for _ in range(3)]
        finally:
            eng.close()

    assert run(True) == run(False)


def _ride(rt: Any, prompts: list[list[int]], asks: list[Any], order: list[int]) -> dict[int, list[Any]]:
    """The Sampled of each token for the prompts `order` names, begun together and ridden on
    steps of ROWS rows shared in that order (each sequence takes what it has left, one row once
    it decodes, while the step has rows), STEPS tokens each."""
    eng = _engine(rt)
    try:
        seqs = {i: eng.sequence() for i in order}
        for i in order:
            eng.begin(seqs[i], prompts[i], STEPS)
        got: dict[int, list[Any]] = {i: [] for i in order}
        while any(len(got[i]) < STEPS for i in order):
            live, counts, left = [], [], ROWS
            for i in (i for i in order if len(got[i]) < STEPS):
                n = min(len(seqs[i].tokens) - seqs[i].kv, left)
                if n < 1:
                    break
                live.append(i)
                counts.append(n)
                left -= n
            for i, s in zip(live, eng.ride([seqs[i] for i in live], [asks[i] for i in live], counts), strict=True):
                if s is not None:
                    got[i].append(s)
        return got
    finally:
        eng.close()


def _top_disagreement(a: Any, b: Any) -> float:
    """The largest difference between two results' logprob differences (each token both top-N
    lists hold, against `a`'s top-1), from the same context; inf when `b` lacks `a`'s top-1."""
    da, db = dict(a.top), dict(b.top)
    ref = a.top[0][0]
    if ref not in db:
        return float("inf")
    return max(abs((da[t] - da[ref]) - (db[t] - db[ref])) for t in da.keys() & db.keys())


@pytest.mark.parametrize("n", [7, 32])
def test_riding_prompts_give_their_tokens_alone(rt: Any, n: int) -> None:
    """n prompts (5..2,104 tokens) riding together beside each other's decode rows: each one's
    greedy tokens are those it gets riding alone until a step where the alone run's top two
    logprobs lie closer than the two runs disagree (measured on both runs' top-N logprobs at every
    step both ran from the same context: the largest, D, at most DISAGREE_MAX; a row may part only
    where the alone gap between its token and the batched token is at most 2 D)."""
    import kern_runtime as kr

    prompts = [_prompt(7000 + i, _length(i)) for i in range(n)]
    asks = [kr.Sampling(logprobs=TOP_N)] * n
    want = {i: _ride(rt, prompts, asks, [i])[i] for i in range(n)}
    got = _ride(rt, prompts, asks, list(range(n)))
    worst, parted = 0.0, []
    for i in range(n):
        for j, (a, b) in enumerate(zip(want[i], got[i], strict=True)):
            worst = max(worst, _top_disagreement(a, b))
            if a.token != b.token:
                parted.append((i, j, dict(a.top)[a.token] - dict(a.top).get(b.token, float("-inf"))))
                break
    print(f"{n} riders: largest disagreement {worst:.4f}; parted (row, step, alone gap) {parted}")
    assert worst <= DISAGREE_MAX
    for i, j, gap in parted:
        assert gap <= 2 * worst, f"rider {i} parted at step {j} with an alone gap {gap} > 2 x {worst}"


def test_a_seeded_rider_draws_alone_and_batched(rt: Any) -> None:
    """Nine seeded prompts riding together and in three groups: the draws agree but where bf16
    noise between GEMMs at other m moves a draw whose two best scores tie that closely (as
    test_seeded_draw_alone_and_batched)."""
    import kern_runtime as kr

    asks = [kr.Sampling(temperature=1.0, top_p=0.9, seed=60 + i) for i in range(9)]
    prompts = [_prompt(8000 + i, 20 + 70 * i) for i in range(9)]

    def tokens(order: list[int]) -> dict[int, list[int]]:
        return {i: [s.token for s in v] for i, v in _ride(rt, prompts, asks, order).items()}

    together = tokens(list(range(9)))
    apart = {**tokens([3]), **tokens([0, 5]), **tokens([1, 2, 4, 6, 7, 8])}
    same = sum(together[i] == apart[i] for i in range(9))
    assert same >= 7, (together, apart)
