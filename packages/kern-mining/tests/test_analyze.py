from __future__ import annotations

import json
import tempfile
from collections import Counter
from dataclasses import replace
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from helpers.dumps import launch, synthetic, write_dump
from hypothesis import given, settings
from hypothesis import strategies as st

from kern_mining.analyze import Analysis, AnalyzeConfig, analyze, analyze_dir
from kern_mining.dump import load_dump
from kern_mining.fit import Fit
from kern_mining.synth import GroundTruth, KernelSpec, SynthSpec, default_model


def assert_recovers(analysis: Analysis, truth: GroundTruth) -> None:
    assert [tuple(f.tokens for f in w.forwards) for w in analysis.windows] == list(truth.windows)
    assert analysis.tokens_reference is not None
    assert analysis.tokens_reference.symbol in truth.tokens_references
    sites = {(s.symbol, s.ordinal): s for s in analysis.sites}
    for key, want in truth.sites.items():
        got = sites[key]
        assert got.grid == want.grid, key
        assert dict(got.scalars) == want.scalars, key
        assert dict(got.pointers) == want.pointers, key
    extra = {k[0] for k in sites} - {k[0] for k in truth.sites}
    assert extra <= truth.jitter_symbols


def test_recovers_the_default_synthetic_capture_exactly(tmp_path: Path) -> None:
    pid, truth = synthetic(tmp_path)
    analysis = analyze_dir(pid)
    assert_recovers(analysis, truth)
    assert analysis.core == "add"
    assert analysis.undecided == ()


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_recovers_ground_truth_across_timing_and_boundary_jitter(tmp_path: Path, seed: int) -> None:
    pid, truth = synthetic(tmp_path, SynthSpec(seed=seed))
    assert_recovers(analyze_dir(pid), truth)


@pytest.mark.parametrize(
    "spec",
    [
        SynthSpec(layers=1, prompts=(3, 17, 40, 150), decode_steps=2, warmup=()),
        SynthSpec(
            layers=8, prompts=(5, 100, 300, 1000, 2000), decode_steps=6, boundary_jitter=False
        ),
        SynthSpec(layers=2, prompts=(9, 12, 64, 65), decode_steps=1, warmup=(4096,)),
    ],
)
def test_recovers_ground_truth_for_other_shapes(tmp_path: Path, spec: SynthSpec) -> None:
    pid, truth = synthetic(tmp_path, spec)
    assert_recovers(analyze_dir(pid), truth)


def test_the_tokens_reference_is_chosen_by_the_data_not_by_order(tmp_path: Path) -> None:
    # "embed" runs once per forward with a varying grid.x too, but ceil(t/4) as t would leave fits unfit.
    pid, _ = synthetic(tmp_path)
    analysis = analyze_dir(pid)
    ref = analysis.tokens_reference
    assert ref is not None and ref.candidates >= 2
    assert ref.symbol == "rms_norm" and ref.unfit == 0


def test_json_has_the_documented_keys(tmp_path: Path) -> None:
    pid, _ = synthetic(tmp_path)
    data = json.loads(json.dumps(analyze_dir(pid).to_json()))
    assert {"windows", "tokens_reference", "sites", "abi"} <= set(data)
    assert set(data["windows"][0]["forwards"][0]) == {"first", "last", "tokens"}
    assert data["tokens_reference"]["symbol"] == "rms_norm"
    site = next(s for s in data["sites"] if s["symbol"] == "cache_write")
    assert site["grid"][0] == {"form": "ceil_div_mul", "a": 3, "b": None, "c": 4}
    assert site["pointers"] == [
        {"param": 0, "class": "workspace"},
        {"param": 1, "class": "persistent"},
        {"param": 2, "class": "persistent"},
    ]
    assert {"param": 3, "fit": {"form": "const", "a": None, "b": None, "c": 6144}} in site[
        "scalars"
    ]
    abi = {a["symbol"]: a for a in data["abi"]}
    assert abi["gemm_qkv"]["layout"] == "packed"
    assert abi["mystery"]["layout"] == "unknown"
    assert abi["fused_add_rms_norm"] == {
        "symbol": "fused_add_rms_norm",
        "layout": "flat",
        "params": 6,
        "param_sizes": [8, 8, 8, 4, 4, 4],
        "max_param_size": 8,
        "pointer_params": 3,
        "launches": 18 * 4,
    }


