"""GPU benchmark of the host tier, each comparison measured in the same run.

- park and wake of a ~6 GiB checkpoint (the Qwen3-4B KV shape: 147,456 bytes a token, 16-token
  pages) on the transfer stream, against one pinned cuMemcpy of the same bytes (targets >= 90% of
  it), and the host time to issue each (target <= 2 ms); the staged `wake_now` of the same copy
  (its 36 slices a page, one 2-D copy and one event per slice) against the same memcpy;
- decode-like work (a graph of bandwidth-bound kernels, ~1 ms a replay) while a 6 GiB park runs on
  the transfer stream, against the same replays idle (target <= 1.10x).

Usage: python3 tools/gpu/bench_tier.py OUT_DIR   (writes OUT_DIR/bench_tier.json and .txt)
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

import kern_pool
import kern_runtime as kr
from kern_runtime import _driver as drv
from kern_runtime.bench import table as _table

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[2]
KERNEL_SRC = ROOT / "packages/kern-runtime/tests/kernels/rt_test.cu"
TOKEN = 147_456
UNIT = 16
PAGES = 2731  # 43,696 tokens: 6.0 GiB
SLICES = 36  # Qwen3-4B's layers
SPIN_N = 1 << 24  # 64 MiB of f32 a side: one launch reads and writes 128 MiB
SPIN_CALLS = 24
STEPS = 40


def _manifest(sha: str) -> dict[str, Any]:
    there = {"op": "mix", "args": [{"buf": "x"}, {"buf": "y"}, {"f32": 0.5}, {"f32": 0.25}, {"i32": SPIN_N}]}
    back = {"op": "mix", "args": [{"buf": "y"}, {"buf": "x"}, {"f32": 0.5}, {"f32": 0.25}, {"i32": SPIN_N}]}
    # NOTE: `stamp` is never run; it references the KV state and its block table, as a manifest must.
    stamp = {"op": "stamp", "args": [{"state": "kv", "offset": 0}, {"buf": "bt"}, {"i64": 1}, {"u8": 1}, {"i32": 128}]}
    return {
        "schema_version": 5, "model": "bench-tier",
        "states": {"kv": {"bytes_per_token": TOKEN, "slices": SLICES}},
        "buffers": {
            "bt": {"dtype": "i32", "shape": [2 * PAGES + 64], "kind": "input", "domain": {"index_into": "kv", "stride": UNIT}},
            "x": {"dtype": "f32", "shape": [SPIN_N], "kind": "carry"},
            "y": {"dtype": "f32", "shape": [SPIN_N], "kind": "carry"},
        },
        "modules": {"t": {"source": "rt_test.cubin", "sha256": sha}},
        "ops": {"stamp": {"params": ["inout state", "in buffer<i32>", "i64", "u8", "i32"], "impl": {"launches": [
                    {"module": "t", "entry": "rt_fill_i64", "block": [128, 1, 1], "grid": [1, 1, 1],
                     "params": ["inout state", "i64", "u8", "i32"],
                     "args": [{"param": 0}, {"param": 2}, {"param": 3}, {"param": 4}]}]}},
                "mix": {"params": ["in buffer<f32>", "out buffer<f32>", "f32", "f32", "i32"], "impl": {"launches": [
            {"module": "t", "entry": "rt_mix", "block": [128, 1, 1], "grid": [SPIN_N // 128, 1, 1]}]}}},
        "programs": {"spin": {"graph": True, "calls": [there, back] * (SPIN_CALLS // 2)},
                     "stamp": {"calls": [stamp]}},
    }  # fmt: skip


def _build(work: Path) -> tuple[Path, str]:
    out = work / "kernels"
    out.mkdir(exist_ok=True)
    subprocess.run(["nvcc", "-cubin", "-arch=sm_90", "-o", str(out / "rt_test.cubin"), str(KERNEL_SRC)], check=True)
    return out, hashlib.sha256((out / "rt_test.cubin").read_bytes()).hexdigest()


def _stamp_ends(rt: kr.Runtime, lease: kern_pool.Lease) -> dict[int, np.ndarray]:
    page = UNIT * TOKEN
    marks: dict[int, np.ndarray] = {}
    for i in (0, len(lease.pages) // 2, len(lease.pages) - 1):
        marks[i] = np.random.default_rng(i).integers(0, 255, page, dtype=np.uint8)
        rt.write_state("kv", lease.pages[i] * page, marks[i])
    return marks


def _timed(rt: kr.Runtime, start: Callable[[], T]) -> tuple[T, float, float]:
    """(what `start` returned, host issue s, wall s until both streams drained), from idle."""
    rt.synchronize()
    t0 = time.perf_counter()
    got = start()
    t1 = time.perf_counter()
    rt.synchronize()
    return got, t1 - t0, time.perf_counter() - t0


def _park(rt: kr.Runtime, cp: kern_pool.Checkpoint) -> tuple[kern_pool.Parked, float, float]:
    """(parked, host issue s, wall s until landed) of a park on the transfer stream."""
    room = rt.room(cp.clone())
    assert isinstance(room, kern_pool.Room), "the host block holds the checkpoint"
    return _timed(rt, lambda: rt.park(room))


def _wake(rt: kr.Runtime, parked: kern_pool.Parked, length: int) -> tuple[kern_pool.Lease, float, float]:
    """(lease, host issue s, wall s until landed) of a wake on the transfer stream (a Waking)."""
    waking, issue, wall = _timed(rt, lambda: rt.wake(parked, length, length))
    got = rt.awake(waking)
    assert isinstance(got, kern_pool.Lease)
    return got, issue, wall


def _memcpy(dst: int, src: int, nbytes: int, to_host: bool, stream: Any) -> tuple[float, float]:
    """(wall s, host issue s) of one pinned async copy of `nbytes` on `stream`."""
    drv.stream_synchronize(stream)
    t0 = time.perf_counter()
    (drv.copy_dtoh_async if to_host else drv.copy_htod_async)(dst, src, nbytes, stream)
    t1 = time.perf_counter()
    drv.stream_synchronize(stream)
    return time.perf_counter() - t0, t1 - t0


def _steps_ms(rt: kr.Runtime, stream: Any) -> float:
    """GPU ms per replay of the spin graph over STEPS replays (compute-stream events)."""
    start, end = drv.event_create(), drv.event_create()
    drv.event_record(start, stream)
    for _ in range(STEPS):
        rt.issue("spin", {})
    drv.event_record(end, stream)
    drv.event_synchronize(end)
    ms = drv.event_elapsed_ms(start, end) / STEPS
    drv.event_destroy(start)
    drv.event_destroy(end)
    return ms


def bench(work: Path) -> list[dict[str, Any]]:
    kdir, sha = _build(work)
    manifest = work / "tier.json"
    manifest.write_text(json.dumps(_manifest(sha)))
    tokens = PAGES * UNIT
    with kr.Runtime.load(manifest, kdir, capacity=kr.Capacity(tokens=2 * tokens + 64 * UNIT, seqs=1)) as rt:
        rt.load_weights(kr.Safetensors.parse(struct.pack("<Q", 2) + b"{}"))
        t0 = time.perf_counter()
        host = rt.reserve_host(PAGES + 1, 0)
        reserve_s = time.perf_counter() - t0
        lease = rt.lease(tokens)
        marks = _stamp_ends(rt, lease)
        cp = rt.retire(lease, tokens)
        n_pages = len(cp.pages)
        nbytes = n_pages * UNIT * TOKEN
        seqs = rt._pool()  # pyright: ignore[reportPrivateUsage]
        stream = rt._stream  # pyright: ignore[reportPrivateUsage]
        kv = seqs.arenas["kv"]
        base = seqs._host_base  # pyright: ignore[reportPrivateUsage]
        first = kv.base + cp.pages[0] * UNIT * TOKEN
        runs = kern_pool.fold([(p, i) for i, p in enumerate(cp.pages)], 1, 1)
        nan = (float("nan"), float("nan"))
        peer_out, issue_out = min(_memcpy(base, first, nbytes, True, stream) for _ in range(3)) if len(runs) == 1 else nan
        peer_in, issue_in = min(_memcpy(first, base, nbytes, False, stream) for _ in range(3)) if len(runs) == 1 else nan
        parks, wakes, staged = [], [], []
        for _ in range(3):
            parked, issue, wall = _park(rt, cp)
            parks.append((issue, wall))
            woken, wissue, wwall = _wake(rt, parked, tokens)
            wakes.append((wissue, wwall))
            ok = all(np.array_equal(rt.read_state("kv", woken.pages[i] * UNIT * TOKEN, UNIT * TOKEN), m) for i, m in marks.items())
            assert ok, "a woken page differs from the parked one"
            woken.release()
            now, sissue, swall = _timed(rt, functools.partial(rt.wake_now, parked, tokens, tokens))
            staged.append((sissue, swall))
            ok = all(np.array_equal(rt.read_state("kv", now.pages[i] * UNIT * TOKEN, UNIT * TOKEN), m) for i, m in marks.items())
            assert ok, "a page woken by wake_now differs from the parked one"
            now.release()
            parked.release()  # NOTE: so the next park copies every page again
        idle = min(_steps_ms(rt, stream) for _ in range(3))
        busy: list[float] = []
        for _ in range(3):
            rt.synchronize()
            room = rt.room(cp.clone())
            assert isinstance(room, kern_pool.Room)
            parked = rt.park(room)
            busy.append(_steps_ms(rt, stream))
            still = not drv.event_query(seqs._flying[-1].event) if seqs._flying else False  # pyright: ignore[reportPrivateUsage]
            rt.synchronize()
            parked.release()
            if not still:
                busy[-1] = float("nan")  # the park ended before the replays did: not a measurement
        cp.release()
        units = host.units
    p_issue, p_wall = min(parks, key=lambda r: r[1])
    w_issue, w_wall = min(wakes, key=lambda r: r[1])
    s_issue, s_wall = min(staged, key=lambda r: r[1])
    gib = nbytes / (1 << 30)
    during = min((b for b in busy if b == b), default=float("nan"))
    return [
        {"name": f"reserve_host {units} units ({gib:.2f} GiB pinned)", "value": round(reserve_s * 1e3, 1), "unit": "ms", "target": "", "peer": ""},
        {"name": f"checkpoint of {n_pages} pages ({gib:.2f} GiB) in runs", "value": len(runs), "unit": "runs", "target": "", "peer": ""},
        {"name": "park (transfer stream), GB/s", "value": round(nbytes / p_wall / 1e9, 2), "unit": "GB/s", "target": ">= 0.9x peer", "peer": f"pinned cuMemcpyDtoH {nbytes / peer_out / 1e9:.2f} GB/s"},
        {"name": "  park vs memcpy", "value": round(peer_out / p_wall * 100, 1), "unit": "%", "target": ">= 90", "peer": "100"},
        {"name": "  park host issue time", "value": round(p_issue * 1e3, 3), "unit": "ms", "target": "<= 2", "peer": f"that cuMemcpyDtoHAsync call alone {issue_out * 1e3:.3f} ms"},
        {"name": "wake (transfer stream), GB/s", "value": round(nbytes / w_wall / 1e9, 2), "unit": "GB/s", "target": ">= 0.9x peer", "peer": f"pinned cuMemcpyHtoD {nbytes / peer_in / 1e9:.2f} GB/s"},
        {"name": "  wake vs memcpy", "value": round(peer_in / w_wall * 100, 1), "unit": "%", "target": ">= 90", "peer": "100"},
        {"name": "  wake host issue time", "value": round(w_issue * 1e3, 3), "unit": "ms", "target": "<= 2", "peer": f"that cuMemcpyHtoDAsync call alone {issue_in * 1e3:.3f} ms"},
        {"name": f"staged wake_now ({SLICES} slices a page), GB/s", "value": round(nbytes / s_wall / 1e9, 2), "unit": "GB/s", "target": ">= 0.9x peer", "peer": f"pinned cuMemcpyHtoD {nbytes / peer_in / 1e9:.2f} GB/s"},
        {"name": "  staged wake_now vs memcpy", "value": round(peer_in / s_wall * 100, 1), "unit": "%", "target": ">= 90", "peer": "100"},
        {"name": "  staged wake_now host issue time", "value": round(s_issue * 1e3, 3), "unit": "ms", "target": "", "peer": f"the wake above {w_issue * 1e3:.3f} ms"},
        {"name": f"decode-like replay ({SPIN_CALLS} launches) while a {gib:.1f} GiB park runs", "value": round(during, 4), "unit": "ms", "target": "<= 1.10x idle", "peer": f"idle {idle:.4f} ms"},
        {"name": "  ratio to idle", "value": round(during / idle, 3), "unit": "x", "target": "<= 1.10", "peer": "1.0"},
    ]  # fmt: skip


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("out", type=Path)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=os.environ.get("KERN_BENCH_TMP")) as tmp:
        rows = bench(Path(tmp))
    (args.out / "bench_tier.json").write_text(json.dumps(rows, indent=2) + "\n")
    table = _table(rows)
    (args.out / "bench_tier.txt").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
