"""`kern serve` as a process on the GPU (the qwen3-4b-fast target of kern.toml: the seeded random
Qwen3-4B checkpoint, the Qwen tokenizer), spoken to with the official `openai` client: streamed and
whole answers equal; 32 concurrent requests get the answers each got alone (greedy); the metrics
parse; and the load with faults of helpers.serve_load (KERN_SERVE_LOAD_REQUESTS, default 1,000,
64 clients): every valid answer right, the server idle again, its resident memory flat."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest
from helpers.serve_load import DISTINCT, load_with_faults, parse_metrics
from helpers.serve_proc import Server, launch

pytestmark = pytest.mark.gpu

KEY = "gpu-key"
MODEL = "qwen3-4b-fast"
CAPACITY = 65536
SYSTEM = "You are a helpful assistant who answers questions about numbers briefly. " * 4


def prompt(i: int) -> str:
    return f"{SYSTEM}Question {i}: what is {i * 37 % 101} plus {i}?"


def messages(i: int) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Say something about {i}."}]


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    srv = launch([MODEL, "--port", "0", "--api-key", KEY, "--capacity", str(CAPACITY), "--rows", "64",
                  "--host-bytes", str(4 << 30)], timeout=1800)
    yield srv
    assert srv.stop() == 0
    assert "Traceback" not in srv.stderr, srv.stderr


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=600)


def completion(client: openai.OpenAI, i: int, stream: bool, max_tokens: int = 8) -> str:
    if not stream:
        return client.completions.create(model=MODEL, prompt=prompt(i), max_tokens=max_tokens).choices[0].text
    parts = client.completions.create(model=MODEL, prompt=prompt(i), max_tokens=max_tokens, stream=True)
    return "".join(c.choices[0].text for c in parts if c.choices)


def chat(client: openai.OpenAI, i: int, stream: bool = False, max_tokens: int = 8) -> str:
    msgs: Any = messages(i)
    if not stream:
        out = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=max_tokens)
        return out.choices[0].message.content or ""
    parts = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=max_tokens, stream=True)
    return "".join(c.choices[0].delta.content or "" for c in parts if c.choices)


@pytest.fixture(scope="module")
def alone(client: openai.OpenAI) -> dict[tuple[int, bool], str]:
    """Each distinct request's answer, one request at a time."""
    return {(i, c): chat(client, i) if c else completion(client, i, False)
            for i in range(DISTINCT) for c in (False, True)}


def test_streamed_and_whole_answers_are_equal(client: openai.OpenAI, alone: dict[tuple[int, bool], str]) -> None:
    for i in range(4):
        assert completion(client, i, True) == alone[(i, False)]
        assert chat(client, i, True) == alone[(i, True)]


def test_concurrent_requests_get_their_answers_alone(client: openai.OpenAI, server: Server,
                                                     alone: dict[tuple[int, bool], str]) -> None:
    jobs = [(i % DISTINCT, i % 2 == 1) for i in range(32)]
    with ThreadPoolExecutor(32) as pool:
        got = list(pool.map(lambda j: chat(client, j[0]) if j[1] else completion(client, j[0], j[0] % 2 == 0), jobs))
    assert got == [alone[j] for j in jobs]
    samples = parse_metrics(httpx.get(server.url + "/metrics").text)
    assert samples["kern_generated_tokens_total"] > 0 and samples["kern_prefix_hit_rate"] > 0


def test_load_with_faults(server: Server, alone: dict[tuple[int, bool], str]) -> None:
    before, after, results = load_with_faults(server, KEY, MODEL, alone, prompt, messages, CAPACITY)
    assert after - before < 256 * 1024, (before, after)  # KiB
    assert results["cancel"] > 0
