"""The host's part of a warm turn: `kern_runtime.Engine` over a fake backend (a kern_pool Pool and
Host with the pool the Qwen3-4B fast manifest gets for 40,960 tokens; programs recorded, not run).

A CONTEXT-token conversation is retired into the prefix index, then each warm turn is a new
sequence prefilling the conversation and TURN new tokens on the head path
(`prefill(seq, prompt, 1, first=True)`, the first token read back from the fake) and released:
what the host does around the GPU's work of a warm multi-turn TTFT, with no GPU. The prompt's ids
are the conversation's own int objects (as `Engine.turn`'s caller passes them), or new ones parsed
from JSON (as a served request's are: comparing them with the index's keys is no identity check).
One more row at 14,000 tokens keeps LIVE other sequences live meanwhile (each is weighed for a
fork). Medians of TURNS turns after WARMUP unmeasured ones. Beside each, measured in the same run:
what any prefill over the prompt pays in Python (a list and a tuple of it, and one pass counting
the ids' types). Run: `uv run python -m bench engine_host`.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

import kern_manifest
import kern_pool
import kern_runtime as kr
from kern_runtime.sequences import pool_config_for

MANIFEST = Path(__file__).resolve().parents[1] / "examples" / "qwen3-4b-fast.json"
POOL_TOKENS = 40_960
CONTEXTS = (2_000, 14_000, 32_000)
TURN = 200
WARMUP = 20
TURNS = 200
SYSTEM = 1_000
LIVE = 8


class _Backend(kern_pool.PoolDevice):
    """kern_runtime.Backend without a device: the pool calls are kern_pool's `PoolDevice`, inputs
    are kept, programs recorded by name only, every output reads back token 1."""

    def __init__(self, config: kern_pool.PoolConfig) -> None:
        pool, _ = kern_pool.Pool.create(config)
        super().__init__(pool, kern_pool.Host(pool, 64, 1, 1))
        self.inputs: dict[str, NDArray[Any]] = {}
        self.runs = 0

    def write_input(self, name: str, array: ArrayLike) -> None:
        self.inputs[name] = np.ascontiguousarray(array)

    def run(self, program: str, vars: Mapping[str, int]) -> None:
        self.runs += 1

    def issue(self, program: str, vars: Mapping[str, int]) -> None:
        self.runs += 1

    def read_output(self, name: str, count: int | None = None) -> NDArray[Any]:
        return np.ones(count or 1, dtype=np.int64)

    def synchronize(self) -> None:
        return None


def _engine(roles: kr.ServingRoles, manifest: kern_manifest.Manifest) -> kr.Engine:
    config = pool_config_for(manifest, kr.Capacity(tokens=POOL_TOKENS, seqs=1))
    assert config is not None
    return kr.Engine(_Backend(config), roles, kr.EngineConfig(chunk=2048))


def _ids(rng: np.random.Generator, n: int) -> list[int]:
    return [int(x) for x in rng.integers(0, 150_000, size=n)]


def _warm_ms(eng: kr.Engine, context: int, fresh: bool, live: int = 0) -> list[float]:
    """ms of each warm turn (prefill + release) over a `context`-token conversation; `fresh`: each
    prompt's ids are new int objects (parsed from JSON, as a served request's are), else the
    conversation's own objects (as `Engine.turn`'s caller passes `[*seq.tokens, *more]`). `live`
    other sequences hold leases meanwhile, each a SYSTEM-token prefix the conversation starts
    with and SYSTEM tokens of its own (each is weighed for a fork)."""
    rng = np.random.default_rng(context)
    system = _ids(rng, SYSTEM)
    base = eng.sequence()
    eng.turn(base, [*system, *_ids(rng, context - SYSTEM)], 1)
    conv = list(base.tokens)
    for _ in range(live):
        eng.prefill(eng.sequence(), [*system, *_ids(rng, SYSTEM)], 1)
    prompts = [[*conv, *_ids(rng, TURN)] for _ in range(WARMUP + TURNS)]
    if fresh:
        prompts = [json.loads(json.dumps(p)) for p in prompts]
    times: list[float] = []
    for prompt in prompts:
        seq = eng.sequence()
        t0 = time.perf_counter()
        done = eng.prefill(seq, prompt, 1, first=True)
        eng.release(seq)
        times.append((time.perf_counter() - t0) * 1e3)
        assert done.source is kr.Source.RESIDENT and done.reused == context and done.first is not None, done
    return times[WARMUP:]


def _floor_ms(context: int) -> float:
    """Median ms of what any prefill over the prompt pays in Python: the list `prefill` makes, the
    tuple the index keys by, and one pass counting the ids' types (the exact-int check)."""
    prompt = json.loads(json.dumps(_ids(np.random.default_rng(context), context + 1 + TURN)))
    times: list[float] = []
    for _ in range(TURNS):
        t0 = time.perf_counter()
        list(map(type, tuple(list(prompt)))).count(int)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def run() -> list[dict[str, object]]:
    """Rows: name, value, unit, target, peer (the floor measured in this same run)."""
    manifest = kr.read_manifest(MANIFEST)
    roles = kr.serving_roles(manifest)
    runs = [(context, fresh, 0) for context in CONTEXTS for fresh in (False, True)] + [(14_000, False, LIVE)]
    rows: list[dict[str, object]] = []
    for context, fresh, live in runs:
        with _engine(roles, manifest) as eng:
            times = _warm_ms(eng, context, fresh, live)
        what = "ids parsed fresh" if fresh else "the conversation's ids"
        beside = f", {live} live sequences of {2 * SYSTEM} tokens sharing its first {SYSTEM}" if live else ""
        rows.append(
            {
                "name": f"warm turn host, {context} + {TURN} tokens, {what}{beside}",
                "value": round(statistics.median(times), 3),
                "unit": "ms",
                "target": None,
                "peer": round(_floor_ms(context), 3),
                "peer_is": f"list, tuple and a type count over the {context + 1 + TURN}-token prompt",
            }
        )
    return rows
