"""`kern bench serve`: continuous batching throughput and latency, beside the same engine at one row.

The engine comes from the `kern serve` factory (`--backend`, default the GPU), loaded as `kern
serve` loads it; the measurement is `kern_runtime.bench.measure_levels` (its module doc says what
each level runs and reports): the engine at one row, then per `--clients` count that many clients
in a closed loop, each sending `--rounds` requests of the shared `--system` prompt, a fresh
`--question` and `--max-tokens` tokens. `--pipeline` picks how `Serving` runs its steps: `on` (a step
of unchanged rows issued before the one in flight is read back), `off` (each step read back before
the next is planned) or `both` (each client count measured both ways, off first). `--ride` picks how
prompts are computed: `on` (they ride on the batched step as rows of it; an engine without a batched
step prefills them apart), `off` (each prompt's own pass through the chunk program, as `kern serve`
runs; the default) or `both`. `--first-token` picks where a plain request's first token comes
from: `head` (the head program at the end of its prefill, sent at once), `step` (the first decode
step after the plan's prefills; the default, as `kern serve` runs unless told) or `both`. Every flag
is checked before the engine loads: client counts (each 1..`MAX_CLIENTS`, one thread a client),
rounds (1..`MAX_ROUNDS`), a request's tokens (within `--capacity`), and the `--json` destination (a
write of no bytes: /dev/full is refused then, not after the run). `--peer on|auto` then runs the
serving peer nobody here wrote (`python -m kern_peer.serve_cli`: transformers' continuous batching,
its own process, on the same checkpoint and workload; `kern_runtime.bench.serve_peer`) and prints
its levels beside kern's (with `--json`, its result goes to the same name with `-peer` before the
suffix); off by default, as it takes minutes. A peer that fails is one line and exit 1.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from kern_cli.config import PEER_MODES
from kern_cli.console import (
    Parser,
    add_version,
    fail,
    output_file_problem,
    positive_ints,
    run_handler,
)
from kern_cli.options import RunError, guarded, logger

if TYPE_CHECKING:
    from kern_runtime.bench import Level, PeerPlan, ServeWorkload
    from kern_serve import ServeOptions

__all__ = ["MAX_CLIENTS", "MAX_ROUNDS", "build_parser", "main"]

PROG = "kern bench serve"
MAX_CLIENTS = 1024
"""The most concurrent clients of a level: each is a thread, and `kern serve` runs 64 rows by default."""
MAX_ROUNDS = 10_000
"""The most requests per client (their prompts are drawn before a level starts)."""
_MODES: dict[str, tuple[bool, ...]] = {"on": (True,), "off": (False,), "both": (False, True)}
_FIRST: dict[str, tuple[bool, ...]] = {"head": (True,), "step": (False,), "both": (False, True)}
"""`--first-token` -> ServingConfig.head per level."""


def _check(args: argparse.Namespace) -> None:
    for name in ("system", "question", "max_tokens", "rounds"):
        if getattr(args, name) < 1:
            raise RunError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.rounds > MAX_ROUNDS:
        raise RunError(f"--rounds allows at most {MAX_ROUNDS}, got {args.rounds}")
    if args.json is not None and (problem := output_file_problem(args.json)) is not None:
        raise RunError(f"--json {problem}")


def _check_request(args: argparse.Namespace, capacity: int | None) -> None:
    """Refuses a request (system prompt, question, answer) longer than the KV pool.

    Raises:
        RunError: it does not fit.
    """
    need = args.system + args.question + args.max_tokens
    if capacity is not None and need > capacity:
        raise RunError(f"--system {args.system} + --question {args.question} + --max-tokens {args.max_tokens} "
                       f"= {need} tokens a request, past --capacity {capacity}")


def _workload(args: argparse.Namespace, clients: list[int]) -> ServeWorkload:
    from kern_runtime.bench import ServeWorkload

    return ServeWorkload(tuple(clients), args.system, args.question, args.max_tokens, args.rounds)


def _measure(args: argparse.Namespace, opts: ServeOptions, clients: list[int]) -> list[Level]:
    from kern_cli import serve
    from kern_runtime.bench import measure_levels

    log = logger(PROG)
    return serve.with_engine(opts, log, lambda engine: measure_levels(
        engine, clients, system=args.system, question=args.question, max_tokens=args.max_tokens,
        rounds=args.rounds, rows=opts.rows, step_tokens=opts.step_tokens, chunk=opts.chunk,
        pipeline=_MODES[args.pipeline], ride=_MODES[args.ride], head=_FIRST[args.first_token], log=log))


def _peer_json(path: Path | None) -> Path | None:
    return None if path is None else path.with_name(f"{path.stem}-peer{path.suffix}")


def _peer(args: argparse.Namespace, opts: ServeOptions, workload: ServeWorkload, levels: list[Level]) -> int:
    """The serving peer on the checkpoint kern ran (the seeded random one when none was given),
    its levels printed beside kern's; 1 with one line when it failed."""
    import tempfile

    import kern_runtime.bench as kb
    from kern_runtime.loading import check_inputs, default_weights

    log = logger(PROG)
    weights = opts.load.weights or default_weights(check_inputs(opts.load).manifest, log)
    try:
        ckpt = kb.checkpoint_dir(list(weights))
        log(f"the serving peer (python -m {kb.SERVE_PEER_MODULE}) on {ckpt}")
        with tempfile.TemporaryDirectory(prefix="kern-bench-serve-peer-") as tmp:
            out = _peer_json(args.json) or Path(tmp) / "peer.json"
            result = kb.run_serve_peer(kb.serve_peer_command(ckpt, workload, opts.load.gpu, out), out, workload)
    except kb.PeerError as exc:
        fail(PROG, str(exc))
        return 1
    print(kb.side_by_side(levels, result))
    return 0


