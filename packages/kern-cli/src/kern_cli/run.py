"""`kern-run` / `kern run`: greedy generation for one sequence.

Flags in, one turn of a `kern_runtime.Engine` called, output out (`--turns` / `--chat`: several
turns on the same engine path, kern_cli.chat; `--tp N`: the turn of `kern_runtime.Ranks`, the
engine over N ranks, one thread per GPU in this process). The prompt goes through the
manifest's chunk program in chunks of `--chunk` (the head program, or else the first decode step,
gives the first token); each further step is one graph replay (`--eager`: call by call) and an
8-byte readback. Every input (manifest, weights, kernels, tokenizer, sizes) is checked before the
GPU is looked for (`kern_runtime.loading`). stdout carries only the generation; logs, the startup
summary and progress go to stderr.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TextIO

from kern_cli.console import Parser, add_version, run_handler
from kern_cli.options import (
    DEFAULT_CAPACITY,
    Bar,
    RunError,
    RunOptions,
    add_run_flags,
    check_devices,
    guarded,
    logger,
    open_runner,
    resolve_options,
)

if TYPE_CHECKING:
    from kern_runtime.loading import LoadInputs
    from kern_runtime.roles import ServingRoles

__all__ = ["build_parser", "execute", "main", "prepare", "register"]

CAPACITY_ALIGN = 256


def _capacity(opts: RunOptions, prompt_len: int, roles: ServingRoles) -> int:
    """The KV capacity: --capacity (or kern.toml's), else what the prompt and the steps reach,
    at least DEFAULT_CAPACITY, within what the model holds.

    Raises:
        RunError: the prompt and the steps do not fit the capacity given, or the model.
    """
    need = prompt_len + opts.steps
    given = opts.load.capacity
    if given is not None:
        if need > given:
            raise RunError(f"prompt ({prompt_len}) + steps ({opts.steps}) exceed --capacity {given}")
        return given
    most = roles.reach(need)
    if need > most:
        raise RunError(f"--steps {opts.steps}: the prompt ({prompt_len} tokens) and the steps need {need} "
                       f"positions; the model holds {most}")
    chosen = max(DEFAULT_CAPACITY, -(-need // CAPACITY_ALIGN) * CAPACITY_ALIGN)
    return min(chosen, roles.reach(chosen))


def prepare(opts: RunOptions) -> tuple[LoadInputs, list[int], Any, int]:
    """Every check that needs no GPU: (the inputs, the prompt ids, the tokenizer, the capacity)."""
    import kern_runtime as kr
    from kern_runtime import loading

    inputs = loading.check_inputs(opts.load)
    tok = loading.tokenizer(opts.tokenizer)
    prompt = list(opts.prompt_ids) if opts.prompt_ids is not None else tok.encode(opts.prompt)
    capacity = _capacity(opts, len(prompt), inputs.roles)
    kr.check_capacity(inputs.roles, capacity)
    kr.check_prompt(inputs.roles, capacity, prompt)
    return inputs, prompt, tok, capacity


def execute(opts: RunOptions, out: TextIO) -> int:
    """Run one generation with resolved options (several turns with `--turns` or `--chat`, on
    several GPUs with `--tp`); returns the exit status."""
    from kern_runtime import loading

    if opts.turns is not None or opts.chat:
        from kern_cli.chat import execute_turns, read_turns

        turns = read_turns(opts.turns) if opts.turns is not None else (opts.prompt or "",)
        return execute_turns(opts, out, turns, chat=opts.chat, prog=opts.prog)
    inputs, prompt, tok, capacity = prepare(opts)
    check_devices(opts, inputs)
    log = logger(opts.prog)
    t0 = time.perf_counter()
    weights = loading.prepare_load(opts.load, inputs, log, Bar(sys.stderr))
    with open_runner(opts, inputs, weights, capacity, log) as runner:
        t1 = time.perf_counter()
        turn = runner.turn(runner.sequence(), prompt, opts.steps)
    ids = turn.tokens
    out.write((" ".join(map(str, ids)) if opts.output == "ids" else loading.decode_text(tok, ids)) + "\n")
    out.flush()
    tp = f"tp {opts.tp}: " if opts.tp is not None else ""
    log(f"{tp}load {t1 - t0:.2f} s; prefill {turn.prefill.prefilled} tokens, first token {turn.ttft_ms:.1f} ms; "
        f"decode {turn.decode_ms_per_token:.3f} ms/token ({len(ids)} tokens, {'eager' if opts.eager else 'graph'})")
    return 0


def _handle(args: argparse.Namespace) -> int:
    return guarded(args.program, lambda: execute(resolve_options(args), sys.stdout))


def build_parser(prog: str = "kern-run") -> argparse.ArgumentParser:
    """The kern-run argument parser."""
    p = Parser(prog=prog, description="greedy generation for one sequence on kern")
    add_version(p, prog)
    add_run_flags(p)
    p.set_defaults(handler=_handle, program=prog)
    return p


def register(subparsers: Any) -> None:
    """Add `kern run` to the `kern` dispatcher."""
    p = subparsers.add_parser("run", help="greedy generation for one sequence",
                              description="greedy generation for one sequence on kern")
    add_run_flags(p)
    p.set_defaults(handler=_handle, program="kern run")


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point of `kern-run`."""
    return run_handler("kern-run", build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
