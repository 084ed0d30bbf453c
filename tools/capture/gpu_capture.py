"""GPU host: build the capture library, capture two workloads, measure the capture's slowdown,
analyze the captures, and write everything (plus small fixtures) under OUT.

    python tools/capture/gpu_capture.py OUT [--python PYTHON]

Workloads: workload_qwen3.py (transformers Qwen3, random weights, eager, greedy generate) and
workload_torch.py (a plain PyTorch eager loop). Each runs twice, without and with the capture;
the timed section (the requests after a warm-up) gives the slowdown. Written under OUT:
  summary.json                   per workload: launches, modules, slowdown, requests/forwards/tokens
                                 found vs expected, ABI census counts
  <name>/capture/pid<N>/         the raw dump (cubins included; large)
  <name>/report.txt, analysis.json, expected.json, timing_{plain,capture}.json
  fixture/<name>/                launches.jsonl.gz + modules.jsonl + expected.json (no cubins):
                                 small enough to commit as packages/kern-mining/tests/fixtures/<name>
Needs: python with torch (and transformers for qwen3), a C compiler, CUDA headers and CUPTI.
Exit status 0 when every workload's analysis finds the expected windows and token counts.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from kern_mining import analyze_dir, build_library, find_toolchain, run_capture

HERE = Path(__file__).resolve().parent

WORKLOADS = {"qwen3": HERE / "workload_qwen3.py", "torch_loop": HERE / "workload_torch.py"}


def _run_plain(python: str, script: Path, out: Path) -> float:
    start = time.perf_counter()
    subprocess.run([python, str(script), "--timing", str(out / "timing_plain.json")], check=True)
    return time.perf_counter() - start


def _fixture(pid: Path, out: Path, expected: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    (out / "launches.jsonl.gz").write_bytes(gzip.compress((pid / "launches.jsonl").read_bytes(), 9))
    shutil.copy(pid / "modules.jsonl", out / "modules.jsonl")
    shutil.copy(expected, out / "expected.json")
    return sum(f.stat().st_size for f in out.iterdir())


def _one(name: str, script: Path, root: Path, python: str, library: Path) -> dict[str, object]:
    out = root / name
    out.mkdir(parents=True, exist_ok=True)
    plain_wall = _run_plain(python, script, out)
    command = [
        python,
        str(script),
        "--timing",
        str(out / "timing_capture.json"),
        "--expected",
        str(out / "expected.json"),
    ]
    start = time.perf_counter()
    result = run_capture(command, out / "capture", library=library)
    capture_wall = time.perf_counter() - start
    if result.returncode != 0 or len(result.process_dirs) != 1:
        return {"error": f"capture exit {result.returncode}, process dumps {result.process_dirs}"}
    pid = result.process_dirs[0]
    analysis = analyze_dir(pid)
    (out / "report.txt").write_text(analysis.render() + "\n")
    (out / "analysis.json").write_text(json.dumps(analysis.to_json(), indent=1) + "\n")
    expected = json.loads((out / "expected.json").read_text())["windows"]
    found = [[f.tokens for f in w.forwards] for w in analysis.windows]
    plain = json.loads((out / "timing_plain.json").read_text())["seconds"]
    captured = json.loads((out / "timing_capture.json").read_text())["seconds"]
    cubins = list(pid.glob("module_*.cubin"))
    ref = analysis.tokens_reference
    return {
        "launches": analysis.launches,
        "modules": len(cubins),
        "cubin_bytes": sum(f.stat().st_size for f in cubins),
        "launches_jsonl_bytes": (pid / "launches.jsonl").stat().st_size,
        "timed_seconds_plain": plain,
        "timed_seconds_capture": captured,
        "slowdown_timed": captured / plain,
        "slowdown_process_wall": capture_wall / plain_wall,
        "core": analysis.core,
        "tokens_reference": None
        if ref is None
        else {"symbol": ref.symbol, "ordinal": ref.ordinal, "scale": ref.scale},
        "expected_windows": expected,
        "found_windows": found,
        "requests_and_tokens_exact": found[-len(expected) :] == expected,
        "abi_census": dict(Counter(e.layout for e in analysis.abi)),
        "undecided": list(analysis.undecided),
        "fixture_bytes": _fixture(pid, root / "fixture" / name, out / "expected.json"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument(
        "--python", default=sys.executable, help="interpreter with torch/transformers"
    )
    parser.add_argument(
        "--only", choices=sorted(WORKLOADS), action="append", help="run only these workloads"
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    toolchain = find_toolchain()
    library = build_library(args.out / "cache", toolchain=toolchain)
    summary: dict[str, object] = {
        "toolchain": {k: str(v) for k, v in vars(toolchain).items()},
        "library": str(library),
    }
    ok = True
    for name in args.only or sorted(WORKLOADS):
        try:
            row = _one(name, WORKLOADS[name], args.out, args.python, library)
        except (subprocess.CalledProcessError, OSError, ValueError) as exc:
            row = {"error": f"{type(exc).__name__}: {exc}"}
        summary[name] = row
        ok = ok and bool(row.get("requests_and_tokens_exact"))
        print(f"== {name}\n" + json.dumps(row, indent=1))
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