def test_forwards_tile_their_window(tmp_path: Path) -> None:
    pid, _ = synthetic(tmp_path)
    for w in analyze_dir(pid).windows:
        assert w.forwards[0].first == w.first and w.forwards[-1].last == w.last
        for a, b in zip(w.forwards, w.forwards[1:], strict=False):
            assert b.first == a.last + 1


def test_the_report_names_windows_reference_fits_and_census(tmp_path: Path) -> None:
    pid, _ = synthetic(tmp_path)
    text = analyze_dir(pid).render()
    assert "5 request windows, 18 forwards" in text
    assert "tokens [7, 1, 1, 1]" in text
    assert "tokens reference: rms_norm" in text
    assert "grid=[ceil(3*t/4), 1, 1]" in text
    assert "ABI census: flat 11, packed 3, unknown 1 symbols" in text


def test_a_one_forward_dump_gives_a_partial_report(tmp_path: Path) -> None:
    pid, _ = synthetic(
        tmp_path, SynthSpec(prompts=(33,), decode_steps=0, warmup=(), boundary_jitter=False)
    )
    analysis = analyze_dir(pid)
    assert len(analysis.forwards) == 1
    assert analysis.tokens_reference is None
    assert analysis.forwards[0].tokens is None
    assert all(f.form == "underdetermined" for s in analysis.sites for f in s.grid)
    assert all(c is None for s in analysis.sites for _, c in s.pointers)
    assert any("only one forward pass" in u for u in analysis.undecided)
    assert any("no tokens reference" in u for u in analysis.undecided)
    assert "undecided: only one forward pass" in analysis.render()


def test_same_token_count_everywhere_leaves_shapes_underdetermined(tmp_path: Path) -> None:
    pid, _ = synthetic(tmp_path, SynthSpec(prompts=(1, 1), decode_steps=2, warmup=()))
    analysis = analyze_dir(pid)
    assert analysis.tokens_reference is None
    sites = {(s.symbol, s.ordinal): s for s in analysis.sites}
    assert sites[("attention", 0)].grid[1].form == "const"
    assert sites[("attention", 0)].grid[0].form == "const"  # 2*ceil(1/16) = 2 in every forward
    assert dict(sites[("attention", 0)].pointers) == {
        0: "workspace",
        1: "persistent",
        2: "workspace",
    }


def test_a_truncated_capture_still_analyzes_and_says_so(tmp_path: Path) -> None:
    pid, _ = synthetic(tmp_path)
    text = (pid / "launches.jsonl").read_text()
    (pid / "launches.jsonl").write_text(text[:-40])
    analysis = analyze_dir(pid)
    assert any("truncated" in n for n in analysis.notes)
    assert analysis.tokens_reference is not None


def test_missing_module_files_do_not_stop_analysis(tmp_path: Path) -> None:
    pid, truth = synthetic(tmp_path)
    (pid / "module_2.cubin").unlink()
    analysis = analyze_dir(pid)
    assert any("module_2.cubin is missing" in n for n in analysis.notes)
    assert_recovers(analysis, truth)


def test_windows_without_the_core_kernel_are_skipped(tmp_path: Path) -> None:
    pid, truth = synthetic(tmp_path)
    dump = load_dump(pid)
    start = dump.launches[0].t_ns - 100_000_000
    init = [launch(start + i * 1000, symbol="init_weights") for i in range(10)]
    d = write_dump(tmp_path / "with_init", init)
    with (d / "launches.jsonl").open("a") as f:
        f.write((pid / "launches.jsonl").read_text())
    analysis = analyze_dir(d)
    assert [(w.first, w.last, w.reason) for w in analysis.skipped_windows] == [
        (0, 9, "no core kernel")
    ]
    assert [tuple(f.tokens for f in w.forwards) for w in analysis.windows] == list(truth.windows)


