"""The batched decode step beside the one-row step, in one run:

    python3 tools/gpu/bench_batch.py OUTDIR [--manifest examples/qwen3-4b-batch.json] [--gpu 0]
        [--rows 1,8,32,64] [--contexts 128,2048] [--steps 64]

For each context, 64 sequences of that many random tokens are prefilled; then, for each row count
R, R of them decode `--steps` greedy steps through the batched step (`Engine.decode` with logprobs
0, so one row runs the batched program too):

- `pipelined`: `Engine.decode_steps` (step k + 1 issued before step k is read back): ms per step
  and output tokens/s;
- `in_turn`: one `Engine.decode` per step (each step's tokens read before the next is issued).

Beside them the one-row step (the manifest's `decode` program: greedy, no logprobs) at the same
context, pipelined and in turn. Targets: a 64-row step <= 2x the one-row step; 32 rows >= 20x the
one-row tokens/s. The seeded random Qwen3-4B checkpoint (kern_qwen3.checkpoint) is written once to
the cache; missing cubins are built from tools/kernels-src. Writes OUTDIR/bench_batch.json (rows:
name, value, unit, target, peer) and OUTDIR/bench_batch.log, and prints the table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from engine_inputs import add_engine_args, load_inputs

from kern_runtime.bench import row as _row

WARM = 4


def _time(run: Callable[[], object], steps: int) -> float:
    """ms per step of `run` (which runs `steps` steps and reads every token back)."""
    t0 = time.perf_counter()
    run()
    return (time.perf_counter() - t0) * 1e3 / steps


def _pair(eng: Any, seqs: list[Any], ask: list[Any], steps: int) -> tuple[float, float]:
    """(pipelined, in turn) ms per step of `seqs`, after a warm-up that captures the graph."""
    for _ in eng.decode_steps(seqs, ask, WARM):
        pass
    piped = _time(lambda: list(eng.decode_steps(seqs, ask, steps)), steps)
    in_turn = _time(lambda: [eng.decode(seqs, ask) for _ in range(steps)], steps)
    return piped, in_turn


def room(rows: list[int], steps: int) -> int:
    """The decode steps the first sequence takes: the one-row pair and each row count's pair."""
    return (len(rows) + 1) * (WARM + 2 * steps)


def measure(eng: Any, context: int, rows: list[int], steps: int, log: Callable[[str], None],
            vocab: int = 150000) -> list[dict[str, Any]]:
    """The one-row and batched rows of one context (`vocab`: the prompts' ids are below it)."""
    import kern_runtime as kr

    rng = np.random.default_rng(context)
    seqs = [eng.sequence() for _ in range(max(rows))]
    for seq in seqs:
        eng.prefill(seq, [int(x) for x in rng.integers(0, vocab, size=context)], room(rows, steps))
    one_piped, one_turn = _pair(eng, seqs[:1], [kr.Sampling()], steps)
    log(f"ctx {context}: one-row step {one_piped:.3f} ms pipelined, {one_turn:.3f} ms in turn")
    out = [_row(f"one_row_ms@{context}", one_piped, "ms"), _row(f"one_row_in_turn_ms@{context}", one_turn, "ms"),
           _row(f"one_row_tok_s@{context}", 1e3 / one_piped, "tok/s")]
    peer = f"one-row step {one_piped:.3f} ms (same run)"
    for n in rows:
        piped, in_turn = _pair(eng, seqs[:n], [kr.Sampling(logprobs=0)] * n, steps)
        log(f"ctx {context}: {n} rows {piped:.3f} ms/step pipelined ({n * 1e3 / piped:.0f} tok/s), "
            f"{in_turn:.3f} in turn")
        out += [
            _row(f"rows{n}_ms@{context}", piped, "ms", target=2.0 * one_piped if n == 64 else None, peer=peer),
            _row(f"rows{n}_in_turn_ms@{context}", in_turn, "ms", peer=peer),
            _row(f"rows{n}_tok_s@{context}", n * 1e3 / piped, "tok/s", peer=peer),
            _row(f"rows{n}_vs_one_row_tok_s@{context}", n * one_piped / piped, "ratio",
                 target=20.0 if n == 32 else None, peer=peer),
        ]
    for seq in seqs:
        eng.release(seq)
    return out


def table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'row':<34} {'value':>12} {'unit':<6} {'target':>10}  peer"]
    for r in rows:
        target = "" if r["target"] is None else (f">= {r['target']:.4g}" if r["unit"] == "ratio" else
                                                 f"<= {r['target']:.4g}")
        lines.append(f"{r['name']:<34} {r['value']:>12.4f} {r['unit']:<6} {target:>10}  {r['peer']}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    add_engine_args(ap, "qwen3-4b-batch")
    ap.add_argument("--rows", default="1,8,32,64")
    ap.add_argument("--contexts", default="128,2048")
    ap.add_argument("--steps", type=int, default=64)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = [int(v) for v in args.rows.split(",")]
    contexts = [int(v) for v in args.contexts.split(",")]

    import kern_runtime as kr

    logfile = (args.out / "bench_batch.log").open("w")

    def log(msg: str) -> None:
        print(f"bench_batch: {msg}", file=sys.stderr, flush=True)
        print(msg, file=logfile, flush=True)

    manifest, files = load_inputs(args, log)
    roles = kr.serving_roles(manifest)
    if roles.rows is None or max(rows) > roles.rows.max_rows:
        log(f"{args.manifest} has no batched step of {max(rows)} rows (kern-qwen3 --rows)")
        return 2
    tokens = max(rows) * (max(contexts) + room(rows, args.steps) + 2 * roles.page_tokens) + roles.page_tokens
    out: list[dict[str, Any]] = []
    with kr.Engine.open(manifest, args.kernels, files, gpu=args.gpu, tokens=tokens,
                        seqs=max(rows) + 1, config=kr.EngineConfig(chunk=2048), log=log, roles=roles) as eng:
        for context in contexts:
            out += measure(eng, context, rows, args.steps, log)
    (args.out / "bench_batch.json").write_text(json.dumps(out, indent=1) + "\n")
    print(table(out))
    print(table(out), file=logfile)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
