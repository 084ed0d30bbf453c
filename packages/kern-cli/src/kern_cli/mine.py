"""`kern-mine` (also `kern mine`): capture a CUDA process, analyze a capture, build the library.

kern-mine capture -o DIR [--host-pointees] [--rebuild] -- python script.py ...
kern-mine analyze DIR [--json FILE] [--window-gap-ms MS] [--burst-gap N] [--forward-gap-ms MS]
kern-mine build [--rebuild]      # print the injection library's path (for CUDA_INJECTION64_PATH)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kern_mining import AnalyzeConfig, MiningError, analyze_dir, build_library, run_capture

__all__ = ["build_parser", "main", "register"]


def _capture(args: argparse.Namespace) -> int:
    command = list(args.cmd)
    if command and command[0] == "--":
        command = command[1:]
    library = build_library(force=args.rebuild)
    result = run_capture(command, Path(args.out), host_pointees=args.host_pointees, library=library)
    for d in result.process_dirs:
        print(d)
    if not result.process_dirs:
        print(
            "kern-mine: no process dump written (no CUDA process, or see kern_capture lines above)",
            file=sys.stderr,
        )
    return result.returncode


def _analyze(args: argparse.Namespace) -> int:
    config = AnalyzeConfig(
        window_gap_ms=args.window_gap_ms,
        burst_gap=args.burst_gap,
        forward_gap_ms=args.forward_gap_ms,
    )
    analysis = analyze_dir(Path(args.dir), config)
    print(analysis.render())
    if args.json:
        Path(args.json).write_text(json.dumps(analysis.to_json(), indent=1) + "\n")
    return 0


def _build(args: argparse.Namespace) -> int:
    print(build_library(force=args.rebuild))
    return 0


def _guarded(handler: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            return int(handler(args))
        except MiningError as exc:
            print(f"kern-mine: error: {exc}", file=sys.stderr)
            return 2

    return run


def _add_commands(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="mine_command", required=True)
    cap = sub.add_parser("capture", help="run a command with the CUPTI capture attached")
    cap.add_argument(
        "-o", "--out", required=True, help="capture root; each CUDA process writes pid<N>/ here"
    )
    cap.add_argument(
        "--host-pointees", action="store_true", help="also dump up to 64 bytes behind host pointers"
    )
    cap.add_argument("--rebuild", action="store_true", help="recompile the injection library")
    cap.add_argument("cmd", nargs=argparse.REMAINDER, help="-- command and its arguments")
    cap.set_defaults(handler=_guarded(_capture))
    ana = sub.add_parser(
        "analyze", help="windows, forwards, tokens, sites, fits, pointer classes, ABI census"
    )
    ana.add_argument("dir", help="a pid<N> dump, or a capture root holding exactly one")
    ana.add_argument("--json", metavar="FILE", help="also write the full result as JSON")
    defaults = AnalyzeConfig()
    ana.add_argument(
        "--window-gap-ms",
        type=float,
        default=defaults.window_gap_ms,
        help="smallest time gap that may cut requests apart; the cut rises to the strongest break in the gaps above it",
    )
    ana.add_argument(
        "--burst-gap", type=int, default=defaults.burst_gap, help="launches between core bursts"
    )
    ana.add_argument(
        "--forward-gap-ms",
        type=float,
        default=defaults.forward_gap_ms,
        help="time gap between forwards",
    )
    ana.set_defaults(handler=_guarded(_analyze))
    bld = sub.add_parser(
        "build", help="build (or find cached) the injection library and print its path"
    )
    bld.add_argument("--rebuild", action="store_true", help="recompile even if cached")
    bld.set_defaults(handler=_guarded(_build))


def build_parser() -> argparse.ArgumentParser:
    """The `kern-mine` parser."""
    parser = argparse.ArgumentParser(
        prog="kern-mine", description="capture CUDA processes and mine their kernels"
    )
    _add_commands(parser)
    return parser


def register(subparsers: Any) -> None:
    """Add `kern mine ...` to the `kern` dispatcher."""
    parser = subparsers.add_parser("mine", help="capture a CUDA process, analyze a capture")
    _add_commands(parser)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `kern-mine`."""
    args = build_parser().parse_args(argv)
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
