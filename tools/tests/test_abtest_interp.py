"""`kern test`'s harness on the CPU: the tiny Qwen3 manifest on the interpreter against candidates
built to fail each way, one per rung of the verdict ladder.

Each candidate is the tiny manifest with one call added (an op whose entry the interpreter runs as
a fault kernel defined here); where a rung needs it, the reference carries a call too. The random
tiny checkpoint's logits are nearly flat (the top token holds about 0.1% of the mass), so the
final norm is scaled by 8 to give peaked rows like a trained model's: KL and argmax flips then
mean what they mean there."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kern_interp import qwen3 as interp
from kern_interp.side import InterpLoader
from kern_qwen3 import QWEN3_TINY_CONFIG, random_checkpoint
from kern_runtime import abtest as ab

ROOT = Path(__file__).resolve().parents[2]
CAPACITY = 60
"""Not a multiple of the 16-token page: the last page has slots no run writes."""
OPTIONS = ab.AbOptions(runs=6, decode_steps=4, capacity=CAPACITY, perf=False, iters=2)
Ptr = tuple[np.ndarray, int]


@pytest.fixture(scope="module")
def tiny() -> dict[str, Any]:
    return json.loads((ROOT / "examples" / "qwen3-tiny.json").read_text())


@pytest.fixture(scope="module")
def tiny_batch() -> dict[str, Any]:
    return json.loads((ROOT / "examples" / "qwen3-tiny-batch.json").read_text())


@pytest.fixture(scope="module")
def tensors(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    path, _ = random_checkpoint(QWEN3_TINY_CONFIG, seed=0, name="qwen3-tiny", root=tmp_path_factory.mktemp("ckpt"))
    out = dict(interp.read_checkpoint(path))
    out["model.norm.weight"] = out["model.norm.weight"] * 8
    return out


# --------------------------------------------------------------------------------------------
# Fault kernels: (t, *args) as the interpreter calls an entry.


def _logits(p: Ptr) -> np.ndarray:
    arr, off = p
    return arr[off : off + 4096]


def _scaled(factor: float) -> Callable[..., None]:
    def kernel(t: int, logits: Ptr) -> None:
        _logits(logits)[:] *= np.float32(factor)

    return kernel


def _zero_last(sign: float) -> Callable[..., None]:
    def kernel(t: int, logits: Ptr) -> None:
        _logits(logits)[-1] = np.float32(sign * 0.0)

    return kernel


def _nan(t: int, logits: Ptr) -> None:
    _logits(logits)[5] = np.nan


def _swap(t: int, logits: Ptr) -> None:
    x = _logits(logits)
    hi, lo = int(np.argmax(x)), int(np.argmin(x))
    x[hi], x[lo] = x[lo], x[hi]


def _swap_rows(t: int, logits: Ptr) -> None:
    arr, off = logits
    for x in arr[off : off + t * 4096].reshape(t, 4096):
        hi, lo = int(np.argmax(x)), int(np.argmin(x))
        x[hi], x[lo] = x[lo], x[hi]


def _jitter_ulp(t: int, logits: Ptr) -> None:
    x = _logits(logits)
    rows = np.random.default_rng().integers(0, len(x), size=8)
    x[rows] = np.nextafter(x[rows], np.float32(np.inf))


def _chunk_jitter(t: int, h: Ptr, hidden: int) -> None:
    """Adds a pattern scaled by the chunk's rows to the embeddings, as a kernel whose reduction
    order depends on the chunk size would round differently."""
    arr, off = h
    rows = arr[off : off + t * hidden].reshape(t, hidden)
    rows += np.float32(1e-4 * (t % 5 + 1)) * np.sin(np.arange(hidden, dtype=np.float32))


def _argmin(t: int, logits: Ptr, nxt: Ptr) -> None:
    arr, off = nxt
    arr[off] = int(np.argmin(_logits(logits)))


def _out_of_domain(t: int, nxt: Ptr) -> None:
    arr, off = nxt
    arr[off] = 4096


def _k_at(slots: Ptr, nkv: int, d: int, p: int, page_stride: int, ahead: int) -> int:
    slot = int(slots[0][slots[1]]) + ahead
    return (slot // p) * page_stride + (slot % p) * nkv * d


def _state_zero(sign: float) -> Callable[..., None]:
    def kernel(t: int, kv: Ptr, slots: Ptr, nkv: int, d: int, p: int, page_stride: int) -> None:
        arr, base = kv
        arr[base + _k_at(slots, nkv, d, p, page_stride, 0)] = np.float32(sign * 0.0)

    return kernel


def _write_ahead(t: int, kv: Ptr, slots: Ptr, nkv: int, d: int, p: int, page_stride: int) -> None:
    """Writes the next slot's key too (an off-by-one): past the run's last token, outside A's writes."""
    arr, base = kv
    arr[base + _k_at(slots, nkv, d, p, page_stride, 1)] = np.float32(1.0)


