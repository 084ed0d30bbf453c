"""`kern test`'s report: one fact per line, each with its section first (`workload`, `pair`,
`noise`, `logits`, `state`, `domain`, `crash`, `perf`), the verdict last; or the same as JSON."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .compare import NOISE_KL_FACTOR, RowStats
from .harness import Result
from .ladder import Verdict
from .perf import Timing

__all__ = ["Report", "report_of"]


@dataclass(frozen=True, slots=True)
class Report:
    """The facts of one A/B test, in order, and its verdict.

    Attributes:
        facts: (section, text) pairs.
        verdict: the ladder's answer.
        evidence: what the ladder judged, as plain values.
    """

    facts: tuple[tuple[str, str], ...]
    verdict: Verdict
    evidence: Mapping[str, Any]

    def text(self) -> str:
        """One `section text` line per fact, the verdict's line last."""
        return "\n".join([*(f"{s} {t}" for s, t in self.facts), self.verdict.line()])

    def json(self) -> str:
        """The report as a JSON object: facts, evidence, verdict, reason and exit status."""
        return json.dumps({"facts": [{"section": s, "text": t} for s, t in self.facts],
                           "evidence": self.evidence, "verdict": self.verdict.outcome.name,
                           "reason": self.verdict.reason, "exit": self.verdict.exit_code}, indent=2)


def _g(x: float) -> str:
    return f"{x:.3g}"


def _total(r: Result) -> int:
    """The rows of the workload: each run's and each batch's."""
    return sum(len(run.decode) + 1 for run in r.runs) + sum(b.rows for b in r.batches)


def _workload(r: Result) -> Iterator[str]:
    rows = sum(len(run.decode) + 1 for run in r.runs)
    steps = [len(run.decode) for run in r.runs]
    yield (f"seed {r.seed:#x}: {len(r.runs)} runs, {rows} rows, capacity {r.pair.a.capacity}, decode steps "
           f"{min(steps)}..{max(steps)}")
    for i, run in enumerate(r.runs):
        yield (f"run {i}: prompt {len(run.prompt)} ({run.drawn}), chunk {run.chunk}, {len(run.decode)} decode ids, "
               f"noise chunk {run.noise_chunk}")
    yield from _batches(r)


def _batches(r: Result) -> Iterator[str]:
    why = r.pair.no_batch()
    if why is not None:
        yield f"batched rows: not driven, {why}: single-row runs only"
        return
    if not r.batches:
        yield "batched rows: not driven, the capacity holds no 2 sequences beside the decode steps"
        return
    rows = r.pair.a.roles.rows
    assert rows is not None
    n = len(r.batches)
    yield (f"batched rows: {n} batch{'es' if n != 1 else ''}, {sum(b.rows for b in r.batches)} rows through "
           f"{rows.program}")
    for i, b in enumerate(r.batches):
        lengths = ", ".join(str(len(p)) for p in b.prompts)
        yield (f"batch {i}: {len(b.prompts)} sequences, prompts {lengths}, chunk {b.chunk}, {len(b.decode[0])} "
               f"decode ids each, noise chunk {b.noise_chunk}")


def _pair(r: Result) -> Iterator[str]:
    a, b = r.pair.a, r.pair.b
    yield f"A {a.model}: programs {', '.join(a.programs)}; logits {a.logits} ({a.manifest.buffers[a.logits].dtype})"
    yield f"B {b.model}: programs {', '.join(b.programs)}; logits {b.logits} ({b.manifest.buffers[b.logits].dtype})"
    yield f"common programs {', '.join(r.pair.common)}; vocabulary {a.vocab}"


def _noise(noise: RowStats | None) -> Iterator[str]:
    if noise is None:
        yield "skipped"
        return
    flips = int(np.count_nonzero(~noise.agree))
    yield (f"A against itself, another chunking: KL max {_g(noise.kl.max())} mean {_g(noise.kl.mean())} nat, "
           f"argmax flips {flips} of {noise.rows} rows, top-20 logits moved up to {_g(noise.shift.max())}")
    yield (f"band: KL max up to {_g(NOISE_KL_FACTOR * noise.kl.max())} nat ({NOISE_KL_FACTOR:g}x), argmax flips "
           f"where A's top-1 - top-2 margin is at most {_g(2 * noise.shift.max())}")


