"""`kern serve` as a real process on the CPU (the tiny Qwen3 with its 8-row batched step through the
interpreter), spoken to with the official `openai` client: completions and chat, streamed and whole
answers equal to the same engine's greedy answer alone, concurrent requests too; seeded sampling
with logprobs the same concurrent as alone and as the engine alone; /v1/models, /health, /metrics; every
error with its status and OpenAI JSON; and a load with faults: KERN_SERVE_LOAD_REQUESTS (default
1,000) requests from 64 concurrent clients, 10% cancelled mid-stream, 5% malformed, 5% past the
capacity: every valid request gets its tokens, the pool and host counts return to idle and the
resident memory stays flat. Then the bounds (max_tokens and prompts accepted at the limit the
refusal names, refused one past it), deeply nested bodies, cut echoes, lone surrogates, fresh and
repeated seeds, and SIGTERM ending a stream that outlives the grace with an error event and
`data: [DONE]`."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from helpers.openai_text import chat_text, completion_text
from helpers.serve_load import DISTINCT, LOAD, load_with_faults, parse_metrics
from helpers.serve_proc import CAPACITY, MODEL, Reference, Server, start

from kern_qwen3 import QWEN3_TINY_CONFIG, random_checkpoint, render
from kern_runtime import Sampling

KEY = "test-key-1"
SYSTEM = "You are a terse assistant. Answer in one word. " * 2


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path, _ = random_checkpoint(dict(QWEN3_TINY_CONFIG), seed=7, name="serve", root=tmp_path_factory.mktemp("ckpt"))
    return path


@pytest.fixture(scope="module")
def ref(weights: Path) -> Iterator[Reference]:
    r = Reference(weights)
    yield r
    r.close()


@pytest.fixture(scope="module")
def server(weights: Path) -> Iterator[Server]:
    srv = start(weights, "--api-key", KEY, "--rows", "64", "--step-tokens", "96", "--chunk", "32",
                "--host-bytes", str(256 * 16 * 2048), "--max-body", "65536")
    yield srv
    assert srv.stop() == 0
    assert "Traceback" not in srv.stderr, srv.stderr


@pytest.fixture
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


def prompt(i: int) -> str:
    return f"{SYSTEM}Question {i}: {'why ' * (i % 7)}what is {i * 37 % 101}?"


def messages(i: int) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Tell me about {i}" + "!" * (i % 5)}]


def completion(client: openai.OpenAI, i: int, max_tokens: int, stream: bool) -> str:
    return completion_text(client, MODEL, prompt(i), max_tokens, stream)


def chat(client: openai.OpenAI, i: int, max_tokens: int, stream: bool) -> str:
    return chat_text(client, MODEL, messages(i), max_tokens, stream)


# ---- answers ------------------------------------------------------------------------------------


def test_completions_streamed_and_whole_equal_the_engine_alone(client: openai.OpenAI, ref: Reference) -> None:
    for i in range(3):
        want = ref.completion(prompt(i), 12)
        assert completion(client, i, 12, stream=False) == want
        assert completion(client, i, 12, stream=True) == want
    out = client.completions.create(model=MODEL, prompt=prompt(0), max_tokens=12)
    assert out.usage is not None and out.usage.completion_tokens == len(ref.tokens(ref.tok.encode(prompt(0)), 12))
    assert out.choices[0].finish_reason in ("length", "stop")


def test_chat_streamed_and_whole_equal_the_engine_alone(client: openai.OpenAI, ref: Reference) -> None:
    for i in range(3):
        want = ref.chat(messages(i), 10)
        assert chat(client, i, 10, stream=False) == want
        assert chat(client, i, 10, stream=True) == want


def test_token_id_prompts_and_stop_strings(client: openai.OpenAI, ref: Reference) -> None:
    ids = ref.tok.encode(prompt(5))
    want = ref.text(ids, 12)
    out = client.completions.create(model=MODEL, prompt=ids, max_tokens=12)
    assert out.choices[0].text == want
    if len(want) > 3:
        stop = want[2:4]
        cut = want[: want.find(stop)]
        got = client.completions.create(model=MODEL, prompt=ids, max_tokens=12, stop=[stop])
        assert got.choices[0].text == cut and got.choices[0].finish_reason == "stop"
        streamed = client.completions.create(model=MODEL, prompt=ids, max_tokens=12, stop=[stop], stream=True)
        assert "".join(c.choices[0].text for c in streamed if c.choices) == cut


def test_concurrent_requests_get_the_tokens_they_get_alone(client: openai.OpenAI, ref: Reference) -> None:
    jobs = [(i, i % 2 == 0, i % 3 == 0) for i in range(24)]
    want = [ref.chat(messages(i), 9) if is_chat else ref.completion(prompt(i), 9) for i, is_chat, _ in jobs]

    def one(job: tuple[int, bool, bool]) -> str:
        i, is_chat, stream = job
        return chat(client, i, 9, stream) if is_chat else completion(client, i, 9, stream)

    with ThreadPoolExecutor(12) as pool:
        assert list(pool.map(one, jobs)) == want


def test_first_tokens_from_the_head_give_the_tokens_alone(weights: Path, ref: Reference) -> None:
    """`kern serve --first-token head`: concurrent greedy requests, streamed and whole, chat and
    completions, get the tokens they get alone, and the server exits cleanly."""
    srv = start(weights, "--first-token", "head", "--rows", "16", "--step-tokens", "96", "--chunk", "32")
    try:
        api = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        jobs = [(i, i % 2 == 0, i % 3 == 0) for i in range(12)]
        want = [ref.chat(messages(i), 7) if is_chat else ref.completion(prompt(i), 7) for i, is_chat, _ in jobs]

        def one(job: tuple[int, bool, bool]) -> str:
            i, is_chat, stream = job
            if is_chat:
                return chat_text(api, MODEL, messages(i), 7, stream)
            return completion_text(api, MODEL, prompt(i), 7, stream)

        with ThreadPoolExecutor(6) as pool:
            assert list(pool.map(one, jobs)) == want
    finally:
        assert srv.stop() == 0
    assert "Traceback" not in srv.stderr, srv.stderr


SAMPLED = {"temperature": 0.9, "top_p": 0.95, "top_k": 40}


def sampled(client: openai.OpenAI, i: int, max_tokens: int = 8) -> tuple[str, list[float]]:
    out = client.completions.create(model=MODEL, prompt=prompt(i), max_tokens=max_tokens, seed=100 + i, logprobs=2,
                                    extra_body={"top_k": SAMPLED["top_k"]}, temperature=SAMPLED["temperature"],
                                    top_p=SAMPLED["top_p"])
    lp = out.choices[0].logprobs
    assert lp is not None and lp.token_logprobs is not None and lp.top_logprobs is not None
    assert all(0 < len(top) <= 2 for top in lp.top_logprobs)
    return out.choices[0].text, [float(x) for x in lp.token_logprobs if x is not None]


def test_seeded_sampling_is_the_same_concurrent_and_alone(client: openai.OpenAI, ref: Reference) -> None:
    alone = [sampled(client, i) for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda i: sampled(client, i), range(8)))
    assert [t for t, _ in together] == [t for t, _ in alone]
    for (_, got), (_, want) in zip(together, alone, strict=True):
        assert got == pytest.approx(want, abs=1e-4)  # float32 sums over 8 rows, not 1
    for i, (text, logprobs) in enumerate(alone):
        ask = Sampling(seed=100 + i, logprobs=2, **SAMPLED)
        want = ref.sampled(ref.tok.encode(prompt(i)), 8, ask)
        assert text == ref.shown([s.token for s in want])
        assert logprobs == pytest.approx([s.logprob for s in want], abs=1e-4)
        assert all(lp <= 0 for lp in logprobs)
    greedy = [ref.completion(prompt(i), 8) for i in range(8)]
    assert sum(a[0] != g for a, g in zip(alone, greedy, strict=True)) >= 4  # the draws are not the argmax


def test_chat_logprobs_streamed_and_whole(client: openai.OpenAI, ref: Reference) -> None:
    msgs: Any = messages(3)
    kw: Any = {"model": MODEL, "messages": msgs, "max_tokens": 6, "seed": 5, "temperature": 0.8, "logprobs": True,
               "top_logprobs": 3}
    whole = client.chat.completions.create(**kw).choices[0]
    assert whole.logprobs is not None and whole.logprobs.content is not None
    content = whole.logprobs.content
    want = ref.sampled(ref.tok.encode(render(msgs)), 6, Sampling(temperature=0.8, seed=5, logprobs=3))
    assert [c.logprob for c in content] == pytest.approx([s.logprob for s in want], abs=1e-4)
    assert [t.logprob for c in content for t in c.top_logprobs] == pytest.approx(
        [lp for s in want for _, lp in s.top], abs=1e-4)
    assert [t.token for c in content for t in c.top_logprobs] == [ref.tok.decode([i]) for s in want for i, _ in s.top]
    parts = list(client.chat.completions.create(**kw, stream=True))
    streamed = [c for p in parts if p.choices and p.choices[0].logprobs for c in p.choices[0].logprobs.content or []]
    assert "".join(p.choices[0].delta.content or "" for p in parts if p.choices) == whole.message.content
    assert [c.logprob for c in streamed] == [c.logprob for c in content]


def test_models_health_and_metrics(client: openai.OpenAI, server: Server) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    health = httpx.get(server.url + "/health").json()
    assert health["status"] == "ok" and health["model"] == MODEL
    text = httpx.get(server.url + "/metrics").text
    samples = parse_metrics(text)
    for name in ("kern_queue_depth", "kern_running_rows", "kern_tokens_per_second", "kern_prefix_hit_rate",
                 "kern_pool_pages_used", "kern_host_units_used", "kern_generated_tokens_total"):
        assert name in samples, name
    assert samples["kern_generated_tokens_total"] > 0
    assert samples['kern_ttft_seconds_bucket{le="+Inf"}'] == samples["kern_ttft_seconds_count"] > 0
    assert samples["kern_tpot_seconds_count"] > 0 and 0 < samples["kern_prefix_hit_rate"] <= 1
    assert samples["kern_ridden_tokens_total"] == 0  # kern serve prefills each prompt apart (riding is opt-in)


# ---- errors -------------------------------------------------------------------------------------


def post(server: Server, path: str, body: Any, key: str | None = KEY, raw: bytes | None = None) -> httpx.Response:
    headers = {"content-type": "application/json"}
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    content = raw if raw is not None else json.dumps(body).encode()
    return httpx.post(server.url + path, content=content, headers=headers, timeout=60)


def error_of(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and isinstance(err["message"], str)
    assert "Traceback" not in r.text
    return err


BASE = {"model": MODEL, "prompt": "hello", "max_tokens": 4}

BAD_REQUESTS: list[tuple[dict[str, Any], str, str | None]] = [
    ({**BASE, "model": "gpt-4"}, "model_not_found", "model"),
    ({k: v for k, v in BASE.items() if k != "model"}, "missing_required_parameter", "model"),
    ({**BASE, "max_tokens": CAPACITY}, "context_length_exceeded", "max_tokens"),
    ({**BASE, "max_tokens": 0}, "invalid_value", "max_tokens"),
    ({**BASE, "max_tokens": "4"}, "invalid_type", "max_tokens"),
    ({**BASE, "prompt": "x" * CAPACITY}, "context_length_exceeded", "prompt"),
    ({**BASE, "prompt": [1, 2, 99999]}, "invalid_value", "prompt"),
    ({**BASE, "prompt": ""}, "invalid_type", "prompt"),
    ({**BASE, "temperature": -1}, "invalid_value", "temperature"),
    ({**BASE, "temperature": 3}, "invalid_value", "temperature"),
    ({**BASE, "top_p": 0}, "invalid_value", "top_p"),
    ({**BASE, "top_k": -2}, "invalid_value", "top_k"),
    ({**BASE, "n": 2}, "unsupported_parameter", "n"),
    ({**BASE, "stop": ["a", "b", "c", "d", "e"]}, "invalid_value", "stop"),
    ({**BASE, "stop": 5}, "invalid_type", "stop"),
    ({**BASE, "stream": "yes"}, "invalid_type", "stream"),
    ({**BASE, "logprobs": 21}, "invalid_value", "logprobs"),
    ({**BASE, "seed": 1 << 64}, "invalid_value", "seed"),
]


@pytest.mark.parametrize(("body", "code", "param"), BAD_REQUESTS)
def test_bad_completion_parameters_are_400(server: Server, body: dict[str, Any], code: str, param: str | None) -> None:
    err = error_of(post(server, "/v1/completions", body), 400)
    assert (err["code"], err["param"], err["type"]) == (code, param, "invalid_request_error")


def test_bad_chat_bodies_are_400(server: Server) -> None:
    chat_base = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    cases = [({**chat_base, "messages": []}, "messages"), ({**chat_base, "messages": [{"role": "robot", "content": "x"}]},
                                                           "messages"),
             ({**chat_base, "messages": [{"role": "user", "content": 3}]}, "messages"),
             ({**chat_base, "top_logprobs": 2}, "top_logprobs"),
             ({**chat_base, "max_completion_tokens": CAPACITY}, "max_tokens")]
    for body, param in cases:
        assert error_of(post(server, "/v1/chat/completions", body), 400)["param"] == param


def test_an_idle_connection_outlives_a_clients_pool_expiry(server: Server) -> None:
    """One connection, two requests 6 s apart (past httpx's 5 s pool expiry): the server kept it."""
    with httpx.Client(limits=httpx.Limits(keepalive_expiry=60)) as c:
        streams: list[object] = []
        for _ in range(2):
            r = c.get(server.url + "/health")
            assert r.status_code == 200
            streams.append(r.extensions["network_stream"])
            time.sleep(6)
        assert streams[0] is streams[1]


def test_malformed_oversized_unauthorized_unknown(server: Server) -> None:
    assert error_of(post(server, "/v1/completions", None, raw=b'{"model": '), 400)["code"] == "invalid_json"
    assert error_of(post(server, "/v1/completions", None, raw=b"[1, 2]"), 400)["code"] == "invalid_json"
    assert error_of(post(server, "/v1/completions", None, raw=b"\xff\xfe"), 400)["code"] == "invalid_json"
    big = {**BASE, "prompt": "a" * 70000}
    assert error_of(post(server, "/v1/completions", big), 400)["code"] == "body_too_large"
    assert error_of(post(server, "/v1/completions", BASE, key="wrong"), 401)["type"] == "authentication_error"
    assert error_of(post(server, "/v1/completions", BASE, key=None), 401)["code"] == "invalid_api_key"
    assert httpx.get(server.url + "/v1/models").status_code == 401
    assert error_of(httpx.get(server.url + "/v1/nothing"), 404)["code"] == "not_found"
    assert error_of(httpx.get(server.url + "/v1/completions"), 405)["code"] == "method_not_allowed"
    r = httpx.get(server.url + "/v1/models/other", headers={"authorization": f"Bearer {KEY}"})
    assert error_of(r, 404)["code"] == "model_not_found"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="nope", max_retries=0).models.list()
    with pytest.raises(openai.BadRequestError):
        openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0).completions.create(
            model="other", prompt="x")


