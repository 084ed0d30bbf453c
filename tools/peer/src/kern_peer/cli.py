"""`python -m kern_peer` (also `kern-peer`): the peer's timings on one GPU as one JSON file.

    python -m kern_peer --weights DIR [--contexts 128,2048,8192,32768] [--prefill 709,4096,16384]
        [--steps 256] [--prefill-reps 5] [--gpu 0] --json OUT.json

Bad input (flags, a checkpoint that is missing or not a Qwen3, no torch, no CUDA device) is one
`kern-peer: message` line on stderr and exit 2, before the GPU is touched; progress goes to stderr
as `kern-peer: ...` lines. The JSON: {"peer", "torch", "device", "compile_s", "decode": [{"context",
"fed_ms_per_token", "fixed_ms_per_token", "cache_tokens"}], "prefill": [{"tokens", "ms"}]}.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, NoReturn

from kern_peer.config import PeerConfig, PeerConfigError, checkpoint_files, read_config

__all__ = ["PeerArgs", "PeerUsageError", "UsageParser", "check_torch", "ints", "main", "parse_args"]

PROG = "kern-peer"
MIN_STEPS = 16


class PeerUsageError(Exception):
    """Bad flags or inputs: one line, exit 2."""


class UsageParser(argparse.ArgumentParser):
    """A parser whose errors are `PeerUsageError`s naming its prog's --help."""

    def error(self, message: str) -> NoReturn:
        raise PeerUsageError(f"{message} (see {self.prog} --help)")


@dataclass(frozen=True, slots=True)
class PeerArgs:
    """The checked command line."""

    config: PeerConfig
    files: tuple[Path, ...]
    contexts: tuple[int, ...]
    prefill: tuple[int, ...]
    steps: int
    prefill_reps: int
    gpu: int
    json: Path

    @property
    def cache_tokens(self) -> int:
        """The KV cache the timings need: each context's steps (and warm-up) and each prompt."""
        from_decode = max(c + self.steps + 16 for c in self.contexts)
        return max(from_decode, max(self.prefill))


def ints(flag: str, text: str) -> tuple[int, ...]:
    """Comma-separated positive integers of a flag (`PeerUsageError` otherwise)."""
    items = text.split(",")
    if any(not t.strip() for t in items):
        raise PeerUsageError(f"{flag} has an empty item in {text!r}: give comma-separated positive integers")
    try:
        values = tuple(int(t) for t in items)
    except ValueError:
        raise PeerUsageError(f"{flag} must be comma-separated integers, got {text!r}") from None
    if min(values) < 1:
        raise PeerUsageError(f"{flag} needs positive integers, got {text!r}")
    return values


def _parser() -> UsageParser:
    p = UsageParser(prog=PROG, description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--version", action="version", version=f"{PROG} {_version()}")
    p.add_argument("--weights", type=Path, nargs="+", required=True, help="checkpoint directory or .safetensors files")
    p.add_argument("--contexts", default="128,2048,8192,32768", help="decode contexts, comma separated")
    p.add_argument("--prefill", default="709,4096,16384", help="prompt lengths, comma separated")
    p.add_argument("--steps", type=int, default=256, help=f"timed decode steps per context (>= {MIN_STEPS})")
    p.add_argument("--prefill-reps", type=int, default=5, help="prefill repetitions (median)")
    p.add_argument("--gpu", type=int, default=0, help="CUDA device ordinal")
    p.add_argument("--json", type=Path, required=True, help="write the result here")
    return p


def _version() -> str:
    try:
        return version("kern-peer")
    except PackageNotFoundError:
        return "unknown (not installed)"


def parse_args(argv: Sequence[str]) -> PeerArgs:
    """The command line, checked without torch and without a GPU.

    Raises:
        PeerUsageError: a bad flag or input.
    """
    a = _parser().parse_args(list(argv))
    contexts, prefill = ints("--contexts", a.contexts), ints("--prefill", a.prefill)
    if a.steps < MIN_STEPS:
        raise PeerUsageError(f"--steps must be at least {MIN_STEPS}, got {a.steps}")
    if a.prefill_reps < 1 or a.gpu < 0:
        raise PeerUsageError(f"--prefill-reps must be at least 1 and --gpu not negative, got {a.prefill_reps}, {a.gpu}")
    parent = a.json.parent
    if a.json.is_dir() or not parent.is_dir():
        raise PeerUsageError(f"--json {a.json}: not a file in an existing directory")
    try:
        config_path, files = checkpoint_files(a.weights)
        config = read_config(config_path)
    except PeerConfigError as exc:
        raise PeerUsageError(str(exc)) from None
    args = PeerArgs(config, tuple(files), contexts, prefill, a.steps, a.prefill_reps, a.gpu, a.json)
    if args.cache_tokens > config.max_pos:
        raise PeerUsageError(f"the contexts and prompts need {args.cache_tokens} positions; the model holds "
                             f"{config.max_pos} (max_position_embeddings)")
    return args


def check_torch(gpu: int, *more: str) -> None:
    """torch (and `more` modules of the gpu-test group) installed, and CUDA device `gpu` seen.

    Raises:
        PeerUsageError: what is missing, one line.
    """
    for name in ("torch", *more):
        if importlib.util.find_spec(name) is None:
            raise PeerUsageError(f"{name} is not installed (uv sync --group gpu-test, or pip install {name})")
    import torch

    if not torch.cuda.is_available():
        raise PeerUsageError("torch sees no CUDA device")
    if gpu >= torch.cuda.device_count():
        raise PeerUsageError(f"--gpu {gpu}: torch sees {torch.cuda.device_count()} CUDA device(s)")


def _log(msg: str) -> None:
    print(f"{PROG}: {msg}", file=sys.stderr, flush=True)


def run(args: PeerArgs) -> dict[str, Any]:
    """Load the checkpoint, time everything, return the result (torch imported here)."""
    import torch

    from kern_peer.model import Peer
    from kern_peer.timing import run_all

    device = torch.device("cuda", args.gpu)
    torch.cuda.set_device(device)
    with torch.no_grad():
        _log(f"loading {len(args.files)} file(s), cache of {args.cache_tokens} positions")
        peer = Peer(args.config, args.files, device, args.cache_tokens)
        result = run_all(peer, args.contexts, args.prefill, args.steps, args.prefill_reps, _log)
    label = (f"torch {torch.__version__}: torch.compile (inductor, default mode), SDPA over a static KV cache, "
             "one CUDA graph per decode step, the next token fed on the device")
    return {"peer": label, "torch": torch.__version__, "device": torch.cuda.get_device_name(device), **result}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m kern_peer` / `kern-peer`."""
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
        check_torch(args.gpu)
    except PeerUsageError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    result = run(args)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    _log(f"wrote {args.json}")
    return 0
