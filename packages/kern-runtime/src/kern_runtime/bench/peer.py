"""`kern bench`'s compiled PyTorch peer, run as a process: `python -m kern_peer` (tools/peer), which
imports torch (kern's packages never do). This module decides whether it runs, builds its command
line, runs it and reads its JSON result into a report; it imports neither kern_peer nor torch."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import KernRuntimeError
from .options import BenchOptions
from .report import Report, peer_rows

__all__ = [
    "PEER_MODES",
    "PEER_MODULE",
    "PEER_TIMEOUT_S",
    "PeerError",
    "PeerPlan",
    "check_mode",
    "check_result",
    "measure_peer",
    "missing_modules",
    "peer_command",
    "plan_peer",
    "planned",
    "qwen3_problem",
    "run_peer",
    "run_process",
]

PEER_MODULE = "kern_peer"
PEER_MODES = ("auto", "on", "off")
PEER_TIMEOUT_S = 600


class PeerError(KernRuntimeError):
    """The peer cannot run as asked (`--peer on` without torch, a checkpoint it cannot read), or
    its run failed or returned a malformed result."""


@dataclass(frozen=True, slots=True)
class PeerPlan:
    """Whether the peer runs, and the one-line reason when it does not."""

    run: bool
    note: str = ""


def missing_modules(*more: str) -> str | None:
    """What keeps a peer from running on this machine: kern_peer, torch or one of `more` (modules
    of the gpu-test group) not installed, as one line; None when all are."""
    needs = [(PEER_MODULE, "install the kern-peer tool (a workspace member: uv sync)"),
             *((m, f"uv sync --group gpu-test, or pip install {m}") for m in ("torch", *more))]
    for module, install in needs:
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed ({install})"
    return None


def _missing() -> str | None:
    return missing_modules()


def check_mode(mode: str) -> None:
    """Raises:
    PeerError: `mode` is not one of PEER_MODES."""
    if mode not in PEER_MODES:
        raise PeerError(f"--peer must be one of {', '.join(PEER_MODES)}, got {mode!r}")


def planned(mode: str, why: str | None, who: str) -> PeerPlan:
    """The plan of a peer (`who`: "the PyTorch peer") in `mode` (on or auto), `why` it cannot run
    (None: it can).

    Raises:
        PeerError: `mode` is on and it cannot run.
    """
    if why is None:
        return PeerPlan(True)
    if mode == "on":
        raise PeerError(f"--peer on: {who} cannot run: {why}")
    return PeerPlan(False, f"{who} is skipped: {why} (--peer off says nothing)")


def qwen3_problem(config: Mapping[str, Any]) -> str | None:
    """Why a checkpoint's config.json is not one the peers run (None: a bf16 Qwen3)."""
    if config.get("model_type") != "qwen3":
        return f"it runs Qwen3 checkpoints, and config.json says model_type {config.get('model_type')!r}"
    quant = config.get("quantization_config")
    if quant is not None:
        method = quant.get("quant_method") if isinstance(quant, Mapping) else None
        return f"it runs bf16 checkpoints, and config.json has a quantization_config ({str(method)[:32]})"
    return None


FP8_MANIFEST = "it runs bf16 checkpoints, and this manifest's weights are FP8 (its default checkpoint is FP8)"


def plan_peer(mode: str, config: Mapping[str, Any] | None, *, default_weights: bool,
              fp8: bool = False) -> PeerPlan:
    """Whether the peer runs: `mode` is on (it must), auto (when it can) or off. `config` is the
    checkpoint's config.json (None: none found); `default_weights`: the seeded random Qwen3-4B
    checkpoint will be used (a Qwen3, FP8 when `fp8`: the manifest binds e4m3 weights). No GPU, no
    torch import.

    Raises:
        PeerError: `mode` is on and the peer cannot run; `mode` is not one of PEER_MODES.
    """
    check_mode(mode)
    if mode == "off":
        return PeerPlan(False)
    why = _missing()
    if why is None and default_weights and fp8:
        why = FP8_MANIFEST
    if why is None and not default_weights:
        why = "the weights have no config.json beside them" if config is None else qwen3_problem(config)
    return planned(mode, why, "the PyTorch peer")


