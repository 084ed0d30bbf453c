"""Analysis of a capture with no model knowledge: windows, forwards, tokens, sites, fits, ABI.

1. Request windows: the launch stream is cut at time gaps longer than a threshold chosen from the
   data: `window_gap_ms` is the floor, raised to the strongest break (a ratio of BREAK_RATIO or
   more) in the sorted gaps above it, so host work between steps does not cut a request. A gap that
   ends at a symbol's first launch is load time (lazy loading), not idle time, unless it looks like
   the idle gaps (see `_windows`); load time is taken out of the clock for the steps below.
2. Forward passes: each of the most frequent symbols is tried as the core kernel, which runs in
   one dense burst per forward. Bursts are runs of core launches at most `burst_gap` launches and
   `forward_gap_ms` apart (the host work between forwards, sampling and input preparation, shows
   as a time gap or as a long stretch without the core kernel). Between two bursts the cut goes at
   a time gap that dominates the others there, else where the longest common suffix with a
   window's own head (the launches before its first burst) begins, else at the midpoint. Each
   symbol in at least half the windows is also tried as the recurring first kernel of a forward
   (cuts right before each of its launches). The segmentation kept is the one that looks most like
   forward passes: no window whose first forward swallows the prefill (a decode-only core), some
   kernel that runs exactly once in every forward, bursts before anchors, then among bursts more
   launches inside forwards (a kernel one shape alone selects runs in one burst in one window
   and reads as a one-forward capture that skips every other request), then more such kernels,
   more forwards, and more kernels with a constant count per forward (`_regularity`).
3. Call sites are (symbol, ordinal within the forward), the ordinal counted against the most common
   per-forward count; a forward with one launch too many or too few (boundary jitter) is aligned by
   relative position.
4. The tokens reference is chosen by the data: among call sites (each runs once per forward) whose
   grid.x varies, the one whose grid.x, taken as t, leaves the fewest unfit and underdetermined
   fits, among those present in the most forwards; ties go to more fits that are t itself, then
   to kernels that run once per forward. When
   the smallest value divides all others (a one-token decode forward), it is taken as one token:
   a grid.x of a*t still reads as t, and `scale` records a.
5. Pointer parameters are classified by (allocation start, offset) across forwards: stable and
   used by one site = weight, stable and shared across sites = persistent, varying = workspace.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Literal

from kern_mining.dump import Dump, RecordedLaunch, load_dump
from kern_mining.fit import Fit, fit_samples

__all__ = [
    "AbiEntry",
    "Analysis",
    "AnalyzeConfig",
    "ForwardPass",
    "PointerClass",
    "Site",
    "SkippedWindow",
    "TokensReference",
    "Window",
    "analyze",
    "analyze_dir",
]

PointerClass = Literal["weight", "persistent", "workspace"]
SCALAR_SIZES = (1, 2, 4, 8)
BREAK_RATIO = 8.0
CORE_CANDIDATES = 12
ANCHOR_CANDIDATES = 64
CUT_DOMINANCE = 4.0


@dataclass(frozen=True)
class AnalyzeConfig:
    """Thresholds of the analysis.

    Attributes:
        window_gap_ms: the floor of the window gap: only longer gaps can start a new request
            window (the threshold rises to the strongest break in the gaps above it).
        burst_gap: core-kernel launches at most this many launches apart belong to one burst.
        forward_gap_ms: core-kernel launches further apart in time than this end a burst.
    """

    window_gap_ms: float = 5.0
    burst_gap: int = 25
    forward_gap_ms: float = 0.5


@dataclass(slots=True, frozen=True)
class ForwardPass:
    """One forward pass: positions [first, last] in time order and its token count."""

    first: int
    last: int
    tokens: int | None


@dataclass(frozen=True)
class Window:
    """One request window (positions [first, last]) and the forwards found in it."""

    first: int
    last: int
    forwards: tuple[ForwardPass, ...]


@dataclass(slots=True, frozen=True)
class SkippedWindow:
    """A time window that holds no forward pass, and why."""

    first: int
    last: int
    reason: str


@dataclass(frozen=True)
class TokensReference:
    """The call site whose grid.x, divided by `scale`, is taken as the token count, and how well
    everything fits then."""

    symbol: str
    ordinal: int
    scale: int
    unfit: int
    underdetermined: int
    candidates: int


@dataclass(frozen=True)
class Site:
    """One call site: its grid and scalar fits and its pointer classes."""

    symbol: str
    ordinal: int
    forwards: int
    grid: tuple[Fit, Fit, Fit]
    scalars: tuple[tuple[int, Fit], ...]
    pointers: tuple[tuple[int, PointerClass | None], ...]


@dataclass(frozen=True)
class AbiEntry:
    """How one symbol receives its parameters."""

    symbol: str
    layout: Literal["flat", "packed", "unknown"]
    params: int | None
    param_sizes: tuple[int, ...] | None
    max_param_size: int | None
    pointer_params: int
    launches: int


@dataclass(frozen=True)
class Analysis:
    """The result of `analyze`; `undecided` lists what the data could not decide."""

    dump: Path
    launches: int
    core: str
    windows: tuple[Window, ...]
    skipped_windows: tuple[SkippedWindow, ...]
    tokens_reference: TokensReference | None
    sites: tuple[Site, ...]
    abi: tuple[AbiEntry, ...]
    notes: tuple[str, ...]
    undecided: tuple[str, ...]

    @property
    def forwards(self) -> list[ForwardPass]:
        """Every forward of every window, in order."""
        return [f for w in self.windows for f in w.forwards]

    def to_json(self) -> dict[str, object]:
        """The machine-readable report (see docs/mining.md)."""
        ref = self.tokens_reference
        return {
            "dump": str(self.dump),
            "launches": self.launches,
            "core": self.core,
            "windows": [
                {
                    "first": w.first,
                    "last": w.last,
                    "forwards": [
                        {"first": f.first, "last": f.last, "tokens": f.tokens} for f in w.forwards
                    ],
                }
                for w in self.windows
            ],
            "skipped_windows": [
                {"first": w.first, "last": w.last, "reason": w.reason} for w in self.skipped_windows
            ],
            "tokens_reference": None
            if ref is None
            else {
                "symbol": ref.symbol,
                "ordinal": ref.ordinal,
                "scale": ref.scale,
                "unfit": ref.unfit,
                "underdetermined": ref.underdetermined,
                "candidates": ref.candidates,
            },
            "sites": [_site_json(s) for s in self.sites],
            "abi": [
                {
                    "symbol": a.symbol,
                    "layout": a.layout,
                    "params": a.params,
                    "param_sizes": None if a.param_sizes is None else list(a.param_sizes),
                    "max_param_size": a.max_param_size,
                    "pointer_params": a.pointer_params,
                    "launches": a.launches,
                }
                for a in self.abi
            ],
            "notes": list(self.notes),
            "undecided": list(self.undecided),
        }

    def render(self) -> str:
        """A readable report."""
        from kern_mining._report import render

        return render(self)


def _site_json(s: Site) -> dict[str, object]:
    return {
        "symbol": s.symbol,
        "ordinal": s.ordinal,
        "forwards": s.forwards,
        "grid": [g.to_json() for g in s.grid],
        "scalars": [{"param": i, "fit": f.to_json()} for i, f in s.scalars],
        "pointers": [{"param": i, "class": c} for i, c in s.pointers],
    }


# ------------------------------------------------------------------ windows and forwards


def _gap_threshold(gaps: Sequence[float], floor_ns: float) -> float:
    """The window gap: the configured floor, raised to the strongest break in the gaps above it.

    Gaps above the floor are sorted; where one is more than BREAK_RATIO times the next, the
    smaller ones are host work inside a request (a scheduler step, a sampler), not idle time.
    """
    above = sorted((g for g in gaps if g > floor_ns), reverse=True)
    best, threshold = BREAK_RATIO, floor_ns
    for a, b in pairwise(above):
        if b > 0 and a / b >= best:
            best, threshold = a / b, b
    return threshold


def _windows(
    launches: Sequence[RecordedLaunch], floor_ns: float
) -> tuple[list[tuple[int, int]], list[int]]:
    """Request windows, and launch times with load gaps taken out.

    A gap that ends at a symbol's first launch may be load time (lazy loading of a module or a
    function inside a forward) rather than idle time. It is taken as load time when some symbol
    launched before it runs again later (host work that never recurs, weight init, keeps its gap),
    unless it looks like the idle gaps found elsewhere: the launch before it is one that ends
    another window, or the first known launch after it is one that starts another window.
    """
    n = len(launches)
    symbols = [la.symbol for la in launches]
    last_seen = {s: i for i, s in enumerate(symbols)}
    gaps = [0] + [b.t_ns - a.t_ns for a, b in pairwise(launches)]
    seen: set[str] = set()
    fresh: set[int] = set()
    loads: set[int] = set()
    reach = -1
    for i, s in enumerate(symbols):
        if s not in seen:
            fresh.add(i)
            if i and reach >= i:
                loads.add(i)
        seen.add(s)
        reach = max(reach, last_seen[s])
    threshold = _gap_threshold([g for i, g in enumerate(gaps) if i and i not in loads], floor_ns)
    cuts = {i for i in range(1, n) if i not in loads and gaps[i] > threshold}
    enders = {symbols[i - 1] for i in cuts}
    starters = {symbols[i] for i in cuts} | ({symbols[0]} if n else set())
    for i in sorted(loads):
        if gaps[i] <= threshold:
            # NOTE: a short gap stays: it may be the host's work between forwards, which the
            # burst segmentation reads, at a symbol that happens to run first there (a copy).
            loads.discard(i)
            continue
        known = next((j for j in range(i, min(n, i + 3)) if j not in fresh), None)
        if symbols[i - 1] in enders or (known is not None and symbols[known] in starters):
            loads.discard(i)
            cuts.add(i)
    times: list[int] = []
    removed = 0
    for i, la in enumerate(launches):
        removed += gaps[i] if i in loads else 0
        times.append(la.t_ns - removed)
    starts = [0, *sorted(cuts)]
    ends = [s - 1 for s in starts[1:]] + [n - 1]
    return list(zip(starts, ends, strict=True)), times


def _bursts(
    positions: list[int], times: Sequence[int], config: AnalyzeConfig
) -> list[tuple[int, int]]:
    gap_ns = config.forward_gap_ms * 1e6
    bursts: list[tuple[int, int]] = [(positions[0], positions[0])]
    for p in positions[1:]:
        prev = bursts[-1][1]
        if p - prev <= config.burst_gap and times[p] - times[prev] <= gap_ns:
            bursts[-1] = (bursts[-1][0], p)
        else:
            bursts.append((p, p))
    return bursts


def _common_suffix(a: Sequence[str], b: Sequence[str]) -> int:
    n = 0
    while n < len(a) and n < len(b) and a[-1 - n] == b[-1 - n]:
        n += 1
    return n


def _cut(
    symbols: Sequence[str], times: Sequence[int], after: int, before: int, head: Sequence[str]
) -> int:
    """The first position of the next forward, between bursts ending at `after` and starting at
    `before`: at a time gap that dominates the others there (the host's work between forwards),
    else where the longest common suffix with a window's head begins, else at the midpoint."""
    gaps = sorted(
        ((times[i] - times[i - 1], i) for i in range(after + 1, before + 1)), reverse=True
    )
    if len(gaps) == 1 or (len(gaps) > 1 and gaps[0][0] >= CUT_DOMINANCE * max(1, gaps[1][0])):
        return gaps[0][1]
    between = symbols[after + 1 : before]
    matched = _common_suffix(between, head)
    if matched:
        return before - matched
    return (after + before + 1) // 2


def _forward_bounds(
    symbols: Sequence[str],
    times: Sequence[int],
    window: tuple[int, int],
    core: str,
    head: Sequence[str],
    config: AnalyzeConfig,
) -> list[tuple[int, int]]:
    first, last = window
    positions = [i for i in range(first, last + 1) if symbols[i] == core]
    if not positions:
        return []
    bursts = _bursts(positions, times, config)
    starts = [first] + [_cut(symbols, times, a[1], b[0], head) for a, b in pairwise(bursts)]
    ends = [s - 1 for s in starts[1:]] + [last]
    return list(zip(starts, ends, strict=True))


def _head(symbols: Sequence[str], windows: list[tuple[int, int]], core: str) -> list[str]:
    """The most common run of launches before a window's first core launch."""
    heads: Counter[tuple[str, ...]] = Counter()
    for first, last in windows:
        for i in range(first, last + 1):
            if symbols[i] == core:
                heads[tuple(symbols[first:i])] += 1
                break
    if not heads:
        return []
    return list(max(heads.items(), key=lambda kv: (kv[1], len(kv[0])))[0])


# ------------------------------------------------------------------------- alignment


def _reference_positions(occurrences: list[list[float]], count: int) -> list[float]:
    exact = [occ for occ in occurrences if len(occ) == count]
    return [sorted(occ[k] for occ in exact)[len(exact) // 2] for k in range(count)]


def _align(occ: list[float], ref: list[float]) -> list[tuple[int, int]]:
    """(ordinal, index into occ) pairs for a forward whose count differs from the reference."""
    n, m = len(occ), len(ref)
    best: tuple[float, list[tuple[int, int]]] | None = None
    if n > m:
        for shift in range(n - m + 1):
            cost = sum(abs(occ[shift + k] - ref[k]) for k in range(m))
            if best is None or cost < best[0]:
                best = (cost, [(k, shift + k) for k in range(m)])
    else:
        for shift in range(m - n + 1):
            cost = sum(abs(occ[j] - ref[shift + j]) for j in range(n))
            if best is None or cost < best[0]:
                best = (cost, [(shift + j, j) for j in range(n)])
    assert best is not None
    return best[1]


SiteKey = tuple[str, int]


def _align_sites(
    launches: Sequence[RecordedLaunch], forwards: list[tuple[int, int]]
) -> dict[SiteKey, list[RecordedLaunch | None]]:
    per_symbol: dict[str, list[list[int]]] = defaultdict(lambda: [[] for _ in forwards])
    for f, (first, last) in enumerate(forwards):
        for i in range(first, last + 1):
            per_symbol[launches[i].symbol][f].append(i)
    sites: dict[SiteKey, list[RecordedLaunch | None]] = {}
    for symbol, per_forward in per_symbol.items():
        counts = Counter(len(p) for p in per_forward if p)
        mode = max(counts.items(), key=lambda kv: (kv[1], kv[0]))[0]
        rel = [
            [(i - forwards[f][0]) / max(1, forwards[f][1] - forwards[f][0]) for i in p]
            for f, p in enumerate(per_forward)
        ]
        ref = _reference_positions(rel, mode)
        columns: list[list[RecordedLaunch | None]] = [[None] * len(forwards) for _ in range(mode)]
        for f, p in enumerate(per_forward):
            pairs = (
                [(k, k) for k in range(mode)]
                if len(p) == mode
                else _align(rel[f], ref)
                if p
                else []
            )
            for ordinal, j in pairs:
                columns[ordinal][f] = launches[p[j]]
        for ordinal, column in enumerate(columns):
            sites[(symbol, ordinal)] = column
    return sites


# -------------------------------------------------------------------------- fitting


@dataclass
class _SiteData:
    key: SiteKey
    column: list[RecordedLaunch | None]
    grid: list[list[tuple[int, int]]] = field(default_factory=list[list[tuple[int, int]]])
    scalars: dict[int, list[tuple[int, int]]] = field(
        default_factory=dict[int, list[tuple[int, int]]]
    )
    pointers: dict[int, list[tuple[int, tuple[int | None, int]]]] = field(
        default_factory=dict[int, list[tuple[int, tuple[int | None, int]]]]
    )


def _site_data(key: SiteKey, column: list[RecordedLaunch | None]) -> _SiteData:
    data = _SiteData(key, column, grid=[[], [], []])
    pointer_params: set[int] = set()
    for la in column:
        if la is not None and isinstance(la.params, tuple):
            pointer_params.update(i for i, p in enumerate(la.params) if p.pointer is not None)
    for f, la in enumerate(column):
        if la is None:
            continue
        for axis in range(3):
            data.grid[axis].append((f, la.grid[axis]))
        if not isinstance(la.params, tuple):
            continue
        for i, p in enumerate(la.params):
            if i in pointer_params:
                value = p.value
                where = (
                    (p.pointer.range_start, value - p.pointer.range_start)
                    if p.pointer
                    else (None, value)
                )
                data.pointers.setdefault(i, []).append((f, where))
            elif p.size in SCALAR_SIZES:
                data.scalars.setdefault(i, []).append((f, p.value))
    return data


def _fit(samples: list[tuple[int, int]], tokens: Sequence[int | None]) -> Fit:
    return fit_samples((tokens[f], y) for f, y in samples)


def _score(sites: list[_SiteData], tokens: Sequence[int | None]) -> tuple[int, int, int]:
    unfit = underdetermined = exact = 0
    for site in sites:
        for samples in [*site.grid, *site.scalars.values()]:
            # NOTE: a site seen only at one token count (decode-only kernels under a reference
            # that gives every decode forward t = 1) cannot be decided by any reference, so it
            # says nothing about this one; counting it would favour references that leave those
            # forwards without a token count.
            if len({tokens[f] for f, _ in samples if tokens[f] is not None}) < 2:
                continue
            fit = _fit(samples, tokens)
            unfit += fit.form == "unfit"
            underdetermined += fit.form == "underdetermined"
            exact += fit.form == "tokens"
    return unfit, underdetermined, exact


def _normalized(values: list[int | None]) -> tuple[list[int | None], int]:
    """Divide out a common factor when the smallest value is that factor (a one-token forward)."""
    present = [v for v in values if v is not None]
    g = math.gcd(*present)
    if g <= 1 or min(present) != g:
        return values, 1
    return [None if v is None else v // g for v in values], g


def _candidates(sites: list[_SiteData]) -> list[tuple[SiteKey, list[int | None], int]]:
    """Sites whose grid.x varies, one per distinct token vector: unscaled, once-per-forward first."""
    once = {s.key[0] for s in sites if s.key[1] == 0} - {s.key[0] for s in sites if s.key[1] == 1}
    best: dict[tuple[int | None, ...], tuple[tuple[int, bool, SiteKey], list[int | None], int]] = {}
    for site in sites:
        raw: list[int | None] = [la.grid[0] if la else None for la in site.column]
        if len({t for t in raw if t is not None}) < 2:
            continue
        tokens, scale = _normalized(raw)
        rank = (scale, site.key[0] not in once, site.key)
        kept = best.get(tuple(tokens))
        if kept is None or rank < kept[0]:
            best[tuple(tokens)] = (rank, tokens, scale)
    ordered = sorted(best.values(), key=lambda v: v[0])
    return [(rank[2], tokens, scale) for rank, tokens, scale in ordered]


def _choose_reference(
    sites: list[_SiteData], n_forwards: int
) -> tuple[TokensReference | None, list[int | None]]:
    candidates = _candidates(sites)
    best: tuple[tuple[int, int, int, int, int], TokensReference, list[int | None]] | None = None
    for order, (key, tokens, scale) in enumerate(candidates):
        unfit, under, exact = _score(sites, tokens)
        distinct = len({t for t in tokens if t is not None})
        # NOTE: coverage first: a reference missing from some forwards (a decode-only GEMV)
        # leaves them without a token count, and leaves the sites there unscored, so its own
        # count of failed fits is low for the wrong reason.
        covered = sum(t is not None for t in tokens)
        rank = (-covered, unfit + under, -exact, -distinct, order)
        if best is None or rank < best[0]:
            ref = TokensReference(key[0], key[1], scale, unfit, under, len(candidates))
            best = (rank, ref, tokens)
    if best is None:
        return None, [None] * n_forwards
    return best[1], best[2]


def _classify(sites: list[_SiteData]) -> dict[tuple[SiteKey, int], PointerClass | None]:
    stable: dict[tuple[SiteKey, int], tuple[int | None, int]] = {}
    classes: dict[tuple[SiteKey, int], PointerClass | None] = {}
    for site in sites:
        for param, samples in site.pointers.items():
            where = {w for _, w in samples}
            if len(samples) < 2:
                classes[(site.key, param)] = None
            elif len(where) > 1:
                classes[(site.key, param)] = "workspace"
            else:
                stable[(site.key, param)] = where.pop()
    users: dict[tuple[int | None, int], set[SiteKey]] = defaultdict(set)
    for (key, _), where in stable.items():
        users[where].add(key)
    for (key, param), where in stable.items():
        classes[(key, param)] = "persistent" if len(users[where]) > 1 else "weight"
    return classes


# ------------------------------------------------------------------------------ ABI


def _abi(launches: Sequence[RecordedLaunch]) -> list[AbiEntry]:
    by_symbol: dict[str, list[RecordedLaunch]] = defaultdict(list)
    for la in launches:
        by_symbol[la.symbol].append(la)
    entries: list[AbiEntry] = []
    for symbol in sorted(by_symbol):
        group = by_symbol[symbol]
        flat = [la.params for la in group if isinstance(la.params, tuple)]
        if flat:
            pointers = {i for params in flat for i, p in enumerate(params) if p.pointer is not None}
            sizes = tuple(p.size for p in flat[0])
            entry = AbiEntry(
                symbol, "flat", len(sizes), sizes, max(sizes, default=0), len(pointers), len(group)
            )
        elif any(la.params is None for la in group):
            entry = AbiEntry(symbol, "packed", None, None, None, 0, len(group))
        else:
            entry = AbiEntry(symbol, "unknown", None, None, None, 0, len(group))
        entries.append(entry)
    return entries


# ------------------------------------------------------------------------- analysis


def _fragments(
    symbols: Sequence[str], core: str, kept: list[tuple[tuple[int, int], list[tuple[int, int]]]]
) -> set[int]:
    """Windows whose every forward has under half the usual core count (host-side bits, not passes)."""
    counts = [
        [sum(symbols[i] == core for i in range(a, b + 1)) for a, b in bounds] for _, bounds in kept
    ]
    usual = Counter(c for per in counts for c in per).most_common(1)[0][0]
    return {k for k, per in enumerate(counts) if 2 * max(per) < usual}


def _segment(
    symbols: Sequence[str],
    times: Sequence[int],
    windows: list[tuple[int, int]],
    core: str,
    config: AnalyzeConfig,
) -> tuple[list[tuple[tuple[int, int], list[tuple[int, int]]]], list[SkippedWindow]]:
    head = _head(symbols, windows, core)
    kept: list[tuple[tuple[int, int], list[tuple[int, int]]]] = []
    skipped: list[SkippedWindow] = []
    for window in windows:
        bounds = _forward_bounds(symbols, times, window, core, head, config)
        if bounds:
            kept.append((window, bounds))
        else:
            skipped.append(SkippedWindow(window[0], window[1], "no core kernel"))
    fragments = _fragments(symbols, core, kept)
    for k in sorted(fragments):
        (first, last), _ = kept[k]
        skipped.append(
            SkippedWindow(first, last, "core kernel under half its usual count per forward")
        )
    skipped.sort(key=lambda w: w.first)
    return [w for k, w in enumerate(kept) if k not in fragments], skipped


def _regularity(
    symbols: Sequence[str], kept: list[tuple[tuple[int, int], list[tuple[int, int]]]]
) -> tuple[bool, int, int, int]:
    """How much a segmentation looks like forward passes, best first when compared:

    - merged: a core kernel missing from some forwards (a decode-only GEMV) leaves no cut
      before its first launch in a window, so a window's first forward swallows the prefill
      and runs about twice as long as the others;
    - once: symbols that run exactly once in every forward (embedding, final norm, sampler);
      cuts at every layer leave them out of most pieces, cuts at every request count them
      once per request, not per forward;
    - steady: symbols that run the same nonzero number of times in every forward (cuts at
      every layer leave the kernels before and after the layers out of most pieces);
    - then more forwards.
    """
    forwards = [b for _, bounds in kept for b in bounds]
    if len(forwards) == 1:
        # NOTE: one forward is trivially periodic; it beats reading its layers as forwards.
        first, last = forwards[0]
        distinct = len(set(symbols[first : last + 1]))
        return True, distinct, distinct, 1
    if not forwards:
        return True, 0, 0, 0
    counts: dict[str, list[int]] = defaultdict(lambda: [0] * len(forwards))
    for f, (first, last) in enumerate(forwards):
        for i in range(first, last + 1):
            counts[symbols[i]][f] += 1
    steady = sum(1 for per in counts.values() if min(per) > 0 and min(per) == max(per))
    once = sum(1 for per in counts.values() if min(per) == max(per) == 1)
    heads = [b - a + 1 for _, bounds in kept for a, b in bounds[:1] if len(bounds) > 1]
    rest = [b - a + 1 for _, bounds in kept for a, b in bounds[1:]]
    merged = bool(heads and rest) and 2 * _median(heads) >= 3 * _median(rest)
    return not merged, once, steady, len(forwards)


def _median(values: list[int]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def _anchored(
    symbols: Sequence[str], windows: list[tuple[int, int]], anchor: str
) -> tuple[list[tuple[tuple[int, int], list[tuple[int, int]]]], list[SkippedWindow]]:
    """Forwards that each begin at a launch of `anchor` (the window's first begins at the window)."""
    kept: list[tuple[tuple[int, int], list[tuple[int, int]]]] = []
    skipped: list[SkippedWindow] = []
    for first, last in windows:
        positions = [i for i in range(first, last + 1) if symbols[i] == anchor]
        if not positions:
            skipped.append(SkippedWindow(first, last, "no core kernel"))
            continue
        starts = [first, *positions[1:]]
        ends = [s - 1 for s in starts[1:]] + [last]
        kept.append(((first, last), list(zip(starts, ends, strict=True))))
    return kept, skipped


Segmentation = tuple[list[tuple[tuple[int, int], list[tuple[int, int]]]], list[SkippedWindow]]


def _find_forwards(
    launches: Sequence[RecordedLaunch], config: AnalyzeConfig
) -> tuple[str, list[tuple[tuple[int, int], list[tuple[int, int]]]], list[SkippedWindow]]:
    """Try each frequent symbol as the core of burst segmentation and each symbol present in
    at least half the windows as the first kernel of a forward; keep the segmentation that looks
    most like forward passes (see `_regularity`), bursts before anchors, then the more frequent
    symbol."""
    symbols = [la.symbol for la in launches]
    windows, times = _windows(launches, config.window_gap_ms * 1e6)
    by_count = sorted(Counter(symbols).items(), key=lambda kv: (-kv[1], kv[0]))
    presence: Counter[str] = Counter()
    for first, last in windows:
        presence.update(set(symbols[first : last + 1]))
    tries: list[tuple[str, bool]] = [(core, True) for core, _ in by_count[:CORE_CANDIDATES]]
    tries += [
        (s, False) for s, n in by_count if 2 * presence[s] >= len(windows) and n > len(windows)
    ][:ANCHOR_CANDIDATES]
    best: tuple[tuple[bool, bool, int, int, int, int, int], str, Segmentation] | None = None
    for rank, (core, burst) in enumerate(tries):
        found = (
            _segment(symbols, times, windows, core, config)
            if burst
            else _anchored(symbols, windows, core)
        )
        valid, once, steady, n = _regularity(symbols, found[0])
        # NOTE: bursts first: they cut where the host works between forwards. Cuts at a
        # recurring kernel can also fall at every layer, so they serve only when no burst
        # segmentation has a kernel that runs once in every forward.
        regular = valid and (once > 0 or n == 1)
        # NOTE: then, among regular bursts, the launches inside forwards: a kernel that one
        # shape alone selects (cuBLAS picks a GEMM by shape) can run in one dense burst in one
        # window, a capture of one forward (trivially regular) with every other request skipped
        # for want of it. Not for anchors: they keep every window that holds the anchor, a
        # start-up window too, and count the anchor itself as a kernel once per forward.
        covered = sum(b - a + 1 for (a, b), _ in found[0]) if regular and burst else 0
        score = (regular, regular and burst, covered, once, steady, n, -rank)
        if best is None or score > best[0]:
            best = (score, core, found)
    assert best is not None
    kept, skipped = best[2]
    return best[1], kept, skipped


def _undecided(n_forwards: int, ref: TokensReference | None, sites: Sequence[Site]) -> list[str]:
    notes: list[str] = []
    if n_forwards < 2:
        notes.append(
            "only one forward pass: no fit or pointer class can be decided across forwards"
        )
    if ref is None:
        notes.append("no tokens reference: no kernel runs once per forward with a varying grid.x")
    under = sum(
        f.form == "underdetermined" for s in sites for f in [*s.grid, *(x for _, x in s.scalars)]
    )
    if under:
        notes.append(
            f"{under} grid axes or scalars are underdetermined (too few distinct token counts)"
        )
    open_pointers = sum(c is None for s in sites for _, c in s.pointers)
    if open_pointers:
        notes.append(
            f"{open_pointers} pointer params are seen in fewer than two forwards: class undecided"
        )
    return notes


def analyze(dump: Dump, config: AnalyzeConfig | None = None) -> Analysis:
    """Analyze a loaded dump. Never raises for thin data: the result's `undecided` says what is open."""
    config = config or AnalyzeConfig()
    launches = dump.launches
    core, kept, skipped = _find_forwards(launches, config)
    forwards = [b for _, wb in kept for b in wb]
    columns = _align_sites(launches, forwards)
    data = [_site_data(key, column) for key, column in sorted(columns.items())]
    ref, tokens = _choose_reference(data, len(forwards))
    classes = _classify(data)
    sites = tuple(
        Site(
            symbol=d.key[0],
            ordinal=d.key[1],
            forwards=sum(la is not None for la in d.column),
            grid=(_fit(d.grid[0], tokens), _fit(d.grid[1], tokens), _fit(d.grid[2], tokens)),
            scalars=tuple((i, _fit(s, tokens)) for i, s in sorted(d.scalars.items())),
            pointers=tuple((i, classes[(d.key, i)]) for i in sorted(d.pointers)),
        )
        for d in data
    )
    windows: list[Window] = []
    f = 0
    for (first, last), bounds in kept:
        fwd = tuple(ForwardPass(a, b, tokens[f + k]) for k, (a, b) in enumerate(bounds))
        f += len(bounds)
        windows.append(Window(first, last, fwd))
    return Analysis(
        dump=dump.path,
        launches=len(launches),
        core=core,
        windows=tuple(windows),
        skipped_windows=tuple(skipped),
        tokens_reference=ref,
        sites=sites,
        abi=tuple(_abi(launches)),
        notes=dump.notes,
        undecided=tuple(_undecided(len(forwards), ref, sites)),
    )


def analyze_dir(path: Path, config: AnalyzeConfig | None = None) -> Analysis:
    """Load the dump at `path` (a pid<N> dir, or a capture root holding one) and analyze it."""
    return analyze(load_dump(path), config)
