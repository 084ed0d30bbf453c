"""tools/gen_qwen3.py: manifests for a tiny Qwen3 and the 4B shape, checked against the verifier,
the shapes, the Hugging Face tensor names and the kernel sources' signatures."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from helpers.qwen3_options import generate as _generate

import kern_qwen3 as gen
from kern_qwen3 import QWEN3_4B_CONFIG, QWEN3_TINY_CONFIG, cli, qwen3_tensor_shapes

TOOLS = Path(__file__).resolve().parents[2]



FAKE_ENTRIES = {e: ("qwen3_attn" if "attn" in e else "qwen3_core")
                for e in (*gen.ENTRIES, *gen.DEVICE_FEED_ENTRIES, *gen.GEMV_ENTRIES, *gen.FUSED_ENTRIES,
                          *gen.DEFER_ENTRIES.values(), *gen.DEFER_P4.values(),
                          *gen.F32_ENTRIES)}
FAKE_HASHES = {"qwen3_core": "a" * 64, "qwen3_attn": "b" * 64}


def _manifest(config: dict[str, Any] | Any, **kw: Any) -> dict[str, Any]:
    return _generate(gen.shape_from_config(config), FAKE_HASHES, FAKE_ENTRIES, model="t", **kw)


def _verify(manifest: dict[str, Any]) -> None:
    from kern_manifest import parse_manifest, verify

    verify(parse_manifest(json.dumps(manifest)))


@pytest.mark.parametrize("feed", ["host", "device"])
@pytest.mark.parametrize("config", [QWEN3_TINY_CONFIG, QWEN3_4B_CONFIG], ids=["tiny", "4b"])
def test_manifest_verifies(config: dict[str, Any], feed: str) -> None:
    _verify(_manifest(config, feed=feed))


def test_device_feed_reads_carries_seeded_by_start() -> None:
    m = _manifest(QWEN3_TINY_CONFIG, feed="device")
    decode = m["programs"]["decode"]["calls"]
    read = {a["buf"] for c in decode for a in c["args"] if "buf" in a}
    assert {"step_ids", "step_pos", "step_slot", "step_len"} <= read
    assert not {"ids", "positions", "slots", "seq_len"} & read
    assert decode[-1]["op"] == "decode_advance"
    start = m["programs"]["start"]["calls"]
    assert [(c["args"][0]["buf"], c["args"][1]["buf"]) for c in start] == [
        ("ids", "step_ids"), ("positions", "step_pos"), ("slots", "step_slot"), ("seq_len", "step_len")]
    host = _manifest(QWEN3_TINY_CONFIG, feed="host")
    assert "start" not in host["programs"] and "decode_advance" not in host["ops"]
    assert "step_ids" not in host["buffers"]
    with pytest.raises(gen.GenError, match="feed"):
        _manifest(QWEN3_TINY_CONFIG, feed="both")


def test_untied_manifest_verifies_and_reads_lm_head() -> None:
    m = _manifest({**QWEN3_TINY_CONFIG, "tie_word_embeddings": False})
    _verify(m)
    head = next(c for c in m["programs"]["decode"]["calls"] if c["label"] == "lm_head")
    assert head["args"][1] == {"buf": "lm_head"}
    assert m["buffers"]["lm_head"]["bind"] == [{"tensor": "lm_head.weight"}]


@pytest.mark.parametrize(("config", "layers"), [(QWEN3_TINY_CONFIG, 2), (QWEN3_4B_CONFIG, 36)])
def test_call_counts(config: dict[str, Any], layers: int) -> None:
    progs = _manifest(config, feed="device")["programs"]
    # embed + first norm; per layer 4 attention + 6 MLP calls; lm_head, argmax, advance.
    assert len(progs["decode"]["calls"]) == 2 + 10 * layers + 3
    assert len(_manifest(config, feed="host")["programs"]["decode"]["calls"]) == 2 + 10 * layers + 2
    # prefill stops after the last layer's KV write: its attention output is never read.
    assert len(progs["prefill"]["calls"]) == 2 + 10 * (layers - 1) + 3
    assert progs["prefill"]["calls"][-1]["label"] == f"l{layers - 1}.kv_write"
    assert [c["op"] for c in progs["load"]["calls"]] == ["rope_table"]
    assert progs["decode"]["graph"] is True and "graph" not in progs["prefill"]


def test_4b_decode_reads_8_04_gb_of_weights() -> None:
    m = _manifest(QWEN3_4B_CONFIG)
    h, d, inter, vocab = 2560, 128, 9728, 151936
    per_layer = (32 + 16) * d * h + h * 32 * d + 2 * inter * h + h * inter + 2 * h + 2 * d
    expected = 2 * (36 * per_layer + vocab * h + h)
    assert gen.decode_weight_bytes(m) == expected
    assert round(expected / 1e9, 2) == 8.04
    shapes = gen.decode_gemm_shapes(m)
    assert len(shapes) == 36 * 4 + 1
    assert shapes[:4] == [("l0.qkv", 1, 6144, h), ("l0.o", 1, h, 4096), ("l0.gate_up", 1, 2 * inter, h),
                          ("l0.down", 1, h, inter)]
    assert shapes[-1] == ("embed", 1, vocab, h)


def test_weights_bind_every_checkpoint_tensor_once() -> None:
    for config in (QWEN3_TINY_CONFIG, {**QWEN3_TINY_CONFIG, "tie_word_embeddings": False}):
        m = _manifest(config)
        bound = [seg["tensor"] for b in m["buffers"].values() if b["kind"] == "weight" for seg in b["bind"]]
        shapes = qwen3_tensor_shapes(config)
        assert sorted(bound) == sorted(shapes)
        for b in (b for b in m["buffers"].values() if b["kind"] == "weight"):
            rows = sum(shapes[seg["tensor"]][0] for seg in b["bind"])
            cols = {shapes[seg["tensor"]][1:] for seg in b["bind"]}
            assert (rows, *cols.pop()) == tuple(b["shape"]) and not cols


def test_qkv_and_gate_up_concatenate_in_order() -> None:
    b = _manifest(QWEN3_4B_CONFIG)["buffers"]
    p = "model.layers.7"
    assert [s["tensor"] for s in b["l7.qkv"]["bind"]] == [f"{p}.self_attn.{x}_proj.weight" for x in "qkv"]
    assert [s["tensor"] for s in b["l7.gate_up"]["bind"]] == [f"{p}.mlp.gate_proj.weight",
                                                              f"{p}.mlp.up_proj.weight"]
    assert b["l7.qkv"]["shape"] == [6144, 2560] and b["l7.gate_up"]["shape"] == [19456, 2560]


def test_kv_layout_offsets_and_strides() -> None:
    m = _manifest(QWEN3_4B_CONFIG)
    assert m["states"]["kv"] == {"bytes_per_token": 36 * 2 * 8 * 128 * 2}
    writes = [c for c in m["programs"]["decode"]["calls"] if c["op"] == "kv_write"]
    assert [c["args"][1].get("offset", 0) for c in writes] == [i * 2 * 16 * 8 * 128 * 2 for i in range(36)]
    assert writes[0]["args"][-1] == {"i64": 36 * 2 * 16 * 8 * 128}
    # the per-layer offsets stay inside one page
    assert writes[-1]["args"][1]["offset"] + 2 * 16 * 8 * 128 * 2 == 16 * m["states"]["kv"]["bytes_per_token"]


def test_inputs_outputs_and_vars() -> None:
    m = _manifest(QWEN3_4B_CONFIG, chunk=1024)
    b = m["buffers"]
    assert m["vars"] == {"tokens": {"max": 1024}}
    assert {k: (v["dtype"], v["shape"]) for k, v in b.items() if v["kind"] == "input"} == {
        "ids": ("i64", ["tokens"]), "positions": ("i64", ["tokens"]), "slots": ("i64", ["tokens"]),
        "seq_len": ("i32", [1]), "block_table": ("i32", [40960 // 16 + 1]),
    }
    assert {k: (v["dtype"], v["shape"]) for k, v in b.items() if v["kind"] == "output"} == {
        "logits": ("bf16", [1, 151936]), "next_token": ("i64", [1]),
    }
    assert b["rope_cos"]["shape"] == [40960, 64]
    assert b["ids"]["domain"] == {"min": 0, "max": 151935}
    assert b["block_table"]["domain"] == {"index_into": "kv", "stride": 16}
    assert b["slots"]["domain"] == {"index_into": "kv"}


def test_f32_literals_are_floats() -> None:
    text = json.dumps(_manifest({**QWEN3_TINY_CONFIG, "rope_theta": 10000}))
    assert '"f32": 10000.0' in text and '"f32": 10000}' not in text


def test_config_errors() -> None:
    bad: list[tuple[dict[str, Any], str]] = [
        ({**QWEN3_TINY_CONFIG, "model_type": "llama"}, "model_type"),
        ({**QWEN3_TINY_CONFIG, "num_key_value_heads": 3}, "multiple"),
        ({**QWEN3_TINY_CONFIG, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_type"),
        ({**QWEN3_TINY_CONFIG, "attention_bias": True}, "attention_bias"),
        ({**QWEN3_TINY_CONFIG, "hidden_size": -1}, "hidden_size"),
        ({**QWEN3_TINY_CONFIG, "rms_norm_eps": 0}, "rms_norm_eps"),
        ({k: v for k, v in QWEN3_TINY_CONFIG.items() if k != "rope_theta"}, "rope_theta"),
    ]
    for cfg, word in bad:
        with pytest.raises(gen.ConfigError, match=word):
            gen.shape_from_config(cfg)


def test_transformers5_rope_parameters_are_read() -> None:
    cfg = {k: v for k, v in QWEN3_TINY_CONFIG.items() if k not in ("rope_theta", "rope_scaling")}
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 5e5}
    assert gen.shape_from_config(cfg).theta == 5e5


def test_kernel_errors() -> None:
    shape = gen.shape_from_config(QWEN3_TINY_CONFIG)
    partial = {k: v for k, v in FAKE_ENTRIES.items() if k != "kern_argmax_final"}
    with pytest.raises(gen.KernelsError, match="kern_argmax_final"):
        _generate(shape, FAKE_HASHES, partial, model="t")
    with pytest.raises(gen.KernelsError, match="qwen3_attn"):
        _generate(shape, {"qwen3_core": "a" * 64}, FAKE_ENTRIES, model="t")
    with pytest.raises(gen.GenError, match="chunk"):
        _generate(shape, FAKE_HASHES, FAKE_ENTRIES, model="t", chunk=0)


@pytest.mark.parametrize(
    ("change", "word"),
    [
        ({"head_dim": 96}, "head_dim 96"),
        ({"num_attention_heads": 24, "num_key_value_heads": 2}, "12 query heads"),
        ({"hidden_size": 260}, "hidden_size 260"),
        ({"intermediate_size": 770}, "intermediate_size 770"),
    ],
)
def test_shapes_our_kernels_cannot_run_are_refused(change: dict[str, int], word: str) -> None:
    with pytest.raises(gen.KernelsError, match=word):
        _manifest({**QWEN3_TINY_CONFIG, **change})


def test_entry_modules_scans_sources(tmp_path: Path) -> None:
    (tmp_path / "a.cu").write_text('extern "C" __global__ void kern_embed(int x) {}\n'
                                   'extern "C" __global__ void __launch_bounds__(256) kern_rmsnorm(int x) {}\n')
    (tmp_path / "b.cu").write_text('extern "C" __global__ void kern_argmax_final(int x) {}\n')
    assert gen.entry_modules(tmp_path) == {"kern_embed": "a", "kern_rmsnorm": "a", "kern_argmax_final": "b"}
    (tmp_path / "c.cu").write_text('extern "C" __global__ void kern_embed(int x) {}\n')
    with pytest.raises(gen.KernelsError, match="kern_embed"):
        gen.entry_modules(tmp_path)


def test_main_reports_bad_config_on_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({**QWEN3_TINY_CONFIG, "model_type": "gpt2"}))
    assert cli.main([str(cfg), "-o", str(tmp_path / "m.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model_type" in err[0]
    assert not (tmp_path / "m.json").exists()


# --------------------------------------------------------------------------------------------
# The manifest's kernel ABI against the signatures in tools/kernels-src.

_SIG = re.compile(r"__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(kern_\w+)\s*\(([^)]*)\)")
_C_TYPES = {"bf16": "bf16", "__nv_bfloat16": "bf16", "int64_t": "i64", "int": "i32", "int32_t": "i32",
            "float": "f32"}


def _c_params(src: Path) -> dict[str, list[tuple[str, bool, bool]]]:
    """entry -> [(dtype, is_pointer, is_const)] parsed from the .cu sources."""
    out: dict[str, list[tuple[str, bool, bool]]] = {}
    for path in src.glob("*.cu"):
        for entry, params in _SIG.findall(path.read_text()):
            parsed = []
            for p in (p.strip() for p in params.split(",") if p.strip()):
                words = p.replace("*", " * ").replace("__restrict__", "").split()
                base = next(w for w in words if w in _C_TYPES)
                parsed.append((_C_TYPES[base], "*" in words, "const" in words))
            out[entry] = parsed
    return out


def test_manifest_abi_matches_kernel_sources() -> None:
    src = TOOLS / "kernels-src"
    entries = gen.entry_modules(src)
    feed = "device" if all(e in entries for e in gen.DEVICE_FEED_ENTRIES) else "host"
    hashes = dict.fromkeys(set(entries.values()), "c" * 64)
    shape = gen.shape_from_config(QWEN3_TINY_CONFIG)
    fast = _generate(shape, hashes, entries, model="t", feed=feed, gemv=list(gen.GEMV_GEMMS), fuse=True, pdl=True)
    plain = _generate(shape, hashes, entries, model="t", feed=feed)
    fold = _generate(shape, hashes, entries, model="t", feed=feed, gemv=list(gen.GEMV_GEMMS), fold_norm=True,
                     defer_norm=True)
    ops = plain["ops"] | fast["ops"] | fold["ops"]
    assert {op for op in ops if op.startswith("gemv")} == {
        "gemv_b4_1024x256", "gemv_s4_256x512", "gemv_silu_768x256", "gemv_p4_256x768", "gemv_p4_4096x256",
        "gemv_b4_d_1024x256", "gemv_b4_silu_d_768x256"}
    _assert_abi(ops, _c_params(src))


def _assert_abi(ops: dict[str, Any], sigs: dict[str, list[tuple[str, bool, bool]]]) -> None:
    for name, op in ops.items():
        for launch in op["impl"]["launches"]:
            if launch["entry"].startswith("extern:"):
                continue
            declared = launch.get("params", op["params"])
            actual = sigs[launch["entry"]]
            assert len(declared) == len(actual), (name, launch["entry"])
            for text, (ctype, ptr, const) in zip(declared, actual, strict=True):
                where = (name, launch["entry"], text, ctype)
                if " " in text:  # buffer or state
                    direction, kind = text.split(" ", 1)
                    assert ptr and const == (direction == "in"), where
                    if kind.startswith("buffer<"):
                        assert kind == f"buffer<{ctype}>", where
                else:
                    assert not ptr and text == ctype, where


def test_main_reports_a_failed_build_on_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(dict(QWEN3_TINY_CONFIG)))
    assert cli.main([str(cfg), "-o", str(tmp_path / "m.json"), "--kernels-src", str(tmp_path / "nosrc")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kern-qwen3: ")
    assert not (tmp_path / "m.json").exists()


def test_main_with_a_preset_writes_the_manifest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "build_and_hash", lambda src, out: FAKE_HASHES)
    monkeypatch.setattr(cli, "entry_modules", lambda src: FAKE_ENTRIES)
    out = tmp_path / "qwen3-tiny.json"
    assert cli.main(["--preset", "qwen3-tiny", "-o", str(out)]) == 0
    assert json.loads(out.read_text()) == _manifest(QWEN3_TINY_CONFIG, feed="device") | {"model": "qwen3-tiny"}
    flags = ["--gemv", "all", "--fuse", "--pdl", "--fold-norm", "--defer-norm"]
    assert cli.main(["--preset", "qwen3-tiny", "-o", str(out), *flags]) == 0
    assert json.loads(out.read_text()) == _manifest(
        QWEN3_TINY_CONFIG, feed="device", gemv=list(gen.GEMV_GEMMS), fuse=True, pdl=True, fold_norm=True,
        defer_norm=True) | {"model": "qwen3-tiny"}


def test_examples_are_what_the_generator_writes() -> None:
    """examples/ are regenerated artifacts: same structure as a fresh generation (hashes aside)."""
    root = TOOLS.parent
    fast: dict[str, Any] = {"gemv": list(gen.GEMV_GEMMS), "fuse": True, "pdl": True, "fold_norm": True,
                            "defer_norm": True}
    shipped_sets = [("qwen3-4b", QWEN3_4B_CONFIG, {}), ("qwen3-tiny", QWEN3_TINY_CONFIG, {}),
                    ("qwen3-4b-gemv", QWEN3_4B_CONFIG, {"gemv": list(gen.GEMV_DEFAULT)}),
                    ("qwen3-4b-fast", QWEN3_4B_CONFIG, fast), ("qwen3-4b-f32", QWEN3_4B_CONFIG, {"precision": "f32"})]
    for name, config, kw in shipped_sets:
        shipped = json.loads((root / "examples" / f"{name}.json").read_text())
        entries = gen.entry_modules(TOOLS / "kernels-src")
        hashes = {m: v["sha256"] for m, v in shipped["modules"].items()}
        fresh = _generate(gen.shape_from_config(config), hashes, entries, model=name, feed="device", **kw)
        assert shipped == fresh


def test_decode_gemms_can_run_as_our_gemv() -> None:
    m = _manifest(QWEN3_4B_CONFIG, feed="device", gemv=["o", "gate_up", "lm_head"])
    _verify(m)
    decode = {c["label"]: c for c in m["programs"]["decode"]["calls"]}
    assert decode["l3.o"]["op"] == "gemv_s4_2560x4096" and decode["l3.qkv"]["op"] == "gemm"
    assert decode["lm_head"] == {"label": "lm_head", "op": "gemv_p4_151936x2560",
                                 "args": [{"buf": "x"}, {"buf": "embed"}, {"buf": "logits"}]}
    assert m["ops"]["gemv_s4_2560x4096"]["impl"]["launches"][0]["grid"] == [2560, 1, 1]
    # gate_up runs the SiLU-and-mul GEMV: it reads the whole [2 * inter, hidden] weight, writes act.
    assert decode["l3.gate_up"]["args"] == [{"buf": "x"}, {"buf": "l3.gate_up"}, {"buf": "act"}]
    assert "l3.silu_mul" not in decode
    launch = m["ops"]["gemv_silu_9728x2560"]["impl"]["launches"][0]
    assert launch["entry"] == "kern_gemv_bf16_silu" and launch["grid"] == [2432, 1, 1] and launch["block"] == [128, 1, 1]
    assert launch["args"][3:] == [{"i32": 1}, {"i32": 9728}, {"i32": 2560}, {"i32": 9728}]
    assert all(c["op"] == "gemm" for c in m["programs"]["prefill"]["calls"] if c["label"].endswith((".o", ".down")))
    assert gen.decode_gemm_shapes(m) == gen.decode_gemm_shapes(_manifest(QWEN3_4B_CONFIG, feed="device"))
    assert gen.decode_weight_bytes(m) == gen.decode_weight_bytes(_manifest(QWEN3_4B_CONFIG, feed="device"))
    with pytest.raises(gen.GenError, match="choose from"):
        _manifest(QWEN3_TINY_CONFIG, gemv=["attn"])
    every = _manifest(QWEN3_TINY_CONFIG, feed="device", gemv=list(gen.GEMV_GEMMS))
    _verify(every)
    assert not any(c["op"] == "gemm" for c in every["programs"]["decode"]["calls"])


def test_gemv_picks_follow_the_entry_table() -> None:
    m = _manifest(QWEN3_4B_CONFIG, feed="device", gemv=list(gen.GEMV_GEMMS))
    for label, op, entry, grid in [("l0.qkv", "gemv_b4_6144x2560", "kern_gemv_bf16_b4", 878),
                                   ("l0.o", "gemv_s4_2560x4096", "kern_gemv_bf16_s4", 2560),
                                   ("l0.down", "gemv_p4_2560x9728", "kern_gemv_bf16_p4", 2560),
                                   ("lm_head", "gemv_p4_151936x2560", "kern_gemv_bf16_p4", 25323)]:
        call = next(c for c in m["programs"]["decode"]["calls"] if c["label"] == label)
        launch = m["ops"][call["op"]]["impl"]["launches"][0]
        assert (call["op"], launch["entry"], launch["grid"][0]) == (op, entry, grid)


def test_pdl_marks_every_decode_launch_and_nothing_else() -> None:
    m = _manifest(QWEN3_4B_CONFIG, feed="device", gemv=list(gen.GEMV_GEMMS), fuse=True, pdl=True)
    _verify(m)

    def launches(program: str) -> list[dict[str, Any]]:
        return [la for c in m["programs"][program]["calls"] for la in m["ops"][c["op"]]["impl"]["launches"]]

    step = launches("decode")
    assert step[0]["entry"] == "kern_embed" and "pdl" not in step[0]
    assert all(la.get("pdl") is True for la in step[1:])
    assert not any("pdl" in la for p in ("prefill", "load", "start") for la in launches(p))
    ops = {c["op"] for c in m["programs"]["decode"]["calls"]}
    assert {"embed", "rmsnorm.pdl", "add_rmsnorm.pdl", "qk_norm_rope_kv.pdl"} <= ops
    with pytest.raises(gen.GenError, match="pdl needs every decode GEMM"):
        _manifest(QWEN3_4B_CONFIG, feed="device", gemv=["o", "gate_up", "lm_head"], pdl=True)


@pytest.mark.parametrize("feed", ["host", "device"])
def test_nothing_before_the_attention_writes_what_it_reads_before_its_pdl_wait(feed: str) -> None:
    """kern_attn_decode reads seq_len and the block table before its PDL wait, and that code may
    overlap any launch back to the step's first (the only launch without PDL). So no call before an
    attention may write those buffers: in the decode step only the advance, after the argmax, does."""
    m = _manifest(QWEN3_4B_CONFIG, feed=feed, gemv=list(gen.GEMV_GEMMS), fuse=True, pdl=True)
    calls = m["programs"]["decode"]["calls"]

    def written(call: dict[str, Any]) -> set[str]:
        params = m["ops"][call["op"]]["params"]
        return {a["buf"] for p, a in zip(params, call["args"], strict=True)
                if "buf" in a and p.split()[0] in ("out", "inout")}  # fmt: skip

    attn = [i for i, c in enumerate(calls) if c["label"].endswith(".attn")]
    assert len(attn) == 36
    for i in attn:
        _qkv, _kv, table, seq_len, *_ = calls[i]["args"]
        before = set().union(*(written(c) for c in calls[:i]))
        assert not before & {table["buf"], seq_len["buf"]}, calls[i]["label"]
    writers = [c["label"] for c in calls if {"block_table", "step_len"} & written(c)]
    assert writers == (["advance"] if feed == "device" else [])


def test_defer_norm_folds_into_the_deferred_bands() -> None:
    """fold_norm + defer_norm: qkv and gate_up run gemv_defer.cu's entries on one wave of
    GEMV_DEFER_BLOCKS blocks per SM (no dynamic shared memory), with the fold's arguments; it needs
    fold_norm and a hidden size the registers hold."""
    m = _manifest(QWEN3_4B_CONFIG, feed="device", gemv=list(gen.GEMV_GEMMS), fuse=True, pdl=True, fold_norm=True,
                  defer_norm=True)
    _verify(m)
    base = _manifest(QWEN3_4B_CONFIG, feed="device", gemv=list(gen.GEMV_GEMMS), fuse=True, pdl=True)
    decode = {c["label"]: c for c in m["programs"]["decode"]["calls"]}
    was = {c["label"]: c for c in base["programs"]["decode"]["calls"]}
    norms = {f"l{i}.post_norm" for i in range(36)} | {f"l{i}.next_norm" for i in range(35)}
    assert decode.keys() == was.keys() - norms  # every norm before qkv and gate_up folds in
    for label, op, entry, n in (("l3.qkv", "gemv_b4_d_6144x2560", "kern_gemv_bf16_b4_d", 6144),
                                ("l3.gate_up", "gemv_b4_silu_d_9728x2560", "kern_gemv_bf16_b4_silu_d", 9728)):
        assert decode[label]["op"] == op and len(decode[label]["args"]) == 6
        (launch,) = m["ops"][op]["impl"]["launches"]
        per_block = -(-n // (gen.GEMV_SMS * gen.GEMV_DEFER_BLOCKS))
        assert gen.defer_launch(n) == (-(-n // per_block), 128, 0)
        assert gen.defer_launch(n, 2)[0] == -(-n // -(-n // (gen.GEMV_SMS * 2))) <= gen.GEMV_SMS * 2
        assert (launch["entry"], launch["grid"], launch["block"]) == (entry, [gen.defer_launch(n)[0], 1, 1], [128, 1, 1])
        assert "shared_mem" not in launch and launch["pdl"] is True
        assert launch["args"][6:] == [{"i32": 1}, {"i32": n}, {"i32": 2560}, {"i32": n}, {"f32": 1e-6}]
    # A prefetched gate_up pick folds into its deferred form, on `_p4_silu`'s own launch.
    m = _manifest(QWEN3_4B_CONFIG, feed="device", gemv=list(gen.GEMV_GEMMS), fuse=True, pdl=True, fold_norm=True,
                  defer_norm=True, gemv_pick={"gate_up": "kern_gemv_bf16_p4_silu"})
    _verify(m)
    (launch,) = m["ops"]["gemv_p4_silu_d_9728x2560"]["impl"]["launches"]
    grid, _threads, smem = gen.gemv_launch("kern_gemv_bf16_p4_silu", 9728, 2560)
    assert (launch["entry"], launch["grid"], launch["shared_mem"]) == ("kern_gemv_bf16_p4_silu_d", [grid, 1, 1], smem)
    text = (TOOLS / "kernels-src" / "gemv_defer.cu").read_text()
    assert f"constexpr int DEFER_MAXP = {gen.DEFER_MAX_K // 1024};" in text
    assert text.count(f"__launch_bounds__(128, {gen.GEMV_DEFER_BLOCKS})") == 2
    with pytest.raises(gen.GenError, match="needs --fold-norm too"):
        _manifest(QWEN3_4B_CONFIG, feed="device", gemv=list(gen.GEMV_GEMMS), defer_norm=True)
    with pytest.raises(gen.GenError, match="holds at most 4096"):
        _manifest({**QWEN3_4B_CONFIG, "hidden_size": 5120}, feed="device", gemv=list(gen.GEMV_GEMMS), fold_norm=True,
                  defer_norm=True)


def test_fused_step_has_one_attention_launch_and_no_kv_write() -> None:
    m = _manifest(QWEN3_4B_CONFIG, feed="device", gemv=list(gen.GEMV_GEMMS), fuse=True, pdl=True)
    decode = m["programs"]["decode"]["calls"]
    # per layer: qkv, qk_norm_rope_kv, attn, o, post_norm, gate_up (+ silu), down, next_norm
    assert len(decode) == 2 + 36 * 8 + 3
    assert [c["label"] for c in decode[2:10]] == [
        "l0.qkv", "l0.qk_norm_rope_kv", "l0.attn", "l0.o", "l0.post_norm", "l0.gate_up", "l0.down", "l0.next_norm"]
    attn = m["ops"][decode[4]["op"]]
    assert [la["entry"] for la in attn["impl"]["launches"]] == ["kern_attn_decode"]
    assert decode[4]["args"][-1] == {"buf": "attn_count"}
    assert m["buffers"]["attn_count"] == {"dtype": "i32", "shape": [8], "kind": "carry"}
    load = m["programs"]["load"]["calls"]
    assert load[-1] == {"label": "attn_count", "op": "zero_i32", "args": [{"buf": "attn_count"}, {"i32": 8}]}
    prefill = [c["label"] for c in m["programs"]["prefill"]["calls"]]
    assert prefill[-2:] == ["l35.qkv", "l35.qk_norm_rope_kv"] and not any("kv_write" in p for p in prefill)
    kv = decode[3]["args"][6]
    assert kv == {"state": "kv"} and decode[3]["args"][-1] == {"i64": 36 * 2 * 16 * 8 * 128}


def test_gemv_entries_table_matches_gemv_cu() -> None:
    """GEMV_ENTRIES' (columns per block, threads) follow from each entry's template arguments
    (warps, columns per group, unroll, split) and launch bounds in gemv.cu."""
    import re

    text = (TOOLS / "kernels-src" / "gemv.cu").read_text() + (TOOLS / "kernels-src" / "gemv.cuh").read_text()
    found = {}
    for bounds, entry, warps, cols, _unroll, split in re.findall(
            r"__launch_bounds__\((\d+)\)\s*(kern_gemv_bf16_\w+)\([^)]*\)\s*\{\s*gemv(?:_seq)?<(\d+), (\d+), (\d+), (\d+)", text):
        assert int(bounds) == int(warps) * 32, entry
        found[entry] = (int(warps) // int(split) * int(cols), int(bounds))
    table = {e: (v.columns, v.threads) for e, v in gen.GEMV_ENTRIES.items()}
    by = {layout: {e for e, v in gen.GEMV_ENTRIES.items() if v.layout is layout} for layout in gen.Layout}
    streaming, band, prefetched = by[gen.Layout.STREAM], by[gen.Layout.BAND], by[gen.Layout.PREFETCH]
    assert not by[gen.Layout.RING]  # the ring entries are the lab's
    assert found == {e: table[e] for e in by[gen.Layout.COLUMNS] if e != "kern_gemv_bf16"}
    silu = set(gen.silu_entries(gen.GEMV_ENTRIES))
    # The prefetched entry: 4 warps (kern_gemv_bf16_s4's split), its rows in dynamic shared memory.
    p4 = re.findall(r"__launch_bounds__\((\d+)\)\s*(kern_gemv_bf16_\w+)\([^)]*\)\s*\{\s*with_rows\(rows, "
                    r"\[&\]\(auto r\) \{ gemv_p4_rows<", text)
    assert {e: int(b) for b, e in p4} == {e: gen.GEMV_ENTRIES[e].threads for e in prefetched} == {
        "kern_gemv_bf16_p4": 128, "kern_gemv_bf16_p4_silu": 128}
    assert re.search(r"kern_gemv_bf16_p4_silu\([^)]*\)\s*\{\s*with_rows\(rows, \[&\]\(auto r\) \{ "
                     r"gemv_p4_rows<GEMV_SILU,", text)
    # Band entries: block = SPLIT warps, and the blocks per SM their launch bounds promise.
    bands = {e: (int(b), int(per_sm), int(split), epi) for b, per_sm, e, split, epi in re.findall(
        r"__launch_bounds__\((\d+), (\d+)\)\s*(kern_gemv_bf16_\w+)\([^)]*\)\s*\{\s*gemv_(?:band|deep)<(\d+), "
        r"(?:\d+, )+(GEMV_\w+)>", text)}
    assert set(bands) == band
    for e, (threads, per_sm, split, epi) in bands.items():
        v = gen.GEMV_ENTRIES[e]
        assert v.threads == threads == 32 * split and v.per_sm == per_sm
        assert (epi == "GEMV_SILU") == (e in silu)
    assert table["kern_gemv_bf16"] == (4, 128)  # the GEMV_* macros as built (docs/qwen3.md)
    # The streaming entries: 8 warps, the stage cap the generator sizes launches with.
    assert re.search(r"constexpr int TMA_WARPS = 16;", text)
    assert re.search(rf"#define GEMV_TMA_CAP {gen.GEMV_TMA_STAGE_CAP}\n", text)
    tma = dict(re.findall(r"__launch_bounds__\(TMA_WARPS \* 32, 1\)\s*(kern_gemv_bf16_\w+)\([^)]*\)\s*\{\s*gemv_tma<(\w+)>",
                          text))
    assert tma == {"kern_gemv_bf16_tma": "GEMV_STORE", "kern_gemv_bf16_tma_silu": "GEMV_SILU"}
    assert streaming == set(tma) and {e for e in silu if e in streaming} == {"kern_gemv_bf16_tma_silu"}
    assert all(gen.GEMV_ENTRIES[e].threads == 512 for e in streaming)


def test_band_gemv_launch_is_one_balanced_wave() -> None:
    """A band launch has at most GEMV_SMS x (blocks per SM) blocks, every block gets a band, and
    bands differ by at most one column."""
    for entry, per_sm in ((e, v.per_sm) for e, v in gen.GEMV_ENTRIES.items() if v.layout is gen.Layout.BAND):
        for n in (1, 7, 924, 925, 2560, 6144, 9728, 151936):
            grid, threads, smem = gen.gemv_launch(entry, n, 2560)
            assert threads == 128 and smem == 0 and 1 <= grid <= min(n, gen.GEMV_SMS * per_sm)
            sizes = {(b + 1) * n // grid - b * n // grid for b in range(grid)}
            assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1, (entry, n, sizes)
    assert gen.gemv_launch("kern_gemv_bf16_b4", 6144, 2560) == (878, 128, 0)


def test_streaming_gemv_launch_is_sized_for_its_ring() -> None:
    """A streaming GEMV runs min(n, GEMV_TMA_BLOCKS) blocks with the ring's shared memory; a row too
    long for the ring is refused when the manifest is generated, not at run time."""
    assert gen.gemv_launch("kern_gemv_bf16_s4", 6144, 2560) == (6144, 128, 0)
    assert gen.gemv_launch("kern_gemv_bf16_tma", 6144, 2560) == (gen.GEMV_TMA_BLOCKS, 512, gen.GEMV_TMA_SMEM)
    assert gen.gemv_launch("kern_gemv_bf16_tma", 37, 40) == (37, 512, gen.GEMV_TMA_SMEM)
    assert gen.gemv_launch("kern_gemv_bf16_tma_silu", 9728, 2560)[2] == gen.GEMV_TMA_SMEM
    # A one-row stage of depth k takes 2k bytes and k / 2 bytes of partials (2.5k); the SiLU form 5k.
    longest = gen.GEMV_TMA_SMEM * 2 // 5 // 8 * 8
    gen.gemv_launch("kern_gemv_bf16_tma", 10, longest)
    gen.gemv_launch("kern_gemv_bf16_tma_silu", 10, longest // 2 // 8 * 8)
    with pytest.raises(gen.GenError, match="exceed"):
        gen.gemv_launch("kern_gemv_bf16_tma", 10, longest + 8)
    with pytest.raises(gen.GenError, match="exceed"):
        gen.gemv_launch("kern_gemv_bf16_tma_silu", 10, longest // 2 // 8 * 8 + 8)
    m = _manifest(QWEN3_4B_CONFIG, feed="device", gemv=list(gen.GEMV_GEMMS),
                  gemv_pick={"qkv": "kern_gemv_bf16_tma", "gate_up": "kern_gemv_bf16_tma_silu"})
    qkv = m["ops"]["gemv_tma_6144x2560"]["impl"]["launches"][0]
    assert qkv["grid"] == [gen.GEMV_TMA_BLOCKS, 1, 1] and qkv["shared_mem"] == gen.GEMV_TMA_SMEM
    decode = [c["op"] for c in m["programs"]["decode"]["calls"]]
    assert "gemv_tma_silu_9728x2560" in decode and "silu_mul" not in decode


def test_gemv_pick_overrides_the_table() -> None:
    every = list(gen.GEMV_GEMMS)
    m = _manifest(QWEN3_4B_CONFIG, feed="device", gemv=every, gemv_pick={"down": "kern_gemv_bf16_s8",
                                                                         "gate_up": "kern_gemv_bf16"})
    _verify(m)
    decode = {c["label"]: c for c in m["programs"]["decode"]["calls"]}
    assert decode["l0.down"]["op"] == "gemv_s8_2560x9728"
    assert m["ops"]["gemv_s8_2560x9728"]["impl"]["launches"][0]["block"] == [256, 1, 1]
    assert decode["l0.gate_up"]["op"] == "gemv_19456x2560" and "l0.silu_mul" in decode
    assert decode["l0.o"]["op"] == f"gemv{gen.GEMV_PICK['o'].removeprefix('kern_gemv_bf16')}_2560x4096"
    for bad in ({"attn": "kern_gemv_bf16"}, {"o": "kern_gemv_fast"}, {"o": "kern_gemv_bf16_silu"}):
        with pytest.raises(gen.GenError, match="picks: "):
            _manifest(QWEN3_4B_CONFIG, feed="device", gemv=every, gemv_pick=bad)


# ------------------------------------------------------------------------------ --capture

ROOT = Path(__file__).resolve().parents[3]
DONOR_CAPTURE = ROOT / "tools" / "tests" / "fixtures" / "donor_run2"
"""The donor captured on the H200 with the kernels shipped in kernels/ (same sha256s)."""


def _shipped() -> tuple[dict[str, str], dict[str, str]]:
    import hashlib

    modules = {p.name.rsplit("-", 1)[0]: hashlib.sha256(p.read_bytes()).hexdigest()
               for p in (ROOT / "kernels").glob("*.cubin")}
    return modules, gen.entry_modules(ROOT / "tools" / "kernels-src")


def test_capture_agrees_with_the_generated_donor_shape() -> None:
    modules, entries = _shipped()
    m = _generate(gen.shape_from_config(QWEN3_TINY_CONFIG), modules, entries, model="t", feed="device")
    assert cli.against_capture(m, DONOR_CAPTURE) == []


def test_capture_refuses_another_shape_and_other_constants(monkeypatch: pytest.MonkeyPatch) -> None:
    modules, entries = _shipped()
    m = _generate(gen.shape_from_config(QWEN3_4B_CONFIG), modules, entries, model="t", feed="device")
    problems = cli.against_capture(m, DONOR_CAPTURE)
    assert any("bytes_per_token 147456, mined 2048" in p for p in problems)
    tiny = _generate(gen.shape_from_config(QWEN3_TINY_CONFIG), modules, entries, model="t", feed="device")
    monkeypatch.setattr("kern_qwen3.entries.DECODE_SPLITS", 16)
    assert "decode_splits is 16 here but 32 in the capture" in cli.against_capture(tiny, DONOR_CAPTURE)


def test_capture_of_other_kernels_names_the_module(tmp_path: Path) -> None:
    modules, entries = _shipped()
    stale = {k: "0" * 64 for k in modules}
    m = _generate(gen.shape_from_config(QWEN3_TINY_CONFIG), stale, entries, model="t", feed="device")
    problems = cli.against_capture(m, DONOR_CAPTURE)
    assert any(p.startswith("module qwen3_core pins sha256 000000000000") for p in problems)
    assert cli.against_capture(m, tmp_path) != []  # an empty directory is not a capture


def test_capture_pins_the_cubins_it_ran(tmp_path: Path) -> None:
    modules, entries = _shipped()
    donor_ran = json.loads((ROOT / "examples" / "qwen3-tiny.json").read_text())["modules"]  # the donor's shape
    assert cli.captured_modules(DONOR_CAPTURE, entries) == {k: modules[k] for k in donor_ran}
    out = tmp_path / "tiny.json"
    rc = cli.main(["--preset", "qwen3-tiny", "--capture", str(DONOR_CAPTURE), "-o", str(out)])
    assert rc == 0 and json.loads(out.read_text())["modules"]["attention"]["sha256"] == modules["attention"]


def test_capture_that_cannot_be_mined_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "tiny.json"
    assert cli.main(["--preset", "qwen3-tiny", "--capture", str(tmp_path), "-o", str(out)]) == 2
    assert cli.main(["--preset", "qwen3-4b", "--capture", str(DONOR_CAPTURE), "-o", str(out)]) == 2
    assert not out.exists()


def test_prefetched_gemv_launch_holds_its_columns_rows() -> None:
    """A `_p4` launch gives each block max(1, min(n, GEMV_P4_SMEM // 2k)) columns (`_p4_silu`: // 4k) and their rows of
    shared memory; o at the 4B shape is one resident wave; a row beyond a block's shared memory is
    refused when the manifest is generated."""
    assert gen.gemv_launch("kern_gemv_bf16_p4", 2560, 4096) == (640, 128, 32768)
    assert gen.gemv_launch("kern_gemv_bf16_p4", 2560, 9728) == (2560, 128, 19456)
    assert gen.gemv_launch("kern_gemv_bf16_p4", 7, 40) == (1, 128, 7 * 80)  # no more rows than n
    grid, _threads, smem = gen.gemv_launch("kern_gemv_bf16_p4", 2560, 4096)
    assert grid <= gen.GEMV_SMS * (227 * 1024 // smem)
    gen.gemv_launch("kern_gemv_bf16_p4", 10, gen.GEMV_P4_MAX_ROW // 2)
    with pytest.raises(gen.GenError, match="exceed a block's shared memory"):
        gen.gemv_launch("kern_gemv_bf16_p4", 10, gen.GEMV_P4_MAX_ROW // 2 + 8)
    # `_p4_silu`: a column is its gate and its up row.
    assert gen.gemv_launch("kern_gemv_bf16_p4_silu", 9728, 2560) == (3243, 128, 3 * 2 * 5120)
    gen.gemv_launch("kern_gemv_bf16_p4_silu", 10, gen.GEMV_P4_MAX_ROW // 4)
    with pytest.raises(gen.GenError, match="exceed a block's shared memory"):
        gen.gemv_launch("kern_gemv_bf16_p4_silu", 10, gen.GEMV_P4_MAX_ROW // 4 + 8)
    m = _manifest(QWEN3_4B_CONFIG, feed="device", gemv=list(gen.GEMV_GEMMS), fuse=True, pdl=True,
                  gemv_pick={"o": "kern_gemv_bf16_p4"})
    _verify(m)
    launch = m["ops"]["gemv_p4_2560x4096"]["impl"]["launches"][0]
    assert (launch["entry"], launch["grid"], launch["shared_mem"]) == ("kern_gemv_bf16_p4", [640, 1, 1], 32768)


def test_decode_splits_must_fill_the_attention_clusters(monkeypatch: pytest.MonkeyPatch) -> None:
    """kern_attn_decode's grid y is DECODE_SPLITS and its clusters are 8 blocks along y (the
    `__cluster_dims__` in attention.cu): another split count is refused before a manifest exists."""
    text = (TOOLS / "kernels-src" / "attention.cuh").read_text() + (TOOLS / "kernels-src" / "attention.cu").read_text()
    assert f"constexpr int DEC_CLUSTER = {gen.DECODE_CLUSTER};" in text
    assert "__cluster_dims__(1, DEC_CLUSTER, 1)" in text
    assert gen.DECODE_SPLITS % gen.DECODE_CLUSTER == 0
    monkeypatch.setattr("kern_qwen3._finish.DECODE_SPLITS", 12)
    with pytest.raises(gen.KernelsError, match="DECODE_SPLITS 12"):
        _manifest(QWEN3_TINY_CONFIG, feed="device")


# --------------------------------------------------------------------------------------------
# Reference precision (`precision="f32"`).


@pytest.mark.parametrize("feed", ["host", "device"])
@pytest.mark.parametrize("config", [QWEN3_TINY_CONFIG, QWEN3_4B_CONFIG], ids=["tiny", "4b"])
def test_f32_manifest_verifies(config: dict[str, Any], feed: str) -> None:
    _verify(_manifest(config, feed=feed, precision="f32"))


def test_f32_manifest_keeps_weights_bf16_and_everything_else_f32() -> None:
    m = _manifest(QWEN3_4B_CONFIG, feed="device", precision="f32")
    b = m["buffers"]
    assert {n: v for n, v in b.items() if v["kind"] == "weight"} == {
        n: v for n, v in _manifest(QWEN3_4B_CONFIG)["buffers"].items() if v["kind"] == "weight"}
    floats = {n: v["dtype"] for n, v in b.items() if v["kind"] != "weight" and v["dtype"] in ("bf16", "f32")}
    assert floats == dict.fromkeys(("rope_cos", "rope_sin", "logits", "h", "x", "y", "qkv", "attn", "gu", "act"),
                                   "f32")
    assert {n: b[n]["dtype"] for n in ("ids", "positions", "slots", "seq_len", "block_table", "next_token")} == {
        "ids": "i64", "positions": "i64", "slots": "i64", "seq_len": "i32", "block_table": "i32", "next_token": "i64"}
    assert m["states"]["kv"] == {"bytes_per_token": 36 * 2 * 8 * 128 * 4}
    writes = [c for c in m["programs"]["decode"]["calls"] if c["op"] == "qk_norm_rope_kv"]
    assert [c["args"][6].get("offset", 0) for c in writes] == [i * 2 * 16 * 8 * 128 * 4 for i in range(36)]
    assert writes[0]["args"][-1] == {"i64": 36 * 2 * 16 * 8 * 128}  # page stride in elements
    assert writes[-1]["args"][6]["offset"] + 2 * 16 * 8 * 128 * 4 == 16 * m["states"]["kv"]["bytes_per_token"]
    launches = [la for op in m["ops"].values() for la in op["impl"]["launches"]]
    assert {la["entry"] for la in launches} == {*gen.F32_ENTRIES, *gen.DEVICE_FEED_ENTRIES}
    assert not any("pdl" in la or "carveout" in la for la in launches)
    assert set(m["modules"]) == {"qwen3_core", "qwen3_attn"}  # FAKE_ENTRIES' two fake modules


@pytest.mark.parametrize("feed", ["host", "device"])
def test_f32_programs_run_the_f32_ops_in_the_bf16_order(feed: str) -> None:
    m = _manifest(QWEN3_TINY_CONFIG, feed=feed, precision="f32")
    progs = m["programs"]
    layer = ["qkv", "qk_norm_rope_kv", "attn", "o", "post_norm", "gate_up", "silu_mul", "down", "next_norm"]
    labels = [c["label"] for c in progs["decode"]["calls"]]
    tail = ["lm_head", "argmax", *(["advance"] if feed == "device" else [])]
    assert labels == ["embed", "l0.in_norm", *(f"l{i}.{x}" for i in range(2) for x in layer), *tail]
    # prefill stops after the last layer's KV write; its GEMMs tile any rows, decode's run the GEMV
    assert [c["label"] for c in progs["prefill"]["calls"]][-2:] == ["l1.qkv", "l1.qk_norm_rope_kv"]
    assert {c["op"] for c in progs["prefill"]["calls"] if c["label"].endswith("qkv")} == {"gemm_f32_1024x256"}
    assert progs["decode"]["calls"][-len(tail)]["op"] == "gemv_f32_4096x256"
    gemm = m["ops"]["gemm_f32_1024x256"]["impl"]["launches"][0]
    assert (gemm["entry"], gemm["grid"]) == ("kern_f32_gemm", [16, {"ceil_div": ["tokens", 64]}, 1])
    gemv = m["ops"]["gemv_f32_4096x256"]["impl"]["launches"][0]
    assert (gemv["entry"], gemv["grid"]) == ("kern_f32_gemv", [512, 1, 1])
    assert [c["op"] for c in progs["load"]["calls"]] == ["rope_table"]
    assert m["ops"]["rope_table"]["impl"]["launches"][0]["entry"] == "kern_f32_rope_table"
    assert progs["decode"]["graph"] is True and ("start" in progs) == (feed == "device")


def test_f32_manifest_abi_matches_kernel_sources() -> None:
    src = TOOLS / "kernels-src"
    entries = gen.entry_modules(src)
    assert entries["kern_f32_attn"] == "qwen3_f32" and entries["kern_argmax_final"] == "sampling"
    hashes = dict.fromkeys(set(entries.values()), "c" * 64)
    m = _generate(gen.shape_from_config(QWEN3_TINY_CONFIG), hashes, entries, model="t", feed="device",
                     precision="f32")
    assert set(m["modules"]) == {"qwen3_f32", "sampling"}
    _assert_abi(m["ops"], _c_params(src))


@pytest.mark.parametrize(
    ("option", "flag"),
    [({"gemv": ["o"]}, "gemv"), ({"fuse": True}, "fuse"),
     ({"gemv": list(gen.GEMV_GEMMS), "pdl": True}, "gemv, pdl"),
     ({"gemv": list(gen.GEMV_GEMMS), "fold_norm": True, "defer_norm": True}, "gemv, defer_norm")],
)
def test_f32_refuses_the_bf16_speed_options(option: dict[str, Any], flag: str) -> None:
    with pytest.raises(gen.GenError, match=f"precision f32 .* drop .*{flag}") as info:
        _manifest(QWEN3_TINY_CONFIG, precision="f32", **option)
    assert "\n" not in str(info.value)
    _manifest(QWEN3_TINY_CONFIG, **option)  # the same options build at bf16


def test_unknown_precision_and_missing_f32_kernels_are_refused() -> None:
    with pytest.raises(gen.GenError, match="precision must be one of bf16, f32, got 'fp8'"):
        _manifest(QWEN3_TINY_CONFIG, precision="fp8")
    shape = gen.shape_from_config(QWEN3_TINY_CONFIG)
    partial = {k: v for k, v in FAKE_ENTRIES.items() if k != "kern_f32_attn"}
    with pytest.raises(gen.KernelsError, match=r"kern_f32_attn: precision f32 needs qwen3_f32\.cu"):
        _generate(shape, FAKE_HASHES, partial, model="t", precision="f32")
    with pytest.raises(gen.KernelsError, match="qwen3_core"):
        _generate(shape, {"qwen3_attn": "b" * 64}, FAKE_ENTRIES, model="t", precision="f32")
    with pytest.raises(gen.GenError, match="chunk"):
        _generate(shape, FAKE_HASHES, FAKE_ENTRIES, model="t", chunk=0, precision="f32")


def test_main_writes_the_f32_manifest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cli, "build_and_hash", lambda src, out: FAKE_HASHES)
    monkeypatch.setattr(cli, "entry_modules", lambda src: FAKE_ENTRIES)
    out = tmp_path / "qwen3-tiny-f32.json"
    assert cli.main(["--preset", "qwen3-tiny", "-o", str(out), "--precision", "f32", "--feed", "host"]) == 0
    assert json.loads(out.read_text()) == _manifest(QWEN3_TINY_CONFIG, feed="host", precision="f32") | {
        "model": "qwen3-tiny-f32"}
    capsys.readouterr()
    assert cli.main(["--preset", "qwen3-tiny", "-o", str(tmp_path / "x.json"), "--precision", "f32", "--fuse"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "drop fuse" in err[0] and not (tmp_path / "x.json").exists()


def test_f32_programs_compile_in_the_runtime_on_the_host() -> None:
    """kern_runtime stages every launch of the f32 manifest (f32 buffers, the f32 state's byte
    offsets, grids over `tokens`) with stand-in addresses, no GPU."""
    from kern_manifest import parse_manifest
    from kern_runtime._program import Resources, compile_program

    doc = _manifest(QWEN3_TINY_CONFIG, feed="device", precision="f32")
    m = parse_manifest(json.dumps(doc))
    buffers = {n: (0x10000000 * (i + 1), b.nbytes(m.var_max)) for i, (n, b) in enumerate(m.buffers.items())}
    funcs = {(op, i): f"{op}#{i}" for op, o in m.ops.items() for i in range(len(o.impl.launches))}
    scratch = {op: {s: 0x7000000000 + 4096 * j for j, s in enumerate(o.impl.scratch or {})} for op, o in m.ops.items()}
    kv = 0x8000000000
    res = Resources(m, buffers, {"kv": (kv, 1 << 30)}, scratch, funcs, None, {}, "stream")
    prefill = {s.label: s.run.record for s in compile_program(res, "prefill", {"tokens": 97})}  # type: ignore[attr-defined]
    assert prefill["l0.qkv"].grid == (16, 2, 1) and prefill["l1.qk_norm_rope_kv"].grid == (97, 8, 1)
    assert prefill["l1.qk_norm_rope_kv"].args.slot(6) == (kv + 2 * 16 * 2 * 128 * 4).to_bytes(8, "little")
    decode = [(s.label, s.run.record) for s in compile_program(res, "decode", {"tokens": 1})]  # type: ignore[attr-defined]
    grids = {label: rec.grid for label, rec in decode}
    assert grids["l0.attn"] == (1, 4, 1) and grids["lm_head"] == (512, 1, 1) and grids["l0.gate_up"] == (192, 1, 1)
    assert [label for label, _ in decode].count("argmax") == 2
    assert len(compile_program(res, "load", {})) == 1 and len(compile_program(res, "start", {})) == 4


def test_f32_launch_constants_match_qwen3_f32_cu() -> None:
    text = (TOOLS / "kernels-src" / "qwen3_f32.cu").read_text()
    defines = {name: int(v) for name, v in re.findall(r"#define (F32_\w+) (\d+)", text)}
    assert defines["F32_GEMM_BM"] == defines["F32_GEMM_BN"] == gen.F32_GEMM_TILE
    assert defines["F32_GEMV_WARPS"] == gen.F32_GEMV_COLS
    assert defines["F32_ATT_WARPS"] * 32 == gen.F32_ATTN_THREADS
    m = _manifest(QWEN3_4B_CONFIG, precision="f32")
    blocks = {la["entry"]: la["block"][0] for op in m["ops"].values() for la in op["impl"]["launches"]}
    # every entry's __launch_bounds__ admits the block the generator launches
    limits: dict[str, int] = {}
    for expr, entry in re.findall(r"__launch_bounds__\(([^)]*)\)\s*(kern_\w+)", text):
        factors = [defines[f] if f in defines else int(f) for f in (x.strip() for x in expr.split("*"))]
        limits[entry] = math.prod(factors)
    assert set(limits) == {e for e in gen.F32_ENTRIES if e.startswith("kern_f32_")}
    # NOTE: the GEMM (16 x 16 threads), GEMV (8 warps), attention (8 warps), SiLU and argmax (256-thread
    # strides) index by a fixed block, so a smaller one would leave work undone; q/k norm takes
    # head_dim / 2 (64 for the 4B), the row kernels any multiple of 32: every block is its bound.
    assert {e: blocks[e] for e in limits if e != "kern_f32_rope_table"} == {
        e: n for e, n in limits.items() if e != "kern_f32_rope_table"}
    assert blocks["kern_f32_rope_table"] <= limits["kern_f32_rope_table"]
