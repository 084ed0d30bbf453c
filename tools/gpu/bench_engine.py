"""The engine's time to first token on a long conversation, three ways in one run:

    python3 tools/gpu/bench_engine.py OUTDIR [--manifest examples/qwen3-4b-fast.json] [--gpu 0]
        [--context 14000] [--turn 200] [--reps 5] [--chunk 2048]

A `--context`-token conversation (random ids) is prefilled once; then each repetition times one
new user turn of `--turn` tokens (prefill plus the first decode step, up to the first token read
back, on an idle stream):

- cold: the whole conversation plus the turn prefilled from nothing (a fresh conversation);
- warm: the conversation's prefix resident in the index, only the turn prefilled (target <= 3%
  of cold); once more at a turn length not run before, so the row also pays compiling the chunk
  program at that length (launch records, cuBLASLt plans);
- woken: the conversation's prefix parked in the host tier, woken, then the turn prefilled
  (target <= 15% of cold).

The seeded random Qwen3-4B checkpoint (kern_qwen3.checkpoint) is written once to the cache;
missing cubins are built from tools/kernels-src. Timed turns are released after their first token, so only the conversation stays in the index.
Writes OUTDIR/bench_engine.json (rows: name,
value, unit, target, peer) and prints the table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from engine_inputs import add_engine_args, load_inputs


def _row(name: str, value: float, unit: str, target: float | None = None, peer: str = "") -> dict[str, Any]:
    return {"name": name, "value": round(value, 4), "unit": unit, "target": target, "peer": peer}


def _ids(rng: np.random.Generator, n: int) -> list[int]:
    return [int(x) for x in rng.integers(0, 150000, size=n)]


def _ttft(eng: Any, prompt: list[int]) -> tuple[float, Any]:
    """prefill + the first step on an idle stream, up to the token read back; the sequence is
    released after it (nothing new enters the index, so no timed turn evicts)."""
    seq = eng.sequence()
    eng.backend.synchronize()
    t0 = time.perf_counter()
    pre = eng.prefill(seq, prompt, 1)
    eng.step(seq)
    ms = (time.perf_counter() - t0) * 1e3
    eng.release(seq)
    return ms, pre


def _park_all(eng: Any) -> None:
    while eng.evict():
        pass
    eng.backend.synchronize()


def measure(eng: Any, context: int, turn: int, reps: int, log: Callable[[str], None]) -> list[dict[str, Any]]:
    """The cold, warm and woken TTFT rows of one engine (a host tier is needed for woken)."""
    rng = np.random.default_rng(0)
    base = eng.sequence()
    eng.turn(base, _ids(rng, context), 1)  # the conversation, kept in the index
    conv = list(base.tokens)
    cold, warm, fresh, woken = [], [], [], []
    for i in range(reps):
        ms, pre = _ttft(eng, [*_ids(rng, context), *_ids(rng, turn)])
        assert pre.reused == 0, pre
        cold.append(ms)
        ms, pre = _ttft(eng, [*conv, *_ids(rng, turn)])
        assert pre.source.value == "resident" and pre.reused >= context - 16, pre
        warm.append(ms)
        ms, pre = _ttft(eng, [*conv, *_ids(rng, turn + 1 + i)])  # a turn length not run before
        assert pre.source.value == "resident", pre
        fresh.append(ms)
        _park_all(eng)
        ms, pre = _ttft(eng, [*conv, *_ids(rng, turn)])
        assert pre.source.value == "parked" and pre.reused >= context - 16, pre
        woken.append(ms)
        log(f"rep {i}: cold {cold[-1]:.1f} ms, warm {warm[-1]:.2f} ms (new length {fresh[-1]:.2f}), "
            f"woken {woken[-1]:.2f} ms")
    c, w, k = statistics.median(cold), statistics.median(warm), statistics.median(woken)
    peer = f"cold TTFT {c:.1f} ms (same run)"
    return [
        _row(f"ttft_cold_ms@{context}+{turn}", c, "ms"),
        _row(f"ttft_warm_ms@{context}+{turn}", w, "ms", peer=peer),
        _row(f"ttft_warm_new_length_ms@{context}+{turn}+", statistics.median(fresh), "ms", peer=peer),
        _row(f"ttft_woken_ms@{context}+{turn}", k, "ms", peer=peer),
        _row("ttft_warm_vs_cold", w / c, "ratio", target=0.03, peer=peer),
        _row("ttft_woken_vs_cold", k / c, "ratio", target=0.15, peer=peer),
    ]


def table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'row':<34} {'value':>12} {'unit':<6} {'target':>8}  peer"]
    for r in rows:
        target = "" if r["target"] is None else f"<= {r['target']}"
        lines.append(f"{r['name']:<34} {r['value']:>12.4f} {r['unit']:<6} {target:>8}  {r['peer']}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    add_engine_args(ap, "qwen3-4b-fast")
    ap.add_argument("--context", type=int, default=14000)
    ap.add_argument("--turn", type=int, default=200)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--chunk", type=int, default=2048)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    import kern_runtime as kr

    def log(msg: str) -> None:
        print(f"bench_engine: {msg}", file=sys.stderr, flush=True)

    manifest, files = load_inputs(args, log)
    roles = kr.serving_roles(manifest)
    tokens = 2 * (args.context + args.turn) + 1024  # the kept conversation and one timed turn
    page = manifest["states"]["kv"]["bytes_per_token"] * roles.page_tokens
    host = 2 * (args.context // roles.page_tokens + 2) * page
    with kr.Engine.open(args.manifest, args.kernels, files, gpu=args.gpu, tokens=tokens,
                        host_bytes=host, config=kr.EngineConfig(chunk=args.chunk), log=log, roles=roles) as eng:
        rows = measure(eng, args.context, args.turn, args.reps, log)
    (args.out / "bench_engine.json").write_text(json.dumps(rows, indent=1) + "\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
