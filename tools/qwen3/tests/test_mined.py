"""kern_qwen3.mined on synthetic captures shaped like tools/donor/run_donor.py's: the mined
entries, parameter tables, literals, grid fits and wiring, the wiring assertions firing on broken
captures, and check_against agreeing with kern_qwen3's manifest for the same shape and catching
manifests that disagree."""

from __future__ import annotations

import copy
import json
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from helpers.qwen3_options import generate as _generate

import kern_qwen3 as gen
from kern_qwen3 import QWEN3_TINY_CONFIG, mined

TOOLS = Path(__file__).resolve().parents[2]


SHAPE = gen.shape_from_config(QWEN3_TINY_CONFIG)
ENTRIES = gen.entry_modules(TOOLS / "kernels-src")
TYPES = mined.entry_param_types()
SHAS = {m: f"{i + 1:x}" * 64 for i, m in enumerate(sorted(set(ENTRIES.values())))}
assert len(SHAS) < 14, "one hex digit per module, and 'e' is the cuBLAS module's"
CUBLAS_MODULE = len(SHAS) + 1
"""The capture's module id of the cuBLAS library module (ours are 1 .. len(SHAS))."""
PROMPTS = (6, 23, 64, 157)
CHUNK = 96
P, SPLITS, PARTS, BM = 16, 16, 64, 128
MS = 1_000_000


@dataclass
class Breaks:
    residual_moves: bool = False
    shared_weight: bool = False
    kv_view_off_by_head: bool = False
    kv_not_shared: bool = False
    argmax_split: bool = False
    weight_moves: bool = False
    drop_param: bool = False
    prefill_only: bool = False
    gemv_decode: bool = False


@dataclass
class Synth:
    """A donor run written as launches.jsonl: our kernels with flat params, GEMMs packed."""

    breaks: Breaks
    lines: list[dict[str, Any]] = field(default_factory=list[dict[str, Any]])
    t_ns: int = 10 * MS
    ranges: list[tuple[int, int]] = field(default_factory=list[tuple[int, int]])
    top: int = 0x7F00_0000_0000
    forwards: int = 0

    def alloc(self, nbytes: int) -> int:
        start = self.top
        self.ranges.append((start, nbytes))
        self.top += (nbytes + 0x1FFFFF) // 0x200000 * 0x200000
        return start

    def _pointer(self, addr: int) -> dict[str, Any] | None:
        for start, size in self.ranges:
            if start <= addr < start + size:
                return {"memory_type": "device", "range_start": start, "range_size": size}
        return None

    def launch(self, entry: str, grid: tuple[int, int, int], block: int, *args: float) -> None:
        kinds = TYPES[entry]
        params: list[dict[str, Any]] = []
        offset = 0
        for kind, value in zip(kinds, args, strict=True):
            size = mined.PARAM_BYTES[kind]
            offset = (offset + size - 1) // size * size
            if kind == "f32":
                data = struct.pack("<f", value).hex()
            else:
                data = (int(value) % (1 << (8 * size))).to_bytes(size, "little").hex()
            pointer = self._pointer(int(value)) if kind == "ptr" else None
            params.append({"offset": offset, "size": size, "data": data, "pointer": pointer})
            offset += size
        if self.breaks.drop_param and entry == "kern_silu_mul":
            params.pop()
        module = sorted(SHAS).index(ENTRIES[entry]) + 1
        self._line(entry, module, grid, block, params)

    def gemm(self) -> None:
        self._line("nvjet_tst_128x64", CUBLAS_MODULE, (4, 1, 1), 128, None)

    def _line(self, symbol: str, module: int, grid: tuple[int, int, int], block: int, params: Any) -> None:
        self.t_ns += 6000
        self.lines.append({"t_ns": self.t_ns, "symbol": symbol, "module": module, "grid": list(grid),
                           "block": [block, 1, 1], "shared_mem": 0, "cluster": None, "params": params})

    def gap(self, ms: float) -> None:
        self.t_ns += int(ms * MS)


