"""The load with faults both `kern serve` process tests run (CPU: the interpreter; GPU: the 4B):
KERN_SERVE_LOAD_REQUESTS (default 1,000) requests from 64 concurrent clients, 10% cancelled
mid-stream, 5% malformed, 5% past the capacity; every valid answer compared with the expected one,
the server idle again after each half, its resident memory measured between the halves. And the
Prometheus text parser of the metrics checks."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

import httpx
import openai
from helpers.serve_proc import Server

__all__ = ["CLIENTS", "DISTINCT", "LOAD", "kind_of", "load_with_faults", "parse_metrics"]

LOAD = int(os.environ.get("KERN_SERVE_LOAD_REQUESTS", "1000"))
CLIENTS = 64
DISTINCT = 16
"""Distinct prompts (and chats) of the valid requests; the expected answers are keyed by them."""
MAX_TOKENS = 8


def kind_of(i: int) -> str:
    """10% cancelled mid-stream, 5% malformed, 5% past the capacity, the rest valid."""
    r = i % 20
    return "cancel" if r < 2 else "malformed" if r == 2 else "oversized" if r == 3 else "valid"


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text: every line a comment or `name{labels} value`; buckets never decrease."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("# "):
            assert re.fullmatch(r"# (HELP|TYPE) kern_\w+ .+", line), line
            continue
        m = re.fullmatch(r'(kern_\w+(?:\{\w+="[^"]*"\})?) (\S+)', line)
        assert m is not None, line
        out[m.group(1)] = float(m.group(2))
    for hist in ("kern_ttft_seconds", "kern_tpot_seconds"):
        counts = [v for k, v in out.items() if k.startswith(hist + "_bucket")]
        assert counts == sorted(counts) and counts
    return out


async def _settle(raw: httpx.AsyncClient, server: Server) -> None:
    """Wait until the server is idle: nothing queued or running, no open sequence or leased page."""
    h: dict[str, Any] = {}
    for _ in range(1200):
        h = (await raw.get(server.url + "/health")).json()
        if h["queue_depth"] == h["running_rows"] == h["open_sequences"] == h["leased_pages"] == 0:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"the server did not return to idle: {h}")


def load_with_faults(server: Server, key: str, model: str, want: Mapping[tuple[int, bool], str],
                     prompt: Callable[[int], str], messages: Callable[[int], list[dict[str, str]]],
                     capacity: int, agree: Callable[[str, tuple[int, bool]], bool] | None = None,
                     ) -> tuple[int, int, dict[str, int]]:
    """Run the load; returns the server's RSS (KiB) after the first fifth and at the end, and the
    requests done by kind. Fails on the first wrong status and on any wrong answer: one that is not
    `want`'s, or that `agree(answer, key)` refuses when given."""
    aclient = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=600)
    raw = httpx.AsyncClient(timeout=600, headers={"authorization": f"Bearer {key}"})
    results = {"valid": 0, "cancel": 0, "malformed": 0, "oversized": 0}
    wrong: list[tuple[int, str, str]] = []

    async def completion(n: int, stream: bool) -> str:
        if not stream:
            return (await aclient.completions.create(model=model, prompt=prompt(n), max_tokens=MAX_TOKENS)).choices[0].text
        parts = await aclient.completions.create(model=model, prompt=prompt(n), max_tokens=MAX_TOKENS, stream=True)
        return "".join([p.choices[0].text async for p in parts if p.choices])

    async def chat(n: int) -> str:
        msgs: Any = messages(n)
        out = await aclient.chat.completions.create(model=model, messages=msgs, max_tokens=MAX_TOKENS)
        return out.choices[0].message.content or ""

    async def one(i: int) -> None:
        kind, n, is_chat = kind_of(i), i % DISTINCT, (i // 5) % 2 == 1
        if kind == "malformed":
            r = await raw.post(server.url + "/v1/completions", content=b'{"model": "' + model.encode() + b'", "pr')
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json", r.text
        elif kind == "oversized":
            body = {"model": model, "prompt": "hello", "max_tokens": capacity + i}
            r = await raw.post(server.url + "/v1/completions", json=body)
            assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
        elif kind == "cancel":
            stream = await aclient.completions.create(model=model, prompt=prompt(n), max_tokens=200, stream=True)
            async for _ in stream:
                break
            await stream.close()
        else:
            got = await (chat(n) if is_chat else completion(n, i % 3 == 0))
            if not (agree(got, (n, is_chat)) if agree is not None else got == want[(n, is_chat)]):
                wrong.append((i, got, want[(n, is_chat)]))
        results[kind] += 1

    async def run(ids: range) -> None:
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in ids:
            queue.put_nowait(i)

        async def worker() -> None:
            while not queue.empty():
                await one(queue.get_nowait())

        await asyncio.gather(*(worker() for _ in range(CLIENTS)))

    async def main() -> tuple[int, int]:
        try:
            first = max(1, LOAD // 5)
            await run(range(first))
            await _settle(raw, server)
            before = server.rss_kib()
            await run(range(first, LOAD))
            await _settle(raw, server)
            return before, server.rss_kib()
        finally:
            await aclient.close()
            await raw.aclose()

    before, after = asyncio.run(main())
    assert not wrong, wrong[:3]
    assert results["valid"] == sum(kind_of(i) == "valid" for i in range(LOAD))
    return before, after, results
