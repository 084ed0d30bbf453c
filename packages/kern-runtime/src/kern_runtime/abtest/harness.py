"""The stages of one A/B test: A loaded, run over the workload and recorded, run again with
another chunking (the noise pass) and timed, then closed with its weights kept (`into_resident`);
B loaded over them and run on the same workload from the same zeroed states, compared run by run
as it goes, and timed. The workload's runs come first, then its batches (where both manifests have
a batched step); a batch's rows are compared as a run's are. A failure of B's load or of one of its
runs or batches is B's crash: the ones before it are still compared."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from . import compare
from .compare import RowStats
from .drive import Record, Side, drive
from .ladder import Evidence, Verdict, judge
from .options import AbOptions
from .pair import Facts, Pair
from .perf import Timing, time_side
from .rows import drive_batch
from .workload import Batch, Run, draw_batches, draw_workload

__all__ = ["Loader", "Result", "StateCheck", "ab_test"]

Item = Run | Batch
"""One sequence of the workload, or one batch of them."""


class Loader(Protocol):
    """Loads the two sides: A with its weights, B over A's kept weights."""

    def reference(self) -> Side:
        """A, ready to run."""
        ...

    def candidate(self, resident: object) -> Side:
        """B, its weights claimed from `resident` (what A's `into_resident` kept) where identical."""
        ...


@dataclass(frozen=True, slots=True)
class _Kept:
    """What a run of A leaves for the comparison: its rows, and per state a write set and digest."""

    logits: NDArray[np.float32]
    dtype: str
    tokens: NDArray[np.int64]
    written: Mapping[str, NDArray[np.bool_]]
    digests: Mapping[str, bytes]


@dataclass(slots=True)
class StateCheck:
    """One state of A against B's: compared byte for byte only when laid out alike.

    Attributes:
        compared: both declare it alike.
        outside: B's bytes outside A's write set, all runs together.
        equal: every run left the same bytes on both sides.
    """

    compared: bool
    outside: int = 0
    equal: bool = True


@dataclass(slots=True)
class _Tally:
    """B's comparison as its runs come in."""

    stats: list[RowStats] = field(default_factory=list[RowStats])
    logit_bits: bool = True
    logit_values: bool = True
    tokens: bool = True
    token_flips: int = 0
    states: dict[str, StateCheck] = field(default_factory=dict[str, StateCheck])
    domain: dict[str, int] = field(default_factory=dict[str, int])
    crash: str | None = None


@dataclass(frozen=True, slots=True)
class Result:
    """One A/B test.

    Attributes:
        seed: the workload's seed.
        runs: the workload.
        pair: the two manifests.
        stats: B's rows against A's (up to B's crash).
        noise: A's rows against its noise pass (None: no noise pass).
        states: each state's check, by name.
        domain: B's outputs outside a declared domain, one line each.
        evidence: what the ladder judged.
        verdict: its answer.
        timing: A's and B's timings (`A`, `B`; empty without the timing stage or after a crash).
        completed: B's runs and batches compared (the runs first).
        batches: the workload's batches (none unless both manifests have a batched step).
    """

    seed: int
    runs: tuple[Run, ...]
    pair: Pair
    stats: RowStats
    noise: RowStats | None
    states: Mapping[str, StateCheck]
    domain: tuple[str, ...]
    evidence: Evidence
    verdict: Verdict
    timing: Mapping[str, Timing]
    completed: int
    batches: tuple[Batch, ...] = ()

    @property
    def batched_rows(self) -> int:
        """B's rows of batches compared."""
        return sum(b.rows for b in self.batches[: max(0, self.completed - len(self.runs))])


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _keep(rec: Record) -> _Kept:
    return _Kept(rec.logits, rec.dtype, rec.tokens,
                 {n: compare.written_blocks(img) for n, img in rec.states.items()},
                 {n: hashlib.blake2b(img.tobytes()).digest() for n, img in rec.states.items()})


def _drive(side: Side, f: Facts, item: Item, *, noise: bool = False, states: bool = True) -> Record:
    """`item` on `side` at its chunk (`noise`: its noise pass's)."""
    chunk = item.noise_chunk if noise else item.chunk
    if isinstance(item, Batch):
        return drive_batch(side, f, item, chunk, states=states)
    return drive(side, f, item, chunk, states=states)


def _label(items: tuple[Item, ...], i: int) -> str:
    before = sum(isinstance(it, Batch) for it in items[:i])
    return f"batch {before}" if isinstance(items[i], Batch) else f"run {i - before}"


def _counted(items: tuple[Item, ...]) -> str:
    batches = sum(isinstance(it, Batch) for it in items)
    return f"{len(items) - batches} runs" + (f", {batches} batches" if batches else "")


def _reference(side: Side, pair: Pair, items: tuple[Item, ...], options: AbOptions,
               log: Callable[[str], None]) -> tuple[list[_Kept], RowStats | None, Timing | None]:
    log(f"A: {_counted(items)}")
    kept = [_keep(_drive(side, pair.a, it)) for it in items]
    noise = None
    if options.noise:
        log("A: the noise pass (another chunking)")
        noise = RowStats.concat([compare.row_stats(k.logits, _drive(side, pair.a, it, noise=True, states=False).logits)
                                 for k, it in zip(kept, items, strict=True)])
    timing = None
    if options.perf:
        log("A: timing")
        timing = time_side(side, pair.a, pair.common, options.iters)
    return kept, noise, timing


def _alike(pair: Pair, name: str) -> bool:
    a, b = pair.a, pair.b
    return name in a.states and name in b.states and a.layout(name) == b.layout(name)


