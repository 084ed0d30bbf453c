"""The batched decode step in the engine on the lab's rows attention builds, beside the product's:

    PYTHONPATH=tools/tests:tools/gpu python3 tools/lab/rows_variants.py OUTDIR
        [--entries kern_attn_decode_rows_flat8,...] [--one-row] [--rows 1,8,32,64] [--contexts 128,2048]
        [--steps 64]

builds the product's and the lab's kernels into OUTDIR/kernels and writes OUTDIR/manifests/<name>.json
for the product (`batch`: examples/qwen3-4b-batch.json's options, kern_lab.variants.batch_plan) and
each build of `--entries` (default every kern_lab.ROWS_ENTRIES; `--one-row`: the one-row step's
attention on it too): the same manifest with the batched step's attention on that build
(kern_lab.RowsAttention). Each manifest then runs tools/gpu/bench_batch.py's measurement on one
engine (the seeded random Qwen3-4B checkpoint): the one-row step and the batched step at each row
count, pipelined and in turn. Writes OUTDIR/rows_variants.json (name -> bench_batch rows) and
OUTDIR/rows_variants.md (ms per step by manifest and row count) and prints the table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def manifests(out: Path, entries: list[str], one_row: bool) -> dict[str, Path]:
    """The product's batch manifest and one per entry, generated against the kernels built here."""
    import kern_qwen3 as gen
    from kern_lab import build_lab_kernels, lab_entry_modules
    from kern_lab.variants import batch_plan
    from kern_mining.build import build_kernels

    kernels = out / "kernels"
    hashes = {m: sha for m, (_p, sha) in build_kernels(ROOT / "tools" / "kernels-src", kernels).items()}
    hashes |= {m: sha for m, (_p, sha) in build_lab_kernels(kernels).items()}
    table = lab_entry_modules()
    shape = gen.shape_from_config(gen.QWEN3_4B_CONFIG)
    (out / "manifests").mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    for name, entry in [("batch", None), *((e.removeprefix("kern_attn_decode_rows_"), e) for e in entries)]:
        m = gen.generate(shape, hashes, table, model=f"qwen3-4b-{name}", plan=batch_plan(entry, one_row=one_row))
        paths[name] = out / "manifests" / f"{name}.json"
        paths[name].write_text(json.dumps(m, indent=1) + "\n")
    return paths


def table(results: dict[str, list[dict[str, Any]]]) -> str:
    """ms per step (pipelined) by manifest: the one-row step, then each row count, per context."""
    names = sorted({r["name"] for rows in results.values() for r in rows
                    if r["unit"] == "ms" and "in_turn" not in r["name"]})
    lines = ["| row | " + " | ".join(results) + " |", "|---|" + "---|" * len(results)]
    for n in names:
        vals = [next((f"{r['value']:.3f}" for r in rows if r["name"] == n), "") for rows in results.values()]
        lines.append(f"| {n} | " + " | ".join(vals) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    from kern_lab import ROWS_ENTRIES

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("out", type=Path)
    ap.add_argument("--entries", default=",".join(ROWS_ENTRIES))
    ap.add_argument("--one-row", action="store_true")
    ap.add_argument("--rows", default="1,8,32,64")
    ap.add_argument("--contexts", default="128,2048")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--gpu", type=int, default=0)
    args = ap.parse_args(argv)
    entries = [e for e in args.entries.split(",") if e]
    unknown = [e for e in entries if e not in ROWS_ENTRIES]
    if unknown:
        ap.error(f"not a rows build: {', '.join(unknown)} (choose from {', '.join(ROWS_ENTRIES)})")
    rows = [int(v) for v in args.rows.split(",")]
    contexts = [int(v) for v in args.contexts.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)

    import bench_batch

    import kern_runtime as kr
    from kern_qwen3 import QWEN3_4B_CONFIG, random_checkpoint

    def log(msg: str) -> None:
        print(f"rows_variants: {msg}", file=sys.stderr, flush=True)

    paths = manifests(args.out, entries, args.one_row)
    ckpt, _ = random_checkpoint(QWEN3_4B_CONFIG, seed=0, name="qwen3-4b")
    results: dict[str, list[dict[str, Any]]] = {}
    for name, path in paths.items():
        roles = kr.serving_roles(kr.read_manifest(path))
        assert roles.rows is not None
        tokens = max(rows) * (max(contexts) + bench_batch.room(rows, args.steps) + 2 * roles.page_tokens) \
            + roles.page_tokens
        log(f"{name}: {path}")
        with kr.Engine.open(path, args.out / "kernels", kr.weight_files([ckpt]), gpu=args.gpu, tokens=tokens,
                            seqs=max(rows) + 1, config=kr.EngineConfig(chunk=2048), roles=roles) as eng:
            results[name] = [r for ctx in contexts for r in bench_batch.measure(eng, ctx, rows, args.steps, log)]
        (args.out / "rows_variants.json").write_text(json.dumps(results, indent=1) + "\n")
    text = table(results)
    (args.out / "rows_variants.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
