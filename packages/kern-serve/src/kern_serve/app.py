"""`kern serve`'s ASGI application (Starlette): the routes over one `kern_runtime.serving.Serving`.

POST /v1/completions, POST /v1/chat/completions (streamed as server-sent events when asked),
GET /v1/models, /v1/models/{id}, /health, /metrics (Prometheus text, `kern_serve.metrics_text`).
Every error is OpenAI's JSON with its status (`ApiFailure`, `error_body`); an unexpected exception
answers 500 with its type only. A client that goes away cancels its request: the handler waits for
the request's next event or the connection's `http.disconnect`, whichever comes first. When the
server stops, `Closing.cut` ends every request still open: a stream with an error event and
`data: [DONE]`, a whole answer with 503 `shutting_down`. This module needs the HTTP stack (the
`http` extra); the rest of kern_serve imports it only where it serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import secrets
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from kern_pool import Finish, Refusal, Refused
from kern_runtime import ApiError, PromptError, check_prompt
from kern_runtime.loading import clip, shown
from kern_runtime.serving import Done, Event, Serving, Token
from kern_runtime.serving import Request as Job
from kern_serve._api import Ask, Text, bad, chat_ask, completion_ask, error_body
from kern_serve._conversation import Template
from kern_serve._metrics import metrics_text
from kern_serve.errors import ApiFailure

__all__ = ["Closing", "Model", "make_app"]

RETRY_AFTER_S = 1
"""What a 503 (queue full) tells the client to wait, in seconds."""


@dataclass(frozen=True)
class Model:
    """What the routes serve: the model's name, the engine thread, the tokenizer's encode and
    decode, the chat template, the ids that end an answer, the API key (None: open) and the
    largest request body."""

    name: str
    serving: Serving
    encode: Callable[[str], list[int]]
    decode: Callable[[Sequence[int]], str]
    template: Template
    stop_ids: frozenset[int]
    api_key: str | None
    max_body: int
    created: int


def failure(exc: ApiFailure) -> JSONResponse:
    """The JSON response of an error."""
    return JSONResponse(error_body(exc), status_code=exc.status, headers=exc.headers)


def _shutting_down() -> ApiFailure:
    return ApiFailure(503, "the server is shutting down", "overloaded_error", code="shutting_down")


class Closing:
    """The server's shutdown as the routes see it: `cut()` ends every request still open (a stream
    with an error event then `data: [DONE]`, a whole answer with 503 `shutting_down`)."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.open = 0
        """Requests submitted and not yet answered."""

    def cut(self) -> int:
        """End the open requests; returns how many there were."""
        self.event.set()
        return self.open


# ---- request checks ------------------------------------------------------------------------------


def _authorize(request: Request, key: str | None) -> None:
    if key is None:
        return
    given = request.headers.get("authorization", "")
    token = given[7:] if given.lower().startswith("bearer ") else ""
    if not hmac.compare_digest(token.encode(), key.encode()):
        raise ApiFailure(401, "invalid API key: send Authorization: Bearer <key>", "authentication_error",
                         code="invalid_api_key")