def test_a_full_queue_is_503_with_retry_after(weights: Path) -> None:
    srv = start(weights, "--rows", "1", "--max-queued", "1")
    try:
        body = {"model": MODEL, "prompt": "hello", "max_tokens": 400}

        async def burst() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=120) as c:
                return await asyncio.gather(*(c.post(srv.url + "/v1/completions", json=body) for _ in range(6)))

        answers = asyncio.run(burst())
        full = [r for r in answers if r.status_code == 503]
        assert full and all(r.headers["retry-after"] == "1" for r in full)
        assert all(error_of(r, 503)["code"] == "queue_full" for r in full)
        assert all(r.status_code == 200 for r in answers if r not in full)
        assert len(full) < len(answers)
    finally:
        assert srv.stop() == 0
    assert "Traceback" not in srv.stderr


# ---- load and faults ----------------------------------------------------------------------------


def test_load_with_faults(server: Server, ref: Reference) -> None:
    want = {(i, c): ref.chat(messages(i), 8) if c else ref.completion(prompt(i), 8)
            for i in range(DISTINCT) for c in (False, True)}
    before, after, results = load_with_faults(server, KEY, MODEL, want, prompt, messages, CAPACITY)
    assert sum(results.values()) == LOAD
    assert after - before < 48 * 1024, (before, after)  # KiB: flat, not growing with the requests
    samples = parse_metrics(httpx.get(server.url + "/metrics").text)
    assert samples['kern_requests_total{outcome="cancelled"}'] >= results["cancel"]
    assert samples["kern_host_units_used"] <= samples["kern_host_units_total"]