def _prefill_grid(t: int) -> tuple[int, int, int]:
    """kern_prefill_attn's grid (tools/donor/run_donor.py's)."""
    return math.ceil(t * SHAPE.heads // SHAPE.kv_heads / BM), SHAPE.kv_heads, min(16, math.ceil(512 / t))


class Donor:
    """The donor's schedule (tools/donor/run_donor.py) over a Synth."""

    def __init__(self, breaks: Breaks) -> None:
        s = SHAPE
        self.w = Synth(breaks)
        self.b = breaks
        a = self.w.alloc
        self.embed = a(s.vocab * s.hidden * 2)
        self.norms = {f"l{i}.{n}": a(s.hidden * 2) for i in range(s.layers) for n in ("in_norm", "post_norm")}
        self.norms |= {f"l{i}.{n}": a(s.head_dim * 2) for i in range(s.layers) for n in ("q_norm", "k_norm")}
        self.norms["final_norm"] = a(s.hidden * 2)
        self.o_w = [a(s.hidden * s.heads * s.head_dim * 2) for _ in range(s.layers)]
        self.gu_w = [a(2 * s.inter * s.hidden * 2) for _ in range(s.layers)]
        ws = a(64 << 20)
        names = ("h", "x", "y", "qkv", "attn", "gu", "act", "logits", "part_o", "part_lse", "pf_o", "pf_lse", "pval",
                 "pidx", "next", "ids", "pos", "slots", "seq_len", "block_table", "s_ids", "s_pos",
                 "s_slot", "s_len", "cos", "sin")
        self.buf = {n: ws + k * (1 << 20) for k, n in enumerate(names)}
        self.page_stride = s.layers * 2 * P * s.kv_heads * s.head_dim
        self.kv = a(64 * self.page_stride * 2)

    def kv_at(self, layer: int) -> int:
        return self.kv + layer * 2 * P * SHAPE.kv_heads * SHAPE.head_dim * 2

    def forward(self, t: int, decode: bool) -> None:
        s, w, b, B = SHAPE, self.w, self.b, self.buf
        w.forwards += 1
        io = ("s_ids", "s_pos", "s_slot", "s_len") if decode else ("ids", "pos", "slots", "seq_len")
        nq, nkv, d, eps = s.heads, s.kv_heads, s.head_dim, s.eps
        w.launch("kern_embed", (t, 1, 1), 256, B[io[0]], self.embed, B["h"], s.hidden)
        w.launch("kern_rmsnorm", (t, 1, 1), 256, B["h"], self.norms["l0.in_norm"], B["x"], s.hidden, eps)
        for i in range(s.layers):
            q_norm = self.norms["l0.q_norm" if b.shared_weight and i == 1 else f"l{i}.q_norm"]
            if b.weight_moves and i == 1 and w.forwards == 3:
                q_norm += 4096
            w.gemm()
            w.launch("kern_qk_norm_rope", (t, nq + nkv, 1), d // 2, B["qkv"], q_norm,
                     self.norms[f"l{i}.k_norm"], B[io[1]], B["cos"], B["sin"], nq, nkv, d, eps)
            view = B["qkv"] + (d * 2 if b.kv_view_off_by_head else 0)
            w.launch("kern_kv_write", (t, nkv, 1), 32, view, self.kv_at(i), B[io[2]], nq, nkv, d, P,
                     self.page_stride)
            if i == s.layers - 1 and not decode:
                return
            kv = self.kv_at(i) + (2 if b.kv_not_shared else 0)
            if decode:
                w.launch("kern_attn_decode_partial", (nkv, SPLITS, 1), 128, B["qkv"], kv, B["block_table"],
                         B[io[3]], B["part_o"], B["part_lse"], nq, nkv, d, P, self.page_stride, SPLITS,
                         d**-0.5)
                w.launch("kern_attn_decode_reduce", (nq, 1, 1), 128, B["part_o"], B["part_lse"], B["attn"],
                         nq, d, SPLITS)
            else:
                w.launch("kern_prefill_attn", _prefill_grid(t), 384, B["qkv"], kv, B["block_table"], B[io[3]],
                         B["attn"], B["pf_o"], B["pf_lse"], t, nq, nkv, d, P, self.page_stride, d**-0.5)
                w.launch("kern_prefill_combine", (t, nq, 1), 128, B["pf_o"], B["pf_lse"], B[io[3]], B["attn"], t, nq,
                         nkv, d)
            if decode and b.gemv_decode:
                w.launch("kern_gemv_bf16_s4", (s.hidden, 1, 1), 128, B["attn"], self.o_w[i], B["y"], 1,
                         s.hidden, nq * d, s.hidden)
            else:
                w.gemm()
            res = B["h"] + (512 if b.residual_moves and i == 1 else 0)
            w.launch("kern_add_rmsnorm", (t, 1, 1), 256, res, B["y"], self.norms[f"l{i}.post_norm"], B["x"],
                     s.hidden, eps)
            if decode and b.gemv_decode:
                w.launch("kern_gemv_bf16_s4", (2 * s.inter, 1, 1), 128, B["x"], self.gu_w[i], B["gu"], 1,
                         2 * s.inter, s.hidden, 2 * s.inter)
            else:
                w.gemm()
            w.launch("kern_silu_mul", (t, -(-s.inter // 1024), 1), 128, B["gu"], B["act"], s.inter)
            w.gemm()
            nxt = self.norms["final_norm" if i == s.layers - 1 else f"l{i + 1}.in_norm"]
            w.launch("kern_add_rmsnorm", (t, 1, 1), 256, res, B["y"], nxt, B["x"], s.hidden, eps)
        w.gemm()
        pidx = B["pidx"] + (64 if b.argmax_split else 0)
        w.launch("kern_argmax_partial", (PARTS, 1, 1), 256, B["logits"], B["pval"], B["pidx"], s.vocab)
        w.launch("kern_argmax_final", (1, 1, 1), 256, B["pval"], pidx, B["next"], PARTS)
        w.launch("kern_decode_advance", (1, 1, 1), 32, B["next"], B["s_ids"], B["s_pos"], B["s_slot"],
                 B["s_len"], B["block_table"], P)

    def run(self) -> list[list[int]]:
        w, B = self.w, self.buf
        w.launch("kern_rope_table", (SHAPE.max_pos, 1, 1), 64, B["cos"], B["sin"], SHAPE.max_pos,
                 SHAPE.head_dim // 2, SHAPE.theta)
        windows: list[list[int]] = []
        for n in PROMPTS:
            w.gap(100)
            fwd: list[int] = []
            done = 0
            while done < n - 1:
                t = min(CHUNK, n - 1 - done)
                self.forward(t, decode=False)
                fwd.append(t)
                done += t
                w.gap(2)
            for src, dst in (("ids", "s_ids"), ("pos", "s_pos"), ("slots", "s_slot")):
                w.launch("kern_copy_i64", (1, 1, 1), 32, B[src], B[dst], 1)
            w.launch("kern_copy_i32", (1, 1, 1), 32, B["seq_len"], B["s_len"], 1)
            for _ in range(0 if self.b.prefill_only else 4):
                self.forward(1, decode=True)
                fwd.append(1)
                w.gap(2)
            windows.append(fwd)
        return windows


def write_capture(root: Path, breaks: Breaks | None = None) -> list[list[int]]:
    donor = Donor(breaks or Breaks())
    windows = donor.run()
    pid = root / "pid4242"
    pid.mkdir(parents=True)
    (pid / "launches.jsonl").write_text("".join(json.dumps(x) + "\n" for x in donor.w.lines))
    mods = [{"id": k + 1, "sha256": SHAS[m], "bytes": 100, "functions": []} for k, m in enumerate(sorted(SHAS))]
    mods.append({"id": CUBLAS_MODULE, "sha256": "e" * 64, "bytes": 100, "functions": ["nvjet_tst_128x64"]})
    for m in mods:
        (pid / f"module_{m['id']}.cubin").write_bytes(b"\x7fELF")
    (pid / "modules.jsonl").write_text("".join(json.dumps(m) + "\n" for m in mods))
    return windows


def manifest() -> dict[str, Any]:
    return _generate(SHAPE, SHAS, ENTRIES, model="qwen3-tiny", feed="device")


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("cap")
    windows = write_capture(root)
    return mined.mined_facts(root), windows


# ------------------------------------------------------------------------------ mining


def test_roles_match_the_kernel_sources() -> None:
    for entry, roles in mined.ROLES.items():
        assert len(TYPES[entry]) == len(roles), entry


def test_programs_and_token_counts(good: Any) -> None:
    facts, windows = good
    assert list(facts.programs) == ["load", "prefill", "start", "decode"]
    assert facts.programs["prefill"].tokens == tuple(t for w in windows for t in w[:-4])
    assert facts.programs["decode"].tokens == (1,) * 16
    assert [la.entry for la in facts.programs["start"].launches] == ["kern_copy_i64"] * 3 + ["kern_copy_i32"]
    decode = [la.entry for la in facts.programs["decode"].launches]
    assert decode[:2] == ["kern_embed", "kern_rmsnorm"] and decode[-3:] == [
        "kern_argmax_partial", "kern_argmax_final", "kern_decode_advance"]
    assert decode.count("kern_kv_write") == SHAPE.layers
    # NOTE: the analyzer cuts the same forwards; its tokens reference is its own business (the
    # report says which one it chose), so only the count is pinned here.
    assert len(facts.analyzer_tokens) == sum(len(w) for w in windows)
    assert all(n.startswith("kern_mining.analyze found") for n in facts.notes)


def test_scalars_are_the_literals(good: Any) -> None:
    facts, _ = good
    sc = facts.scalars
    assert (sc["nq"], sc["nkv"], sc["head_dim"], sc["hidden"], sc["inter"], sc["vocab"]) == (
        SHAPE.heads, SHAPE.kv_heads, SHAPE.head_dim, SHAPE.hidden, SHAPE.inter, SHAPE.vocab)
    assert (sc["page_tokens"], sc["splits"], sc["argmax_parts"], sc["layers"]) == (P, SPLITS, PARTS, SHAPE.layers)
    assert sc["page_stride"] == SHAPE.layers * 2 * P * SHAPE.kv_heads * SHAPE.head_dim
    assert struct.pack("<f", sc["eps"]) == struct.pack("<f", SHAPE.eps)
    assert struct.pack("<f", sc["scale"]) == struct.pack("<f", SHAPE.head_dim**-0.5)
    assert sc["max_pos"] == SHAPE.max_pos and sc["theta"] == SHAPE.theta


def test_param_tables_and_grids(good: Any) -> None:
    facts, _ = good
    prefill = facts.programs["prefill"].launches
    kv = next(la for la in prefill if la.entry == "kern_kv_write")
    assert [(q.offset, q.size, q.type) for q in kv.params] == [
        (0, 8, "ptr"), (8, 8, "ptr"), (16, 8, "ptr"), (24, 4, "i32"), (28, 4, "i32"), (32, 4, "i32"),
        (36, 4, "i32"), (40, 8, "i64")]
    assert kv.module_sha256 == SHAS["qwen3_core"]
    assert [g.expr for g in kv.grid] == ["tokens", SHAPE.kv_heads, 1]
    attn = next(la for la in prefill if la.entry == "kern_prefill_attn")
    group = SHAPE.heads // SHAPE.kv_heads
    assert [g.expr for g in attn.grid[:2]] == [{"ceil_div": ["tokens", BM // group]}, SHAPE.kv_heads]
    assert attn.grid[2].observed == tuple((t, min(16, math.ceil(512 / t))) for t in sorted({5, 22, 63, 96, 60}))
    rows = next(q for q in attn.params if q.role == "rows")
    assert rows.literal is None and rows.fit is not None and rows.fit.form == "tokens"
    decode = facts.programs["decode"].launches
    assert len(facts.launches_of("kern_kv_write")) == 2 * SHAPE.layers
    dkv = next(la for la in decode if la.entry == "kern_kv_write")
    assert dkv.grid[0].expr == "tokens"  # NOTE: pooled with prefill, where t varies
    part = next(la for la in decode if la.entry == "kern_attn_decode_partial")
    assert [g.expr for g in part.grid] == [SHAPE.kv_heads, SPLITS, 1]


def test_generator_constants(good: Any) -> None:
    facts, _ = good
    c = mined.generator_constants(facts)
    assert (c.page_tokens, c.decode_splits, c.prefill_bm, c.argmax_parts) == (
        gen.PAGE_TOKENS, gen.DECODE_SPLITS, gen.PREFILL_BM, gen.ARGMAX_PARTS)
    assert c.entry_modules["kern_prefill_attn"] == SHAS["prefill"]
    assert c.entry_modules["kern_argmax_final"] == SHAS["sampling"]
    with pytest.raises(TypeError):
        facts.scalars["eps"] = 1.0  # type: ignore[index]


def test_wiring_facts(good: Any) -> None:
    facts, _ = good
    d, nq, nkv = SHAPE.head_dim, SHAPE.heads, SHAPE.kv_heads
    assert facts.wiring["qkv_k_offset"] == nq * d * 2
    assert facts.wiring["qkv_v_offset"] == (nq + nkv) * d * 2
    assert facts.wiring["kv_layer_bytes"] == 2 * P * nkv * d * 2
    assert facts.wiring["kv_bytes_per_token"] == SHAPE.kv_bytes_per_token
    json.dumps(facts.to_json())


@pytest.mark.parametrize(("breaks", "needle"), [
    (Breaks(residual_moves=True), "residual"),
    (Breaks(shared_weight=True), "share"),
    (Breaks(kv_view_off_by_head=True), "fused qkv"),
    (Breaks(kv_not_shared=True), "KV state"),
    (Breaks(argmax_split=True), "argmax pidx"),
    (Breaks(weight_moves=True), "moves between forwards"),
])
def test_broken_wiring_is_refused(tmp_path: Path, breaks: Breaks, needle: str) -> None:
    write_capture(tmp_path, breaks)
    with pytest.raises(mined.WiringError) as info:
        mined.mined_facts(tmp_path)
    assert any(needle in p for p in info.value.problems), info.value.problems


def test_off_by_one_head_names_the_offset(tmp_path: Path) -> None:
    write_capture(tmp_path, Breaks(kv_view_off_by_head=True))
    with pytest.raises(mined.WiringError) as info:
        mined.mined_facts(tmp_path)
    assert any(f"+{SHAPE.head_dim * 2} bytes" in p and "kern_kv_write" in p for p in info.value.problems)


def test_layout_that_disagrees_with_sources(tmp_path: Path) -> None:
    write_capture(tmp_path, Breaks(drop_param=True))
    with pytest.raises(mined.CaptureShapeError, match="kern_silu_mul"):
        mined.mined_facts(tmp_path)


def test_gemv_sites_keep_their_own_shapes(tmp_path: Path) -> None:
    write_capture(tmp_path, Breaks(gemv_decode=True))
    facts = mined.mined_facts(tmp_path)
    gemvs = facts.launches_of("kern_gemv_bf16_s4")
    assert [next(q.literal for q in la.params if q.role == "gemv_n") for la in gemvs] == [
        SHAPE.hidden, 2 * SHAPE.inter] * SHAPE.layers
    assert "gemv_n" not in facts.scalars
    problems = mined.check_against(manifest(), facts)
    assert any("kern_gemv_bf16_s4 in the capture" in p for p in problems), problems


def test_empty_capture_dir_is_a_dump_error(tmp_path: Path) -> None:
    from kern_mining import DumpError

    with pytest.raises(DumpError):
        mined.mined_facts(tmp_path)


def test_prefill_only_capture_pins_no_decode_constants(tmp_path: Path) -> None:
    write_capture(tmp_path, Breaks(prefill_only=True))
    facts = mined.mined_facts(tmp_path)
    assert "decode" not in facts.programs
    with pytest.raises(mined.CaptureShapeError, match="splits"):
        mined.generator_constants(facts)


def test_manifest_without_programs_is_reported_not_raised(good: Any) -> None:
    facts, _ = good
    problems = mined.check_against({}, facts)
    assert {p.split("'")[1] for p in problems} == {"load", "prefill", "start", "decode"}


def test_capture_without_our_kernels(tmp_path: Path) -> None:
    pid = tmp_path / "pid1"
    pid.mkdir()
    line = {"t_ns": 1, "symbol": "other", "module": None, "grid": [1, 1, 1], "block": [1, 1, 1],
            "shared_mem": 0, "cluster": None, "params": None}
    (pid / "launches.jsonl").write_text(json.dumps(line) + "\n")
    with pytest.raises(mined.CaptureShapeError, match="no forward pass"):
        mined.mined_facts(tmp_path)


# ------------------------------------------------------------------------ check_against


def test_generated_manifest_agrees(good: Any) -> None:
    facts, _ = good
    assert mined.check_against(manifest(), facts) == []


def _first_launch(m: dict[str, Any], op: str) -> dict[str, Any]:
    return m["ops"][op]["impl"]["launches"][0]


Mutation = Callable[[dict[str, Any]], object]
MUTATIONS: list[tuple[Mutation, str]] = [
    (lambda m: _first_launch(m, "attn_prefill")["grid"].__setitem__(0, {"ceil_div": ["tokens", 32]}), "grid[0]"),
    (lambda m: _first_launch(m, "attn_prefill")["grid"].__setitem__(2, 1), "grid[2]"),
    (lambda m: _first_launch(m, "kv_write").update(grid=["tokens", 1, 1]), "grid[1]"),
    (lambda m: _first_launch(m, "silu_mul").update(block=[256, 1, 1]), "block"),
    (lambda m: m["ops"]["attn_decode"]["impl"]["launches"][0]["args"].__setitem__(11, {"i32": 32}), "splits"),
    (lambda m: m["ops"]["kv_write"]["params"].__setitem__(7, "i32"), "param sizes"),
    (lambda m: m["programs"]["decode"]["calls"][1]["args"].__setitem__(4, {"f32": 1e-5}), "eps"),
    (lambda m: m["programs"]["prefill"]["calls"][4]["args"].__setitem__(1, {"state": "kv", "offset": 64}), "state offset"),
    (lambda m: m["modules"]["attention"].update(sha256="0" * 64), "pins sha256"),
    (lambda m: m["programs"]["decode"]["calls"].pop(1), "launch 1"),
    (lambda m: m["programs"].pop("start"), "no 'start' program"),
    (lambda m: m["states"]["kv"].update(bytes_per_token=4096), "bytes_per_token"),
]


@pytest.mark.parametrize(("mutate", "needle"), MUTATIONS)
def test_disagreeing_manifest_is_reported(good: Any, mutate: Mutation, needle: str) -> None:
    facts, _ = good
    m = copy.deepcopy(manifest())
    mutate(m)
    problems = mined.check_against(m, facts)
    assert any(needle in p for p in problems), problems


def test_shipped_tiny_example_against_the_capture(good: Any) -> None:
    """examples/qwen3-tiny.json launches what the synthetic donor ran; only the hashes differ."""
    facts, _ = good
    shipped = json.loads((TOOLS.parent / "examples" / "qwen3-tiny.json").read_text())
    problems = mined.check_against(shipped, facts)
    assert problems and all("pins sha256" in p for p in problems)


# ------------------------------------------------------------- committed GPU captures

FIXTURES = sorted((TOOLS / "tests" / "fixtures").glob("donor*/expected.json"))


@pytest.mark.parametrize("expected_file", FIXTURES, ids=[p.parent.name for p in FIXTURES])
def test_committed_donor_capture(expected_file: Path) -> None:
    """A capture of the real donor on a GPU (tools/capture/donor_capture.py's fixture/donor/,
    committed as tools/tests/fixtures/donor*/): it mines cleanly, the mined pointers are the
    donor's own buffers, and kern_qwen3's manifest for its shape and hashes agrees with it."""
    exp = json.loads(expected_file.read_text())
    facts = mined.mined_facts(expected_file.parent)
    config = dict(QWEN3_TINY_CONFIG) | {"num_hidden_layers": exp["shape"]["layers"]}
    fresh = _generate(gen.shape_from_config(config), exp["modules"], ENTRIES, model="donor",
                         chunk=exp["shape"]["chunk"], feed="device")
    assert mined.check_against(fresh, facts) == []
    a = exp["addresses"]
    decode = facts.programs["decode"].launches
    qk = next(la for la in decode if la.entry == "kern_qk_norm_rope")
    assert qk.samples[0].values[0] == a["qkv"]
    chunks = [t for w in exp["windows"] for t in w[:-4]]  # NOTE: the donor's 4 decode steps
    assert list(facts.programs["prefill"].tokens[-len(chunks) :]) == chunks
    assert facts.programs["decode"].tokens == (1,) * (4 * (len(exp["windows"]) + len(exp["warmup"])))


def test_analyzer_reference_covers_decode_forwards(tmp_path: Path) -> None:
    # Regression: decode-only kernels (one token count each) once made a prefill-only kernel
    # the tokens reference, leaving every decode forward without a token count.
    from kern_mining.analyze import analyze_dir

    windows = write_capture(tmp_path)
    analysis = analyze_dir(tmp_path / "pid4242")
    assert analysis.tokens_reference is not None
    assert analysis.tokens_reference.symbol not in {"kern_prefill_attn", "kern_prefill_combine",
                                                    "kern_attn_decode_partial"}
    found = [[f.tokens for f in win.forwards] for win in analysis.windows]
    assert [w[-4:] for w in found] == [[1, 1, 1, 1]] * len(windows)
    assert [w[0] for w in found[:3]] == [w[0] for w in windows[:3]]
