"""`kern`: one entry point, one module per subcommand.

Each subcommand module exposes `register(subparsers)`, which adds its parser and sets
`handler=callable(args) -> int` as a default. Handlers print results to stdout, logs to stderr, and
return the exit status (0 ok, 2 for bad input); they never let a traceback reach the user for errors
the packages raise on purpose. Errors follow `kern_cli.console`'s rule: one `kern <subcommand>:
message` line on stderr.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from kern_cli.console import Parser, add_version, fail, quiet_ends

# NOTE: subcommand modules, imported lazily so `kern manifest` never loads CUDA libraries.
SUBCOMMANDS: tuple[str, ...] = ("manifest_cmd", "run", "chat", "kernels_cmd", "bench_cmd", "mine", "serve", "abtest_cmd")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="kern", description="kern: manifests, runs, kernels, benchmarks")
    add_version(parser, "kern")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in SUBCOMMANDS:
        importlib.import_module(f"kern_cli.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `kern`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:2] == ["bench", "serve"]:
        # NOTE: `kern bench` takes a target as its first positional, so `serve` has its own parser
        from kern_cli import bench_serve

        return bench_serve.main(argv[2:])
    args, extra = build_parser().parse_known_args(argv)
    prog = f"kern {args.command}"
    if extra:
        # NOTE: argparse leaves a subcommand's extra words to the top parser, whose error would say `kern:`
        return fail(prog, f"unrecognized arguments: {' '.join(extra)} (see {prog} --help)")
    return quiet_ends(prog, lambda: int(args.handler(args)))


if __name__ == "__main__":
    sys.exit(main())