# ---- bounds, nesting and seeds ------------------------------------------------------------------


def stream_status(server: Server, body: dict[str, Any]) -> httpx.Response | int:
    """A streamed request's status once its answer starts (the request is then dropped), or its
    whole error answer."""
    headers = {"authorization": f"Bearer {KEY}"}
    with httpx.stream("POST", server.url + "/v1/completions", json={**body, "stream": True}, headers=headers,
                      timeout=120) as r:
        if r.status_code != 200:
            r.read()
            return r
        return r.status_code


@pytest.mark.parametrize("prompt_len", [1, 4000])
def test_max_tokens_is_refused_past_the_largest_accepted_value_it_names(server: Server, prompt_len: int) -> None:
    """The message's bound is the scheduler's: accepted at N, refused at N + 1 naming N (the pool
    of 4,096 tokens keeps a page spare, so N is 4,080 - prompt + 1, not the reach's 4,096 -
    prompt + 1)."""
    ids = [65] * prompt_len
    most = 4080 - prompt_len + 1
    assert stream_status(server, {**BASE, "prompt": ids, "max_tokens": most}) == 200
    for asked in (most + 1, 10**20):
        r = stream_status(server, {**BASE, "prompt": ids, "max_tokens": asked})
        assert isinstance(r, httpx.Response)
        err = error_of(r, 400)
        assert (err["code"], err["param"]) == ("context_length_exceeded", "max_tokens")
        assert err["message"].endswith(f"with a prompt of {prompt_len} tokens, at most {most}"), err["message"]


