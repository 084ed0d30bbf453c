"""kern bench's report from synthetic measurements: floors, the peer's rows, the breakdown tables,
the files under --out and the plot (skipped in one line without matplotlib)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kern_runtime.bench.report as rep
from kern_qwen3 import QWEN3_4B_CONFIG, QWEN3_TINY_CONFIG, qwen3_tensor_shapes
from kern_runtime.providers import find

QWEN3 = find({"model": "qwen3-4b"})


def test_bandwidth_floor_per_context() -> None:
    rng = np.random.default_rng(3)
    weights, per_token = int(rng.integers(1e9, 9e9)), int(rng.integers(1e4, 2e5))
    rate = float(rng.uniform(1e12, 5e12))
    rows = {r["name"]: r for r in rep.floor_rows(weights, per_token, (128, 32768), rate)}
    assert rows["copy_bandwidth_rw"]["value"] == round(rate / 1e12, 4)
    for c in (128, 32768):
        want = (weights + c * per_token) / rate * 1e3
        assert rows[f"bandwidth_floor_ms_per_step@ctx{c}"]["value"] == pytest.approx(want, abs=1e-4)
    assert rows["bandwidth_floor_ms_per_step@ctx32768"]["value"] > rows["bandwidth_floor_ms_per_step@ctx128"]["value"]


@pytest.mark.parametrize("config", [QWEN3_4B_CONFIG, QWEN3_TINY_CONFIG])
@pytest.mark.parametrize("n", [1, 709, 16384])
def test_prefill_flops_count_every_layer_matrix_and_causal_attention(config: Any, n: int) -> None:
    """Against the checkpoint's own tensor list: each 2-D layer weight is one GEMM per token."""
    shapes = qwen3_tensor_shapes(config)
    per_token = sum(a * b for k, (a, *rest) in shapes.items() if k.startswith("model.layers.") and rest
                    for b in rest)
    heads, d, layers = config["num_attention_heads"], config["head_dim"], config["num_hidden_layers"]
    pairs = n * (n + 1) / 2  # NOTE: query i sees keys 0..i; the floor counts n^2 / 2
    attention = 2 * 2 * pairs * d * heads * layers
    head = 2 * config["vocab_size"] * config["hidden_size"]
    got = QWEN3.prefill_flops(config, n)
    assert got == pytest.approx(2 * n * per_token + attention + head, rel=2 / n + 1e-9)


def test_compute_floor_rows_and_a_config_that_is_not_qwen3() -> None:
    rows = {r["name"]: r for r in rep.compute_floor_rows(QWEN3.prefill_flops, dict(QWEN3_4B_CONFIG), (709, 4096), 7.5e14)}
    assert rows["gemm_rate_bf16"]["value"] == 750.0
    assert rows["compute_floor_ms@4096"]["value"] == pytest.approx(QWEN3.prefill_flops(QWEN3_4B_CONFIG, 4096) / 7.5e11, abs=1e-4)
    from kern_qwen3 import ConfigError

    with pytest.raises(ConfigError, match="model_type"):
        rep.compute_floor_rows(QWEN3.prefill_flops, {"model_type": "llama"}, (709,), 1e15)


def test_checkpoint_config(tmp_path: Path) -> None:
    assert rep.checkpoint_config([]) is None
    assert rep.checkpoint_config([tmp_path]) is None
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    (tmp_path / "a.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")  # NOTE: an empty safetensors file
    assert rep.checkpoint_config([tmp_path]) == {"model_type": "qwen3"}
    assert rep.checkpoint_config([tmp_path / "a.safetensors"]) == {"model_type": "qwen3"}
    (tmp_path / "config.json").write_text("[1]")
    assert rep.checkpoint_config([tmp_path]) is None


def _kern_rows(contexts: tuple[int, ...], rng: np.random.Generator) -> list[rep.Row]:
    rows = []
    for c in contexts:
        fed = float(rng.uniform(2, 12))
        rows += [rep.row(f"decode_gpu_ms_per_step@ctx{c}", fed, "ms"),
                 rep.row(f"decode_gpu_fixed_ms_per_step@ctx{c}", fed * 0.97, "ms", peer="x"),
                 rep.row(f"bandwidth_floor_ms_per_step@ctx{c}", fed / 2, "ms")]
    return [*rows, rep.row("prefill_ms@709", float(rng.uniform(5, 20)), "ms")]


def _peer_result(contexts: tuple[int, ...], rng: np.random.Generator) -> dict[str, Any]:
    return {"peer": "torch test", "compile_s": float(rng.uniform(10, 90)),
            "decode": [{"context": c, "fed_ms_per_token": float(rng.uniform(2, 12)),
                        "fixed_ms_per_token": float(rng.uniform(2, 12))} for c in contexts],
            "prefill": [{"tokens": 709, "ms": float(rng.uniform(5, 20))}]}


def test_peer_rows_and_the_peer_column() -> None:
    rng = np.random.default_rng(0)
    contexts = (128, 2048)
    kern = _kern_rows(contexts, rng)
    result = _peer_result(contexts, rng)
    rows = {r["name"]: r for r in rep.peer_rows(result, kern)}
    by = {r["name"]: r for r in kern}
    for d in result["decode"]:
        c = d["context"]
        assert rows[f"peer_decode_gpu_ms_per_step@ctx{c}"]["value"] == round(d["fed_ms_per_token"], 4)
        assert rows[f"peer_decode_gpu_fixed_ms_per_step@ctx{c}"]["value"] == round(d["fixed_ms_per_token"], 4)
        assert by[f"decode_gpu_ms_per_step@ctx{c}"]["peer"] == f"torch peer {d['fed_ms_per_token']:.4g} ms"
        assert by[f"decode_gpu_fixed_ms_per_step@ctx{c}"]["peer"] == f"torch peer {d['fixed_ms_per_token']:.4g} ms; x"
    assert rows["peer_prefill_ms@709"]["value"] == round(result["prefill"][0]["ms"], 4)
    assert rows["peer_compile_s"]["peer"] == "torch test"