async def _json(request: Request, limit: int) -> dict[str, Any]:
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > limit):
        raise bad(f"the request body is larger than {limit} bytes", code="body_too_large")
    raw = bytearray()
    async for part in request.stream():
        raw += part
        if len(raw) > limit:
            raise bad(f"the request body is larger than {limit} bytes", code="body_too_large")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad(f"the body is not valid JSON ({exc})", code="invalid_json") from None
    except RecursionError:  # NOTE: the parser recurses once per level of nesting
        raise bad("the body nests too deeply to parse", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad("the body must be a JSON object", code="invalid_json")
    return body


def _prompt_ids(m: Model, ask: Ask) -> list[int]:
    if ask.chat:
        try:
            text = m.template(list(ask.messages))
        except ValueError as exc:
            raise bad(f"messages: {exc}", "messages") from None
        return m.encode(text)
    return m.encode(ask.prompt) if isinstance(ask.prompt, str) else list(ask.prompt)


def _fits(m: Model, ask: Ask, ids: list[int]) -> None:
    engine = m.serving.engine
    param = "messages" if ask.chat else "prompt"
    # NOTE: the scheduler's bound is the one submit applies, so the message names the true limit
    most = m.serving.sched.most_tokens(len(ids))
    if most < 1:
        raise bad(f"the prompt has {len(ids)} tokens; this server holds at most {len(ids) + most - 1} (prompt and "
                  "answer)", param, "context_length_exceeded")
    try:
        check_prompt(engine.roles, engine.reach, ids)
    except PromptError as exc:
        raise bad(str(exc), param) from None
    if ask.max_tokens > most:
        raise bad(f"max_tokens {shown(ask.max_tokens)} is past what this server holds: with a prompt of {len(ids)} "
                  f"tokens, at most {most}", "max_tokens", "context_length_exceeded")


def _submit(m: Model, ask: Ask, ids: list[int], sink: Callable[[Event], None]) -> Job:
    if not m.serving.decoder.sampling:
        if ask.sampling.temperature > 0:
            raise bad("this engine decodes greedily: temperature must be 0", "temperature", "unsupported_parameter")
        if ask.sampling.logprobs >= 0:
            raise bad("this engine decodes greedily: logprobs are not available", "logprobs",
                      "unsupported_parameter")
    top_n = m.serving.decoder.top_n
    if ask.sampling.logprobs > top_n:
        param = "top_logprobs" if ask.chat else "logprobs"
        raise bad(f"{param} {ask.sampling.logprobs} is past this engine's bound of {top_n}", param)
    job = Job(ids, ask.max_tokens, sink, ask.sampling, m.stop_ids, ask.stop)
    try:
        answer = m.serving.submit(job)
    except ApiError:
        raise _shutting_down() from None
    if isinstance(answer, Refused):
        if answer.why is Refusal.QUEUE_FULL:
            raise ApiFailure(503, "the server's queue is full: retry later", "overloaded_error", code="queue_full",
                             headers={"Retry-After": str(RETRY_AFTER_S)})
        raise bad("the prompt and max_tokens need more KV memory than this server has", "max_tokens",
                  "context_length_exceeded")
    return job


# ---- events ---------------------------------------------------------------------------------------


class _Events:
    """A request's events on the event loop, the connection's disconnect and the server's cut."""

    def __init__(self, receive: Receive, closing: Closing) -> None:
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[Event] = asyncio.Queue()
        self.gone = asyncio.ensure_future(self._disconnect(receive))
        self.cut = asyncio.ensure_future(closing.event.wait())

    def sink(self, ev: Event) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits for it
            self.loop.call_soon_threadsafe(self.queue.put_nowait, ev)

    @staticmethod
    async def _disconnect(receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    async def next(self) -> Event | None:
        """The next event, or None when the client went away or the server cut the request
        (`stopped`)."""
        if self.cut.done():
            return None
        get = asyncio.ensure_future(self.queue.get())
        await asyncio.wait({get, self.gone, self.cut}, return_when=asyncio.FIRST_COMPLETED)
        if get.done() and not self.cut.done():
            return get.result()
        get.cancel()
        return None

    @property
    def stopped(self) -> bool:
        """Whether the server cut this request (it is stopping)."""
        return self.cut.done()

    def close(self) -> None:
        self.gone.cancel()
        self.cut.cancel()


# ---- answers --------------------------------------------------------------------------------------


def _finish(done: Done) -> str:
    if done.finish is None:
        raise ApiFailure(500, f"the engine failed this request: {done.error}", "server_error", code="engine_error")
    if done.finish is Finish.CANCELLED:
        raise _shutting_down()
    return "length" if done.finish is Finish.LENGTH else "stop"


def _usage(done: Done) -> dict[str, Any]:
    return {"prompt_tokens": done.prompt, "completion_tokens": done.generated,
            "total_tokens": done.prompt + done.generated,
            "prompt_tokens_details": {"cached_tokens": done.cached}}


def _logprobs(m: Model, ask: Ask, tokens: Sequence[Token]) -> dict[str, Any] | None:
    if ask.sampling.logprobs < 0:
        return None
    if ask.chat:
        return {"content": [{"token": m.decode([t.token]), "logprob": t.logprob,
                             "bytes": list(m.decode([t.token]).encode()),
                             "top_logprobs": [{"token": m.decode([i]), "logprob": lp,
                                               "bytes": list(m.decode([i]).encode())} for i, lp in t.top]}
                            for t in tokens]}
    texts = [m.decode([t.token]) for t in tokens]
    offsets = [sum(len(x) for x in texts[:k]) for k in range(len(texts))]
    return {"tokens": texts, "token_logprobs": [t.logprob for t in tokens],
            "top_logprobs": [{m.decode([i]): lp for i, lp in t.top} for t in tokens], "text_offset": offsets}


class _Answer:
    """One request's answer, built from its events (the same for streamed and whole answers)."""

    def __init__(self, m: Model, ask: Ask) -> None:
        self.m, self.ask = m, ask
        self.text = Text(m.decode, ask.stop, m.stop_ids)
        self.id = ("chatcmpl-" if ask.chat else "cmpl-") + secrets.token_hex(12)
        self.created = int(time.time())
        self.tokens: list[Token] = []

    def _head(self, chunk: bool) -> dict[str, Any]:
        kind = "chat.completion" if self.ask.chat else "text_completion"
        if chunk and self.ask.chat:
            kind = "chat.completion.chunk"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.m.name}

    def _choice(self, text: str, finish: str | None, tokens: Sequence[Token], chunk: bool) -> dict[str, Any]:
        lp = _logprobs(self.m, self.ask, tokens)
        if not self.ask.chat:
            return {"index": 0, "text": text, "logprobs": lp, "finish_reason": finish}
        body = {"content": text} if chunk else {"role": "assistant", "content": text}
        return {"index": 0, "delta" if chunk else "message": body, "logprobs": lp, "finish_reason": finish}

    def whole(self, done: Done) -> dict[str, Any]:
        finish = _finish(done)
        text = self.text.shown + self.text.end()
        return {**self._head(False), "choices": [self._choice(text, finish, self.tokens, False)],
                "usage": _usage(done)}

    def first_chunk(self) -> dict[str, Any] | None:
        if not self.ask.chat:
            return None
        return {**self._head(True), "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                 "logprobs": None, "finish_reason": None}]}

    def token_chunk(self, t: Token) -> dict[str, Any] | None:
        self.tokens.append(t)
        delta = self.text.push(t.token)
        if not delta and self.ask.sampling.logprobs < 0:
            return None
        return {**self._head(True), "choices": [self._choice(delta, None, [t], True)]}

    def last_chunks(self, done: Done) -> list[dict[str, Any]]:
        finish = _finish(done)
        out = [{**self._head(True), "choices": [self._choice(self.text.end(), finish, [], True)]}]
        if self.ask.usage:
            out.append({**self._head(True), "choices": [], "usage": _usage(done)})
        return out


def _sse(obj: Mapping[str, Any] | str) -> bytes:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode()


class _Stream(Response):
    """Server-sent events from an async iterator of bytes; `on_close` runs however it ends."""

    def __init__(self, chunks: AsyncIterator[bytes], on_close: Callable[[], None]) -> None:
        # NOTE: no body attribute, so no content-length header (as StreamingResponse)
        self.status_code, self.media_type, self.background = 200, "text/event-stream", None
        self.init_headers({"cache-control": "no-cache"})
        self.chunks, self.on_close = chunks, on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            async for chunk in self.chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:  # the client went away mid-write
            pass
        finally:
            self.on_close()


async def _stream(answer: _Answer, events: _Events) -> AsyncIterator[bytes]:
    first = answer.first_chunk()
    if first is not None:
        yield _sse(first)
    while (ev := await events.next()) is not None:
        if isinstance(ev, Token):
            chunk = answer.token_chunk(ev)
            if chunk is not None:
                yield _sse(chunk)
            continue
        try:
            for chunk in answer.last_chunks(ev):
                yield _sse(chunk)
        except ApiFailure as exc:
            yield _sse(error_body(exc))
        yield _sse("[DONE]")
        return
    if events.stopped:
        yield _sse(error_body(_shutting_down()))
        yield _sse("[DONE]")


async def _generate(m: Model, closing: Closing, request: Request,
                    parse: Callable[[Mapping[str, Any], str], Ask]) -> Response:
    _authorize(request, m.api_key)
    ask = parse(await _json(request, m.max_body), m.name)
    ids = _prompt_ids(m, ask)
    _fits(m, ask, ids)
    events = _Events(request.receive, closing)
    try:
        job = _submit(m, ask, ids, events.sink)
    except BaseException:
        events.close()
        raise
    answer = _Answer(m, ask)
    closing.open += 1

    def close() -> None:
        # NOTE: cancelling a request that ended is a no-op (ids are never reused)
        closing.open -= 1
        events.close()
        m.serving.cancel(job.id)

    if ask.stream:
        return _Stream(_stream(answer, events), close)
    try:
        while (ev := await events.next()) is not None:
            if isinstance(ev, Token):
                answer.tokens.append(ev)
                answer.text.push(ev.token)
            else:
                return JSONResponse(answer.whole(ev))
        return failure(_shutting_down()) if events.stopped else Response(status_code=499)
    finally:
        close()


# ---- routes ---------------------------------------------------------------------------------------


def _routes(m: Model, closing: Closing) -> list[Route]:
    async def completions(request: Request) -> Response:
        return await _generate(m, closing, request, completion_ask)

    async def chat(request: Request) -> Response:
        return await _generate(m, closing, request, chat_ask)

    async def models(request: Request) -> Response:
        _authorize(request, m.api_key)
        return JSONResponse({"object": "list", "data": [_model_card(m)]})

    async def model(request: Request) -> Response:
        _authorize(request, m.api_key)
        if request.path_params["name"] != m.name:
            raise ApiFailure(404, f"model {shown(request.path_params['name'])} is not served here; this server serves "
                                  f"{m.name!r}", param="model", code="model_not_found")
        return JSONResponse(_model_card(m))

    async def health(request: Request) -> Response:
        g = m.serving.snapshot()
        return JSONResponse({"status": "ok", "model": m.name, "queue_depth": int(g["queue_depth"]),
                             "running_rows": int(g["running_rows"]), "open_sequences": int(g["open_sequences"]),
                             "leased_pages": int(g["leased_pages"])})

    async def metrics(request: Request) -> Response:
        return Response(metrics_text(m.serving), media_type="text/plain; version=0.0.4")

    return [
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{name:path}", model, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]


def _model_card(m: Model) -> dict[str, Any]:
    return {"id": m.name, "object": "model", "created": m.created, "owned_by": "kern",
            "max_model_len": m.serving.engine.reach}


async def _api_failure(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiFailure)
    return failure(exc)


async def _http_failure(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    return failure(ApiFailure(exc.status_code, f"{request.method} {clip(request.url.path)}: {exc.detail}", kind,
                              code=code))


async def _disconnected(request: Request, exc: Exception) -> Response:
    return Response(status_code=499)


async def _unexpected(request: Request, exc: Exception) -> Response:
    print(f"kern serve: {request.method} {clip(request.url.path)}: {type(exc).__name__}: {clip(str(exc))}",
          file=sys.stderr, flush=True)
    return failure(ApiFailure(500, f"internal error ({type(exc).__name__})", "server_error", code="internal_error"))


class _Guard:
    """The outermost layer: any exception a route lets out answers 500 JSON (never a traceback)."""

    def __init__(self, app: Starlette) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def tracked(message: Any) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            if scope["type"] != "http" or started:
                return
            request = Request(scope)
            await (await _unexpected(request, exc))(scope, receive, send)


def make_app(m: Model, closing: Closing | None = None) -> _Guard:
    """The ASGI application serving `m`; `closing.cut()` ends its open requests."""
    # NOTE: Starlette answers an exception no handler takes in its outermost layer, plain text,
    # before _Guard sees it; the Exception handler makes that answer the JSON 500
    app = Starlette(routes=_routes(m, closing or Closing()), exception_handlers={
        ApiFailure: _api_failure, HTTPException: _http_failure, ClientDisconnect: _disconnected,
        Exception: _unexpected,
    })
    return _Guard(app)
