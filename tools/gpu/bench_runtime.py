"""GPU benchmarks of kern_runtime, each comparison measured in the same run.

- weight loading: an 8 GiB safetensors checkpoint from warm page cache, kern's pread + pinned
  double-buffer loader vs safetensors' own `load_file(device="cuda")` (targets >= 20 GB/s, >= 3x);
- issue(): host time per graph replay, excluding GPU time (target < 30 us), beside a bare
  cuGraphLaunch of the same graph and eager run() of the same one-launch program.

Usage: python tools/gpu/bench_runtime.py OUT_DIR [--gib 8]  (writes OUT_DIR/bench_runtime.json)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import kern_runtime as kr
from kern_runtime import _driver as drv
from kern_runtime.bench import table as _table

ROOT = Path(__file__).resolve().parents[2]
KERNEL_SRC = ROOT / "packages/kern-runtime/tests/kernels/rt_test.cu"
TENSOR_SHAPE = (8192, 16384)  # bf16: 256 MiB a tensor


def _write_checkpoint(path: Path, count: int) -> int:
    nbytes = TENSOR_SHAPE[0] * TENSOR_SHAPE[1] * 2
    header: dict[str, Any] = {}
    for i in range(count):
        header[f"layer.{i}.weight"] = {"dtype": "BF16", "shape": list(TENSOR_SHAPE), "data_offsets": [i * nbytes, (i + 1) * nbytes]}
    text = json.dumps(header).encode()
    text += b" " * ((-len(text)) % 8)
    chunk = np.random.default_rng(0).integers(0, 1 << 16, nbytes // 2, dtype=np.uint16).tobytes()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for _ in range(count):
            f.write(chunk)
    return count * nbytes


def _warm(path: Path) -> None:
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass


def _gemm_manifest(count: int) -> dict[str, Any]:
    n, k = TENSOR_SHAPE
    buffers: dict[str, Any] = {
        "a": {"dtype": "bf16", "shape": [1, k], "kind": "input"},
        "c": {"dtype": "bf16", "shape": [1, n], "kind": "output"},
    }
    calls = []
    for i in range(count):
        buffers[f"w{i}"] = {"dtype": "bf16", "shape": [n, k], "kind": "weight", "bind": [{"tensor": f"layer.{i}.weight"}]}
        calls.append({"op": "gemm", "args": [{"buf": "a"}, {"buf": f"w{i}"}, {"buf": "c"}, {"i32": 1}, {"i32": n}, {"i32": k}]})
    return {
        "schema_version": 5, "model": "bench-load", "buffers": buffers, "modules": {},
        "ops": {"gemm": {"params": ["in buffer<bf16>", "in buffer<bf16>", "out buffer<bf16>", "i32", "i32", "i32"],
                         "impl": {"launches": [{"entry": "extern:cublaslt_bf16_tn"}]}}},
        "programs": {"step": {"calls": calls}},
    }  # fmt: skip


def _pread_ceiling(path: Path, threads: int, chunk: int) -> float:
    """GB/s of pread alone from warm cache into pinned buffers (no DMA): the loader's ceiling."""
    import threading

    size = path.stat().st_size
    bufs = [drv.host_alloc(chunk) for _ in range(threads)]
    views = [drv.host_view(b, chunk) for b in bufs]
    fd = os.open(path, os.O_RDONLY)
    counter = iter(range(0, size, chunk))
    lock = threading.Lock()

    def work(view: memoryview) -> None:
        while True:
            with lock:
                off = next(counter, None)
            if off is None:
                return
            os.preadv(fd, [view[: min(chunk, size - off)]], off)

    pool = [threading.Thread(target=work, args=(v,)) for v in views]
    t0 = time.perf_counter()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    dt = time.perf_counter() - t0
    os.close(fd)
    for b in bufs:
        drv.host_free(b)
    return size / dt / 1e9


def _safetensors_gbs(ckpt: Path, total: int) -> float:
    import torch
    from safetensors.torch import load_file

    best = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        tensors = load_file(str(ckpt), device="cuda")
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
        del tensors
        torch.cuda.empty_cache()
    return total / best / 1e9


def _kern_load(manifest: Path, empty: Path, ckpt: Path, threads: int, chunk: int) -> tuple[float, float]:
    """(seconds for Runtime.load + load_weights, seconds for load_weights alone), best of two."""
    best_total = best_weights = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        with kr.Runtime.load(manifest, empty) as rt:
            t1 = time.perf_counter()
            rt.load_weights(kr.Safetensors.open(ckpt), threads=threads, chunk_bytes=chunk)
            t2 = time.perf_counter()
        best_total = min(best_total, t2 - t0)
        best_weights = min(best_weights, t2 - t1)
    return best_total, best_weights