def _runs(rng: np.random.Generator, layers: int, runs: int) -> list[list[rep.CallTime]]:
    out = []
    for _ in range(runs):
        calls: list[rep.CallTime] = [("embed", float(rng.uniform(0.001, 0.003)))]
        for i in range(layers):
            calls += [(f"l{i}.qkv", float(rng.uniform(0.01, 0.02))), (f"l{i}.attn", float(rng.uniform(0.005, 0.4)))]
        calls.append(("lm_head", float(rng.uniform(0.15, 0.2))))
        out.append(calls)
    return out


def test_call_kinds_sum_each_kind_over_layers_and_average_runs() -> None:
    rng = np.random.default_rng(1)
    runs = _runs(rng, 3, 4)
    kinds = {k: (n, us) for k, n, us in rep.call_kinds(runs)}
    assert set(kinds) == {"embed", "qkv", "attn", "lm_head"}
    assert kinds["qkv"][0] == 3 and kinds["lm_head"][0] == 1
    want = sum(ms for run in runs for label, ms in run if label.endswith(".attn")) * 1e3 / 4
    assert kinds["attn"][1] == pytest.approx(want)
    order = [k for k, _n, _us in rep.call_kinds(runs)]
    assert order == sorted(kinds, key=lambda k: -kinds[k][1])


def test_breakdown_tables_text_and_markdown() -> None:
    rng = np.random.default_rng(2)
    runs = _runs(rng, 2, 3)
    total = sum(us for _k, _n, us in rep.call_kinds(runs))
    text = rep.breakdown_table(128, runs, 0.5)
    lines = text.splitlines()
    assert lines[0].startswith("decode step at context 128: 3 eager runs") and f"sum {total:.1f} us" in lines[0]
    assert "graph replayed back to back 500.0 us" in lines[0]
    assert lines[1].split() == ["call", "calls/step", "us", "each", "us/step", "share"]
    assert len(lines) == 2 + 4
    md = rep.breakdown_markdown(32768, runs, None).splitlines()
    assert md[0] == f"Context 32768 (sum {total:.1f} us):"
    assert md[2] == "| call | calls/step | us each | us/step | share |" and md[3] == "|---|---|---|---|---|"
    shares = [float(line.split("|")[5].strip().rstrip("%")) for line in md[4:]]
    assert sum(shares) == pytest.approx(100, abs=0.3)


def test_decode_series_by_context() -> None:
    rng = np.random.default_rng(4)
    rows = _kern_rows((8192, 128, 2048), rng)
    rows += rep.peer_rows(_peer_result((128, 8192), rng), rows)
    series = dict(rep.decode_series(rows))
    assert list(series) == ["kern, tokens fed in turn", "kern, fixed context", "torch peer, tokens fed in turn",
                            "torch peer, fixed context", "bandwidth floor"]
    assert [c for c, _v in series["kern, tokens fed in turn"]] == [128, 2048, 8192]
    assert [c for c, _v in series["torch peer, fixed context"]] == [128, 8192]
    assert rep.context_of("decode_gpu_ms_per_step@ctx2048", "decode_gpu_ms_per_step") == 2048
    assert rep.context_of("peer_decode_gpu_ms_per_step@ctx2048", "decode_gpu_ms_per_step") is None


def _report(rng: np.random.Generator) -> rep.Report:
    rows = _kern_rows((128, 32768), rng)
    result = _peer_result((128, 32768), rng)
    rows += rep.peer_rows(result, rows)
    return rep.Report(rows, breakdown={128: _runs(rng, 2, 2), 32768: _runs(rng, 2, 2)},
                      replay_ms={128: 2.5, 32768: 3.5}, peer=result, notes=["n"], title="t")


def test_write_report_files(tmp_path: Path) -> None:
    report = _report(np.random.default_rng(5))
    notes: list[str] = []
    files = rep.write_report(report, tmp_path / "out", notes.append)
    names = sorted(f.name for f in files)
    assert names == ["bench.json", "bench.png", "bench.txt", "breakdown.md"] and notes == []
    png = (tmp_path / "out" / "bench.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    saved = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert saved["rows"] == report.rows and saved["peer"] == report.peer and saved["notes"] == ["n"]
    assert set(saved["breakdown"]) == {"128", "32768"} and saved["replay_ms"] == {"128": 2.5, "32768": 3.5}
    text = (tmp_path / "out" / "bench.txt").read_text()
    assert text.startswith("name") and "decode step at context 32768" in text
    assert (tmp_path / "out" / "breakdown.md").read_text().startswith("Context 128 ")


def test_the_plot_is_one_line_without_matplotlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # NOTE: makes `import matplotlib...` fail
    notes: list[str] = []
    files = rep.write_report(_report(np.random.default_rng(6)), tmp_path, notes.append)
    assert notes == ["no plot: matplotlib is not installed (uv sync --group plot, or pip install 'kern-cli[plot]')"]
    assert sorted(f.name for f in files) == ["bench.json", "bench.txt", "breakdown.md"]
    assert not (tmp_path / "bench.png").exists()


def test_no_decode_rows_no_plot(tmp_path: Path) -> None:
    assert rep.plot([rep.row("prefill_ms@709", 10.0, "ms")], tmp_path / "p.png", "t") == "no plot: no decode rows"
