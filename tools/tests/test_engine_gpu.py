"""kern_runtime.Engine on the GPU with the Qwen3-4B shape (seeded random checkpoint,
kern_qwen3.checkpoint): a turn continued from a resident prefix, from a prefix parked to the host
tier (its device pages reused by another sequence, then woken), from a fork of a live sequence
inside a page and from a lease_from at whole pages gives the greedy tokens of the same turns
computed on one fresh sequence without the cache (the same chunks, so the same kernels at every
position: the logits agree to the bit when the kernels are deterministic; the bound below is 1e-3
relative). Lengths cross page (16 tokens) and chunk (64 rows) boundaries. Pages and host units go
back to zero at the end. The head program (the first token from the last prefill chunk's row), on
the plain manifest and the fast one's options: the same greedy tokens as the turns whose first
decode step computes the last prompt token, up to a near-tie."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

TOOLS = Path(__file__).resolve().parents[1]
CHUNK = 64
STEPS = 8
LOGIT_TOL = 1e-3


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """The kernels built once for the module: their directory, module hashes and entries."""
    import kern_qwen3 as gen
    from kern_mining.build import build_kernels

    tmp = tmp_path_factory.mktemp("engine4b")
    hashes = {m: sha for m, (_p, sha) in build_kernels(TOOLS / "kernels-src", tmp / "kernels").items()}
    return SimpleNamespace(dir=tmp, hashes=hashes, entries=gen.entry_modules(TOOLS / "kernels-src"))


def _runtime(built: SimpleNamespace, name: str, **options: Any) -> Iterator[Any]:
    """A Qwen3-4B runtime (seeded random checkpoint, 8,192 KV tokens, a 512 MiB host tier) over the
    manifest of `options` (helpers.qwen3_options' keywords), and its serving roles."""
    from helpers.qwen3_options import generate as _generate

    import kern_qwen3 as gen
    import kern_runtime as kr
    from kern_qwen3 import QWEN3_4B_CONFIG, random_checkpoint

    feed = "device" if all(e in built.entries for e in gen.DEVICE_FEED_ENTRIES) else "host"
    m = _generate(gen.shape_from_config(QWEN3_4B_CONFIG), built.hashes, built.entries, model="qwen3-4b", feed=feed,
                  **options)
    manifest = built.dir / f"{name}.json"
    manifest.write_text(json.dumps(m))
    ckpt, _ = random_checkpoint(QWEN3_4B_CONFIG, seed=0, name="qwen3-4b")
    runtime = kr.Runtime.load(manifest, built.dir / "kernels", gpu=0, capacity=kr.Capacity(tokens=8192, seqs=4))
    try:
        runtime.load_weights(kr.Safetensors.open(ckpt))
        runtime.enable_host_tier(512 << 20)
        yield SimpleNamespace(rt=runtime, roles=kr.serving_roles(kr.read_manifest(manifest)))
    finally:
        runtime.close()


@pytest.fixture(scope="module")
def rt(built: SimpleNamespace) -> Iterator[Any]:
    yield from _runtime(built, "qwen3-4b")


@pytest.fixture(scope="module")
def fast_rt(built: SimpleNamespace) -> Iterator[Any]:
    """The fast manifest's options (examples/qwen3-4b-fast.json: every decode GEMM as our GEMV,
    fused q/k norm + rope + KV write and attention, folded deferred norms, PDL)."""
    yield from _runtime(built, "qwen3-4b-fast", gemv=["qkv", "o", "gate_up", "down", "lm_head"], fuse=True, pdl=True,
                        fold_norm=True, defer_norm=True)


def _engine(rt: Any, chunk: int = CHUNK) -> Any:
    """An engine with an empty index on the module's runtime (`rt`: the fixture's rt and roles)."""
    import kern_runtime as kr

    return kr.Engine(rt.rt, rt.roles, kr.EngineConfig(chunk=chunk, park=True))


def _ids(seed: int, n: int) -> list[int]:
    return [int(x) for x in np.random.default_rng(seed).integers(0, 150000, size=n)]


def _steps(eng: Any, seq: Any, n: int) -> list[np.ndarray]:
    out = []
    for _ in range(n):
        eng.step(seq)
        raw = np.asarray(eng.backend.read_output("logits")).reshape(-1)
        # NOTE: bf16 outputs come back as their uint16 bits; widening them is exact
        out.append((raw.astype(np.uint32) << 16).view(np.float32) if raw.dtype == np.uint16 else raw.astype(np.float32))
    return out


def _turn(eng: Any, seq: Any, prompt: list[int], steps: int = STEPS, room: int | None = None,
          finish: bool = True) -> tuple[Any, list[np.ndarray]]:
    pre = eng.prefill(seq, prompt, room or steps)
    logits = _steps(eng, seq, steps)
    if finish:
        eng.finish(seq)
    return pre, logits


def _continuous(rt: Any, prompts: list[list[int]], steps: list[int], chunk: int = CHUNK,
                room: int = 600) -> tuple[list[int], list[list[np.ndarray]]]:
    """The turns on one sequence of a fresh engine (same runtime, empty index), continuing in place
    (`room`: the length the first lease is sized for)."""
    import kern_runtime as kr

    eng = _engine(rt, chunk)
    seq = eng.sequence()
    out = []
    for prompt, n in zip(prompts, steps, strict=True):
        pre = eng.prefill(seq, prompt, room - len(prompt))
        assert pre.source in (kr.Source.FRESH, kr.Source.CONTINUE), pre
        out.append(_steps(eng, seq, n))
    tokens = list(seq.tokens)
    eng.close()
    return tokens, out


def _same(got: list[np.ndarray], want: list[np.ndarray], got_tokens: list[int], want_tokens: list[int]) -> None:
    assert got_tokens == want_tokens
    worst = max(float(np.linalg.norm(a - b) / np.linalg.norm(b)) for a, b in zip(got, want, strict=True))
    print(f"logits: largest relative L2 difference {worst:.3e} over {len(got)} steps")
    assert worst <= LOGIT_TOL


def _clean(rt: Any, eng: Any) -> None:
    eng.close()
    assert rt.rt.pool.pages_used == 0 and rt.rt.host.used == 0


def test_resident_prefix_turns_match_one_sequence(rt: Any) -> None:
    import kern_runtime as kr

    eng = _engine(rt)
    seq = eng.sequence()
    p1 = _ids(1, 100)  # prefill rows 0..98: chunks of 64 and 35
    _, l1 = _turn(eng, seq, p1)
    kv = len(seq.tokens) - 1  # 107: inside page 6
    p2 = [*seq.tokens, *_ids(2, 90)]  # rows 107..196: two chunks, pages 6..12
    pre, l2 = _turn(eng, seq, p2)
    assert (pre.source, pre.reused) == (kr.Source.RESIDENT, kv)
    tokens, want = _continuous(rt, [p1, p2], [STEPS, STEPS])
    _same(l1 + l2, want[0] + want[1], seq.tokens, tokens)
    _clean(rt, eng)


def test_parked_prefix_is_woken_after_its_pages_were_reused(rt: Any) -> None:
    import kern_runtime as kr

    eng = _engine(rt)
    a = eng.sequence()
    p1 = _ids(3, 100)
    _, l1 = _turn(eng, a, p1)
    assert eng.evict() and eng.counters.parks == 1
    eng.turn(eng.sequence(), _ids(4, 300), 2)  # takes the lowest free pages: those a's entry held
    eng.evict()  # that turn's entry goes to the host too
    p2 = [*a.tokens, *_ids(5, 90)]
    pre, l2 = _turn(eng, a, p2)
    assert (pre.source, pre.reused) == (kr.Source.PARKED, len(p1) - 1 + STEPS)
    assert eng.counters.wakes == 1
    tokens, want = _continuous(rt, [p1, p2], [STEPS, STEPS])
    _same(l1 + l2, want[0] + want[1], a.tokens, tokens)
    _clean(rt, eng)


def test_a_fork_inside_a_page_matches_one_sequence(rt: Any) -> None:
    import kern_runtime as kr

    eng = _engine(rt)
    a = eng.sequence()
    pa = _ids(6, 100)
    _, la = _turn(eng, a, pa, steps=10, room=14, finish=False)  # live: KV of 109 tokens
    b = eng.branch(a, 105)  # 6 decoded tokens in: page 6, offset 9
    pb = [*b.tokens, *_ids(7, 40)]
    pre, lb = _turn(eng, b, pb)
    assert (pre.source, pre.reused) == (kr.Source.FORK, 105)
    more = _steps(eng, a, 4)  # the parent writes on in its own copy of page 6
    a_tokens = list(a.tokens)
    want_a_tokens, want_a = _continuous(rt, [pa], [14])
    _same(la + more, want_a[0], a_tokens, want_a_tokens)
    want_b_tokens, want_b = _continuous(rt, [pa, pb], [6, STEPS])
    _same(lb, want_b[1], b.tokens, want_b_tokens)
    _clean(rt, eng)


def test_lease_from_an_earlier_turn_at_whole_pages_matches_one_sequence(rt: Any) -> None:
    import kern_runtime as kr

    eng = _engine(rt)
    a = eng.sequence()
    _turn(eng, a, _ids(8, 100))
    b = eng.branch(a, 70)
    pb = [*b.tokens, *_ids(9, 60)]  # shares pages 0..3 with a's entry: restored at 64
    pre, lb = _turn(eng, b, pb)
    assert (pre.source, pre.reused) == (kr.Source.RESIDENT, 64)
    want_tokens, want = _continuous(rt, [pb[:65], pb], [0, STEPS])  # rows 0..63 as one chunk, like a's
    _same(lb, want[1], b.tokens, want_tokens)
    _clean(rt, eng)


@pytest.mark.parametrize("parked", [False, True], ids=["resident", "parked"])
def test_a_long_turn_over_a_long_prefix_matches_one_sequence(rt: Any, parked: bool) -> None:
    """Serving-sized chunks (512 rows) and a conversation past 2,048 tokens: the cached prefix
    ends inside a page (1,507 = 94 pages + 3) and the new turn's rows cross chunk and page
    boundaries up to 2,215."""
    import kern_runtime as kr

    chunk = 512
    eng = _engine(rt, chunk)
    a = eng.sequence()
    p1 = _ids(10, 1500)  # rows 0..1498: chunks of 512, 512, 475
    _, l1 = _turn(eng, a, p1)
    if parked:
        assert eng.evict() and eng.counters.parks == 1
        eng.turn(eng.sequence(), _ids(11, 1600), 2)  # reuses the pages a's entry held
        eng.evict()
    p2 = [*a.tokens, *_ids(12, 700)]  # rows 1507..2206
    pre, l2 = _turn(eng, a, p2)
    source = kr.Source.PARKED if parked else kr.Source.RESIDENT
    assert (pre.source, pre.reused) == (source, len(p1) - 1 + STEPS)
    tokens, want = _continuous(rt, [p1, p2], [STEPS, STEPS], chunk=chunk, room=2400)
    _same(l1 + l2, want[0] + want[1], a.tokens, tokens)
    _clean(rt, eng)


# --------------------------------------------------------------------------------------------
# The head program: the first token from the last prefill chunk's row.

HEAD_LOGIT_TOL = 0.15
"""The first token's logits through the head against the first decode step's (relative L2): the
last prompt token's layers run the chunk program's GEMMs and prefill attention instead of the
step's GEMVs and decode attention, so the two differ by bf16 rounding (a few 1e-2 on the random
4B, like two bf16 implementations against each other); a wrong row or buffer gives ~1."""


def _head_turn(eng: Any, seq: Any, prompt: list[int], steps: int) -> tuple[list[int], np.ndarray]:
    pre = eng.prefill(seq, prompt, steps, first=True)
    assert pre.first is not None and seq.kv == len(prompt), pre
    first = _steps_logits(eng)
    tokens = [pre.first]
    for _ in range(steps - 1):
        tokens.append(eng.step(seq))
    return tokens, first


def _steps_logits(eng: Any) -> np.ndarray:
    raw = np.asarray(eng.backend.read_output("logits")).reshape(-1)
    return (raw.astype(np.uint32) << 16).view(np.float32) if raw.dtype == np.uint16 else raw.astype(np.float32)


def _stepped_turn(eng: Any, seq: Any, prompt: list[int], steps: int) -> tuple[list[int], list[np.ndarray]]:
    pre = eng.prefill(seq, prompt, steps)
    assert pre.first is None, pre
    logits = _steps(eng, seq, steps)
    return list(seq.tokens[len(prompt):]), logits


def _same_greedy(got: list[int], want: list[int], want_logits: list[np.ndarray], what: str) -> None:
    """`got` equals `want`, or departs from it at a near-tie of the run that gave `want`: its top-1
    logit minus its logit of `got`'s token at most NEAR_TIE_ULPS bf16 ulps (qwen3_checks' rule)."""
    from qwen3_checks import NEAR_TIE_ULPS, bf16_ulp

    if got == want:
        print(f"{what}: {len(got)} tokens identical")
        return
    j = next(i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b)
    lg = want_logits[j]
    top = float(lg[want[j]])
    gap = (top - float(lg[got[j]])) / bf16_ulp(top)
    print(f"{what}: departs at step {j} ({got[j]} vs {want[j]}), gap {gap:.3f} bf16 ulps")
    assert gap <= NEAR_TIE_ULPS, (what, j, gap)


@pytest.mark.parametrize("which", ["plain", "fast"])
def test_the_heads_turns_are_the_first_steps(which: str, request: pytest.FixtureRequest) -> None:
    """Turns whose first token comes from the head against the same turns whose first decode step
    computes it (one engine each, fresh sequences): the greedy tokens agree (up to a near-tie) for
    prompts whose last chunk ends inside a page, on a chunk's last row and as a chunk of one row;
    and a conversation continued from its resident prefix through `Engine.turn`."""
    rt = request.getfixturevalue("rt" if which == "plain" else "fast_rt")
    assert rt.roles.head_program is not None
    head, stepped = _engine(rt), _engine(rt)
    for n in (2, 64, 65, 100, 129, 700):
        prompt = _ids(20 + n, n)
        got, got_first = _head_turn(head, head.sequence(), prompt, STEPS)
        want, want_logits = _stepped_turn(stepped, stepped.sequence(), prompt, STEPS)
        rel = float(np.linalg.norm(got_first - want_logits[0]) / np.linalg.norm(want_logits[0]))
        print(f"{which} n={n}: first-token logits relative L2 {rel:.3e}")
        assert rel <= HEAD_LOGIT_TOL, (n, rel)
        _same_greedy(got, want, want_logits, f"{which} n={n}")
        for eng in (head, stepped):
            for seq in eng.sequences:
                eng.release(seq)
    conv = head.sequence()
    t1 = head.turn(conv, _ids(30, 100), STEPS)
    p2 = [*conv.tokens, *_ids(31, 90)]
    t2 = head.turn(conv, p2, STEPS)
    assert t2.prefill.source.value == "resident" and t2.prefill.first == t2.tokens[0]
    assert head.counters.heads == 6 + 2
    for prompt, t in ((_ids(30, 100), t1), (p2, t2)):
        want, want_logits = _stepped_turn(stepped, stepped.sequence(), prompt, STEPS)
        _same_greedy(t.tokens, want, want_logits, f"{which} turn of {len(prompt)}")
    print(f"{which}: TTFT {t1.ttft_ms:.2f} / {t2.ttft_ms:.2f} ms")
    stepped.close()
    _clean(rt, head)
