"""Smoke run of the generated Qwen3 manifests on kern_runtime: load, seeded random weights,
prefill, then decode eagerly and through the CUDA graph; the token streams must be identical.
Reports load time and decode ms/step (one graph replay plus the 8-byte token read-back).

Usage: python tools/gpu/smoke_qwen3.py OUT_DIR [--models tiny,4b] [--kernels kernels] [--steps 64]
       (writes OUT_DIR/smoke_qwen3.json)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import kern_runtime as kr

ROOT = Path(__file__).resolve().parents[2]


def _kernels(path: Path) -> Path:
    from kern_mining.build import build_kernels

    build_kernels(ROOT / "tools/kernels-src", path)
    return path


def _start(rt: kr.Runtime, prompt: list[int]) -> None:
    """Prefill all but the last prompt token, then stage the last one for the first decode step."""
    n = len(prompt)
    rt.write_input("block_table", np.arange(256, dtype=np.int32))
    pos = np.arange(n - 1, dtype=np.int64)
    rt.write_input("ids", np.asarray(prompt[:-1], np.int64))
    rt.write_input("positions", pos)
    rt.write_input("slots", pos)
    rt.write_input("seq_len", np.array([n - 1], np.int32))
    rt.run("prefill", {"tokens": n - 1})
    rt.write_input("ids", np.array([prompt[-1]], np.int64))
    rt.write_input("positions", np.array([n - 1], np.int64))
    rt.write_input("slots", np.array([n - 1], np.int64))
    rt.write_input("seq_len", np.array([n], np.int32))
    if "start" in rt.manifest.programs:  # device-fed decode: seed the step carries from the inputs
        rt.run("start", {})


def _decode(rt: kr.Runtime, steps: int, graph: bool) -> tuple[list[int], float]:
    out: list[int] = []
    t0 = time.perf_counter()
    for _ in range(steps):
        if graph:
            rt.issue("decode", {"tokens": 1})
        else:
            rt.run("decode", {"tokens": 1})
        out.append(int(rt.read_output("next_token", 1)[0]))
    return out, (time.perf_counter() - t0) / steps * 1e3


def _smoke(model: str, kdir: Path, root: Path, steps: int) -> dict[str, Any]:
    from kern_qwen3 import QWEN3_4B_CONFIG, QWEN3_TINY_CONFIG, random_checkpoint

    config = {"tiny": QWEN3_TINY_CONFIG, "4b": QWEN3_4B_CONFIG}[model]
    manifest = ROOT / f"examples/qwen3-{model}.json"
    ckpt, _ = random_checkpoint(config, seed=0, name=model, root=root)
    result: dict[str, Any] = {"manifest": str(manifest.relative_to(ROOT))}
    t0 = time.perf_counter()
    with kr.Runtime.load(manifest, kdir, capacity=kr.Capacity(tokens=4096, seqs=1)) as rt:
        t1 = time.perf_counter()
        moved = rt.load_weights(kr.Safetensors.open(ckpt))
        t2 = time.perf_counter()
        print(rt.summary())
        prompt = [(37 * i + 11) % 4000 + 1 for i in range(40)]
        _start(rt, prompt)
        eager, eager_ms = _decode(rt, steps, graph=False)
        _start(rt, prompt)
        graph, graph_ms = _decode(rt, steps, graph=True)
        _start(rt, prompt)
        again, _ = _decode(rt, steps, graph=True)
    result |= {"load_s": round(t1 - t0, 3), "load_weights_s": round(t2 - t1, 3), "weight_bytes": moved,
               "eager_tokens": eager, "graph_tokens": graph, "equal": eager == graph == again,
               "eager_ms_per_step": round(eager_ms, 3), "graph_ms_per_step": round(graph_ms, 3)}  # fmt: skip
    return result


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--models", default="tiny,4b")
    ap.add_argument("--kernels", type=Path, default=ROOT / "kernels")
    ap.add_argument("--steps", type=int, default=64)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        kdir = _kernels(args.kernels if args.kernels.is_dir() else Path(tmp) / "kernels")
        for model in args.models.split(","):
            results[model] = _smoke(model, kdir, Path(tmp), args.steps)
            print(json.dumps({model: results[model]}))
    (args.out / "smoke_qwen3.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0 if all(r["equal"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