def _check_states(t: _Tally, pair: Pair, a: _Kept, rec: Record) -> None:
    for name in sorted({*a.digests, *rec.states}):
        check = t.states.setdefault(name, StateCheck(compared=_alike(pair, name)))
        if not check.compared:
            continue
        image = rec.states[name]
        check.outside += compare.outside_bytes(a.written[name], image)
        check.equal &= hashlib.blake2b(image.tobytes()).digest() == a.digests[name]


def _check_domains(t: _Tally, b: Facts, rec: Record) -> None:
    outputs: dict[str, NDArray[Any]] = {b.roles.next_token: rec.tokens, b.logits: rec.logits}
    for name, (low, high) in b.domains.items():
        bad = compare.out_of_domain(outputs[name], low, high)
        if bad:
            t.domain[name] = t.domain.get(name, 0) + bad


def _compare(t: _Tally, pair: Pair, a: _Kept, rec: Record) -> None:
    t.stats.append(compare.row_stats(a.logits, rec.logits))
    t.logit_bits &= a.dtype == rec.dtype and compare.bits_equal(a.logits, rec.logits)
    t.logit_values &= compare.values_equal(a.logits, rec.logits)
    t.tokens &= compare.bits_equal(a.tokens, rec.tokens)
    t.token_flips += int(np.count_nonzero(compare.off_top(rec.logits, rec.tokens)
                                          & ~compare.off_top(a.logits, a.tokens)))
    _check_states(t, pair, a, rec)
    _check_domains(t, pair.b, rec)


def _candidate(loader: Loader, resident: object, pair: Pair, items: tuple[Item, ...], kept: list[_Kept],
               options: AbOptions, log: Callable[[str], None]) -> tuple[_Tally, Timing | None]:
    t = _Tally()
    log(f"B: {_counted(items)}")
    try:
        side = loader.candidate(resident)
    except Exception as exc:
        t.crash = f"at load: {_one_line(exc)}"
        return t, None
    try:
        _run_candidate(t, side, pair, items, kept)
        timing = _time_candidate(t, side, pair, options, log)
    finally:
        _close(t, side)
    return t, timing


def _time_candidate(t: _Tally, side: Side, pair: Pair, options: AbOptions,
                    log: Callable[[str], None]) -> Timing | None:
    if not options.perf or t.crash is not None:
        return None
    log("B: timing")
    try:
        return time_side(side, pair.b, pair.common, options.iters)
    except Exception as exc:
        t.crash = f"in the timing: {_one_line(exc)}"
        return None


def _close(t: _Tally, side: Side) -> None:
    try:
        side.close()
    except Exception as exc:
        t.crash = t.crash or f"at close: {_one_line(exc)}"


def _run_candidate(t: _Tally, side: Side, pair: Pair, items: tuple[Item, ...], kept: list[_Kept]) -> None:
    for i, (item, a) in enumerate(zip(items, kept, strict=True)):
        try:
            rec = _drive(side, pair.b, item)
        except Exception as exc:
            t.crash = f"in {_label(items, i)}: {_one_line(exc)}"
            return
        _compare(t, pair, a, rec)


def _domain_lines(t: _Tally, b: Facts) -> tuple[str, ...]:
    out = []
    for name, count in sorted(t.domain.items()):
        low, high = b.domains[name]
        out.append(f"{name}: {count} values outside [{'' if low is None else low}, {'' if high is None else high}]")
    return tuple(out)


def _evidence(t: _Tally, stats: RowStats, noise: RowStats | None, domain: tuple[str, ...],
              options: AbOptions) -> Evidence:
    flips = stats.flips(options.logit_kl)
    if noise is not None and noise.rows >= stats.rows:
        flips &= noise.agree[: stats.rows]
    states_equal = all(c.compared and c.equal for c in t.states.values())
    complete = t.crash is None
    return Evidence(
        rows=stats.rows, domain=domain, nonfinite_rows=int(np.count_nonzero(stats.nonfinite)),
        outside_bytes=sum(c.outside for c in t.states.values()), crash=t.crash, flips=int(np.count_nonzero(flips)),
        token_flips=t.token_flips,
        bits_identical=complete and t.logit_bits and t.tokens and states_equal,
        values_identical=complete and t.logit_values and t.tokens and states_equal,
        logits_identical=complete and t.logit_bits,
        within_noise=complete and noise is not None and compare.within_noise(stats, noise),
        kl_max=float(stats.kl.max()) if stats.rows else float("inf"), logit_kl=options.logit_kl)


def ab_test(loader: Loader, pair: Pair, options: AbOptions, log: Callable[[str], None] = lambda s: None) -> Result:
    """Run the stages (see the module's docstring) and judge. Errors of A (the reference) propagate;
    B's are its crash."""
    runs = draw_workload(options.seed, pair.a.roles, pair.b.roles, options)
    batches = draw_batches(options.seed, pair.a.roles, pair.b.roles, options) if pair.no_batch() is None else ()
    items: tuple[Item, ...] = (*runs, *batches)
    side = loader.reference()
    try:
        kept, noise, timing_a = _reference(side, pair, items, options, log)
        resident = side.into_resident()
    except BaseException:
        side.close()
        raise
    tally, timing_b = _candidate(loader, resident, pair, items, kept, options, log)
    stats = RowStats.concat(tally.stats)
    domain = _domain_lines(tally, pair.b)
    evidence = _evidence(tally, stats, noise, domain, options)
    timing = {"A": timing_a, "B": timing_b} if timing_a is not None and timing_b is not None else {}
    return Result(options.seed, runs, pair, stats, noise, dict(tally.states), domain, evidence, judge(evidence),
                  timing, len(tally.stats), batches)
