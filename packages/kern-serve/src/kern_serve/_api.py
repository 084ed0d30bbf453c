"""The OpenAI wire format of `kern serve`: request bodies checked into `Ask`s, the text a client
sees, errors as `{"error": {"message", "type", "param", "code"}}`.

No I/O here: `completion_ask` / `chat_ask` read a parsed JSON body (and raise `ApiFailure` with the
status, the parameter and a one-line message), `Text` turns generated ids into the text a client
sees (stop ids dropped, cut at the first stop string, streamed deltas held back while they could
still become a stop string or an incomplete character), and `error_body` is an error's JSON (the
answers and stream chunks are built in `kern_serve.app`).
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kern_runtime import Sampling
from kern_runtime.detok import Detok
from kern_runtime.loading import shown
from kern_serve.errors import ApiFailure

__all__ = ["MAX_LOGPROBS", "MAX_STOPS", "Ask", "Text", "bad", "chat_ask", "completion_ask", "error_body"]

MAX_STOPS = 4
"""Most stop strings a request may give (OpenAI's limit)."""
MAX_LOGPROBS = 20
"""Most top alternatives a request may ask for."""

_UNSUPPORTED_ZERO = ("presence_penalty", "frequency_penalty")
_UNSUPPORTED = ("suffix", "tools", "functions", "tool_choice", "function_call")


def error_body(exc: ApiFailure) -> dict[str, Any]:
    """The JSON of an error answer."""
    return {"error": {"message": exc.message, "type": exc.kind, "param": exc.param, "code": exc.code}}


def bad(message: str, param: str | None = None, code: str | None = "invalid_value") -> ApiFailure:
    """A 400 answer."""
    return ApiFailure(400, message, param=param, code=code)


@dataclass(frozen=True, slots=True)
class Ask:
    """A checked request: the prompt (text or ids), most tokens, sampling, stop strings, stream
    and usage flags, how many top logprobs (-1: none)."""

    model: str
    prompt: str | list[int]
    max_tokens: int
    sampling: Sampling
    stop: tuple[str, ...]
    stream: bool
    usage: bool
    chat: bool
    messages: tuple[dict[str, str], ...] = ()


# ---- fields ---------------------------------------------------------------------------------------


def _int(body: Mapping[str, Any], name: str, default: int, lo: int, hi: int | None = None) -> int:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(f"{name} must be an integer, got {shown(value)}", name, "invalid_type")
    if value < lo or (hi is not None and value > hi):
        top = "" if hi is None else f" and at most {hi}"
        raise bad(f"{name} must be at least {lo}{top}, got {shown(value)}", name)
    return value


def _float(body: Mapping[str, Any], name: str, default: float, lo: float, hi: float, *, open_lo: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad(f"{name} must be a number, got {shown(value)}", name, "invalid_type")
    x = float(value)
    if not math.isfinite(x) or x > hi or x < lo or (open_lo and x == lo):
        side = f"above {lo}" if open_lo else f"at least {lo}"
        raise bad(f"{name} must be {side} and at most {hi}, got {shown(value)}", name)
    return x


def _bool(body: Mapping[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad(f"{name} must be true or false, got {shown(value)}", name, "invalid_type")
    return value


def _stop(body: Mapping[str, Any]) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise bad("stop must be a non-empty string or a list of them", "stop", "invalid_type")
    if len(stops) > MAX_STOPS:
        raise bad(f"stop holds at most {MAX_STOPS} strings, got {len(stops)}", "stop")
    for s in stops:
        _unicode(s, "stop")
    return tuple(stops)


def _unicode(text: str, param: str, where: str | None = None) -> str:
    """`text` unless it cannot be encoded (a lone surrogate, as JSON's \\ud800 escapes allow)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise bad(f"{where or param} holds a lone surrogate at character {exc.start}: send valid Unicode text",
                  param) from None
    return text


def _refuse_unsupported(body: Mapping[str, Any]) -> None:
    for name in _UNSUPPORTED:
        if body.get(name) is not None:
            raise bad(f"{name} is not supported by this server", name, "unsupported_parameter")
    for name in _UNSUPPORTED_ZERO:
        if body.get(name) not in (None, 0, 0.0):
            raise bad(f"{name} is not supported by this server (only 0)", name, "unsupported_parameter")
    for name in ("n", "best_of"):
        if body.get(name) not in (None, 1):
            raise bad(f"{name} must be 1 here: one choice per request", name, "unsupported_parameter")
    if body.get("echo") not in (None, False):
        raise bad("echo is not supported by this server", "echo", "unsupported_parameter")
    if body.get("logit_bias") not in (None, {}):
        raise bad("logit_bias is not supported by this server", "logit_bias", "unsupported_parameter")


def _sampling(body: Mapping[str, Any], logprobs: int) -> Sampling:
    return Sampling(
        temperature=_float(body, "temperature", 0.0, 0.0, 2.0),
        top_k=_int(body, "top_k", 0, 0),
        top_p=_float(body, "top_p", 1.0, 0.0, 1.0, open_lo=True),
        seed=_seed(body),
        logprobs=logprobs,
    )


def _seed(body: Mapping[str, Any]) -> int:
    """The request's seed modulo 2**63; without one a fresh draw, so that unseeded sampling differs
    from request to request while a given seed repeats."""
    if body.get("seed") is None:
        return secrets.randbits(63)
    return _int(body, "seed", 0, -(1 << 63), (1 << 64) - 1) % (1 << 63)


def _common(body: Mapping[str, Any], model: str, max_name: str) -> tuple[str, int, bool, bool]:
    name = body.get("model")
    if not isinstance(name, str) or not name:
        raise bad("model is required: the name /v1/models lists", "model", "missing_required_parameter")
    if name != model:
        raise bad(f"model {shown(name)} is not served here; this server serves {model!r}", "model", "model_not_found")
    _refuse_unsupported(body)
    max_tokens = _int(body, max_name, 16, 1)
    stream = _bool(body, "stream", False)
    opts = body.get("stream_options")
    if opts is not None and (not isinstance(opts, dict) or not stream):
        raise bad("stream_options is an object, and only with stream: true", "stream_options")
    usage = bool(opts.get("include_usage", False)) if isinstance(opts, dict) else False
    return name, max_tokens, stream, usage


def completion_ask(body: Mapping[str, Any], model: str) -> Ask:
    """A /v1/completions body, checked.

    Raises:
        ApiFailure: 400 naming the first bad parameter.
    """
    name, max_tokens, stream, usage = _common(body, model, "max_tokens")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        ids: str | list[int] = list(prompt)
    elif isinstance(prompt, str) and prompt:
        ids = _unicode(prompt, "prompt")
    else:
        raise bad("prompt must be one non-empty string or one non-empty list of token ids", "prompt", "invalid_type")
    logprobs = body.get("logprobs")
    top = -1 if logprobs is None else _int(body, "logprobs", 0, 0, MAX_LOGPROBS)
    return Ask(name, ids, max_tokens, _sampling(body, top), _stop(body), stream, usage, chat=False)


def _content(m: Any, i: int) -> dict[str, str]:
    if not isinstance(m, dict):
        raise bad(f"messages[{i}] must be an object with role and content", "messages", "invalid_type")
    role, content = m.get("role"), m.get("content")
    if role not in ("system", "user", "assistant"):
        raise bad(f"messages[{i}].role must be system, user or assistant, got {shown(role)}", "messages")
    if isinstance(content, list):
        parts = [p.get("text") if isinstance(p, dict) and p.get("type") == "text" else None for p in content]
        if any(not isinstance(p, str) for p in parts):
            raise bad(f"messages[{i}].content parts must be text parts", "messages", "invalid_type")
        content = "".join(p for p in parts if isinstance(p, str))
    if not isinstance(content, str):
        raise bad(f"messages[{i}].content must be a string or a list of text parts", "messages", "invalid_type")
    return {"role": role, "content": _unicode(content, "messages", f"messages[{i}].content")}


def chat_ask(body: Mapping[str, Any], model: str) -> Ask:
    """A /v1/chat/completions body, checked.

    Raises:
        ApiFailure: 400 naming the first bad parameter.
    """
    max_name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    name, max_tokens, stream, usage = _common(body, model, max_name)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages must be a non-empty list", "messages", "invalid_type")
    msgs = tuple(_content(m, i) for i, m in enumerate(messages))
    top = -1
    if _bool(body, "logprobs", False):
        top = _int(body, "top_logprobs", 0, 0, MAX_LOGPROBS)
    elif body.get("top_logprobs") is not None:
        raise bad("top_logprobs needs logprobs: true", "top_logprobs")
    return Ask(name, "", max_tokens, _sampling(body, top), _stop(body), stream, usage, chat=True, messages=msgs)


# ---- text ---------------------------------------------------------------------------------------


@dataclass
class Text:
    """Generated ids to the text a client sees, streamed as deltas whose sum is the final text.

    The text is `decode` of the ids (a stop id is not text), cut before the first stop string;
    while the request runs, the last len(longest stop) - 1 characters and an unfinished last
    character are held back. Each token costs a decode of a few ids (kern_runtime.detok.Detok)
    and a stop-string search of the text not shown yet, not of the whole answer."""

    decode: Callable[[Sequence[int]], str]
    stops: tuple[str, ...] = ()
    stop_ids: frozenset[int] = frozenset()
    shown: str = ""
    detok: Detok = field(init=False)

    def __post_init__(self) -> None:
        self.detok = Detok(self.decode)

    @property
    def ids(self) -> tuple[int, ...]:
        """The ids of the text (the generated ids but stop ids)."""
        return self.detok.ids

    def _text(self, final: bool) -> str:
        text = self.detok.text(final=True)
        # NOTE: what is shown held no stop string (the request would have ended), so a stop string
        # now found ends past the shown text
        cuts = [i for i in (text.find(s, max(0, len(self.shown) - len(s))) for s in self.stops) if i >= 0]
        if cuts:
            return text[: min(cuts)]
        if not final:
            hold = max((len(s) for s in self.stops), default=1) - 1
            text = text[: len(text) - hold] if hold else text
            text = text.rstrip("\ufffd")
        return text

    def push(self, token: int) -> str:
        """The new text once `token` is generated ('' while held back)."""
        if token not in self.stop_ids:
            self.detok.push([token])
        return self._delta(self._text(False))

    def end(self) -> str:
        """The rest of the text when the request ended."""
        return self._delta(self._text(True))

    def _delta(self, text: str) -> str:
        if len(text) <= len(self.shown) or not text.startswith(self.shown):
            return ""
        delta = text[len(self.shown) :]
        self.shown = text
        return delta
