"""Smoke run of a generated Qwen3 manifest on kern_runtime: load, random weights, chunked prefill,
then decode eagerly and through the CUDA graph; the two token streams must be identical.

Usage: python tools/gpu/smoke_qwen3.py OUT_DIR [--manifest examples/qwen3-tiny.json]
       [--kernels kernels] [--steps 32]   (writes OUT_DIR/smoke_qwen3.json)
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
    from kern_cli.kernels_cmd import build_kernels

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


def main(argv: list[str]) -> int:
    from kern_cli.checkpoint import QWEN3_TINY_CONFIG, random_checkpoint

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--manifest", type=Path, default=ROOT / "examples/qwen3-tiny.json")
    ap.add_argument("--kernels", type=Path, default=ROOT / "kernels")
    ap.add_argument("--steps", type=int, default=32)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"manifest": str(args.manifest)}
    with tempfile.TemporaryDirectory() as tmp:
        kdir = args.kernels if args.kernels.is_dir() else _kernels(Path(tmp) / "kernels")
        ckpt, _ = random_checkpoint(QWEN3_TINY_CONFIG, seed=0, name="tiny", root=Path(tmp))
        t0 = time.perf_counter()
        with kr.Runtime.load(args.manifest, kdir, capacity=kr.Capacity(tokens=4096)) as rt:
            rt.load_weights(kr.Safetensors.open(ckpt))
            result["load_s"] = round(time.perf_counter() - t0, 3)
            print(rt.summary())
            prompt = [(37 * i + 11) % 4000 + 1 for i in range(40)]
            _start(rt, prompt)
            eager, eager_ms = _decode(rt, args.steps, graph=False)
            _start(rt, prompt)
            graph, graph_ms = _decode(rt, args.steps, graph=True)
            _start(rt, prompt)
            again, _ = _decode(rt, args.steps, graph=True)
    result |= {"eager_tokens": eager, "graph_tokens": graph, "equal": eager == graph == again,
               "eager_ms_per_step": round(eager_ms, 3), "graph_ms_per_step": round(graph_ms, 3)}  # fmt: skip
    (args.out / "smoke_qwen3.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return 0 if result["equal"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
