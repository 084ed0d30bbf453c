"""Where the batched decode step's time goes, call by call, beside the one-row step:

    PYTHONPATH=tools/gpu python3 tools/lab/time_rows_step.py DIR [--manifest examples/qwen3-4b-batch.json] [--gpu 0]
        [--rows 1,8,32,64] [--contexts 128,2048]

For each context, 64 sequences of that many random tokens are prefilled through the engine (the
seeded random Qwen3-4B checkpoint, kern_qwen3.checkpoint); each row count R is seated by one
`Engine.decode` (sampling with logprobs 0, so R = 1 runs the batched program too), then
`Runtime.time_calls` runs the batched program eagerly with an event between every two calls
(the calls back to back, as `kern bench --breakdown` does for the one-row step). Calls are summed
by kind (the label without its layer: `l7.qkv` -> `qkv`); the one-row `decode` program beside.

Writes DIR/time_rows_step.json and DIR/time_rows_step.md and prints the tables.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from typing import Any

import numpy as np
from engine_inputs import add_engine_args, load_inputs


def kind(label: str) -> str:
    head, _, rest = label.partition(".")
    return rest if head[:1] == "l" and head[1:].isdigit() and rest else label


def by_kind(calls: list[tuple[str, float]]) -> dict[str, tuple[int, float]]:
    out: dict[str, list[float]] = defaultdict(list)
    for label, ms in calls:
        out[kind(label)].append(ms)
    return {k: (len(v), sum(v) * 1e3) for k, v in sorted(out.items(), key=lambda kv: -sum(kv[1]))}


def table(title: str, kinds: dict[str, tuple[int, float]]) -> str:
    total = sum(us for _, us in kinds.values())
    lines = [f"### {title} (sum {total:.1f} us)", "", "| call | calls | us each | us/step | share |",
             "|---|---|---|---|---|"]
    for k, (n, us) in kinds.items():
        lines.append(f"| {k} | {n} | {us / n:.2f} | {us:.1f} | {us / total:.1%} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    add_engine_args(ap, "qwen3-4b-batch")
    ap.add_argument("--rows", default="1,8,32,64")
    ap.add_argument("--contexts", default="128,2048")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = [int(v) for v in args.rows.split(",")]
    contexts = [int(v) for v in args.contexts.split(",")]

    import kern_runtime as kr

    def log(msg: str) -> None:
        print(f"time_rows_step: {msg}", file=sys.stderr, flush=True)

    manifest, files = load_inputs(args, log)
    roles = kr.serving_roles(manifest)
    assert roles.rows is not None, "the manifest has no batched step"
    n = max(rows)
    tokens = n * (max(contexts) + 64 + 2 * roles.page_tokens) + roles.page_tokens
    md: list[str] = []
    result: dict[str, Any] = {}
    with kr.Engine.open(args.manifest, args.kernels, files, gpu=args.gpu, tokens=tokens,
                        seqs=n + 1, config=kr.EngineConfig(chunk=2048), log=log, roles=roles) as eng:
        rt = eng.backend
        for ctx in contexts:
            rng = np.random.default_rng(ctx)
            seqs = [eng.sequence() for _ in range(n)]
            for seq in seqs:
                eng.prefill(seq, [int(x) for x in rng.integers(0, 150000, size=ctx)], 48)
            eng.decode(seqs[:1], [kr.Sampling()])
            one, _ = rt.time_calls(roles.step_program, roles.step_vars)  # pyright: ignore[reportAttributeAccessIssue]
            kinds = by_kind(one)
            result[f"one_row@{ctx}"] = kinds
            md.append(table(f"one-row step, context {ctx}", kinds))
            for r in rows:
                eng.decode(seqs[:r], [kr.Sampling(logprobs=0)] * r)
                calls, _ = rt.time_calls(roles.rows.program, {roles.rows.var: r})  # pyright: ignore[reportAttributeAccessIssue]
                kinds = by_kind(calls)
                result[f"rows{r}@{ctx}"] = kinds
                md.append(table(f"{r} rows, context {ctx}", kinds))
                print(md[-1], flush=True)
            for seq in seqs:
                eng.release(seq)
    (args.out / "time_rows_step.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "time_rows_step.md").write_text("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