def test_a_config_that_merges_requests_changes_only_the_windows(tmp_path: Path) -> None:
    pid, truth = synthetic(tmp_path)
    dump = load_dump(pid)
    merged = analyze(dump, AnalyzeConfig(window_gap_ms=1000.0))
    assert len(merged.windows) == 1
    assert [f.tokens for f in merged.forwards] == [t for w in truth.windows for t in w]
    assert replace(AnalyzeConfig(), burst_gap=3).burst_gap == 3


def test_a_reference_of_a_times_t_reads_as_t_when_one_token_forwards_exist(tmp_path: Path) -> None:
    head, layer, tail = default_model()
    four = Fit("mul", a=4)

    def scaled(k: KernelSpec) -> KernelSpec:
        return replace(k, grid=(four, *k.grid[1:])) if k.grid[0] == Fit("tokens") else k

    model = (head, tuple(scaled(k) for k in layer), tuple(scaled(k) for k in tail))
    pid, truth = synthetic(tmp_path, SynthSpec(model=model))
    analysis = analyze_dir(pid)
    assert [tuple(f.tokens for f in w.forwards) for w in analysis.windows] == list(truth.windows)
    ref = analysis.tokens_reference
    assert ref is not None and ref.scale == 4 and ref.unfit == 0
    sites = {(s.symbol, s.ordinal): s for s in analysis.sites}
    assert sites[("rms_norm", 0)].grid[0] == four
    assert sites[("cache_write", 1)].grid[0] == Fit("ceil_div_mul", a=3, c=4)


def test_a_window_of_host_side_bits_is_not_a_request(tmp_path: Path) -> None:
    # Between two requests, a burst of preamble kernels that uses the core kernel once or twice.
    pid, truth = synthetic(tmp_path)
    lines = (pid / "launches.jsonl").read_text().splitlines()
    records = [json.loads(x) for x in lines]
    split = next(
        i
        for i in range(1, len(records))
        if records[i]["t_ns"] - records[i - 1]["t_ns"] > 10_000_000
    )
    split = next(
        i
        for i in range(split + 1, len(records))
        if records[i]["t_ns"] - records[i - 1]["t_ns"] > 10_000_000
    )
    t0 = records[split]["t_ns"] - 8_000_000
    extra = [
        launch(t0 + k * 5000, symbol=s) for k, s in enumerate(["fill", "add", "fill", "arange"])
    ]
    for r in extra:
        r["params"] = []
    records[split:split] = extra
    d = write_dump(tmp_path / "with_preamble", records)
    analysis = analyze_dir(d)
    assert [tuple(f.tokens for f in w.forwards) for w in analysis.windows] == list(truth.windows)
    (skipped,) = analysis.skipped_windows
    assert (skipped.first, skipped.last) == (split, split + 3)
    assert skipped.reason.startswith("core kernel under half")


def _torch_like_model() -> tuple[
    tuple[KernelSpec, ...], tuple[KernelSpec, ...], tuple[KernelSpec, ...]
]:
    """An eager-PyTorch-shaped decoder: composite norms, many launches of one elementwise kernel,
    GEMMs through `extra`, and no kernel whose grid.x is the token count itself."""
    one = Fit("const", c=1)

    def ew(symbol: str, grid: Fit, *pointers: str) -> KernelSpec:
        return KernelSpec(symbol, (grid, one, one), pointers)

    rows = Fit("ceil_div", c=2)
    norm = (
        ew("pow", rows, "workspace:h", "workspace:sq"),
        ew("mean", Fit("ceil_div", c=16), "workspace:sq", "workspace:var"),
        ew("add_scalar", one, "workspace:var", "workspace:var"),
        ew("rsqrt", one, "workspace:var", "workspace:var"),
        ew("mul_f32", rows, "workspace:h", "workspace:var"),
        ew("mul_bf16", rows, "weight", "workspace:h"),
    )
    gemm = KernelSpec("gemm", (Fit("ceil_div", c=32), Fit("const", c=8), one), layout="packed")
    head = (
        ew("fill", one, "workspace:mask"),
        ew("embedding", Fit("mul", a=2), "weight", "workspace:h"),
        *norm,
    )
    layer = (
        gemm,
        ew("mul_bf16", rows, "workspace:q", "persistent:cos"),
        ew("mul_bf16", rows, "workspace:k", "persistent:cos"),
        ew("cat", Fit("affine", a=2, b=3), "persistent:kv{layer}", "workspace:k"),
        ew("softmax", Fit("mul", a=4), "workspace:s", "workspace:p"),
        ew("mul_bf16", rows, "workspace:p", "workspace:p"),
        gemm,
        ew("add", rows, "workspace:h", "workspace:o"),
        *norm,
        gemm,
        ew("silu", rows, "workspace:g", "workspace:g"),
        ew("mul_bf16", rows, "workspace:g", "workspace:u"),
        gemm,
        ew("add", rows, "workspace:h", "workspace:d"),
        *norm,
    )
    tail = (
        gemm,
        ew("argmax", one, "workspace:logits", "workspace:tok"),
        ew("mul_i64", one, "workspace:tok", "persistent:unfinished"),
        ew("cat_ids", one, "persistent:ids", "workspace:tok"),
        ew("max", one, "persistent:unfinished", "workspace:flag"),
        ew("copy_ids", one, "persistent:ids", "persistent:unfinished"),
    )
    return head, layer, tail