def _plan_peer(args: argparse.Namespace, opts: ServeOptions) -> PeerPlan:
    import kern_runtime.bench as kb

    return kb.plan_serve_peer(args.peer, kb.checkpoint_config(opts.load.weights))


def _run(args: argparse.Namespace) -> int:
    from kern_cli import serve
    from kern_runtime.bench import levels_table

    clients = list(positive_ints("--clients", args.clients, RunError, MAX_CLIENTS))
    _check(args)
    opts = serve.resolve(args)
    _check_request(args, opts.load.capacity)
    plan = _plan_peer(args, opts)
    levels = _measure(args, opts, clients)
    print(levels_table(levels))
    if args.json is not None:
        try:
            args.json.write_text(json.dumps([asdict(lv) for lv in levels], indent=2) + "\n")
        except OSError as exc:
            return fail(PROG, f"--json {args.json}: {exc.strerror or exc}")
    if plan.note:
        logger(PROG)(plan.note)
    return _peer(args, opts, _workload(args, clients), levels) if plan.run else 0


def _handle(args: argparse.Namespace) -> int:
    from kern_runtime.bench import BenchError, PeerError

    return guarded(PROG, lambda: _run(args), BenchError, PeerError)


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The `kern bench serve` parser: the `kern serve` flags and the workload's."""
    from kern_cli import serve

    p = Parser(prog=prog, description=__doc__.splitlines()[0] if __doc__ else None)
    add_version(p, prog)
    serve.add_engine_flags(p)
    p.add_argument("--clients", default="1,8,32,64",
                   help=f"concurrent client counts, comma separated (each 1..{MAX_CLIENTS})")
    p.add_argument("--system", type=int, default=512, help="shared system prompt tokens (default 512)")
    p.add_argument("--question", type=int, default=32, help="each request's own prompt tokens (default 32)")
    p.add_argument("--max-tokens", type=int, default=128, help="tokens per request (default 128)")
    p.add_argument("--rounds", type=int, default=4, help=f"requests per client (default 4, at most {MAX_ROUNDS})")
    p.add_argument("--pipeline", choices=sorted(_MODES), default="on",
                   help="on: a step of unchanged rows issued before the one in flight is read back; off: steps in "
                        "turn; both: each client count both ways (default on)")
    p.add_argument("--ride", choices=sorted(_MODES), default="off",
                   help="on: prompts ride on the batched step as rows of it; off: each prompt prefills apart, as "
                        "kern serve does; both: each client count both ways (default off)")
    p.add_argument("--first-token", choices=sorted(_FIRST), default="step",
                   help="head: a plain request's first token from the head program at the end of its prefill, sent "
                        "at once; step: from the first decode step (kern serve's default); both: each client count "
                        "both ways (default step)")
    p.add_argument("--peer", choices=PEER_MODES, default="off",
                   help="the serving peer (transformers' continuous batching, python -m kern_peer.serve_cli) on "
                        "the same checkpoint and workload after kern: on (it must run), auto (when torch, "
                        "transformers and kern-peer are installed), off (default; it takes minutes)")
    p.add_argument("--json", type=Path, help="write the levels as JSON here (the peer's beside it, NAME-peer.json)")
    p.set_defaults(handler=_handle, host="127.0.0.1", port=0, api_key=None, model=None, max_queued=1,
                   max_body=1, tokenizer=None)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """`kern bench serve` (the dispatcher routes `kern bench serve ...` here)."""
    return run_handler(PROG, build_parser(), argv)
