"""`kern bench serve`'s serving peer, run as a process: `python -m kern_peer.serve_cli` (tools/peer:
transformers' continuous batching on the same checkpoint and workload), which imports torch and
transformers (kern's packages never do). This module plans it, builds its command line, runs it,
checks its JSON result and sets its levels beside kern's; it imports neither kern_peer nor torch."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .peer import (
    PeerError,
    PeerPlan,
    check_mode,
    missing_modules,
    planned,
    qwen3_problem,
    run_process,
)

if TYPE_CHECKING:
    from .serve import Level

__all__ = [
    "SERVE_PEER_MODULE",
    "SERVE_PEER_TIMEOUT_S",
    "ServeWorkload",
    "check_serve_result",
    "checkpoint_dir",
    "plan_serve_peer",
    "run_serve_peer",
    "serve_peer_command",
    "side_by_side",
]

SERVE_PEER_MODULE = "kern_peer.serve_cli"
SERVE_PEER_TIMEOUT_S = 1800
_LEVEL_NUMBERS = ("output_tok_s", "ttft_p50_ms", "ttft_p99_ms")


@dataclass(frozen=True, slots=True)
class ServeWorkload:
    """The workload both sides run (`kern bench serve`'s flags)."""

    clients: tuple[int, ...]
    system: int
    question: int
    max_tokens: int
    rounds: int


def _missing() -> str | None:
    return missing_modules("transformers")


def plan_serve_peer(mode: str, config: Mapping[str, Any] | None) -> PeerPlan:
    """Whether the serving peer runs: `mode` on (it must), auto (when it can) or off. `config` is
    the checkpoint's config.json (None: none found yet; the seeded random checkpoint has one). No
    GPU, no torch import.

    Raises:
        PeerError: `mode` is on and the peer cannot run; `mode` is not one of PEER_MODES.
    """
    check_mode(mode)
    if mode == "off":
        return PeerPlan(False)
    why = _missing()
    if why is None and config is not None:
        why = qwen3_problem(config)
    return planned(mode, why, "the serving peer")


def checkpoint_dir(weights: Sequence[Path]) -> Path:
    """The checkpoint directory the weights come from (transformers loads a directory).

    Raises:
        PeerError: the files lie in several directories, or theirs holds no config.json.
    """
    dirs = {p if p.is_dir() else p.parent for p in weights}
    if len(dirs) != 1:
        raise PeerError(f"the serving peer loads one checkpoint directory; the weights lie in {len(dirs)}")
    (d,) = dirs
    if not (d / "config.json").is_file():
        raise PeerError(f"the serving peer needs {d / 'config.json'} beside the weights")
    return d


def serve_peer_command(checkpoint: Path, w: ServeWorkload, gpu: int, out: Path) -> list[str]:
    """The serving peer's command line (this interpreter, `-m kern_peer.serve_cli`)."""
    return [sys.executable, "-m", SERVE_PEER_MODULE, "--weights", str(checkpoint),
            "--clients", ",".join(map(str, w.clients)), "--system", str(w.system), "--question", str(w.question),
            "--max-tokens", str(w.max_tokens), "--rounds", str(w.rounds), "--gpu", str(gpu), "--json", str(out)]


def check_serve_result(data: Any, w: ServeWorkload) -> dict[str, Any]:
    """The serving peer's JSON result, checked: a level for every client count, each with all its
    requests and tokens, positive rates and latencies.

    Raises:
        PeerError: a missing or malformed field.
    """
    try:
        levels = {int(lv["clients"]): lv for lv in data["levels"]}
    except (KeyError, TypeError, ValueError) as exc:
        raise PeerError(f"serving peer result: missing or malformed field {exc}") from None
    for c in w.clients:
        lv = levels.get(c)
        if lv is None:
            raise PeerError(f"serving peer result: no level of {c} clients")
        if lv.get("requests") != c * w.rounds or lv.get("output_tokens") != c * w.rounds * w.max_tokens:
            raise PeerError(f"serving peer result: the level of {c} clients answered {lv.get('requests')!r} "
                            f"requests with {lv.get('output_tokens')!r} tokens, not {c * w.rounds} with "
                            f"{c * w.rounds * w.max_tokens}")
        for key in _LEVEL_NUMBERS:
            value = lv.get(key)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise PeerError(f"serving peer result: {key} of {c} clients must be a positive number, got {value!r}")
    return data


def run_serve_peer(command: Sequence[str], out: Path, w: ServeWorkload,
                   timeout: float = SERVE_PEER_TIMEOUT_S) -> dict[str, Any]:
    """Runs the serving peer (its `kern-peer-serve: ...` lines go to our stderr as they come) and
    returns its checked result.

    Raises:
        PeerError: it failed, ran past `timeout`, or wrote a malformed result.
    """
    return check_serve_result(run_process(command, out, "the serving peer", "kern-peer-serve", timeout), w)


def side_by_side(levels: Sequence[Level], peer: Mapping[str, Any]) -> str:
    """kern's client levels beside the peer's at the same client counts (kern's first level of a
    count when it measured several ways): tokens/s, kern's over the peer's, TTFT p50 of each."""
    theirs = {int(lv["clients"]): lv for lv in peer["levels"]}
    head = (f"{'clients':>8} {'kern tok/s':>11} {'peer tok/s':>11} {'kern/peer':>10} {'kern TTFT p50':>14} "
            f"{'peer TTFT p50':>14}")
    lines = [f"beside {peer.get('peer', 'the serving peer')}:", head]
    seen: set[int] = set()
    for lv in levels:
        other = theirs.get(lv.clients)
        if other is None or lv.clients in seen:
            continue
        seen.add(lv.clients)
        lines.append(f"{lv.clients:>8} {lv.output_tok_s:>11.1f} {other['output_tok_s']:>11.1f} "
                     f"{lv.output_tok_s / other['output_tok_s']:>10.2f} {lv.ttft_p50_ms:>11.2f} ms "
                     f"{other['ttft_p50_ms']:>11.2f} ms")
    return "\n".join(lines)