def test_an_eager_pytorch_shaped_capture(tmp_path: Path) -> None:
    # NOTE: token counts of mixed parity: were every t odd, ceil(t/2) = (t+1)/2 would be an affine
    # image of t, and the data could not tell which of the two is the token count.
    spec = SynthSpec(
        model=_torch_like_model(), layers=3, prompts=(6, 23, 64), decode_steps=3, warmup=(11,)
    )
    pid, truth = synthetic(tmp_path, spec)
    analysis = analyze_dir(pid)
    assert analysis.core == "mul_bf16"
    assert [tuple(f.tokens for f in w.forwards) for w in analysis.windows] == list(truth.windows)
    ref = analysis.tokens_reference
    assert ref is not None and ref.scale in (2, 4) and ref.unfit == 0
    sites = {(s.symbol, s.ordinal): s for s in analysis.sites}
    for key, want in truth.sites.items():
        assert sites[key].grid == want.grid, key
        assert dict(sites[key].pointers) == want.pointers, key


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 5), st.integers(1, 4), st.booleans())
def test_recovery_holds_for_random_seeds_depths_and_jitter(
    seed: int, layers: int, steps: int, jitter: bool
) -> None:
    spec = SynthSpec(seed=seed, layers=layers, decode_steps=steps, boundary_jitter=jitter)
    with tempfile.TemporaryDirectory() as tmp:
        pid, truth = synthetic(Path(tmp), spec)
        assert_recovers(analyze_dir(pid), truth)


def _records(pid: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (pid / "launches.jsonl").read_text().splitlines()]


def _forward_starts(records: list[dict[str, Any]]) -> list[int]:
    # NOTE: without boundary jitter every synthetic forward begins with its one "embed" launch.
    return [i for i, r in enumerate(records) if r["symbol"] == "embed"]


def test_lazy_loading_gaps_inside_a_forward_do_not_split_a_request(tmp_path: Path) -> None:
    # The first launch of a kernel can take hundreds of ms (lazy loading), longer than the idle
    # time between requests; such a gap ends at a symbol's first launch and the work goes on.
    pid, truth = synthetic(tmp_path)
    records = _records(pid)
    firsts: dict[str, int] = {}
    for i, r in enumerate(records):
        firsts.setdefault(r["symbol"], i)
    for i in sorted(p for s, p in firsts.items() if s in ("rope", "attention", "rms_norm")):
        for r in records[i:]:
            r["t_ns"] += 300_000_000
    analysis = analyze_dir(write_dump(tmp_path / "lazy", records))
    assert [tuple(f.tokens for f in w.forwards) for w in analysis.windows] == list(truth.windows)
    assert analysis.skipped_windows == ()


def test_host_steps_longer_than_the_floor_do_not_shred_requests(tmp_path: Path) -> None:
    # A scheduler that spends 12 ms between steps: above the 5 ms floor, far below the idle time
    # between requests; the threshold comes from the break in the gap distribution.
    pid, truth = synthetic(tmp_path, SynthSpec(boundary_jitter=False))
    records = _records(pid)
    shift = 0
    gaps = [0] + [b["t_ns"] - a["t_ns"] for a, b in pairwise(records)]
    for i, r in enumerate(records):
        if 500_000 < gaps[i] < 5_000_000:
            shift += 12_000_000
        elif gaps[i] >= 5_000_000:
            shift += 400_000_000
        r["t_ns"] += shift
    analysis = analyze_dir(write_dump(tmp_path / "steps", records))
    assert [tuple(f.tokens for f in w.forwards) for w in analysis.windows] == list(truth.windows)