FAULTS: dict[str, Callable[..., None]] = {
    "kern_test_drift": _scaled(1 + 1e-4), "kern_test_temperature": _scaled(1.5), "kern_test_zero_pos": _zero_last(1.0),
    "kern_test_zero_neg": _zero_last(-1.0), "kern_test_nan": _nan, "kern_test_swap": _swap,
    "kern_test_ulp": _jitter_ulp, "kern_test_swap_rows": _swap_rows, "kern_test_chunk_jitter": _chunk_jitter, "kern_test_domain": _out_of_domain,
    "kern_test_argmin": _argmin,
    "kern_test_state_pos": _state_zero(1.0), "kern_test_state_neg": _state_zero(-1.0),
    "kern_test_write_ahead": _write_ahead,
}  # fmt: skip


@pytest.fixture(autouse=True)
def faults(monkeypatch: pytest.MonkeyPatch) -> None:
    for entry, kernel in FAULTS.items():
        monkeypatch.setitem(interp.KERNELS, entry, kernel)


# --------------------------------------------------------------------------------------------
# Candidates: the tiny manifest with one call added after a labelled one.


def _with(m: dict[str, Any], entry: str, after: str, programs: tuple[str, ...],
          args: Callable[[dict[str, Any]], list[Any]], params: list[str]) -> dict[str, Any]:
    out = copy.deepcopy(m)
    out["ops"][entry] = {"params": params, "impl": {"launches": [
        {"module": "qwen3_core", "entry": entry, "block": [32, 1, 1], "grid": [1, 1, 1]}]}}
    for name in programs:
        calls = out["programs"][name]["calls"]
        i = next(i for i, c in enumerate(calls) if c["label"] == after)
        calls.insert(i + 1, {"label": entry, "op": entry, "args": args(calls[i])})
    return out


def _on_logits(m: dict[str, Any], entry: str) -> dict[str, Any]:
    return _with(m, entry, "lm_head", ("decode", "head"), lambda _: [{"buf": "logits"}], ["inout buffer<bf16>"])


def _on_state(m: dict[str, Any], entry: str) -> dict[str, Any]:
    """After the step's first KV write, with its state, slot, heads, head dim, page and stride."""
    def args(kv_write: dict[str, Any]) -> list[Any]:
        a = kv_write["args"]
        return [a[1], a[2], a[4], a[5], a[6], a[7]]

    return _with(m, entry, "l0.kv_write", ("decode",), args,
                 ["inout state", "in buffer<i64>", "i32", "i32", "i32", "i64"])


def _on_token(m: dict[str, Any], entry: str) -> dict[str, Any]:
    return _with(m, entry, "argmax", ("decode",), lambda _: [{"buf": "next_token"}], ["inout buffer<i64>"])


def _on_argmax(m: dict[str, Any], entry: str) -> dict[str, Any]:
    return _with(m, entry, "argmax", ("decode", "head"), lambda _: [{"buf": "logits"}, {"buf": "next_token"}],
                 ["in buffer<bf16>", "inout buffer<i64>"])


def _on_row_logits(m: dict[str, Any], entry: str) -> dict[str, Any]:
    """After the batched step's lm_head, on every row's logits: the one-row programs untouched."""
    return _with(m, entry, "lm_head", ("decode_rows",), lambda _: [{"buf": "row_logits"}], ["inout buffer<bf16>"])


def _jittery(m: dict[str, Any]) -> dict[str, Any]:
    return _with(m, "kern_test_chunk_jitter", "embed", ("prefill",), lambda _: [{"buf": "h"}, {"i32": 256}],
                 ["inout buffer<bf16>", "i32"])


def _test(a: dict[str, Any], b: dict[str, Any], tensors: dict[str, np.ndarray],
          options: ab.AbOptions = OPTIONS) -> ab.Result:
    ma, mb = interp.model_of(a), interp.model_of(b)
    cap = options.capacity
    return ab.ab_test(InterpLoader(ma, mb, tensors, cap), ab.check_pair(ma, mb, cap), options)


