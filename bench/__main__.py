"""Run the CPU benchmarks: `python -m bench [name ...]` (all when none is named).

Writes out/bench/<name>.json and prints one table per benchmark.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import sys
from pathlib import Path

import bench
from kern_runtime.bench import table as _table

OUT = Path("out/bench")


def main(argv: list[str]) -> int:
    names = argv or sorted(
        m.name.removeprefix("bench_") for m in pkgutil.iter_modules(bench.__path__) if m.name.startswith("bench_")
    )
    OUT.mkdir(parents=True, exist_ok=True)
    for name in names:
        module = importlib.import_module(f"bench.bench_{name}")
        rows = module.run()
        (OUT / f"{name}.json").write_text(json.dumps(rows, indent=2) + "\n")
        print(f"\n## {name}\n{_table(rows)}")
    print(f"\nJSON written under {OUT}/")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
