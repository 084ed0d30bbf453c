"""`kern-pool-sim`: replay a seeded multi-turn chat workload through Pool + Prefix + Host.

Sessions share a few system prompts; each turn appends a user message to the session's history,
looks the prompt up in the prefix index, restores (or wakes) what it can, leases the rest,
"decodes" an answer, retires the lease into a checkpoint and inserts it under the new history.
Sessions are picked with Zipf weights, `batch` turns at a time. Every decision is kern_pool's;
the workload comes from a local SplitMix64 generator, so the same arguments give the same run.

Knobs are checked before anything runs (`Workload.check`): counts positive, sizes not negative,
`--zipf` finite in [0, 10], `--seed` in [0, 2**64), every integer within i64, at most
`MAX_WORKLOAD_TOKENS` tokens of sessions and system prompts, a pool of at most `MAX_POOL_OBJECTS`
pages and slots in at most `MAX_DEVICE_BYTES`; `--json FILE` must be writable before the run.
Errors are one `kern-pool-sim: message` line, exit 2. `kern-pool-sim serve` replays a serving
workload through the scheduler instead (kern_pool.sim_serve; its --help lists its flags).
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from itertools import accumulate
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, TextIO

from kern_pool.cache import CacheFull, KVCache, PoolDevice, Reuse, Source
from kern_pool.chunks import Capacity, PagedState, PoolConfig, SeqState, pool_config
from kern_pool.errors import PoolError
from kern_pool.host import Host, Parked
from kern_pool.pages import Checkpoint, Lease, Pool
from kern_pool.prefix import Hit

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = [
    "MAX_DEVICE_BYTES",
    "MAX_POOL_OBJECTS",
    "MAX_WORKLOAD_TOKENS",
    "MAX_ZIPF",
    "Figures",
    "SimError",
    "Workload",
    "main",
    "simulate",
]

_MASK = (1 << 64) - 1
_I64_MAX = (1 << 63) - 1
VOCAB = 151_000
MAX_WORKLOAD_TOKENS = 1 << 24
"""Most tokens a workload may generate: sessions x the longest session, plus the system prompts."""
MAX_POOL_OBJECTS = 1 << 22
"""Most pages plus slots a simulated pool may hold (each is host bookkeeping)."""
MAX_DEVICE_BYTES = 1 << 40
"""Largest simulated device budget (1 TiB)."""
MAX_ZIPF = 10.0
"""Largest Zipf exponent (beyond it every turn goes to the same session)."""
PROG = "kern-pool-sim"


class SimError(PoolError):
    """The workload cannot run on the configured budget (say which knob to turn)."""


class SplitMix64:
    """A tiny seeded generator with a fixed, version-independent sequence."""

    __slots__ = ("_state",)

    def __init__(self, seed: int) -> None:
        self._state = seed & _MASK

    def next(self) -> int:
        self._state = (self._state + 0x9E3779B97F4A7C15) & _MASK
        z = self._state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        return z ^ (z >> 31)

    def uniform(self) -> float:
        return (self.next() >> 11) / float(1 << 53)

    def between(self, lo: int, hi: int) -> int:
        """An integer in [lo, hi]."""
        return lo + self.next() % (hi - lo + 1)

    def tokens(self, n: int) -> list[int]:
        return [self.next() % VOCAB for _ in range(n)]


@dataclass(frozen=True, slots=True)
class Workload:
    """The simulated service: workload shape and budgets (tokens and bytes)."""

    seed: int = 0
    sessions: int = 200
    turns: int = 4
    system_prompts: int = 4
    system_len: int = 1024
    prompt_len: int = 128
    answer_len: int = 192
    zipf: float = 1.1
    batch: int = 8
    tokens: int = 65_536
    unit: int = 16
    host_tokens: int = 0
    bytes_per_token: int = 147_456
    state_bytes: int = 0

    def check(self) -> None:
        """Raises SimError naming the first bad knob (see the module docstring for the limits)."""
        for name in ("seed", "sessions", "turns", "system_prompts", "system_len", "prompt_len", "answer_len",
                     "batch", "tokens", "unit", "host_tokens", "bytes_per_token", "state_bytes"):
            value: object = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise SimError(f"{flag(name)} must be an integer, got {value!r}")
            if value > _I64_MAX and name != "seed":
                raise SimError(f"{flag(name)} {value} is over {_I64_MAX}")
        for name in ("sessions", "turns", "system_prompts", "prompt_len", "answer_len", "batch", "tokens", "unit", "bytes_per_token"):
            if getattr(self, name) <= 0:
                raise SimError(f"{flag(name)} must be positive")
        if self.system_len < 0 or self.host_tokens < 0 or self.state_bytes < 0:
            raise SimError("--system-len, --host-tokens and --state-bytes must not be negative")
        if not 0 <= self.seed <= _MASK:
            raise SimError(f"--seed {self.seed} is outside [0, 2**64)")
        if not (math.isfinite(self.zipf) and 0 <= self.zipf <= MAX_ZIPF):
            raise SimError(f"--zipf must be a finite number in [0, {MAX_ZIPF:g}], got {self.zipf!r}")
        tokens = self.sessions * self.longest + self.system_prompts * self.system_len
        if tokens > MAX_WORKLOAD_TOKENS:
            raise SimError(
                f"the workload is {tokens} tokens (sessions x longest session + system prompts), over "
                f"{MAX_WORKLOAD_TOKENS}: lower --sessions, --turns or the lengths"
            )

    @property
    def longest(self) -> int:
        """The longest a session can grow (its last turn's prompt plus answer)."""
        return self.system_len + self.turns * (self.prompt_len * 3 // 2 + self.answer_len * 3 // 2)


@dataclass(slots=True)
class Figures:
    """What a run measured (the JSON keys)."""

    hit_rate: float = 0.0
    tokens_total: int = 0
    tokens_recomputed: int = 0
    parks: int = 0
    wakes: int = 0
    evictions: int = 0
    remaps: int = 0
    peak_pages: int = 0
    peak_slots: int = 0
    pages_in_use_end: int = 0
    slots_in_use_end: int = 0
    turns: int = 0


@dataclass(slots=True)
class _Session:
    system: int
    history: list[int] = field(default_factory=list[int])
    left: int = 0


@dataclass(slots=True)
class _Turn:
    session: _Session
    lease: Lease
    full: list[int]


def flag(name: str) -> str:
    """The command-line flag of a workload field: `--prompt-len` for `prompt_len`."""
    return "--" + name.replace("_", "-")


def _pool_config(w: Workload) -> PoolConfig:
    """The pool for a checked workload, refused when it is beyond what is simulated."""
    per_seq = (SeqState("state", w.state_bytes),) if w.state_bytes else ()
    row = -(-w.longest // w.unit)
    # NOTE: before pool_config, which would size (and refuse) chunks for any budget
    budget = w.tokens * w.bytes_per_token + (w.batch + 2) * w.state_bytes
    if budget > MAX_DEVICE_BYTES:
        raise SimError(
            f"the device budget is {budget} bytes (--tokens x --bytes-per-token, plus --state-bytes per slot),"
            f" over {MAX_DEVICE_BYTES} (1 TiB): lower them"
        )
    cfg = pool_config(
        (PagedState("kv", w.bytes_per_token),), per_seq, unit=w.unit, row_pages=row,
        capacity=Capacity(w.tokens, w.batch),
    )
    if cfg.pages_max + cfg.slots_max > MAX_POOL_OBJECTS:
        raise SimError(
            f"the pool would hold {cfg.pages_max} pages and {cfg.slots_max} slots, over {MAX_POOL_OBJECTS} in all:"
            " raise --unit or --state-bytes, or lower --tokens"
        )
    return cfg


class _Sim:
    def __init__(self, w: Workload) -> None:
        w.check()
        cfg = _pool_config(w)
        self.w = w
        self.pool, _ = Pool.create(cfg)
        page_bytes = w.unit * w.bytes_per_token
        slot_units = max(1, -(-w.state_bytes // page_bytes))
        units = w.host_tokens // w.unit
        self.host = Host(self.pool, units, 1, slot_units) if units else None
        self.cache = KVCache(PoolDevice(self.pool, self.host), park=self.host is not None)
        self.rng = SplitMix64(w.seed)
        self.figures = Figures()
        systems = [self.rng.tokens(w.system_len) for _ in range(w.system_prompts)]
        self.sessions = [
            _Session(s, list(systems[s]), w.turns)
            for s in (self.rng.next() % w.system_prompts for _ in range(w.sessions))
        ]

    def _track(self) -> None:
        f = self.figures
        f.peak_pages = max(f.peak_pages, self.pool.pages_used)
        f.peak_slots = max(f.peak_slots, self.pool.slots_used)

    def _acquire(self, decision: Reuse, hit: Hit[Checkpoint, Parked] | None, tokens: int) -> Lease:
        """The manager's lease for `decision` (it makes room itself), its refusal as the sim's."""
        try:
            lease = self.cache.acquire(decision, hit, tokens)
        except CacheFull as full:
            raise SimError(f"{full}; nothing left to evict: raise --tokens or lower --batch") from None
        self._track()
        return lease

    def pick(self, active: list[_Session]) -> list[_Session]:
        """Up to `batch` distinct sessions, Zipf-weighted by rank among the active ones."""
        cumulative = list(accumulate(1.0 / (i + 1) ** self.w.zipf for i in range(len(active))))
        want = min(self.w.batch, len(active))
        chosen: list[_Session] = []
        for _ in range(want * 4):
            i = bisect.bisect_right(cumulative, self.rng.uniform() * cumulative[-1])
            s = active[min(i, len(active) - 1)]
            if s not in chosen:
                chosen.append(s)
                if len(chosen) == want:
                    break
        return chosen

    def start(self, s: _Session) -> _Turn:
        w, f = self.w, self.figures
        prompt = s.history + self.rng.tokens(self.rng.between(w.prompt_len // 2, w.prompt_len * 3 // 2))
        full = prompt + self.rng.tokens(self.rng.between(w.answer_len // 2, w.answer_len * 3 // 2))
        decision, hit = self.cache.decide(prompt, ())
        lease = self._acquire(decision, hit, len(full))
        if decision.source is Source.PARKED:
            self.cache.keep_woken(lease, prompt[: decision.length])
            self._track()
        f.tokens_total += len(prompt)
        f.tokens_recomputed += len(prompt) - decision.length
        lease.kv_indices(decision.length, len(full))
        return _Turn(s, lease, full)

    def finish(self, turn: _Turn) -> None:
        self.cache.retire(turn.lease, turn.full)
        turn.session.history = turn.full
        turn.session.left -= 1
        self.figures.turns += 1

    def run(self, progress: TextIO | None) -> Figures:
        total = self.w.sessions * self.w.turns
        active = list(self.sessions)
        shown = -1
        while active:
            turns = [self.start(s) for s in self.pick(active)]
            for turn in turns:
                self.finish(turn)
            active = [s for s in active if s.left]
            if progress is not None and 100 * self.figures.turns // total != shown:
                shown = 100 * self.figures.turns // total
                _bar(progress, self.figures.turns, total)
        self.cache.clear()
        f = self.figures
        c = self.cache.counters
        f.parks, f.wakes, f.evictions = c.parks, c.wakes, c.evictions
        f.hit_rate = 1.0 - f.tokens_recomputed / f.tokens_total if f.tokens_total else 0.0
        f.remaps = self.pool.remaps
        f.pages_in_use_end = self.pool.pages_used
        f.slots_in_use_end = self.pool.slots_used
        return f


def _bar(out: TextIO, done: int, total: int) -> None:
    filled = 30 * done // total
    out.write(f"\rkern-pool-sim [{'#' * filled}{'.' * (30 - filled)}] {100 * done // total:3d}% {done}/{total} turns")
    if done == total:
        out.write("\n")
    out.flush()


def simulate(workload: Workload, progress: TextIO | None = None) -> Figures:
    """Run the workload; the same workload always gives the same figures.

    Raises:
        SimError: a bad knob, or a budget that cannot hold one batch.
        PoolError: a configuration kern_pool refuses.
    """
    return _Sim(workload).run(progress)


_HELP = {
    "seed": "seed of the workload's PRNG (same seed, same figures)",
    "sessions": "chat sessions in the workload",
    "turns": "turns per session (each turn: prompt in, answer out)",
    "system_prompts": "distinct shared system prompts the sessions start from",
    "system_len": "tokens of each system prompt",
    "prompt_len": "mean user-prompt tokens per turn",
    "answer_len": "mean answer tokens per turn",
    "zipf": "Zipf exponent of which session speaks next (reuse skew)",
    "batch": "sessions served concurrently",
    "tokens": "device KV budget in tokens",
    "unit": "tokens per page",
    "host_tokens": "pinned host tier in tokens (0: no host tier, evictions drop)",
    "bytes_per_token": "KV bytes per token (chunk sizing)",
    "state_bytes": "per-sequence state bytes (0: stateless, pure KV)",
}


SHOWN = 48
"""The longest word a message echoes whole (a value or name past it is cut, its length said)."""


def clip(message: str) -> str:
    """`message` with every word longer than SHOWN characters cut (`999...(3000 chars)`), so no
    echoed value makes the line long."""
    return " ".join(w if len(w) <= SHOWN else f"{w[:SHOWN]}...({len(w)} chars)" for w in message.split(" "))


class Parser(argparse.ArgumentParser):
    """Argparse errors as one `PROG: message (see PROG --help)` line, exit 2."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: {clip(message)} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def _version() -> str:
    try:
        return f"{PROG} {version('kern-pool')}"
    except PackageNotFoundError:
        return f"{PROG} unknown (not installed)"


def _parser() -> argparse.ArgumentParser:
    p = Parser(prog=PROG, description=__doc__.splitlines()[0] if __doc__ else None,
               epilog=f"{PROG} serve [flags]: replay a serving workload (requests arriving at a rate, each a "
                      f"prompt and an answer) through kern_pool.Scheduler, in steps; see {PROG} serve --help.")
    p.add_argument("--version", action="version", version=_version())
    defaults = Workload()
    for name in Workload.__dataclass_fields__:
        value = getattr(defaults, name)
        p.add_argument(flag(name), type=type(value), default=value,
                       metavar=type(value).__name__.upper(), help=f"{_HELP[name]} (default {value})")
    p.add_argument("--json", type=Path, default=None, metavar="FILE", help="also write the figures as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def output_problem(path: Path) -> str | None:
    """Why `path` cannot be written, or None (nothing is written)."""
    try:
        if path.is_dir():
            return f"{path}: is a directory"
        if not path.parent.is_dir():
            missing = not path.parent.exists()
            return f"{path}: directory {path.parent} " + ("does not exist" if missing else "is not a directory")
        if not os.access(path if path.exists() else path.parent, os.W_OK):
            return f"{path}: not writable"
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    return None


def table(figures: DataclassInstance, digits: int = 4) -> str:
    """A figures dataclass as aligned `name  value` lines, floats with `digits` decimals."""
    rows = [(k, f"{v:.{digits}f}" if isinstance(v, float) else str(v)) for k, v in asdict(figures).items()]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point: run, print the table, optionally write `--json FILE`; `serve ...`
    replays a serving workload through the scheduler (kern_pool.sim_serve)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["serve"]:
            from kern_pool import sim_serve

            return sim_serve.main(argv[1:])
        return _run(_parser().parse_args(argv))
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        print(f"\n{PROG}: interrupted", file=sys.stderr)
        return 130


def _fail(message: str) -> int:
    print(f"{PROG}: {clip(message)}", file=sys.stderr)
    return 2


def _run(args: argparse.Namespace) -> int:
    workload = Workload(**{k: getattr(args, k) for k in Workload.__dataclass_fields__})
    problem = output_problem(args.json) if args.json is not None else None
    if problem is not None:
        return _fail(f"--json {problem}")
    try:
        figures = simulate(workload, None if args.quiet else sys.stderr)
    except PoolError as exc:
        return _fail(str(exc))
    print(table(figures))
    sys.stdout.flush()
    if args.json is not None:
        try:
            args.json.write_text(json.dumps(asdict(figures), indent=2, sort_keys=True) + "\n")
        except OSError as exc:
            return _fail(f"--json {args.json}: cannot write ({exc.strerror or exc})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