def peer_command(weights: Sequence[Path], *, contexts: Sequence[int], prefill: Sequence[int], steps: int,
                 gpu: int, out: Path) -> list[str]:
    """The peer's command line (this interpreter, `-m kern_peer`)."""
    return [sys.executable, "-m", PEER_MODULE, "--weights", *map(str, weights),
            "--contexts", ",".join(map(str, contexts)), "--prefill", ",".join(map(str, prefill)),
            "--steps", str(steps), "--gpu", str(gpu), "--json", str(out)]


def _number(where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise PeerError(f"peer result: {where} must be a positive number, got {value!r}")
    return float(value)


def check_result(data: Any, contexts: Sequence[int], prefill: Sequence[int]) -> dict[str, Any]:
    """The peer's JSON result, checked: every context and prefill asked for, positive times.

    Raises:
        PeerError: a missing or malformed field.
    """
    if not isinstance(data, dict):
        raise PeerError("peer result: not a JSON object")
    try:
        _number("compile_s", data["compile_s"])
        decode = {int(d["context"]): d for d in data["decode"]}
        prefills = {int(p["tokens"]): p for p in data["prefill"]}
    except (KeyError, TypeError, ValueError) as exc:
        raise PeerError(f"peer result: missing or malformed field {exc}") from None
    for c in contexts:
        if c not in decode:
            raise PeerError(f"peer result: no decode at context {c}")
        _number(f"decode@{c}.fed_ms_per_token", decode[c].get("fed_ms_per_token"))
        _number(f"decode@{c}.fixed_ms_per_token", decode[c].get("fixed_ms_per_token"))
    for n in prefill:
        if n not in prefills:
            raise PeerError(f"peer result: no prefill of {n} tokens")
        _number(f"prefill@{n}.ms", prefills[n].get("ms"))
    return data


def run_process(command: Sequence[str], out: Path, who: str, prog: str, timeout: float) -> Any:
    """Runs a peer's process (its stderr lines, `PROG: ...`, go to ours as they come) and returns
    the JSON it wrote at `out`; `who` names it in the errors ("the PyTorch peer").

    Raises:
        PeerError: it failed, ran past `timeout`, or wrote no readable JSON.
    """
    try:
        proc = subprocess.run(list(command), stdout=subprocess.DEVNULL, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise PeerError(f"{who} ran past {timeout:.0f} s") from None
    except OSError as exc:
        raise PeerError(f"{who} did not start: {exc.strerror or exc}") from None
    if proc.returncode != 0:
        raise PeerError(f"{who} failed (exit {proc.returncode}; its {prog} lines above say why)")
    try:
        return json.loads(out.read_text())
    except (OSError, ValueError) as exc:
        raise PeerError(f"{who} wrote no readable result at {out}: {exc}") from None


def run_peer(command: Sequence[str], out: Path, contexts: Sequence[int], prefill: Sequence[int],
             timeout: float = PEER_TIMEOUT_S) -> dict[str, Any]:
    """Runs the peer (its stderr, `kern-peer: ...` lines, goes to ours as it comes) and returns
    its checked result.

    Raises:
        PeerError: it failed, ran past `timeout`, or wrote a malformed result.
    """
    return check_result(run_process(command, out, "the PyTorch peer", "kern-peer", timeout), contexts, prefill)


def measure_peer(report: Report, weights: Sequence[Path], options: BenchOptions, gpu: int,
                 log: Callable[[str], None]) -> bool:
    """Runs the peer at `options`' contexts, prefills and steps into `report` (its result, its rows,
    its values in the peer column of kern's rows); False, with the reason in `report.notes`, when
    it failed."""
    o = options
    log("the compiled PyTorch peer (python -m kern_peer)")
    with tempfile.TemporaryDirectory(prefix="kern-bench-peer-") as tmp:
        result_path = Path(tmp) / "peer.json"
        cmd = peer_command(weights, contexts=o.contexts, prefill=o.prefill, steps=o.steps, gpu=gpu, out=result_path)
        try:
            result = run_peer(cmd, result_path, o.contexts, o.prefill)
        except PeerError as exc:
            report.notes.append(str(exc))
            return False
    report.peer = result
    report.rows += peer_rows(result, report.rows)
    return True
