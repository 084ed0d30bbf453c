"""Host-side logic of tools/gpu/qwen3_checks.py: bf16 ulps, the near-tie rule, the recorder."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import qwen3_checks as checks

TOOLS = Path(__file__).resolve().parents[1]


def test_bf16_ulp() -> None:
    assert checks.bf16_ulp(1.0) == 2**-7
    assert checks.bf16_ulp(1.99) == 2**-7
    assert checks.bf16_ulp(-4.5) == 2**-5
    assert checks.bf16_ulp(0.3) == 2**-9


def test_identical_tokens_pass() -> None:
    c = checks.Check("x")
    checks.compare_greedy(c, [1, 2, 3], [1, 2, 3], [9.0, 9.0, 9.0])
    assert c.status == "PENDING" and "identical" in c.detail


def test_divergence_at_near_tie_passes_with_the_gap_reported() -> None:
    c = checks.Check("x")
    checks.compare_greedy(c, [1, 5, 7], [1, 6, 8], [30.0, 1.0, 30.0])
    assert c.status == "PENDING"
    assert c.data == {"diverge_at": 1, "gap_ulps": 1.0, "kern": 5, "transformers": 6}


def test_divergence_without_a_tie_fails() -> None:
    c = checks.Check("x")
    checks.compare_greedy(c, [1, 5], [1, 6], [30.0, 12.0])
    assert c.status == "FAIL" and "step 1" in c.detail


def test_recorder_keeps_going_after_an_error(tmp_path: Path) -> None:
    rec = checks.Recorder(tmp_path)
    with rec.check("boom"):
        raise RuntimeError("first line\nsecond")
    with rec.check("fine") as c:
        c.detail = "ok"
    rows = json.loads((tmp_path / "summary.json").read_text())
    assert [(r["name"], r["status"], r["detail"]) for r in rows] == [
        ("boom", "ERROR", "RuntimeError: first line"), ("fine", "PASS", "ok")]
    assert "Traceback" in (tmp_path / "logs" / "boom.log").read_text()
    assert checks.summarize(rec) == 1


def test_prompts_are_fixed_and_in_vocab() -> None:
    a, b = checks.prompts(4096), checks.prompts(4096)
    assert a == b and sorted(a) == [1, 37, 709]
    assert all(0 <= t < 4096 for p in a.values() for t in p)


def test_recorder_keeps_rows_of_an_earlier_run(tmp_path: Path) -> None:
    first = checks.Recorder(tmp_path)
    with first.check("tiny.load"):
        pass
    with first.check("shared"):
        raise RuntimeError("old")
    second = checks.Recorder(tmp_path)
    with second.check("shared") as c:
        c.detail = "new"
    rows = json.loads((tmp_path / "summary.json").read_text())
    assert [(r["name"], r["status"]) for r in rows] == [("tiny.load", "PASS"), ("shared", "PASS")]


def _base(tokens: list[int], top1: float, other_logit: float, other: int) -> object:
    """A --chunk 512 run whose every step's logits put `top1` on its own token and `other_logit`
    on token `other`."""
    steps = []
    for tok in tokens:
        lg = np.zeros(16, dtype=np.float32)
        lg[tok] = top1
        lg[other] = other_logit
        steps.append(lg)
    return checks.KernRun(list(tokens), steps=steps)


def test_chunk_runs_equal_are_reported_identical() -> None:
    c = checks.Check("x")
    assert checks.compare_chunks(c, 1, [1, 2, 3], _base([1, 2, 3], 8.0, 1.0, 9))
    assert c.status == "PENDING" and c.data == {"chunk1": {"identical": True}}


def test_chunk_divergence_at_a_near_tie_passes_with_the_gap() -> None:
    c = checks.Check("x")
    # 8.0 has bf16 ulp 2^-4; the other token 3 ulps below
    assert checks.compare_chunks(c, 97, [1, 9, 4], _base([1, 2, 3], 8.0, 8.0 - 3 * 2**-4, 9))
    assert c.status == "PENDING"
    assert c.data["chunk97"] == {"identical": False, "diverge_at": 1, "gap_ulps": 3.0, "this": 9, "chunk512": 2}
    assert "near-tie" in c.detail and "step 1" in c.detail


def test_chunk_divergence_without_a_tie_fails() -> None:
    c = checks.Check("x")
    assert not checks.compare_chunks(c, 1, [1, 9], _base([1, 2], 8.0, 8.0 - 5 * 2**-4, 9))
    assert c.status == "FAIL" and "5.00 bf16 ulps" in c.detail


def test_step_launch_labels_follow_the_decode_program() -> None:
    gen = checks._load_gen()  # pyright: ignore[reportPrivateUsage]
    m = json.loads((TOOLS.parent / "examples" / "qwen3-4b-fast.json").read_text())
    labels = checks.step_launch_labels(m)
    assert len(labels) == sum(max(1, len(m["ops"][c["op"]]["impl"].get("launches", [])))
                              for c in m["programs"]["decode"]["calls"])
    assert labels.count("qkv") == 36 and labels.count("attn") == 36 and "l3.qkv" not in labels
    assert labels[-1] != "qkv" and gen.GEMV_GEMMS[-1] in labels  # lm_head once


def test_chain_charges_each_activity_the_time_the_stream_advanced() -> None:
    # Two steps of three launches and a readback; the second kernel waits inside its own span (PDL).
    step = [("a", 0.0, 5.0), ("b", 1.0, 9.0), ("c", 9.5, 10.0), ("Memcpy DtoH", 10.5, 11.0)]
    events = step + [(n, s + 20.0, e + 20.0) for n, s, e in step]
    text = checks.chain_table(events, ["embed", "gemv", "argmax"], reps=2)
    rows = {line.split()[-1]: float(line.split()[0]) for line in text.splitlines()[2:]}
    # The first activity has no predecessor; step 2's a is charged its own 5 (the 9 between 11 and
    # its start at 20 is the host's: idle): 2.5 per step. b 9 - 5 = 4 per step; c and the copy
    # 1 each (the launch gap before each counts to it).
    assert rows == {"embed": 2.5, "gemv": 4.0, "argmax": 1.0, "copy": 1.0}
    head = text.splitlines()[0]
    assert "call labels" in head and "8.5 us per step busy" in head and "4.5 us per step idle" in head
    # lead: b started 4 us before a ended (resident under PDL), c and the copy 0.5 us after b;
    # a step's first launch has none.
    leads = {" ".join(line.split()[4:]): line.split()[3] for line in text.splitlines()[2:]
             if line.split()[3] != "embed"}
    assert leads == {"gemv": "4.00", "argmax": "-0.50", "readback copy": "-0.50"}
    by_name = checks.chain_table(events[:-1], ["x"], reps=2)  # activities do not match: kernel names
    assert "kernel names" in by_name.splitlines()[0] and " b" in by_name


def test_f32_logits_bound_separates_reference_precision_from_bf16() -> None:
    ref = np.linspace(-3.0, 3.0, 1000)
    noise = np.cos(np.arange(1000.0))
    bf16_like = ref + 2e-2 * noise * np.linalg.norm(ref) / np.linalg.norm(noise)  # the bf16 manifests' error
    c = checks.Check("x")
    assert checks.compare_logits_to_fp32(c, bf16_like, ref, 3e-2, checks.LOGIT_REL_TOL) == pytest.approx(2e-2)
    assert c.status == "FAIL" and "tol 0.01" in c.detail
    c = checks.Check("x")
    near = ref + 5e-3 * noise * np.linalg.norm(ref) / np.linalg.norm(noise)
    checks.compare_logits_to_fp32(c, near, ref, 3e-2, checks.LOGIT_REL_TOL)
    assert c.status == "PENDING"  # within the bf16 bound, yet 400x the f32 manifest's measured error
    c = checks.Check("x")
    checks.compare_logits_to_fp32(c, near, ref, 3e-2, checks.F32_LOGIT_REL_TOL)
    assert c.status == "FAIL" and c.data["argmax_equal"]
    c = checks.Check("x")
    f32_like = ref + 1.2e-5 * noise * np.linalg.norm(ref) / np.linalg.norm(noise)  # the H200's 709-token error
    checks.compare_logits_to_fp32(c, f32_like, ref, 3e-2, checks.F32_LOGIT_REL_TOL)
    assert c.status == "PENDING" and c.data["rel_l2"] == pytest.approx(1.2e-5)


def test_prompt_checks_hold_the_f32_manifest_to_its_own_logits_bound(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    ref32 = np.linspace(-3.0, 3.0, 1000)
    noise = np.cos(np.arange(1000.0))
    got = ref32 + 5e-3 * noise * np.linalg.norm(ref32) / np.linalg.norm(noise)
    tokens = [int(np.argmax(ref32))] * checks.STEPS
    run = checks.KernRun(tokens, got, [got] * checks.STEPS)
    monkeypatch.setattr(checks, "kern_generate", lambda *a, **k: run)
    ref = checks.Reference({5: tokens}, {5: [9.0] * checks.STEPS}, {5: ref32}, {5: got}, {5: tokens},
                           {5: [9.0] * checks.STEPS})
    status: dict[bool, str] = {}
    for f32 in (False, True):
        rec = checks.Recorder(tmp_path / f"out{f32}")
        checks._prompt_checks(rec, "m", None, 5, [1], ref, {}, f32)  # pyright: ignore[reportPrivateUsage]
        (c,) = (c for c in rec.checks if c.name == "m.p5.logits_vs_fp32")
        status[f32] = c.status
        assert all(c.status == "PASS" for c in rec.checks if c.name != "m.p5.logits_vs_fp32")
    assert status == {False: "PASS", True: "FAIL"}


def test_logits_within_bf16_noise_passes_at_the_measured_ratios_and_fails_beyond() -> None:
    # Measured on the H200: kern 2.36e-2 / 3.24e-2 / 3.80e-2 against transformers bf16
    # 2.26e-2 / 3.55e-2 / 4.53e-2 (ratios 1.04, 0.91, 0.84).
    for rel, noise in ((2.36e-2, 2.26e-2), (3.24e-2, 3.55e-2), (3.80e-2, 4.53e-2)):
        c = checks.Check("x")
        assert checks.compare_logits_to_bf16_noise(c, rel, noise) and c.status == "PENDING"
        assert "x transformers bf16" in c.detail
    c = checks.Check("x")
    assert not checks.compare_logits_to_bf16_noise(c, 3.0e-2, 2.0e-2)
    assert c.status == "FAIL" and "1.50x" in c.detail and c.data["ratio"] == pytest.approx(1.5)
    for rel, noise in ((float("nan"), 2e-2), (2e-2, float("nan")), (2e-2, 0.0)):
        c = checks.Check("x")
        assert not checks.compare_logits_to_bf16_noise(c, rel, noise) and c.status == "FAIL"
        assert "no comparison" in c.detail


def test_f32_variant_is_the_reference_precision_manifest_and_is_not_benched() -> None:
    gen = checks._load_gen()  # pyright: ignore[reportPrivateUsage]
    variants = checks.product_variants(gen)
    opts = variants["f32"]("device")
    assert checks.is_f32(opts) and not checks.is_benched(opts)
    assert all(checks.is_benched(variants[v]("device")) for v in ("fast", "gemv"))
    m = gen.generate(gen.shape_from_config(checks.configs()["4b"]), dict.fromkeys(("qwen3_f32", "sampling"), "c" * 64),
                     gen.entry_modules(TOOLS / "kernels-src"), model="t", plan=opts)
    assert set(m["modules"]) == {"qwen3_f32", "sampling"}
    assert any(c["op"].startswith("gemv_f32_") for c in m["programs"]["decode"]["calls"])
    # NOTE: capacity 4096 of the 4B's f32 KV: 1.2 GB beside 8 GB of weights.
    assert checks.CAPACITY * m["states"]["kv"]["bytes_per_token"] == 4096 * 294912


def test_f32_near_tie_rule_is_tighter() -> None:
    c = checks.Check("x")
    checks.compare_greedy(c, [1, 5], [1, 6], [30.0, 0.5])
    assert c.status == "PENDING"  # half a bf16 ulp is a near-tie at bf16
    c = checks.Check("x")
    checks.compare_greedy(c, [1, 5], [1, 6], [30.0, 0.5], checks.F32_NEAR_TIE_ULPS)
    assert c.status == "FAIL" and "(> 0.0625)" in c.detail
    c = checks.Check("x")
    checks.compare_greedy(c, [1, 5], [1, 6], [30.0, 0.01], checks.F32_NEAR_TIE_ULPS)
    assert c.status == "PENDING" and "near-tie" in c.detail
    c = checks.Check("x")
    # 8.0 has bf16 ulp 2^-4; the other token half an ulp below
    assert not checks.compare_chunks(c, 97, [1, 9], _base([1, 2], 8.0, 8.0 - 2**-5, 9), checks.F32_NEAR_TIE_ULPS)
    assert c.status == "FAIL"


def test_run_model_checks_f32_against_float32_tokens_and_benches_the_rest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gen = checks._load_gen()  # pyright: ignore[reportPrivateUsage]
    calls: list[tuple[str, ...]] = []
    monkeypatch.setattr(checks, "write_checkpoint", lambda rec, name, cfg: tmp_path)
    monkeypatch.setattr(checks, "generate_manifest",
                        lambda rec, gen, name, ckpt, hashes, variant=None, sources=None: tmp_path / f"{name}.json")

    def references(rec: object, name: str, ckpt: Path, ps: object, f32_greedy: bool = False) -> object:
        calls.append(("references", str(f32_greedy)))
        return "ref"

    def kern_checks(rec: object, name: str, manifest: Path, ckpt: Path, ps: object, ref: object, gpu: int,
                    f32: bool = False) -> dict[int, list[int]]:
        calls.append(("kern_checks", name, str(f32)))
        return {}

    monkeypatch.setattr(checks, "references", references)
    monkeypatch.setattr(checks, "kern_checks", kern_checks)
    monkeypatch.setattr(checks, "cli_checks", lambda *a: None)
    monkeypatch.setattr(checks, "cli_default_check", lambda *a: None)
    monkeypatch.setattr(checks, "kern_bench", lambda rec, label, *a: calls.append(("bench", label)))
    monkeypatch.setattr(checks, "decode_profile", lambda rec, label, *a: calls.append(("profile", label)))
    checks.run_model(checks.Recorder(tmp_path / "out"), gen, "4b", checks.configs()["4b"], {"m": "c" * 64}, 0,
                     bench=True, variants={v: checks.product_variants(gen)[v] for v in ("fast", "f32")})
    assert calls == [("references", "True"), ("kern_checks", "4b", "False"), ("kern_checks", "4b-fast", "False"),
                     ("kern_checks", "4b-f32", "True"), ("bench", "4b"), ("profile", "4b"), ("bench", "4b-fast"),
                     ("profile", "4b-fast")]
    calls.clear()
    checks.run_model(checks.Recorder(tmp_path / "out"), gen, "4b", checks.configs()["4b"], {"m": "c" * 64}, 0,
                     bench=False, variants={"fast": checks.product_variants(gen)["fast"]})
    assert calls[0] == ("references", "False")


def test_product_variants_generate_the_shipped_examples() -> None:
    """`gemv`, `fast` and `f32` are the options of examples/qwen3-4b-{gemv,fast,f32}.json: the same bytes."""
    gen = checks._load_gen()  # pyright: ignore[reportPrivateUsage]
    entries = gen.entry_modules(TOOLS / "kernels-src")
    for variant, example in {"gemv": "qwen3-4b-gemv", "fast": "qwen3-4b-fast", "f32": "qwen3-4b-f32"}.items():
        shipped = json.loads((TOOLS.parent / "examples" / f"{example}.json").read_text())
        hashes = {m: spec["sha256"] for m, spec in shipped["modules"].items()}
        plan = checks.product_variants(gen)[variant]("device")
        m = gen.generate(gen.shape_from_config(checks.configs()["4b"]), hashes, entries, model=example, plan=plan)
        assert m == shipped, variant


def test_an_unknown_variant_is_refused_before_any_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(checks, "build", lambda *a: pytest.fail("built before refusing"))
    with pytest.raises(SystemExit) as info:
        checks.main([str(tmp_path), "--variants", "fast,qkn"])
    assert info.value.code == 2 and "unknown variant(s) qkn" in capsys.readouterr().err


def test_long_prompts_cross_8k_and_32k_and_size_their_session() -> None:
    ps = checks.prompts(151936, checks.PROMPT_LENS + checks.LONG_PROMPT_LENS)
    assert sorted(ps) == [1, 37, 709, 8200, 32800] and all(len(p) == n for n, p in ps.items())
    assert ps[709] == checks.prompts(151936)[709], "the short prompts stay as they were"
    assert checks.capacity(checks.prompts(4096)) == checks.CAPACITY
    assert checks.capacity(ps) >= 32800 + checks.STEPS
    assert checks.chunks_of(709) == (512, 1, 97) and checks.chunks_of(32800) == (512, 2048, 97)


def test_long_prompts_take_sdpa_and_the_last_logits_only() -> None:
    ps = checks.prompts(151936, (37, 709, 8200, 32800))
    parts = checks._by_attention(ps)  # pyright: ignore[reportPrivateUsage]
    assert [(attn, sorted(part)) for attn, part in parts] == [("eager", [37, 709]), ("sdpa", [8200, 32800])]
    assert [attn for attn, _ in checks._by_attention(checks.prompts(4096))] == ["eager"]  # pyright: ignore[reportPrivateUsage]
    assert checks._last_only(ps[709]) == {}  # pyright: ignore[reportPrivateUsage]
    assert checks._last_only(ps[8200]) == {"logits_to_keep": 1}  # pyright: ignore[reportPrivateUsage]


def test_run_model_with_long_checks_the_long_prompts_on_the_4b(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gen = checks._load_gen()  # pyright: ignore[reportPrivateUsage]
    seen: list[tuple[str, list[int]]] = []
    monkeypatch.setattr(checks, "write_checkpoint", lambda rec, name, cfg: tmp_path)
    monkeypatch.setattr(checks, "generate_manifest",
                        lambda rec, gen, name, ckpt, hashes, variant=None, sources=None: tmp_path / f"{name}.json")
    monkeypatch.setattr(checks, "references",
                        lambda rec, name, ckpt, ps, f32_greedy=False: seen.append(("references", sorted(ps))))
    monkeypatch.setattr(checks, "kern_checks",
                        lambda rec, name, manifest, ckpt, ps, ref, gpu, f32=False: seen.append((name, sorted(ps))) or {})
    monkeypatch.setattr(checks, "cli_checks", lambda *a: None)
    monkeypatch.setattr(checks, "cli_default_check", lambda *a: None)
    checks.run_model(checks.Recorder(tmp_path / "out"), gen, "4b", checks.configs()["4b"], {"m": "c" * 64}, 0,
                     bench=False, variants={"fast": checks.product_variants(gen)["fast"]}, long=True)
    want = [1, 37, 709, 8200, 32800]
    assert seen == [("references", want), ("4b", want), ("4b-fast", want)]
