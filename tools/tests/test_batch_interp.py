"""The batched decode step (examples/qwen3-tiny-batch.json, 8 rows) through kern_runtime.Engine on
the float32 Qwen3 interpreter: greedy rows equal the one-row step token for token for 1, 3 and 7
sequences of different lengths (pages and buckets crossed, rows joining and leaving); a seeded draw
is the same alone and batched; logprobs are a numpy log-softmax of the row's logits; the sampling
semantics (top-k / top-p masks, the Philox draw) against an independent numpy statement; bad
requests leave the engine as it was."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kern_runtime as kr
from kern_interp import qwen3 as interp
from kern_interp.backend import InterpBackend
from kern_qwen3 import QWEN3_TINY_CONFIG, random_checkpoint

ROOT = Path(__file__).resolve().parents[2]
STEPS = 5
LENGTHS = (3, 17, 9, 30, 1, 22, 16)


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    path, _ = random_checkpoint(dict(QWEN3_TINY_CONFIG), seed=7, name="batch", root=tmp_path_factory.mktemp("ckpt"))
    return interp.read_checkpoint(path)


@pytest.fixture(scope="module")
def manifest() -> dict[str, Any]:
    return kr.read_manifest(ROOT / "examples" / "qwen3-tiny-batch.json")


def _engine(manifest: dict[str, Any], weights: dict[str, np.ndarray]) -> kr.Engine:
    be = InterpBackend(manifest, weights, pages=128, chunk_pages=8)
    return kr.Engine(be, kr.serving_roles(manifest), kr.EngineConfig(chunk=8))


def _prompt(seed: int, n: int) -> list[int]:
    return [int(x) for x in np.random.default_rng(seed).integers(0, 4000, size=n)]


def _alone(manifest: dict[str, Any], weights: dict[str, np.ndarray], prompt: list[int], steps: int) -> list[int]:
    with _engine(manifest, weights) as eng:
        seq = eng.sequence()
        eng.prefill(seq, prompt, steps)
        return [eng.step(seq) for _ in range(steps)]


def test_roles_find_the_batched_step(manifest: dict[str, Any]) -> None:
    rows = kr.serving_roles(manifest).rows
    assert rows is not None
    assert (rows.program, rows.var, rows.max_rows, rows.seed_program) == ("decode_rows", "rows", 8, "seed_rows")
    assert (rows.sampling, rows.seed, rows.valid, rows.logprobs, rows.top_tokens) == (
        "row_sampling", "row_seed", "row_valid", "row_logprobs", "row_top")
    assert kr.serving_roles(manifest).blocks_len == manifest.buffers["block_table"].shape[-1].const
    assert kr.serving_roles(kr.read_manifest(ROOT / "examples" / "qwen3-tiny.json")).rows is None


@pytest.mark.parametrize("n", [1, 3, 7])
def test_batched_greedy_equals_one_row(manifest: dict[str, Any], weights: dict[str, np.ndarray], n: int) -> None:
    prompts = [_prompt(100 + i, LENGTHS[i]) for i in range(n)]
    want = [_alone(manifest, weights, p, STEPS) for p in prompts]
    with _engine(manifest, weights) as eng:
        seqs = [eng.sequence() for _ in prompts]
        for seq, p in zip(seqs, prompts, strict=True):
            eng.prefill(seq, p, STEPS)
        got: list[list[int]] = [[] for _ in seqs]
        greedy = kr.Sampling(logprobs=-1)
        for _ in range(STEPS):
            for i, s in enumerate(eng.decode(seqs, [kr.Sampling(logprobs=0) if n == 1 else greedy] * n)):
                got[i].append(s.token)
    assert got == want


def test_rows_join_and_leave(manifest: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
    """Sequences join late, leave early and alternate with one-row steps: still the same tokens."""
    prompts = [_prompt(200 + i, LENGTHS[i]) for i in range(4)]
    want = [_alone(manifest, weights, p, 6) for p in prompts]
    with _engine(manifest, weights) as eng:
        seqs = [eng.sequence() for _ in prompts]
        for seq, p in zip(seqs, prompts, strict=True):
            eng.prefill(seq, p, 6)
        got: list[list[int]] = [[] for _ in seqs]
        g = kr.Sampling()
        plan = [[0, 1], [0, 1, 2], [2, 1, 0, 3], [3], [3, 0], [1, 2, 3, 0], [2, 1], [1, 2, 3], [3]]
        for step in plan:
            picked = [seqs[i] for i in step if len(got[i]) < 6]
            out = eng.decode(picked, [g] * len(picked))
            for seq, s in zip(picked, out, strict=True):
                got[seqs.index(seq)].append(s.token)
        for i, seq in enumerate(seqs):
            while len(got[i]) < 6:
                got[i].append(eng.step(seq))
    assert got == want


def test_seeded_draw_is_the_same_alone_and_batched(manifest: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
    prompts = [_prompt(300 + i, LENGTHS[i]) for i in range(5)]
    hot = [kr.Sampling(temperature=1.5, top_k=50, top_p=0.9, seed=11 + i) for i in range(5)]

    def run(idx: list[int]) -> dict[int, list[int]]:
        with _engine(manifest, weights) as eng:
            seqs = {i: eng.sequence() for i in idx}
            for i in idx:
                eng.prefill(seqs[i], prompts[i], STEPS)
            out: dict[int, list[int]] = {i: [] for i in idx}
            for _ in range(STEPS):
                for i, s in zip(idx, eng.decode([seqs[i] for i in idx], [hot[i] for i in idx]), strict=True):
                    out[i].append(s.token)
            return out

    together = run([0, 1, 2, 3, 4])
    assert together == {**run([2]), **run([4, 0]), **run([1, 3])}
    assert len({t for toks in together.values() for t in toks}) > 5  # the draws are not all the argmax


def test_logprobs_are_the_log_softmax(manifest: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
    with _engine(manifest, weights) as eng:
        seqs = [eng.sequence() for _ in range(3)]
        for i, seq in enumerate(seqs):
            eng.prefill(seq, _prompt(400 + i, LENGTHS[i]), 2)
        asks = [kr.Sampling(logprobs=5), kr.Sampling(logprobs=0, temperature=0.7, seed=3), kr.Sampling()]
        out = eng.decode(seqs, asks)
        be = eng.backend
        assert isinstance(be, InterpBackend)
        logits = be.machine.mem["row_logits"].reshape(-1, QWEN3_TINY_CONFIG["vocab_size"])[:4].astype(np.float64)
    for i, (s, ask) in enumerate(zip(out, asks, strict=True)):
        ref = logits[i] - logits[i].max()
        ref = ref - np.log(np.exp(ref).sum())
        if ask.logprobs < 0:
            assert s.logprob is None and s.top == ()
            continue
        assert s.logprob == pytest.approx(ref[s.token], abs=1e-4)
        order = np.argsort(-ref, kind="stable")[: ask.logprobs]
        assert [t for t, _ in s.top] == [int(t) for t in order]
        assert [lp for _, lp in s.top] == pytest.approx([ref[t] for t in order], abs=1e-4)
    assert out[0].token == int(np.argmax(logits[0]))


def test_sampling_semantics_against_numpy() -> None:
    """top-k keeps the k largest (ties kept), top-p the fewest largest reaching the mass, the draw
    is Philox4x32-10 (known answer) through Gumbel-max."""
    # Philox4x32-10 known answer (Random123's kat_vectors: counter 0, key 0).
    words = interp.philox4x32([np.zeros(1, np.uint64)] * 4, (0, 0))
    assert [int(w[0]) for w in words] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    x = np.array([3.0, 1.0, 3.0, 2.0, -1.0, 0.5], dtype=np.float32)
    assert interp.sample_mask(x, 1.0, 2, 1.0).tolist() == [True, False, True, False, False, False]
    assert interp.sample_mask(x, 1.0, 3, 1.0).tolist() == [True, False, True, True, False, False]
    p = np.exp(x - x.max()) / np.exp(x - x.max()).sum()
    top2 = float(p[0] + p[2])
    assert interp.sample_mask(x, 1.0, 0, top2 - 1e-3).tolist() == [True, False, True, False, False, False]
    assert interp.sample_mask(x, 1.0, 0, top2 + 1e-3).tolist() == [True, False, True, True, False, False]
    rng = np.random.default_rng(0)
    logits = rng.normal(size=64).astype(np.float32)
    draws = [interp.sample_token(logits, (1.0, 1.0, 0, -1), seed, 7) for seed in range(4000)]
    freq = np.bincount(draws, minlength=64) / len(draws)
    want = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    assert np.abs(freq - want).max() < 0.03
    assert interp.sample_token(logits, (1.0, 1.0, 0, -1), 5, 7) == interp.sample_token(logits, (1.0, 1.0, 0, -1), 5, 7)


@pytest.mark.parametrize(("kw", "match"), [
    ({"temperature": -1.0}, "temperature"), ({"temperature": float("nan")}, "temperature"),
    ({"top_k": -2}, "top_k"), ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"), ({"seed": -1}, "seed"),
    ({"seed": 2**63}, "seed"), ({"logprobs": -2}, "logprobs"), ({"top_k": True}, "top_k"),
])
def test_bad_sampling_is_one_line(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(kr.EngineError, match=match) as err:
        kr.Sampling(**kw)
    assert "\n" not in str(err.value)


def test_bad_decode_changes_nothing(manifest: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
    with _engine(manifest, weights) as eng:
        seqs = [eng.sequence() for _ in range(3)]
        for i, seq in enumerate(seqs[:2]):
            eng.prefill(seq, _prompt(500 + i, 5), 3)
        g = kr.Sampling()
        before = [list(s.tokens) for s in seqs]
        for args, match in [
            (([seqs[0], seqs[0]], [g, g]), "twice"),
            (([seqs[0], seqs[2]], [g, g]), "prefill"),
            (([seqs[0]], [g, g]), "one Sampling"),
            (([], []), "at least one"),
            (([seqs[0]], [{"temperature": 1.0}]), "one kern_runtime.Sampling"),
            (([seqs[0], seqs[1]], [g, kr.Sampling(logprobs=21)]), "top-N"),
        ]:
            with pytest.raises(kr.EngineError, match=match):
                eng.decode(*args)
        assert [list(s.tokens) for s in seqs] == before
        assert [s.kv for s in seqs[:2]] == [4, 4]


def test_one_row_manifest_refuses_batches(weights: dict[str, np.ndarray]) -> None:
    m = kr.read_manifest(ROOT / "examples" / "qwen3-tiny.json")
    be = InterpBackend(m, weights)
    with kr.Engine(be, kr.serving_roles(m)) as eng:
        a, b = eng.sequence(), eng.sequence()
        eng.prefill(a, _prompt(1, 4), 2)
        eng.prefill(b, _prompt(2, 4), 2)
        with pytest.raises(kr.EngineError, match="no batched decode step"):
            eng.decode([a, b], [kr.Sampling()] * 2)
        assert eng.decode([a], [kr.Sampling()])[0].token == int(be.machine.read_output("next_token")[0])
        with pytest.raises(kr.EngineError, match="no batched decode step"):
            eng.decode([a], [kr.Sampling(logprobs=0)])


@pytest.mark.parametrize("asks", [
    [kr.Sampling()] * 3,
    [kr.Sampling(temperature=0.9, seed=1, logprobs=2), kr.Sampling(), kr.Sampling(top_k=3, temperature=1.0)],
    [kr.Sampling()],
    [kr.Sampling(logprobs=1)],
], ids=["greedy3", "mixed3", "one-row", "one-logprobs"])
def test_pipelined_steps_equal_single_steps(manifest: dict[str, Any], weights: dict[str, np.ndarray],
                                            asks: list[kr.Sampling]) -> None:
    prompts = [_prompt(600 + i, LENGTHS[i + 1]) for i in range(len(asks))]

    def run(pipelined: bool) -> tuple[list[list[kr.Sampled]], list[tuple[str, str]]]:
        with _engine(manifest, weights) as eng:
            seqs = [eng.sequence() for _ in prompts]
            for seq, p in zip(seqs, prompts, strict=True):
                eng.prefill(seq, p, STEPS)
            be = eng.backend
            assert isinstance(be, InterpBackend)
            be.calls.clear()
            out = list(eng.decode_steps(seqs, asks, STEPS)) if pipelined else [
                eng.decode(seqs, asks) for _ in range(STEPS)]
            assert all(len(s.tokens) == len(p) + STEPS for s, p in zip(seqs, prompts, strict=True))
            return out, list(be.calls)

    (steps, calls), (single, _) = run(True), run(False)
    assert steps == single
    kinds = [c[0] for c in calls if c[0] in ("issue", "fetched")]
    order = [k for i, k in enumerate(kinds) if i == 0 or k != kinds[i - 1] or k == "issue"]
    # NOTE: step k + 1 is issued before step k is read back (a step's reads count once)
    assert order == ["issue", "issue", *(["fetched", "issue"] * (STEPS - 2)), "fetched"]
    assert kinds.count("issue") == STEPS


def test_pipeline_closed_early_resumes(manifest: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
    """Closing the iterator after 2 of 5 steps leaves the sequences at 2 steps; the next steps
    reseed the rows the device had moved on and give the uninterrupted tokens."""
    prompts = [_prompt(700 + i, LENGTHS[i]) for i in range(3)]
    asks = [kr.Sampling(temperature=1.2, seed=i) for i in range(3)]

    def run(cut: bool) -> list[list[int]]:
        with _engine(manifest, weights) as eng:
            seqs = [eng.sequence() for _ in prompts]
            for seq, p in zip(seqs, prompts, strict=True):
                eng.prefill(seq, p, 8)
            if cut:
                it = eng.decode_steps(seqs, asks, 5)
                next(it), next(it)
                it.close()  # type: ignore[attr-defined]
                assert [s.kv for s in seqs] == [len(p) + 1 for p in prompts]
            for _ in range(6 if cut else 8):
                eng.decode(seqs, asks)
            return [s.tokens[len(p):] for s, p in zip(seqs, prompts, strict=True)]

    assert run(True) == run(False)


def test_pipeline_checks_first(manifest: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
    with _engine(manifest, weights) as eng:
        seq = eng.sequence()
        eng.prefill(seq, _prompt(9, 4), 3)
        for steps, match in [(0, "at least 1"), (4, "no room")]:
            with pytest.raises(kr.EngineError, match=match):
                eng.decode_steps([seq], [kr.Sampling()], steps)
        assert seq.kv == 3


def test_rows_in_step_are_not_seeded_again(manifest: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
    """The host seeds a row only when its sequence or position changed: a step after a step of
    the same sequences runs the batched program alone; a joining sequence seeds again."""
    with _engine(manifest, weights) as eng:
        seqs = [eng.sequence() for _ in range(4)]
        for i, seq in enumerate(seqs):
            eng.prefill(seq, _prompt(800 + i, LENGTHS[i]), 4)
        be = eng.backend
        assert isinstance(be, InterpBackend)
        g = [kr.Sampling()] * 4
        runs: list[list[tuple[str, str]]] = []
        for step in (seqs[:2], seqs[:2], seqs[:4], seqs[:4]):
            be.calls.clear()
            eng.decode(step, g[: len(step)])
            runs.append([c for c in be.calls if c[0] in ("run", "issue")])
    assert runs == [[("run", "seed_rows"), ("issue", "decode_rows")], [("issue", "decode_rows")],
                    [("run", "seed_rows"), ("issue", "decode_rows")], [("issue", "decode_rows")]]


def test_a_pipeline_keeps_steps_in_flight_and_the_rows_are_its_meanwhile(
        manifest: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
    """Engine.pipeline: steps issued two ahead and read in order give decode_steps' results; while
    one is in flight every call on its rows is refused (nothing changes); after it, another call
    ends the idle pipeline; a step past a lease's room is refused."""
    prompts = [_prompt(900 + i, LENGTHS[i]) for i in range(3)]
    asks = [kr.Sampling(), kr.Sampling(temperature=0.9, seed=5, logprobs=1), kr.Sampling(top_k=4, temperature=1.0)]

    def opened(eng: kr.Engine) -> list[kr.Sequence]:
        seqs = [eng.sequence() for _ in prompts]
        for seq, p in zip(seqs, prompts, strict=True):
            eng.prefill(seq, p, 4)
        return seqs

    with _engine(manifest, weights) as eng:
        want = list(eng.decode_steps(opened(eng), asks, 4))
    with _engine(manifest, weights) as eng:
        seqs = opened(eng)
        other = eng.sequence()
        pipe = eng.pipeline(seqs, asks)
        assert pipe is not None and pipe.seqs == tuple(seqs) and pipe.pending == 0
        pipe.issue()
        pipe.issue()
        assert pipe.pending == 2 and [s.kv for s in seqs] == [len(p) - 1 for p in prompts]
        for call in (lambda: eng.prefill(seqs[2], [*prompts[2], 1], 2), lambda: eng.decode(seqs, asks),
                     lambda: eng.finish(seqs[0]), lambda: eng.release(seqs[1]), lambda: eng.step(seqs[0]),
                     lambda: eng.pipeline(seqs, asks)):
            with pytest.raises(kr.EngineError, match="in flight"):
                call()
        got = [pipe.read()]
        pipe.issue()
        got += [pipe.read(), pipe.read()]
        pipe.issue()
        got.append(pipe.read())
        assert got == want and [s.kv for s in seqs] == [len(p) + 3 for p in prompts]
        with pytest.raises(kr.EngineError, match="no room"):
            pipe.issue()
        with pytest.raises(kr.EngineError, match="no decode step"):
            pipe.read()
        eng.prefill(other, _prompt(1, 3), 2)  # the idle pipeline ends
        assert not pipe.open
        with pytest.raises(kr.EngineError, match="closed"):
            pipe.issue()


