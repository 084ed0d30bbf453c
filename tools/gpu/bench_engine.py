"""The engine's time to first token on a long conversation, three ways and two paths in one run:

    python3 tools/gpu/bench_engine.py OUTDIR [--manifest examples/qwen3-4b-fast.json] [--gpu 0]
        [--context 14000] [--turn 200] [--reps 5] [--chunk 2048]

A `--context`-token conversation (random ids) is prefilled once; then each repetition times one
new user turn of `--turn` tokens, up to the first token read back, on an idle stream:

- cold: the whole conversation plus the turn prefilled from nothing (a fresh conversation);
- warm: the conversation's prefix resident in the index, only the turn prefilled (target <= 3%
  of cold); once more at a turn length not run before, so the row also pays compiling the chunk
  program at that length (launch records, cuBLASLt plans);
- woken: the conversation's prefix parked in the host tier, woken, then the turn prefilled
  (target <= 15% of cold).

Each is timed on two paths: `step` (the chunks take the prompt but its last token, the first decode
step computes it and the first token: `Engine.prefill`, then `Engine.step`) and `head` (the chunks
take the whole prompt, the manifest's head program computes the first token from the last chunk's
row: `Engine.prefill(first=True)`, as `Engine.turn` runs it); the head rows are left out when the
manifest has no head program. The seeded random Qwen3-4B checkpoint (kern_qwen3.checkpoint) is
written once to the cache; missing cubins are built from tools/kernels-src. Timed turns are
released after their first token, so only the conversation stays in the index. Writes
OUTDIR/bench_engine.json (rows: name, value, unit, target, peer), OUTDIR/bench_engine.log (the
progress lines and the table) and prints the table.
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


def _ttft(eng: Any, prompt: list[int], head: bool) -> tuple[float, Any]:
    """The time to the first token read back on an idle stream (`head`: the head program's, else
    the first step's); the sequence is released after it (nothing new enters the index, so no
    timed turn evicts)."""
    seq = eng.sequence()
    eng.backend.synchronize()
    t0 = time.perf_counter()
    pre = eng.prefill(seq, prompt, 1, first=head)
    if pre.first is None:
        eng.step(seq)
    ms = (time.perf_counter() - t0) * 1e3
    assert (pre.first is not None) == head, pre
    eng.release(seq)
    return ms, pre


def _park_all(eng: Any) -> None:
    while eng.evict():
        pass
    eng.backend.synchronize()


def _one_rep(eng: Any, rng: np.random.Generator, conv: list[int], context: int, turn: int, new: int,
             head: bool) -> list[float]:
    """cold, warm, warm at a new length (`new` tokens), woken: one repetition on one path."""
    out = []
    ms, pre = _ttft(eng, [*_ids(rng, context), *_ids(rng, turn)], head)
    assert pre.reused == 0, pre
    out.append(ms)
    ms, pre = _ttft(eng, [*conv, *_ids(rng, turn)], head)
    assert pre.source.value == "resident" and pre.reused >= context - 16, pre
    out.append(ms)
    ms, pre = _ttft(eng, [*conv, *_ids(rng, new)], head)
    assert pre.source.value == "resident", pre
    out.append(ms)
    _park_all(eng)
    ms, pre = _ttft(eng, [*conv, *_ids(rng, turn)], head)
    assert pre.source.value == "parked" and pre.reused >= context - 16, pre
    out.append(ms)
    return out


def _rows(path: str, times: list[list[float]], context: int, turn: int, peer: str) -> list[dict[str, Any]]:
    """The rows of one path: medians of cold, warm, warm at a new length, woken, and the ratios."""
    c, w, f, k = (statistics.median(x[j] for x in times) for j in range(4))
    tag = "" if path == "step" else "head_"
    return [
        _row(f"ttft_{tag}cold_ms@{context}+{turn}", c, "ms", peer=peer),
        _row(f"ttft_{tag}warm_ms@{context}+{turn}", w, "ms", peer=peer),
        _row(f"ttft_{tag}warm_new_length_ms@{context}+{turn}+", f, "ms", peer=peer),
        _row(f"ttft_{tag}woken_ms@{context}+{turn}", k, "ms", peer=peer),
        _row(f"ttft_{tag}warm_vs_cold", w / c, "ratio", target=0.03, peer=peer),
        _row(f"ttft_{tag}woken_vs_cold", k / c, "ratio", target=0.15, peer=peer),
    ]


def measure(eng: Any, context: int, turn: int, reps: int, log: Callable[[str], None]) -> list[dict[str, Any]]:
    """The cold, warm and woken TTFT rows of one engine on the step path and, when the manifest has
    a head program, the head path (a host tier is needed for woken)."""
    rng = np.random.default_rng(0)
    base = eng.sequence()
    eng.turn(base, _ids(rng, context), 1)  # the conversation, kept in the index
    conv = list(base.tokens)
    paths = ["step", "head"] if eng.roles.head_program is not None else ["step"]
    times: dict[str, list[list[float]]] = {p: [] for p in paths}
    for i in range(reps):
        for p in paths:
            # NOTE: new lengths the other path and the other repetitions never ran (chunks of
            # turn + i rows on the step path, turn + 1 + reps + i on the head path)
            new = turn + 1 + i if p == "step" else turn + 1 + reps + i
            times[p].append(_one_rep(eng, rng, conv, context, turn, new, p == "head"))
            cold, warm, fresh, woken = times[p][-1]
            log(f"rep {i} {p}: cold {cold:.1f} ms, warm {warm:.2f} ms (new length {fresh:.2f}), woken {woken:.2f} ms")
    step_cold = statistics.median(x[0] for x in times["step"])
    rows = _rows("step", times["step"], context, turn, f"cold TTFT {step_cold:.1f} ms (same run)")
    if "head" in times:
        warm = {p: statistics.median(x[1] for x in times[p]) for p in paths}
        peer = f"step path: cold {step_cold:.1f} ms, warm {warm['step']:.2f} ms (same run)"
        rows += _rows("head", times["head"], context, turn, peer)
        rows.append(_row("ttft_head_vs_step_warm", warm["head"] / warm["step"], "ratio", peer=peer))
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'row':<42} {'value':>12} {'unit':<6} {'target':>8}  peer"]
    for r in rows:
        target = "" if r["target"] is None else f"<= {r['target']}"
        lines.append(f"{r['name']:<42} {r['value']:>12.4f} {r['unit']:<6} {target:>8}  {r['peer']}")
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

    lines: list[str] = []

    def log(msg: str) -> None:
        lines.append(msg)
        print(f"bench_engine: {msg}", file=sys.stderr, flush=True)

    manifest, files = load_inputs(args, log)
    roles = kr.serving_roles(manifest)
    tokens = 2 * (args.context + args.turn) + 1024  # the kept conversation and one timed turn
    page = (manifest.states["kv"].bytes_per_token or 0) * roles.page_tokens
    host = 2 * (args.context // roles.page_tokens + 2) * page
    with kr.Engine.open(manifest, args.kernels, files, gpu=args.gpu, tokens=tokens,
                        host_bytes=host, config=kr.EngineConfig(chunk=args.chunk), log=log, roles=roles) as eng:
        rows = measure(eng, args.context, args.turn, args.reps, log)
    (args.out / "bench_engine.json").write_text(json.dumps(rows, indent=1) + "\n")
    (args.out / "bench_engine.log").write_text("\n".join([*lines, table(rows)]) + "\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
