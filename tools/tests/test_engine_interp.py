"""kern_runtime.Engine on the float32 Qwen3 interpreter (examples/qwen3-tiny.json, and a host-fed
twin): a turn continued from a cached prefix (resident; parked, its pages overwritten, then woken),
from a fork of a live sequence and from a lease_from at whole pages gives the logits of computing
the whole conversation (the independent numpy Qwen3) and, bit for bit, of the same turns on one
sequence without the cache; lengths cross page (16 tokens) and chunk boundaries. Pages go back to
zero when everything closes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.manifest_reads import counted_reads
from helpers.qwen3_options import generate as _generate
from helpers.tinytok import TinyTok

import kern_qwen3 as gen
import kern_runtime as kr
from kern_interp import qwen3 as interp
from kern_interp.backend import InterpBackend
from kern_qwen3 import QWEN3_TINY_CONFIG, random_checkpoint

ROOT = Path(__file__).resolve().parents[2]
CONFIG: dict[str, Any] = dict(QWEN3_TINY_CONFIG)
CHUNK = 16
STEPS = 6


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    path, _ = random_checkpoint(CONFIG, seed=5, name="engine", root=tmp_path_factory.mktemp("ckpt"))
    return interp.read_checkpoint(path)


@pytest.fixture(scope="module", params=["device", "host"])
def manifest(request: pytest.FixtureRequest) -> Any:
    """The shipped tiny manifest (device-fed, `read_manifest`'s model) and the host-fed manifest of the
    same model (generated, plain JSON)."""
    if request.param == "device":
        return kr.read_manifest(ROOT / "examples" / "qwen3-tiny.json")
    return _generate(gen.shape_from_config(CONFIG), {"m": "0" * 64}, {e: "m" for e in gen.ENTRIES}, model="t",
                     feed="host")


def _ids(seed: int, n: int) -> list[int]:
    return [int(x) for x in np.random.default_rng(seed).integers(0, 4000, size=n)]


def _engine(manifest: Any, weights: dict[str, np.ndarray], **backend: Any) -> kr.Engine:
    be = InterpBackend(manifest, weights, **backend)
    return kr.Engine(be, kr.serving_roles(be.machine.model), kr.EngineConfig(chunk=CHUNK, park="host_pages" in backend))


def _turn(eng: kr.Engine, seq: kr.Sequence, prompt: list[int], steps: int = STEPS,
          finish: bool = True, room: int | None = None) -> tuple[kr.Prefilled, list[np.ndarray]]:
    """prefill + steps, reading each step's logits; finishes the turn unless told not to."""
    pre = eng.prefill(seq, prompt, room or steps)
    logits = [_step(eng, seq) for _ in range(steps)]
    if finish:
        eng.finish(seq)
    return pre, logits


def _step(eng: kr.Engine, seq: kr.Sequence) -> np.ndarray:
    eng.step(seq)
    return np.asarray(eng.backend.read_output("logits"), dtype=np.float32).copy()


def _continuous(manifest: dict[str, Any], weights: dict[str, np.ndarray], prompts: list[list[int]],
                steps: list[int]) -> list[list[np.ndarray]]:
    """The same turns on one sequence of a fresh engine whose lease holds the whole conversation:
    each prompt continues in place (nothing restored, forked or woken)."""
    eng = _engine(manifest, weights, pages=64)
    seq = eng.sequence()
    out = []
    for prompt, n in zip(prompts, steps, strict=True):
        pre = eng.prefill(seq, prompt, 400 - len(prompt))
        assert pre.source in (kr.Source.FRESH, kr.Source.CONTINUE)
        out.append([_step(eng, seq) for _ in range(n)])
    eng.close()
    return out


def _check_reference(weights: dict[str, np.ndarray], seq_tokens: list[int], start: int,
                     logits: list[np.ndarray]) -> None:
    """Each step's logits equal the numpy Qwen3's over the whole conversation up to that step."""
    for i, got in enumerate(logits):
        want = interp.reference_logits(CONFIG, weights, seq_tokens[: start + i])
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-4, f"step {i}"
        assert int(np.argmax(got)) == seq_tokens[start + i]


def _closed_clean(eng: kr.Engine) -> None:
    be = eng.backend
    eng.close()
    assert be.pool.pages_used == 0 and be.pool.slots_used == 0  # type: ignore[attr-defined]
    if be._host is not None:  # type: ignore[attr-defined]
        assert be.host.used == 0  # type: ignore[attr-defined]


def test_a_turn_continues_from_the_resident_prefix(manifest: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
    eng = _engine(manifest, weights, pages=64)
    seq = eng.sequence()
    p1 = _ids(1, 37)  # 36 prefilled rows: chunks 16 + 16 + 4
    pre1, l1 = _turn(eng, seq, p1)
    assert (pre1.source, pre1.reused, pre1.prefilled) == (kr.Source.FRESH, 0, 37)
    kv1 = len(seq.tokens) - 1  # 42: inside page 2
    assert [(len(k), r, p) for k, r, p in eng.prefix.entries()] == [(kv1, True, False)]
    p2 = [*seq.tokens, *_ids(2, 25)]  # prefill rows 42..66: across pages 3 and 4, two chunks
    pre2, l2 = _turn(eng, seq, p2)
    assert (pre2.source, pre2.reused, pre2.prefilled) == (kr.Source.RESIDENT, kv1, len(p2) - kv1)
    p3 = [*seq.tokens, *_ids(3, 21)]
    pre3, l3 = _turn(eng, seq, p3)
    assert pre3.source is kr.Source.RESIDENT and pre3.reused == len(p2) + STEPS - 1
    want = _continuous(manifest, weights, [p1, p2, p3], [STEPS] * 3)
    for got, ref in zip([l1, l2, l3], want, strict=True):
        assert all(np.array_equal(a, b) for a, b in zip(got, ref, strict=True))
    _check_reference(weights, seq.tokens, len(p3), l3)
    assert eng.counters.reused == kv1 + pre3.reused and eng.counters.turns == 0  # turns counts turn()
    _closed_clean(eng)


def test_a_branch_forks_a_live_sequence_inside_a_page(manifest: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
    eng = _engine(manifest, weights, pages=64)
    a = eng.sequence()
    pa = _ids(4, 37)
    _, la = _turn(eng, a, pa, finish=False, room=STEPS + 3)  # live: KV of 42 tokens
    b = eng.branch(a, 40)  # prompt plus 3 answer tokens: inside page 2
    pb = [*b.tokens, *_ids(5, 11)]
    pre, lb = _turn(eng, b, pb)
    assert (pre.source, pre.reused) == (kr.Source.FORK, 40)
    _check_reference(weights, b.tokens, len(pb), lb)
    more = [_step(eng, a) for _ in range(3)]  # the parent goes on writing its own partial page
    want = _continuous(manifest, weights, [pa], [STEPS + 3])
    assert all(np.array_equal(x, y) for x, y in zip(la + more, want[0], strict=True))
    ref_b = _continuous(manifest, weights, [pa, pb], [4, STEPS])  # a decoded positions 36..39
    assert all(np.array_equal(x, y) for x, y in zip(lb, ref_b[1], strict=True))
    _closed_clean(eng)


def test_an_earlier_turn_is_leased_from_at_whole_pages(manifest: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
    eng = _engine(manifest, weights, pages=64)
    a = eng.sequence()
    _turn(eng, a, _ids(6, 37))
    b = eng.branch(a, 35)
    pb = [*b.tokens, *_ids(7, 30)]
    pre, lb = _turn(eng, b, pb)
    assert (pre.source, pre.reused, pre.prefilled) == (kr.Source.RESIDENT, 32, len(pb) - 32)
    _check_reference(weights, b.tokens, len(pb), lb)
    # NOTE: the turn's chunks start at page 2 either way, so the cache-free run computes the same rows
    ref = _continuous(manifest, weights, [pb[:33], pb], [0, STEPS])
    assert all(np.array_equal(x, y) for x, y in zip(lb, ref[1], strict=True))
    _closed_clean(eng)


def test_a_parked_prefix_is_woken_after_its_pages_were_reused(manifest: dict[str, Any],
                                                              weights: dict[str, np.ndarray]) -> None:
    eng = _engine(manifest, weights, pages=16, host_pages=32)
    a, b = eng.sequence(), eng.sequence()
    pa = _ids(8, 37)
    _, la1 = _turn(eng, a, pa)  # KV of 42 tokens: 3 pages in the index
    _turn(eng, b, _ids(9, 210))  # 215 tokens: 14 pages; only 13 free: a's entry is parked
    assert (eng.counters.evictions, eng.counters.parks, eng.counters.dropped) == (1, 1, 0)
    assert sorted((len(k), r, p) for k, r, p in eng.prefix.entries()) == [(42, False, True), (215, True, False)]
    pa2 = [*a.tokens, *_ids(10, 13)]
    pre, la2 = _turn(eng, a, pa2)  # waking needs 3 pages: b's entry is parked first
    assert (pre.source, pre.reused) == (kr.Source.PARKED, 42)
    assert (eng.counters.evictions, eng.counters.parks, eng.counters.wakes) == (2, 2, 1)
    _check_reference(weights, a.tokens, len(pa2), la2)
    want = _continuous(manifest, weights, [pa, pa2], [STEPS, STEPS])
    for got, ref in zip([la1, la2], want, strict=True):
        assert all(np.array_equal(x, y) for x, y in zip(got, ref, strict=True))
    _closed_clean(eng)


def test_live_sequences_take_turns_on_the_row(manifest: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
    """Two live sequences stepped alternately: each is re-seated (block table, staged token,
    device carries) and generates what it generates alone."""
    eng = _engine(manifest, weights, pages=64)
    a, b = eng.sequence(), eng.sequence()
    pa, pb = _ids(11, 21), _ids(12, 50)
    eng.prefill(a, pa, STEPS)
    eng.prefill(b, pb, STEPS)
    got_a, got_b = [], []
    for _ in range(STEPS):
        got_a.append(_step(eng, a))
        got_b.append(_step(eng, b))
    assert eng.backend.pool.pages_used == 2 + 4  # type: ignore[attr-defined]
    for got, p in ((got_a, pa), (got_b, pb)):
        want = _continuous(manifest, weights, [p], [STEPS])[0]
        assert all(np.array_equal(x, y) for x, y in zip(got, want, strict=True))
    _closed_clean(eng)


def test_turn_reports_and_stops(manifest: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
    eng = _engine(manifest, weights, pages=64)
    seq = eng.sequence()
    seen: list[int] = []
    t = eng.turn(seq, _ids(13, 20), 5, on_token=seen.append)
    assert t.tokens == seen == seq.tokens[20:] and len(t.tokens) == 5
    assert t.ttft_ms > 0 and t.decode_ms_per_token > 0 and t.prefill.prefilled == 20
    stop = eng.turn(seq, [*seq.tokens, 7], 5, stop=set(range(4096)))
    assert len(stop.tokens) == 1 and stop.decode_ms_per_token == 0.0 and stop.prefill.reused == 24
    assert eng.counters.turns == 2
    _closed_clean(eng)


# --------------------------------------------------------------------------------------------
# Errors: one line, nothing changed.


def test_engine_errors_leave_everything_as_it_was(manifest: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
    eng = _engine(manifest, weights, pages=16)
    seq = eng.sequence()
    with pytest.raises(kr.EngineError, match="has no live turn: prefill a prompt first"):
        eng.step(seq)
    with pytest.raises(kr.PromptError, match="the prompt is empty"):
        eng.prefill(seq, [], 4)
    with pytest.raises(kr.PromptError, match="outside the model's token ids"):
        eng.prefill(seq, [1, 4096], 4)
    with pytest.raises(kr.EngineError, match="room must be at least 1 decode step"):
        eng.prefill(seq, [1, 2], 0)
    with pytest.raises(kr.EngineError, match="one sequence holds at most 256 here"):
        eng.prefill(seq, list(range(250)), 8)
    assert seq.lease is None and seq.tokens == [] and eng.backend.pool.pages_used == 0  # type: ignore[attr-defined]
    eng.prefill(seq, _ids(14, 100), 30)  # 129 tokens: 9 of the 16 pages
    other = eng.sequence([5, 6])
    with pytest.raises(kr.EngineError, match=r"nothing left to evict: 1 live sequence\(s\) hold the pool"):
        eng.prefill(other, _ids(15, 120), 10)
    assert other.lease is None and other.tokens == [5, 6] and eng.backend.pool.pages_used == 9  # type: ignore[attr-defined]
    for _ in range(30):
        eng.step(seq)
    with pytest.raises(kr.EngineError, match="used its room of 129 tokens"):
        eng.step(seq)
    with pytest.raises(kr.EngineError, match=r"branch length 0 is not in \[1, 130\]"):
        eng.branch(seq, 0)
    eng.release(other)
    with pytest.raises(kr.EngineError, match="is not open in this engine"):
        eng.prefill(other, [1, 2], 2)
    foreign = _engine(manifest, weights, pages=16)
    with pytest.raises(kr.EngineError, match="is not open in this engine"):
        foreign.finish(seq)
    foreign.close()
    with pytest.raises(kr.EngineError, match="turn needs at least 1 step"):
        eng.turn(seq, [1, 2], 0)
    _closed_clean(eng)
    with pytest.raises(kr.EngineError, match="this engine is closed"):
        eng.sequence()


def test_a_pool_whose_page_is_not_the_block_stride_is_refused(weights: dict[str, np.ndarray]) -> None:
    m = kr.read_manifest(ROOT / "examples" / "qwen3-tiny.json")
    be = InterpBackend(m, weights, pages=16)
    roles = kr.serving_roles(m)
    import dataclasses

    with pytest.raises(kr.ApiError, match="the pool's pages hold 16 tokens; the block table's stride is 32"):
        kr.Engine(be, dataclasses.replace(roles, page_tokens=32))
    with pytest.raises(kr.ApiError, match="prefill chunk must be at least 1 row"):
        kr.Engine(be, roles, kr.EngineConfig(chunk=0))


# --------------------------------------------------------------------------------------------
# A server's startup on the CPU backend: the manifest read once.


def test_a_server_startup_parses_and_verifies_the_manifest_once(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """`serving_manifest`, the sizes check, the factory's RAM estimate and the factory itself (each
    given the manifest file's path, as `EngineSpec` names it) parse and verify its text once."""
    from kern_interp.serve import engine as cpu_engine
    from kern_runtime import loading
    from kern_runtime.serving import EngineSpec

    with counted_reads(monkeypatch) as seen:
        ckpt, _ = random_checkpoint(CONFIG, seed=5, name="startup", root=tmp_path)
        path = ROOT / "examples" / "qwen3-tiny-batch.json"
        manifest = loading.serving_manifest(path)
        spec = EngineSpec(path, ROOT / "kernels", (ckpt,), 0, 256, 2, 0, CHUNK)
        loading.check_sizes(spec, manifest, cpu_engine, "kern_interp.serve:engine")
        with loading.call_factory(cpu_engine, spec, "kern_interp.serve:engine") as eng:
            assert isinstance(eng.backend, InterpBackend) and eng.backend.machine.model is manifest
        assert seen == {"parse": 1, "check": 1}


# --------------------------------------------------------------------------------------------
# kern-run --turns / --chat and kern chat over the interpreter.


def _cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, weights: dict[str, np.ndarray]) -> list[kr.Engine]:
    from kern_runtime import loading

    m = kr.read_manifest(ROOT / "examples" / "qwen3-tiny.json")
    (tmp_path / "w.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")  # NOTE: an empty safetensors file
    made: list[kr.Engine] = []

    def fake_open(manifest: Path, kernels: Path, weights_: Any, **kw: Any) -> kr.Engine:
        assert kw["tokens"] == 4096 and kw["gpu"] == 0
        made.append(kr.Engine(InterpBackend(m, weights, pages=64), kw["roles"], kw["config"]))
        return made[-1]

    monkeypatch.setattr(loading, "probe_gpu", lambda gpu: None)
    monkeypatch.setattr(loading, "tokenizer", lambda name: TinyTok())
    monkeypatch.setattr(loading, "check_kernels", lambda *a: None)
    monkeypatch.setattr(loading, "ensure_kernels", lambda *a: None)
    monkeypatch.setattr(kr.Engine, "open", fake_open)
    monkeypatch.chdir(tmp_path)
    return made


CLI = ("--manifest", str(ROOT / "examples" / "qwen3-tiny.json"), "--weights", "w.safetensors", "--steps", "5",
       "--chunk", "16")


def test_kern_run_turns_continue_one_conversation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str],
                                                  weights: dict[str, np.ndarray]) -> None:
    import kern_cli.run as run

    made = _cli(tmp_path, monkeypatch, weights)
    (tmp_path / "turns.txt").write_text("The capital of France is\nAnd of Germany?\n", encoding="utf-8")
    assert run.main([*CLI, "--turns", "turns.txt", "--output", "ids"]) == 0
    out = capsys.readouterr()
    tok = TinyTok()
    eng = _engine(kr.read_manifest(ROOT / "examples" / "qwen3-tiny.json"), weights, pages=64)
    seq = eng.sequence()
    first = eng.turn(seq, tok.encode("The capital of France is"), 5).tokens
    second = eng.turn(seq, [*seq.tokens, *tok.encode("\nAnd of Germany?")], 5)
    assert out.out == f"{' '.join(map(str, first))}\n{' '.join(map(str, second.tokens))}\n"
    reports = [line for line in out.err.splitlines() if ": turn " in line]
    assert reports[0].startswith("kern-run: turn 1: reused 0 tokens from cache, prefilled 24, TTFT ")
    assert reports[1].startswith(f"kern-run: turn 2: reused {second.prefill.reused} tokens from cache, "
                                 f"prefilled {second.prefill.prefilled}, TTFT ")
    assert second.prefill.reused == 28 and "ms/token (5 tokens)" in reports[1]
    assert made[0].backend.pool.pages_used == 0  # type: ignore[attr-defined]


def test_kern_run_chat_renders_the_template(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str], weights: dict[str, np.ndarray]) -> None:
    import kern_cli.run as run
    from kern_qwen3 import render
    from kern_runtime.loading import decode_text

    _cli(tmp_path, monkeypatch, weights)
    (tmp_path / "turns.txt").write_text("hi\nmore\n", encoding="utf-8")
    assert run.main([*CLI, "--turns", "turns.txt", "--chat"]) == 0
    out = capsys.readouterr()
    tok = TinyTok()
    eng = _engine(kr.read_manifest(ROOT / "examples" / "qwen3-tiny.json"), weights, pages=64)
    seq = eng.sequence()
    a1 = eng.turn(seq, tok.encode(render([{"role": "user", "content": "hi"}])), 5).tokens
    said = decode_text(tok, a1)
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": said},
            {"role": "user", "content": "more"}]
    a2 = eng.turn(seq, tok.encode(render(msgs)), 5).tokens
    assert out.out == f"{said}\n{decode_text(tok, a2)}\n"
    assert "kern-run: turn 2: reused " in out.err


def test_kern_chat_streams_answers_from_stdin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str],
                                              weights: dict[str, np.ndarray]) -> None:
    import io

    import kern_cli.chat as chat

    made = _cli(tmp_path, monkeypatch, weights)
    monkeypatch.setattr("sys.stdin", io.StringIO("hello\n/exit\nnever\n"))
    assert chat.main(list(CLI)) == 0
    out = capsys.readouterr()
    assert out.out.endswith("\n") and out.out.strip() and made[0].counters.turns == 1
    assert "kern chat: turn 1: reused 0 tokens from cache" in out.err and "turn 2" not in out.err