def test_a_decode_only_kernel_is_not_the_core_even_when_most_frequent(tmp_path: Path) -> None:
    # Decode forwards run a GEMV four times where the prefill runs one GEMM (cuBLAS picks by
    # shape), and its grid.x varies from step to step; neither may cost the prefill its forward.
    pid, truth = synthetic(tmp_path, SynthSpec(boundary_jitter=False))
    records = _records(pid)
    starts = [*_forward_starts(records), len(records)]
    out: list[dict[str, Any]] = []
    step = 0
    for a, b in pairwise(starts):
        if a and records[a - 1]["t_ns"] + 5_000_000 < records[a]["t_ns"]:
            step = 0
        out += records[:a] if a == starts[0] else []
        for r in records[a:b]:
            decode = r["symbol"] == "embed" and r["params"][3]["data"] == "01000000"
            step = step + 1 if decode else step
            if r["symbol"] == "gemm_qkv" and step and records[a]["params"][3]["data"] == "01000000":
                out += [{**r, "symbol": "gemv", "grid": [2 + step, 1, 1]} for _ in range(4)]
            else:
                out.append(r)
    analysis = analyze_dir(write_dump(tmp_path / "gemv", out))
    assert Counter(r["symbol"] for r in out).most_common(1)[0][0] == "gemv"
    assert analysis.core != "gemv"
    assert [tuple(f.tokens for f in w.forwards) for w in analysis.windows] == list(truth.windows)
    ref = analysis.tokens_reference
    assert ref is not None and ref.symbol != "gemv"


def test_forwards_without_a_time_gap_are_cut_at_their_first_kernel(tmp_path: Path) -> None:
    # A host that launches the next forward at once (no sampler sync, no scheduler gap): only the
    # recurring first kernel of a forward marks where one ends.
    pid, truth = synthetic(tmp_path, SynthSpec(boundary_jitter=False))
    records = _records(pid)
    gaps = [b["t_ns"] - a["t_ns"] for a, b in pairwise(records)]
    t = records[0]["t_ns"]
    for r, gap in zip(records[1:], gaps, strict=True):
        t += 50_000_000 if gap > 5_000_000 else 8_000
        r["t_ns"] = t
    analysis = analyze_dir(write_dump(tmp_path / "nogap", records))
    assert [tuple(f.tokens for f in w.forwards) for w in analysis.windows] == list(truth.windows)
    assert [f.first for f in analysis.forwards] == _forward_starts(records)


def test_a_kernel_of_one_shape_in_one_burst_does_not_read_as_a_one_forward_capture(
    tmp_path: Path,
) -> None:
    # cuBLAS picks its GEMM by shape: the warm-up prefill alone runs one GEMM kernel, once per
    # layer, in one dense burst. Taken as the core kernel it finds one forward in the warm-up
    # window and none in the requests; a reading of one forward must not win by skipping them.
    spec = SynthSpec(prompts=(7, 34), decode_steps=1, warmup=(512,), layers=8)
    pid, truth = synthetic(tmp_path, spec)
    records = _records(pid)
    warmup_end = next(
        i for i in range(1, len(records)) if records[i]["t_ns"] - records[i - 1]["t_ns"] > 10**7
    )
    for r in records[:warmup_end]:
        if r["symbol"] == "gemm_qkv":
            r["symbol"] = "gemm_qkv_large"
    burst = [i for i, r in enumerate(records) if r["symbol"] == "gemm_qkv_large"]
    assert len(burst) == spec.layers and burst[-1] < warmup_end
    analysis = analyze_dir(write_dump(tmp_path / "shape", records))
    assert analysis.core != "gemm_qkv_large"
    assert [tuple(f.tokens for f in w.forwards) for w in analysis.windows] == list(truth.windows)
    assert analysis.skipped_windows == ()
