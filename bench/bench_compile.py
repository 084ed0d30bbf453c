"""Compiling a program at a var key the runtime has not seen: the Qwen3-4B fast manifest's
prefill program (319 calls) at new `tokens` counts, on the host with stand-in addresses,
functions and a BLAS that caches plans by shape (what the runtime's own does), so only the
compile itself is timed: no driver, no cuBLASLt heuristics.

Rows: `ProgramTemplate.compile` at a new key (the template built once, beforehand), beside the
plain `compile_program` at other new keys in the same run (the peer); building the template
once. Median over KEYS new keys each.
Run: `uv run python -m bench compile` (from the repository root).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kern_manifest import Manifest, parse_manifest
from kern_runtime._program import ProgramTemplate, Resources, Step, compile_program
from kern_runtime.blas import GemmShape

MANIFEST = Path("examples/qwen3-4b-fast.json")
PROGRAM = "prefill"
KEYS = 40
FIRST = 100


class _Blas:
    """Plans cached by (shape, algo), as the runtime's BLAS does; nothing runs."""

    def __init__(self) -> None:
        self.plans: dict[tuple[GemmShape, tuple[int, ...] | None], tuple[Any, ...]] = {}

    def plan(self, shape: GemmShape, algo: tuple[int, ...] | None) -> tuple[Any, ...]:
        return self.plans.setdefault((shape, algo), (shape, algo))

    def describe(self, plan: tuple[Any, ...]) -> dict[str, int]:
        return {"id": 0}

    def matmul(self, plan: Any, a: int, w: int, c: int, stream: int) -> None:
        return None


def _resources(m: Manifest) -> Resources:
    env = m.var_max
    buffers = {n: (0x10000000 * (i + 1), b.nbytes(env)) for i, (n, b) in enumerate(m.buffers.items())}
    states = {n: (0x7000000000 + (i << 32), 1 << 34) for i, n in enumerate(m.states)}
    scratch = {o: {s: 0x9000000000 + (i << 24) + j * 4096 for j, s in enumerate(op.impl.scratch)}
               for i, (o, op) in enumerate(m.ops.items())}  # fmt: skip
    funcs = {(o, i): object() for o, op in m.ops.items() for i in range(len(op.impl.launches))}
    return Resources(m, buffers, states, scratch, funcs, _Blas(), {}, 0)  # type: ignore[arg-type]


def _median_ms(fn: Callable[[int], object], keys: range) -> float:
    times: list[float] = []
    for n in keys:
        start = time.perf_counter()
        fn(n)
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1e3, 3)


def _templated(template: ProgramTemplate, res: Resources, tokens: int) -> list[Step]:
    """What the runtime does at a new key: check the template still fits, then compile."""
    assert template.fits(res)
    return template.compile(res, {"tokens": tokens})


def run() -> list[dict[str, object]]:
    """Rows: name, value, unit, target, peer (the plain compile measured in this same run)."""
    m = parse_manifest(MANIFEST.read_bytes())
    res = _resources(m)
    calls = len(m.programs[PROGRAM].calls)
    start = time.perf_counter()
    template = ProgramTemplate(res, PROGRAM)
    build_ms = round((time.perf_counter() - start) * 1e3, 3)
    plain_ms = _median_ms(lambda n: compile_program(res, PROGRAM, {"tokens": n}), range(FIRST, FIRST + KEYS))
    fast_ms = _median_ms(lambda n: _templated(template, res, n), range(FIRST + KEYS, FIRST + 2 * KEYS))
    steps = len(template.compile(res, {"tokens": 200}))
    what = f"{MANIFEST.stem} {PROGRAM} ({calls} calls, {steps} steps)"
    return [
        {"name": f"compile at a new tokens key, {what}", "value": fast_ms, "unit": "ms", "target": None,
         "peer": plain_ms, "peer_is": "plain compile_program at a new key"},
        {"name": f"build the program template once, {what}", "value": build_ms, "unit": "ms", "target": None,
         "peer": plain_ms, "peer_is": "plain compile_program at a new key"},
    ]  # fmt: skip