def test_a_pipeline_closed_with_steps_in_flight_drops_them(manifest: dict[str, Any],
                                                           weights: dict[str, np.ndarray]) -> None:
    """Closing drops the unread steps: the sequences stay at the steps read and the next steps
    (the rows seeded again) give the tokens of an uninterrupted run."""
    prompts = [_prompt(950 + i, LENGTHS[i]) for i in range(2)]
    asks = [kr.Sampling(temperature=1.1, seed=3), kr.Sampling()]

    def run(cut: bool) -> list[list[int]]:
        with _engine(manifest, weights) as eng:
            seqs = [eng.sequence() for _ in prompts]
            for seq, p in zip(seqs, prompts, strict=True):
                eng.prefill(seq, p, 6)
            if cut:
                pipe = eng.pipeline(seqs, asks)
                assert pipe is not None
                pipe.issue()
                pipe.issue()
                pipe.read()
                pipe.close()
                assert pipe.pending == 0 and [s.kv for s in seqs] == [len(p) for p in prompts]
            for _ in range(5 if cut else 6):
                eng.decode(seqs, asks)
            return [s.tokens[len(p):] for s, p in zip(seqs, prompts, strict=True)]

    assert run(True) == run(False)


def test_one_greedy_row_pipelines_on_the_one_row_step(manifest: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
    prompt = _prompt(990, 11)
    want = _alone(manifest, weights, prompt, 4)
    with _engine(manifest, weights) as eng:
        seq = eng.sequence()
        eng.prefill(seq, prompt, 4)
        pipe = eng.pipeline([seq], [kr.Sampling()])
        assert pipe is not None
        pipe.issue()
        got: list[int] = []
        for k in range(4):
            if k < 3:
                pipe.issue()
            got.append(pipe.read()[0].token)
        be = eng.backend
        assert isinstance(be, InterpBackend)
        assert ("issue", "decode") in be.calls and ("issue", "decode_rows") not in be.calls
    assert got == want


def test_the_rows_sampling_inputs_are_written_only_when_they_change(
        manifest: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
    """Steps whose rows keep their Sampling and bucket write no sampling inputs; a changed Sampling
    or bucket writes them again, and the tokens are those of an engine that writes them every
    step."""
    prompts = [_prompt(1000 + i, LENGTHS[i]) for i in range(3)]
    a, b = kr.Sampling(temperature=0.8, seed=1), kr.Sampling(temperature=1.3, top_p=0.5, seed=2)
    steps = [[a, b], [a, b], [b, a], [b, a], [a, b, a], [a, b, a], [a, b]]

    def run(always: bool) -> tuple[list[list[int]], list[int]]:
        with _engine(manifest, weights) as eng:
            be = eng.backend
            assert isinstance(be, InterpBackend)
            writes: list[str] = []
            write = be.write_input

            def counted(name: str, array: Any) -> None:
                writes.append(name)
                write(name, array)

            be.write_input = counted  # type: ignore[method-assign]
            seqs = [eng.sequence() for _ in prompts]
            for seq, p in zip(seqs, prompts, strict=True):
                eng.prefill(seq, p, 8)
            per: list[int] = []
            for asks in steps:
                if always:
                    eng._seats.sampling = None  # pyright: ignore[reportPrivateUsage]
                writes.clear()
                eng.decode(seqs[: len(asks)], asks)
                per.append(writes.count("row_sampling") + writes.count("row_seed"))
            return [s.tokens[len(p):] for s, p in zip(seqs, prompts, strict=True)], per

    (cached, writes), (fresh, _) = run(False), run(True)
    assert cached == fresh
    assert writes == [2, 0, 2, 0, 2, 0, 2]


@pytest.mark.parametrize("n", [1, 3])
def test_a_prefill_of_another_sequence_queues_behind_the_steps_in_flight(
        manifest: dict[str, Any], weights: dict[str, np.ndarray], n: int) -> None:
    """While a pipeline (the one-row step for one greedy row, else the batched step) has steps in
    flight, another sequence is prefilled: the pipeline issues no more, its steps in flight read
    back as if nothing came between, and both sequences then decode the tokens of runs without
    the interruption."""
    prompts = [_prompt(1100 + i, LENGTHS[i]) for i in range(n)]
    late = _prompt(1200, 13)
    asks = [kr.Sampling()] if n == 1 else [kr.Sampling(), kr.Sampling(temperature=0.9, seed=4), kr.Sampling(logprobs=1)]
    with _engine(manifest, weights) as eng:
        seqs = [eng.sequence() for _ in prompts]
        for seq, p in zip(seqs, prompts, strict=True):
            eng.prefill(seq, p, 6)
        want = list(eng.decode_steps(seqs, asks, 6))
    with _engine(manifest, weights) as eng:
        alone = eng.sequence()
        eng.prefill(alone, late, 3)
        want_late = [eng.decode([alone], [kr.Sampling()])[0] for _ in range(3)]
    with _engine(manifest, weights) as eng:
        seqs = [eng.sequence() for _ in prompts]
        for seq, p in zip(seqs, prompts, strict=True):
            eng.prefill(seq, p, 6)
        pipe = eng.pipeline(seqs, asks)
        assert pipe is not None
        pipe.issue()
        pipe.issue()
        other = eng.sequence()
        eng.prefill(other, late, 3)
        assert not pipe.open and pipe.pending == 2
        with pytest.raises(kr.EngineError, match="closed"):
            pipe.issue()
        with pytest.raises(kr.EngineError, match="in flight"):
            eng.decode([other], [kr.Sampling()])
        got = [pipe.read(), pipe.read()]
        got += [eng.decode(seqs, asks) for _ in range(4)]
        got_late = [eng.decode([other], [kr.Sampling()])[0] for _ in range(3)]
    assert got == want and got_late == want_late
