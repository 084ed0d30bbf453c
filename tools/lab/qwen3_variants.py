"""The lab's manifest variants (kern_lab.variants) through the product's Qwen3 checks on a GPU host:

    PYTHONPATH=tools/gpu python3 tools/lab/qwen3_variants.py OUTDIR [--models 4b] [--variants fold,qkn]
        [--gemv-pick PICK.json] [--no-bench]

builds the product's and the lab's kernels into OUTDIR/kernels, then runs tools/gpu/qwen3_checks.py's
checks (transformers references, kern_checks, kern bench, decode profile) for each variant named.
`--gemv-pick` (time_gemv.py --entries writes one) adds the `picked` variant.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import qwen3_checks

from kern_lab import build_lab_kernels, lab_entry_modules
from kern_lab.variants import lab_variants


def _build(out: Path) -> dict[str, str]:
    # NOTE: the product's modules first; a lab module of the same name would be a duplicate entry.
    hashes = qwen3_checks.PRODUCT_SOURCES.build(out)
    hashes |= {m: sha for m, (_p, sha) in build_lab_kernels(out).items()}
    return hashes


LAB_SOURCES = qwen3_checks.Sources(_build, lab_entry_modules)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--gemv-pick", type=Path, default=None)
    known, rest = ap.parse_known_args(argv)
    if known.gemv_pick is not None and not known.gemv_pick.is_file():
        print(f"qwen3_variants: --gemv-pick {known.gemv_pick}: no such file", file=sys.stderr)
        return 2
    pick = json.loads(known.gemv_pick.read_text()) if known.gemv_pick is not None else None
    gen = qwen3_checks._load_gen()  # pyright: ignore[reportPrivateUsage]
    variants = {**qwen3_checks.product_variants(gen), **lab_variants(pick)}
    return qwen3_checks.main(rest, variants=variants, sources=LAB_SOURCES)


if __name__ == "__main__":
    sys.exit(main())