def _logits(r: Result) -> Iterator[str]:
    s, e = r.stats, r.evidence
    total = _total(r)
    if not s.rows:
        yield f"no rows compared of {total}"
        return
    yield f"rows {s.rows} of {total}: KL(A || B) max {_g(s.kl.max())} mean {_g(float(np.mean(s.kl)))} nat"
    if r.batches:
        yield f"batched rows compared: {r.batched_rows} of {sum(b.rows for b in r.batches)}"
    yield f"argmax agrees on {int(np.count_nonzero(s.agree))} of {s.rows} rows; flips failing above {e.logit_kl:g} nat: {e.flips}"
    yield f"next token off B's top logit where A's is on A's: {e.token_flips} rows"
    disagree = ~s.agree
    if disagree.any():
        yield f"A's top-1 - top-2 margin on flipped rows: max {_g(s.margin[disagree].max())}"
    yield f"rank of A's token in B: max {int(s.rank.max())}; top-20 overlap min {int(s.overlap.min())} mean {_g(s.overlap.mean())}"
    yield f"non-finite where A's are finite: {e.nonfinite_rows} rows"
    yield f"byte for byte: {_yes(e.logits_identical)}; within the noise band: {_yes(e.within_noise)}"


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _states(r: Result) -> Iterator[str]:
    for name, c in sorted(r.states.items()):
        if not c.compared:
            yield f"{name}: declared or paged apart on the two sides, not compared"
        else:
            yield f"{name}: {c.outside} bytes written outside A's write set; identical {_yes(c.equal)}"


def _domains(r: Result) -> Iterator[str]:
    for name, (low, high) in sorted(r.pair.b.domains.items()):
        bad = next((line for line in r.domain if line.startswith(f"{name}:")), None)
        yield bad or f"{name}: every value within [{'' if low is None else low}, {'' if high is None else high}]"


def _ratio(a: float, b: float) -> str:
    return f"B/A {b / a:.2f}" if a > 0 else "B/A -"


def _perf(timing: Mapping[str, Timing]) -> Iterator[str]:
    a, b = timing["A"], timing["B"]
    yield (f"step graph TPOT at context {a.context}: A {a.tpot_ms:.3f} ms, B {b.tpot_ms:.3f} ms, "
           f"{_ratio(a.tpot_ms, b.tpot_ms)} (median of replays)")
    if a.batched is not None and b.batched is not None and a.batched[0] == b.batched[0]:
        rows, ba, bb = a.batched[0], a.batched[1], b.batched[1]
        yield (f"batched step of {rows} rows at context {a.context}: A {ba:.3f} ms, B {bb:.3f} ms, "
               f"{_ratio(ba, bb)} (median of replays)")
    for n in sorted(set(a.prefill_ms) & set(b.prefill_ms)):
        pa, pb = a.prefill_ms[n], b.prefill_ms[n]
        yield f"prefill {n} tokens: A {pa:.3f} ms, B {pb:.3f} ms, {_ratio(pa, pb)}"
    for program in sorted(set(a.calls) & set(b.calls)):
        yield from _calls(program, a.calls[program], b.calls[program])


def _calls(program: str, a: Any, b: Any) -> Iterator[str]:
    ka = {k: (n, us) for k, n, us in a}
    kb = {k: (n, us) for k, n, us in b}
    ta, tb = sum(us for _, us in ka.values()), sum(us for _, us in kb.values())
    yield f"{program} call by call: A {ta:.1f} us, B {tb:.1f} us, {_ratio(ta, tb)}"
    for kind in sorted(set(ka) | set(kb), key=lambda k: -max(ka.get(k, (0, 0.0))[1], kb.get(k, (0, 0.0))[1])):
        ca, cb = ka.get(kind), kb.get(kind)
        cell_a = f"{ca[1]:.1f} us in {ca[0]:g}" if ca else "-"
        cell_b = f"{cb[1]:.1f} us in {cb[0]:g}" if cb else "-"
        yield f"{program}.{kind}: A {cell_a}, B {cell_b}"


def _plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return list(value) if isinstance(value, tuple) else value


def report_of(result: Result) -> Report:
    """The report of `result`."""
    sections: list[tuple[str, Iterator[str]]] = [
        ("workload", _workload(result)), ("pair", _pair(result)), ("noise", _noise(result.noise)),
        ("logits", _logits(result)), ("state", _states(result)), ("domain", _domains(result)),
    ]
    if result.evidence.crash is not None:
        sections.append(("crash", iter([f"B {result.evidence.crash}"])))
    if result.timing:
        sections.append(("perf", _perf(result.timing)))
    facts = tuple((name, line) for name, lines in sections for line in lines)
    evidence = {k: _plain(v) for k, v in dataclasses.asdict(result.evidence).items()}
    return Report(facts, result.verdict, evidence)