def _verdict(result: ab.Result) -> tuple[str, int, str]:
    v = result.verdict
    return v.outcome.name, v.exit_code, v.reason


# --------------------------------------------------------------------------------------------
# One fixture per rung.


def test_identical_is_bit_identical(tiny: dict[str, Any], tensors: dict[str, np.ndarray]) -> None:
    result = _test(tiny, copy.deepcopy(tiny), tensors)
    assert _verdict(result)[:2] == ("PASS", 0)
    assert result.verdict.reason.startswith("bit-identical")
    assert result.states["kv"].compared and result.states["kv"].outside == 0


def test_sign_of_zero_in_the_logits_is_values_identical(tiny: dict[str, Any], tensors: dict[str, np.ndarray]) -> None:
    result = _test(_on_logits(tiny, "kern_test_zero_pos"), _on_logits(tiny, "kern_test_zero_neg"), tensors)
    assert _verdict(result)[:2] == ("PASS", 0)
    assert result.verdict.reason.startswith("values identical")


def test_sign_of_zero_in_the_state_is_logits_identical(tiny: dict[str, Any], tensors: dict[str, np.ndarray]) -> None:
    result = _test(_on_state(tiny, "kern_test_state_pos"), _on_state(tiny, "kern_test_state_neg"), tensors)
    assert _verdict(result)[:2] == ("PASS", 0)
    assert result.verdict.reason.startswith("logits identical")
    assert not result.states["kv"].equal and result.states["kv"].outside == 0


def test_nondeterminism_inside_the_noise_band_passes_within_noise(tiny: dict[str, Any],
                                                                   tensors: dict[str, np.ndarray]) -> None:
    a = _jittery(tiny)
    result = _test(a, _on_logits(a, "kern_test_ulp"), tensors)
    assert _verdict(result)[:2] == ("PASS", 0)
    assert result.verdict.reason.startswith("within the noise band")
    assert result.noise is not None and result.noise.kl.max() > result.stats.kl.max() > 0


def test_rounding_drift_passes_on_logit_evidence(tiny: dict[str, Any], tensors: dict[str, np.ndarray]) -> None:
    result = _test(tiny, _on_logits(tiny, "kern_test_drift"), tensors)
    assert _verdict(result)[:2] == ("PASS", 0)
    assert result.verdict.reason.startswith("logit evidence")


def test_a_softer_distribution_is_inconclusive(tiny: dict[str, Any], tensors: dict[str, np.ndarray]) -> None:
    result = _test(tiny, _on_logits(tiny, "kern_test_temperature"), tensors)
    assert _verdict(result)[:2] == ("INCONCLUSIVE", 3)
    assert result.evidence.flips == 0 and result.evidence.kl_max > OPTIONS.logit_kl


def test_nan_fails(tiny: dict[str, Any], tensors: dict[str, np.ndarray]) -> None:
    result = _test(tiny, _on_logits(tiny, "kern_test_nan"), tensors)
    assert _verdict(result)[:2] == ("FAIL", 1)
    assert result.verdict.reason.startswith("non-finite logits")


def test_an_out_of_domain_token_fails(tiny: dict[str, Any], tensors: dict[str, np.ndarray]) -> None:
    result = _test(tiny, _on_token(tiny, "kern_test_domain"), tensors)
    assert _verdict(result)[:2] == ("FAIL", 1)
    assert result.verdict.reason.startswith("output domain: next_token")


def test_a_write_outside_the_write_set_fails(tiny: dict[str, Any], tensors: dict[str, np.ndarray]) -> None:
    result = _test(tiny, _on_state(tiny, "kern_test_write_ahead"), tensors)
    assert _verdict(result)[:2] == ("FAIL", 1)
    assert result.verdict.reason.startswith("memory:")
    # NOTE: one float32 key element per run, 1.0 = 0x3f800000: two non-zero bytes
    assert result.states["kv"].outside == 2 * len(result.runs)