def bench_loading(work: Path, gib: int) -> list[dict[str, Any]]:
    count = gib * 4
    ckpt = work / "ckpt.safetensors"
    total = _write_checkpoint(ckpt, count)
    _warm(ckpt)
    manifest = work / "load.json"
    manifest.write_text(json.dumps(_gemm_manifest(count)))
    empty = work / "no-kernels"
    empty.mkdir(exist_ok=True)
    peer = _safetensors_gbs(ckpt, total)
    rows: list[dict[str, Any]] = []
    for threads in (8, 16):
        ceiling = _pread_ceiling(ckpt, threads, 4 << 20)
        rows.append({"name": f"pread alone into pinned, {threads} threads (ceiling)", "value": round(ceiling, 2),
                     "unit": "GB/s", "target": "", "peer": ""})
    t0 = time.perf_counter()
    drv.host_free(drv.host_alloc(256 << 20))
    rows.append({"name": "cuMemHostAlloc + free of 256 MiB", "value": round((time.perf_counter() - t0) * 1e3, 1),
                 "unit": "ms", "target": "", "peer": ""})
    for threads, chunk in ((8, 4 << 20), (16, 4 << 20), (16, 16 << 20)):
        whole, weights = _kern_load(manifest, empty, ckpt, threads, chunk)
        tag = f"{threads} threads, {chunk >> 20} MiB chunks"
        gbs = total / whole / 1e9
        rows.append({"name": f"Runtime.load + load_weights {gib} GiB warm cache, {tag}", "value": round(gbs, 2),
                     "unit": "GB/s", "target": ">= 20", "peer": f"safetensors load_file(cuda) {peer:.2f} GB/s"})
        rows.append({"name": f"  speedup vs safetensors, {tag}", "value": round(gbs / peer, 2), "unit": "x",
                     "target": ">= 3", "peer": "1.0"})
        rows.append({"name": f"  load_weights alone, {tag}", "value": round(total / weights / 1e9, 2), "unit": "GB/s",
                     "target": "", "peer": ""})
    ckpt.unlink()
    return rows


def _build_kernels(work: Path) -> Path:
    out = work / "kernels"
    out.mkdir(exist_ok=True)
    subprocess.run(["nvcc", "-cubin", "-arch=sm_90", "-o", str(out / "rt_test.cubin"), str(KERNEL_SRC)], check=True)
    return out


def _tiny_manifest(sha: str) -> dict[str, Any]:
    return {
        "schema_version": 5, "model": "bench-issue",
        "buffers": {"x": {"dtype": "f32", "shape": [128], "kind": "input"},
                    "y": {"dtype": "f32", "shape": [128], "kind": "output"}},
        "modules": {"t": {"source": "rt_test.cubin", "sha256": sha}},
        "ops": {"axpb": {"params": ["in buffer<f32>", "out buffer<f32>", "f32", "f32", "i32"],
                         "impl": {"launches": [{"module": "t", "entry": "rt_axpb", "block": [128, 1, 1], "grid": [1, 1, 1]}]}}},
        "programs": {"step": {"graph": True, "calls": [
            {"op": "axpb", "args": [{"buf": "x"}, {"buf": "y"}, {"f32": 1.0}, {"f32": 1.0}, {"i32": 128}]}]}},
    }  # fmt: skip


def _per_call_us(fn: Any, n: int) -> float:
    fn()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e6


def bench_issue(work: Path) -> list[dict[str, Any]]:
    kdir = _build_kernels(work)
    sha = hashlib.sha256((kdir / "rt_test.cubin").read_bytes()).hexdigest()
    manifest = work / "issue.json"
    manifest.write_text(json.dumps(_tiny_manifest(sha)))
    with kr.Runtime.load(manifest, kdir) as rt:
        rt.load_weights(kr.Safetensors.parse(struct.pack("<Q", 2) + b"{}"))
        rt.write_input("x", np.ones(128, np.float32))
        graph = rt.capture_graph("step", {})
        stream = rt._stream  # pyright: ignore[reportPrivateUsage]
        n = 2000
        issue = _per_call_us(lambda: rt.issue("step", {}), n)
        rt.synchronize()
        bare = _per_call_us(lambda: drv.graph_launch(graph.exec_, stream), n)
        rt.synchronize()
        eager = _per_call_us(lambda: rt.run("step", {}), n)
        rt.synchronize()
        small = _per_call_us(lambda: rt.read_output("y", 2), 500)
    return [
        {"name": "issue() host time per replay (1-launch graph)", "value": round(issue, 2), "unit": "us",
         "target": "< 30", "peer": f"bare cuGraphLaunch {bare:.2f} us"},
        {"name": "run() host time, 1 eager launch", "value": round(eager, 2), "unit": "us", "target": "", "peer": ""},
        {"name": "read_output 8 bytes (sync + D2H)", "value": round(small, 2), "unit": "us", "target": "", "peer": ""},
    ]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--gib", type=int, default=8)
    ap.add_argument("--only", choices=["load", "issue"], default=None)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("KERN_BENCH_TMP")) as tmp:
        if args.only in (None, "issue"):
            rows += bench_issue(Path(tmp))
        if args.only in (None, "load"):
            rows += bench_loading(Path(tmp), args.gib)
    (args.out / "bench_runtime.json").write_text(json.dumps(rows, indent=2) + "\n")
    table = _table(rows)
    (args.out / "bench_runtime.txt").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
