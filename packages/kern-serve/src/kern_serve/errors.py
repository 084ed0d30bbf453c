"""The kern_serve error tree: a server that cannot start, and the HTTP error answers.

`StartError` is the caller's to fix (free the address, install the HTTP stack). `ApiFailure` is an
answer, not a bug: the request cannot be served as sent, and the app answers it with its status and
OpenAI's error JSON (`kern_serve.error_body`).
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["ApiFailure", "KernServeError", "StartError"]


class KernServeError(Exception):
    """Root of every error kern_serve raises on purpose."""


class StartError(KernServeError):
    """The server cannot start: its address cannot be bound, or the HTTP stack is not installed."""


class ApiFailure(KernServeError):
    """An HTTP error answer: status, message, OpenAI error type, parameter, code, headers."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param
        self.code = code
        self.headers = dict(headers or {})
