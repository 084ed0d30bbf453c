"""The ASGI app in process: an exception a route lets out is OpenAI's JSON 500 with one
line on stderr (never Starlette's plain-text 500 or a traceback), its echoes cut."""

from __future__ import annotations

from typing import Any, cast

import pytest
from starlette.testclient import TestClient

from kern_serve.app import Model, make_app


def _failing_encode(text: str) -> list[int]:
    raise RuntimeError("x" * 500)


def _model() -> Model:
    return Model("m", cast(Any, None), _failing_encode, lambda ids: "", lambda msgs: "", frozenset(), None, 4096, 0)


def test_an_unexpected_exception_is_the_json_500_and_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with TestClient(make_app(_model()), raise_server_exceptions=False) as client:
        r = client.post("/v1/completions", json={"model": "m", "prompt": "hello"})
    assert r.status_code == 500 and r.headers["content-type"] == "application/json"
    assert r.json() == {"error": {"message": "internal error (RuntimeError)", "type": "server_error", "param": None,
                                  "code": "internal_error"}}
    err = capsys.readouterr().err.splitlines()
    assert err == ["kern serve: POST /v1/completions: RuntimeError: " + "x" * 37 + "..."]