def test_a_crash_fails_with_its_line(tiny: dict[str, Any], tensors: dict[str, np.ndarray],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    calls = iter(range(1_000))

    def crash(t: int, logits: Ptr) -> None:
        if next(calls) == 7:
            raise RuntimeError("CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered\nmore")

    monkeypatch.setitem(interp.KERNELS, "kern_test_crash", crash)
    result = _test(tiny, _on_logits(tiny, "kern_test_crash"), tensors)
    assert _verdict(result)[:2] == ("FAIL", 1)
    assert result.verdict.reason == ("B crashed: in run 1: RuntimeError: CUDA_ERROR_ILLEGAL_ADDRESS: an illegal "
                                     "memory access was encountered")
    assert result.completed == 1 and result.stats.rows == len(result.runs[0].decode) + 1


def test_an_argmax_swap_fails(tiny: dict[str, Any], tensors: dict[str, np.ndarray]) -> None:
    result = _test(tiny, _on_logits(tiny, "kern_test_swap"), tensors)
    assert _verdict(result)[:2] == ("FAIL", 1)
    assert result.verdict.reason.startswith("argmax flips")
    assert result.evidence.flips == result.stats.rows


def test_a_swapped_argmax_kernel_fails_on_its_tokens(tiny: dict[str, Any], tensors: dict[str, np.ndarray]) -> None:
    """The logits byte for byte, the next token the worst one: the token rung fails it."""
    result = _test(tiny, _on_argmax(tiny, "kern_test_argmin"), tensors)
    assert _verdict(result)[:2] == ("FAIL", 1)
    assert result.verdict.reason.startswith("next token: B's is off its top logit")
    assert result.evidence.logits_identical and result.evidence.token_flips == result.stats.rows


# --------------------------------------------------------------------------------------------
# The batched step.


def test_identical_batched_manifests_are_bit_identical_on_batched_rows(tiny_batch: dict[str, Any],
                                                                       tensors: dict[str, np.ndarray]) -> None:
    result = _test(tiny_batch, copy.deepcopy(tiny_batch), tensors)
    assert _verdict(result)[:2] == ("PASS", 0) and result.verdict.reason.startswith("bit-identical")
    assert result.batches and result.batched_rows == sum(b.rows for b in result.batches) > 0
    single = sum(len(run.decode) + 1 for run in result.runs)
    assert result.stats.rows == single + result.batched_rows
    assert result.noise is not None and result.noise.rows == result.stats.rows
    text = ab.report_of(result).text()
    assert f"logits batched rows compared: {result.batched_rows} of {result.batched_rows}" in text


def test_the_batched_rows_run_what_the_one_row_step_runs(tiny_batch: dict[str, Any],
                                                         tensors: dict[str, np.ndarray]) -> None:
    """A batch's rows against the same sequences driven one at a time: the same tokens, logits
    within float32 rounding of other shapes."""
    ma = interp.model_of(tiny_batch)
    f = ab.check_pair(ma, ma, CAPACITY).a
    batch = ab.draw_batches(1, f.roles, f.roles, OPTIONS)[0]
    side = InterpLoader(ma, ma, tensors, CAPACITY).reference()
    rec = ab.drive_batch(side, f, batch, batch.chunk, states=False)
    n = len(batch.prompts)
    for i, (prompt, decode) in enumerate(zip(batch.prompts, batch.decode, strict=True)):
        run = ab.Run(prompt, batch.chunk, decode, "uniform", batch.noise_chunk)
        one = ab.drive(side, f, run, run.chunk, states=False)
        stats = ab.row_stats(one.logits, rec.logits[i::n])
        assert stats.agree.all() and stats.kl.max() < 1e-6
        np.testing.assert_array_equal(one.tokens, rec.tokens[i::n])


def test_a_candidate_broken_only_in_the_batched_step_fails(tiny_batch: dict[str, Any],
                                                           tensors: dict[str, np.ndarray]) -> None:
    result = _test(tiny_batch, _on_row_logits(tiny_batch, "kern_test_swap_rows"), tensors)
    assert _verdict(result)[:2] == ("FAIL", 1) and result.verdict.reason.startswith("argmax flips")
    assert result.evidence.flips == result.batched_rows > 0


def test_one_batched_side_means_single_row_runs_only(tiny: dict[str, Any], tiny_batch: dict[str, Any],
                                                     tensors: dict[str, np.ndarray]) -> None:
    result = _test(tiny, tiny_batch, tensors)
    assert result.batches == () and result.batched_rows == 0
    assert result.stats.rows == sum(len(run.decode) + 1 for run in result.runs)
    lines = ab.report_of(result).text().splitlines()
    assert ("workload batched rows: not driven, A has no batched step with a [rows, vocab] logits buffer: "
            "single-row runs only") in lines


# --------------------------------------------------------------------------------------------
# The report and the stages around the ladder.


def test_the_report_ends_in_the_verdict_and_times_both_sides(tiny: dict[str, Any],
                                                              tensors: dict[str, np.ndarray]) -> None:
    options = ab.AbOptions(runs=2, decode_steps=2, capacity=CAPACITY, iters=2)
    result = _test(tiny, _on_logits(tiny, "kern_test_drift"), tensors, options)
    rep = ab.report_of(result)
    lines = rep.text().splitlines()
    assert lines[-1].startswith("PASS logit evidence")
    sections = {line.split()[0] for line in lines[:-1]}
    assert sections == {"workload", "pair", "noise", "logits", "state", "domain", "perf"}
    assert any(line.startswith("perf step graph TPOT") for line in lines)
    doc = json.loads(rep.json())
    assert doc["verdict"] == "PASS" and doc["exit"] == 0 and doc["facts"][0]["section"] == "workload"


def test_the_batched_step_is_timed_on_both_sides_where_both_have_it(tiny_batch: dict[str, Any],
                                                                   tensors: dict[str, np.ndarray]) -> None:
    options = ab.AbOptions(runs=1, decode_steps=2, capacity=600, iters=2, noise=False)
    result = _test(tiny_batch, tiny_batch, tensors, options)
    a, b = result.timing["A"], result.timing["B"]
    assert a.batched is not None and b.batched is not None
    assert a.batched[0] == b.batched[0] == 4  # 600 tokens hold 4 rows of 144 (context 128 + 1, in pages)
    lines = ab.report_of(result).text().splitlines()
    assert any(line.startswith("perf batched step of 4 rows at context 128: A ") for line in lines)
    assert _verdict(result)[0] == "PASS"


def test_no_noise_pass_means_no_noise_band(tiny: dict[str, Any], tensors: dict[str, np.ndarray]) -> None:
    a = _jittery(tiny)
    options = ab.AbOptions(runs=6, decode_steps=4, capacity=CAPACITY, perf=False, noise=False)
    result = _test(a, _on_logits(a, "kern_test_ulp"), tensors, options)
    assert result.noise is None and not result.evidence.within_noise
    assert result.verdict.reason.startswith("logit evidence")


def test_the_same_seed_gives_the_same_rows(tiny: dict[str, Any], tensors: dict[str, np.ndarray]) -> None:
    first = _test(tiny, _on_logits(tiny, "kern_test_drift"), tensors)
    again = _test(tiny, _on_logits(tiny, "kern_test_drift"), tensors)
    assert first.runs == again.runs
    np.testing.assert_array_equal(first.stats.kl, again.stats.kl)


# --------------------------------------------------------------------------------------------
# `kern test` end to end, the interpreter standing in for the GPU.


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tensors: dict[str, np.ndarray],
        tmp_path: Path) -> Callable[..., tuple[int, str]]:
    from kern_cli.main import main
    from kern_runtime import loading

    monkeypatch.setattr(loading, "probe_gpu", lambda gpu: None)
    monkeypatch.setattr(ab, "GpuLoader", lambda a, b, *rest, **kw: InterpLoader(a.manifest, b.manifest, tensors, a.capacity))
    ckpt, _ = random_checkpoint(QWEN3_TINY_CONFIG, seed=0, name="qwen3-tiny", root=tmp_path)

    def run(a: dict[str, Any], b: dict[str, Any], *flags: str) -> tuple[int, str]:
        paths = []
        for name, m in (("a.json", a), ("b.json", b)):
            (tmp_path / name).write_text(json.dumps(m))
            paths.append(str(tmp_path / name))
        rc = main(["test", *paths, "--weights", str(ckpt), "--kernels", str(ROOT / "kernels"), "--capacity",
                   str(CAPACITY), "--runs", "4", "--decode-steps", "3", "--no-perf", *flags])
        return rc, capsys.readouterr().out

    return run


def test_kern_test_exits_by_the_verdict(tiny: dict[str, Any], cli: Callable[..., tuple[int, str]]) -> None:
    rc, out = cli(tiny, tiny)
    assert rc == 0 and out.splitlines()[-1].startswith("PASS bit-identical")
    assert out.splitlines()[0].startswith("workload seed 0x5eed: 4 runs")
    rc, out = cli(tiny, _on_logits(tiny, "kern_test_nan"), "--seed", "3")
    assert rc == 1 and out.splitlines()[-1].startswith("FAIL non-finite logits")
    assert out.splitlines()[0].startswith("workload seed 0x3: 4 runs")
    rc, out = cli(tiny, _on_logits(tiny, "kern_test_temperature"), "--json")
    doc = json.loads(out)
    assert rc == 3 and (doc["verdict"], doc["exit"]) == ("INCONCLUSIVE", 3)
