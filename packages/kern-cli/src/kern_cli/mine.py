"""`kern-mine` (also `kern mine`): capture a CUDA process, analyze a capture, build the library.

kern-mine capture -o DIR [--host-pointees] [--rebuild] -- python script.py ...
kern-mine analyze DIR [--json FILE] [--window-gap-ms MS] [--burst-gap N] [--forward-gap-ms MS]
kern-mine build [--rebuild]      # print the injection library's path (for CUDA_INJECTION64_PATH)

Outputs are checked before any work (an `-o` that is a file, a `--json` whose directory is
missing); errors are one `kern-mine: message` line (`kern mine: ...` under `kern`), exit 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kern_cli.console import (
    Parser,
    add_version,
    fail,
    output_dir_problem,
    output_file_problem,
    run_handler,
)
from kern_mining import AnalyzeConfig, MiningError, analyze_dir, build_library, run_capture

__all__ = ["build_parser", "main", "register"]


def _capture(args: argparse.Namespace) -> int:
    out = Path(args.out)
    problem = output_dir_problem(out)
    if problem is not None:
        return fail(args.program, f"-o {problem}")
    command = list(args.cmd)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        return fail(args.program, f"no command to capture: give it after `--`, e.g. {args.program} capture -o DIR -- python x.py")
    library = build_library(force=args.rebuild)
    result = run_capture(command, out, host_pointees=args.host_pointees, library=library)
    for d in result.process_dirs:
        print(d)
    if not result.process_dirs:
        print(
            f"{args.program}: no process dump written (no CUDA process, or see kern_capture lines above)",
            file=sys.stderr,
        )
    return result.returncode


def _analyze(args: argparse.Namespace) -> int:
    json_path = Path(args.json) if args.json else None
    problem = output_file_problem(json_path) if json_path is not None else None
    if problem is not None:
        return fail(args.program, f"--json {problem}")
    config = AnalyzeConfig(
        window_gap_ms=args.window_gap_ms,
        burst_gap=args.burst_gap,
        forward_gap_ms=args.forward_gap_ms,
    )
    analysis = analyze_dir(Path(args.dir), config)
    print(analysis.render())
    if json_path is not None:
        try:
            json_path.write_text(json.dumps(analysis.to_json(), indent=1) + "\n")
        except OSError as exc:
            return fail(args.program, f"--json {json_path}: cannot write ({exc.strerror or exc})")
    return 0


def _build(args: argparse.Namespace) -> int:
    print(build_library(force=args.rebuild))
    return 0


def _guarded(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            return int(handler(args))
        except MiningError as exc:
            return fail(args.program, str(exc))
        except BrokenPipeError:
            raise  # NOTE: a closed stdout (`| head`): quiet_ends exits 141
        except OSError as exc:
            where = f"{exc.filename}: " if exc.filename else ""
            return fail(args.program, f"{where}{exc.strerror or exc}")

    return run


def _milliseconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of milliseconds >= 0, got {text!r}")
    return value


def _launches(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number of launches >= 0, got {text!r}")
    return value


def _add_commands(parser: argparse.ArgumentParser, program: str) -> None:
    parser.set_defaults(program=program)
    sub = parser.add_subparsers(dest="mine_command", metavar="{capture,analyze,build}", required=True)
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
        type=_milliseconds,
        default=defaults.window_gap_ms,
        help="smallest time gap that may cut requests apart; the cut rises to the strongest break in the gaps above it",
    )
    ana.add_argument(
        "--burst-gap", type=_launches, default=defaults.burst_gap, help="launches between core bursts"
    )
    ana.add_argument(
        "--forward-gap-ms",
        type=_milliseconds,
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
    parser = Parser(prog="kern-mine", description="capture CUDA processes and mine their kernels")
    add_version(parser, "kern-mine")
    _add_commands(parser, "kern-mine")
    return parser


def register(subparsers: Any) -> None:
    """Add `kern mine ...` to the `kern` dispatcher."""
    parser = subparsers.add_parser("mine", help="capture a CUDA process, analyze a capture")
    _add_commands(parser, "kern mine")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `kern-mine`."""
    return run_handler("kern-mine", build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