def test_a_prompt_past_the_server_is_refused_naming_its_bound(server: Server) -> None:
    assert stream_status(server, {**BASE, "prompt": [65] * 4080, "max_tokens": 1}) == 200
    r = stream_status(server, {**BASE, "prompt": [65] * 4081, "max_tokens": 1})
    assert isinstance(r, httpx.Response)
    err = error_of(r, 400)
    assert (err["code"], err["param"]) == ("context_length_exceeded", "prompt")
    assert err["message"] == "the prompt has 4081 tokens; this server holds at most 4080 (prompt and answer)"


@pytest.mark.parametrize("depth", [500, 1000, 30000])
def test_a_deeply_nested_body_is_a_400_json_error(server: Server, depth: int) -> None:
    raw = b'{"model": "' + MODEL.encode() + b'", "prompt": ' + b"[" * depth + b"]" * depth + b"}"
    err = error_of(post(server, "/v1/completions", None, raw=raw), 400)
    assert err["code"] in ("invalid_json", "invalid_type")
    assert len(err["message"]) < 200


def test_echoed_values_are_cut(server: Server) -> None:
    err = error_of(post(server, "/v1/completions", {**BASE, "model": "m" * 5000}), 400)
    assert err["code"] == "model_not_found" and len(err["message"]) < 200
    err = error_of(post(server, "/v1/completions", {**BASE, "temperature": "x" * 5000}), 400)
    assert err["param"] == "temperature" and len(err["message"]) < 200
    r = httpx.get(server.url + "/v1/models/" + "n" * 3000, headers={"authorization": f"Bearer {KEY}"})
    assert len(error_of(r, 404)["message"]) < 200


