"""The peer's timings, as kern bench takes them: decode ms/token at a context (the step graph
replayed back to back as it feeds itself, and with every replay at the context), prefill ms."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from kern_peer.model import Peer, bucket

__all__ = ["WARMUP_STEPS", "decode_times", "prefill_ms", "warm_up"]

WARMUP_STEPS = 10
PROMPT_VOCAB = 1000
"""Random prompt ids are drawn below this (timing does not depend on them)."""


def _prompt(rng: np.random.Generator, n: int) -> torch.Tensor:
    return torch.from_numpy(rng.integers(0, PROMPT_VOCAB, size=n).astype(np.int64))


def _events_ms(body: Callable[[], None], count: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(count):
        body()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / count


def warm_up(peer: Peer) -> float:
    """Compiles the prefill (dynamic length) and decode shapes on a short prompt; its seconds."""
    t0 = time.perf_counter()
    rng = np.random.default_rng(1)
    ids = _prompt(rng, 64).to(peer.device)
    peer.prefill(ids[:-1])
    peer.prefill(ids[:-2])
    peer.set_state(int(ids[-1]), 63)
    peer.graph(64 + WARMUP_STEPS).replay()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def decode_times(peer: Peer, context: int, steps: int, rng: np.random.Generator) -> dict[str, Any]:
    """Prefill `context` - 1 tokens, then the step at position context - 1 (seeing `context`
    tokens): `steps` replays back to back (tokens fed in turn) and `steps` replays each at that
    position (a copy of the token and position before each), in ms per replay."""
    ids = _prompt(rng, context).to(peer.device)
    if context > 1:
        peer.prefill(ids[:-1])
    tok0, pos0 = ids[-1:].clone(), torch.tensor([context - 1], device=peer.device)
    peer.set_state(int(ids[-1]), context - 1)
    length = bucket(context + steps + WARMUP_STEPS)
    g = peer.graph(length)
    for _ in range(WARMUP_STEPS):
        g.replay()

    def reset() -> None:
        peer.tok.copy_(tok0)
        peer.pos.copy_(pos0)

    reset()
    fed = _events_ms(g.replay, steps)

    def fixed_step() -> None:
        reset()
        g.replay()

    fixed = _events_ms(fixed_step, steps)
    return {"context": context, "fed_ms_per_token": fed, "fixed_ms_per_token": fixed, "cache_tokens": length}


def prefill_ms(peer: Peer, tokens: int, reps: int, rng: np.random.Generator) -> dict[str, Any]:
    """Prefill of a `tokens`-token prompt (its first tokens - 1 into the cache, as kern's
    prefill rows count it): the median of `reps` after one untimed run."""
    ids = _prompt(rng, tokens).to(peer.device)[:-1]
    samples: list[float] = []
    for _ in range(reps + 1):
        samples.append(_events_ms(lambda: peer.prefill(ids), 1))
    return {"tokens": tokens, "ms": statistics.median(samples[1:])}


def run_all(peer: Peer, contexts: Sequence[int], prefill: Sequence[int], steps: int, reps: int,
            log: Callable[[str], None]) -> dict[str, Any]:
    """Every timing of a kern bench run, as kern bench reads it (kern_runtime.bench.peer)."""
    log("compiling (torch.compile, inductor default mode)")
    compile_s = warm_up(peer)
    log(f"compiled in {compile_s:.1f} s")
    rng = np.random.default_rng(0)
    decode = []
    for c in contexts:
        log(f"decode at context {c}")
        decode.append(decode_times(peer, c, steps, rng))
    pre = []
    for n in prefill:
        log(f"prefill of {n} tokens")
        pre.append(prefill_ms(peer, n, reps, rng))
    return {"compile_s": compile_s, "decode": decode, "prefill": pre}