def sampled_text(client: openai.OpenAI, seed: int | None) -> str:
    out = client.completions.create(model=MODEL, prompt=prompt(1), max_tokens=8, temperature=1.0, seed=seed)
    return out.choices[0].text


def test_unseeded_sampling_draws_afresh_and_a_seed_repeats(client: openai.OpenAI) -> None:
    unseeded = [sampled_text(client, None) for _ in range(3)]
    assert len(set(unseeded)) == 3, unseeded
    assert sampled_text(client, 12345) == sampled_text(client, 12345)
    assert sampled_text(client, 0) == sampled_text(client, 0)


# ---- shutdown -----------------------------------------------------------------------------------


def test_sigterm_ends_a_stream_past_the_grace_with_an_error_event_then_done(weights: Path) -> None:
    """A stream of 4,000 tokens and a whole answer of as many outlive the 5 s grace: SIGTERM ends
    the stream with the shutting_down error event and `data: [DONE]`, the whole answer with 503
    shutting_down; the server says so in one line and exits 0. (The pool holds both at once.)"""
    srv = start(weights, "--capacity", "16384")
    lines: list[str] = []
    whole: list[httpx.Response] = []
    started = threading.Event()

    def stream() -> None:
        body = {"model": MODEL, "prompt": [65, 66], "max_tokens": 4000, "stream": True}
        with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                lines.append(line)
                started.set()

    def answer() -> None:
        body = {"model": MODEL, "prompt": [67, 68], "max_tokens": 4000}
        whole.append(httpx.post(srv.url + "/v1/completions", json=body, timeout=60))

    threads = [threading.Thread(target=stream), threading.Thread(target=answer)]
    threads[0].start()
    try:
        assert started.wait(60)
        threads[1].start()
        deadline = time.monotonic() + 30
        while httpx.get(srv.url + "/health").json()["running_rows"] < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        srv.proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(60)
        assert srv.proc.wait(60) == 0
    finally:
        srv.stop()
    assert error_of(whole[0], 503)["code"] == "shutting_down"
    events = [ln.removeprefix("data: ") for ln in lines if ln.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2]) == {"error": {"message": "the server is shutting down", "type": "overloaded_error",
                                                "param": None, "code": "shutting_down"}}
    assert all(json.loads(e)["choices"][0]["finish_reason"] is None for e in events[:-2])
    after = srv.lines[srv.lines.index(next(ln for ln in srv.lines if "listening on" in ln)) + 1:]
    assert after == ["kern serve: stopped: 2 open requests ended after the 5 s grace"], srv.stderr


@pytest.mark.parametrize(("path", "raw", "param"), [
    ("/v1/completions", b'{"model": "%s", "prompt": "a\\ud800b"}', "prompt"),
    ("/v1/chat/completions", b'{"model": "%s", "messages": [{"role": "user", "content": "a\\udfffb"}]}', "messages"),
    ("/v1/completions", b'{"model": "%s", "prompt": "a", "stop": ["\\ud800"]}', "stop"),
])
def test_a_lone_surrogate_is_a_400(server: Server, path: str, raw: bytes, param: str) -> None:
    err = error_of(post(server, path, None, raw=raw % MODEL.encode()), 400)
    assert err["param"] == param and "lone surrogate" in err["message"]
