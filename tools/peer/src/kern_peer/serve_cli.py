"""`python -m kern_peer.serve_cli` (also `kern-peer-serve`): transformers' continuous batching on
`kern bench serve`'s workload, one JSON file (kern_peer.serve).

    python -m kern_peer.serve_cli --weights DIR [--clients 1,8,32,64] [--system 512] [--question 32]
        [--max-tokens 128] [--rounds 4] [--gpu 0] --json OUT.json

Bad input (flags, a checkpoint that is missing or not a Qwen3, no torch or transformers, no CUDA
device) is one `kern-peer-serve: message` line on stderr and exit 2, before the GPU is touched. The
JSON: {"peer", "torch", "transformers", "device", "workload", "levels": [{"clients", "requests",
"output_tokens", "wall_s", "output_tok_s", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms",
"tpot_p99_ms"}]}.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kern_peer.cli import PeerUsageError, UsageParser, check_torch, ints
from kern_peer.config import PeerConfigError, checkpoint_files, read_config
from kern_peer.serve import Workload

__all__ = ["ServeArgs", "main", "parse_args"]

PROG = "kern-peer-serve"


@dataclass(frozen=True, slots=True)
class ServeArgs:
    """The checked command line."""

    checkpoint: Path
    workload: Workload
    gpu: int
    json: Path


def _parser() -> UsageParser:
    p = UsageParser(prog=PROG, description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--weights", type=Path, required=True, help="checkpoint directory (config.json + safetensors)")
    p.add_argument("--clients", default="1,8,32,64", help="client counts, comma separated")
    p.add_argument("--system", type=int, default=512, help="shared system prompt tokens")
    p.add_argument("--question", type=int, default=32, help="each request's own prompt tokens")
    p.add_argument("--max-tokens", type=int, default=128, help="tokens generated per request")
    p.add_argument("--rounds", type=int, default=4, help="requests per client")
    p.add_argument("--gpu", type=int, default=0, help="CUDA device ordinal")
    p.add_argument("--json", type=Path, required=True, help="write the result here")
    return p


def parse_args(argv: Sequence[str]) -> ServeArgs:
    """The command line, checked without torch and without a GPU.

    Raises:
        PeerUsageError: a bad flag or input.
    """
    a = _parser().parse_args(list(argv))
    clients = ints("--clients", a.clients)
    for flag, value in (("--system", a.system), ("--question", a.question), ("--max-tokens", a.max_tokens),
                        ("--rounds", a.rounds)):
        if value < 1:
            raise PeerUsageError(f"{flag} must be at least 1, got {value}")
    if a.gpu < 0:
        raise PeerUsageError(f"--gpu must not be negative, got {a.gpu}")
    if a.json.is_dir() or not a.json.parent.is_dir():
        raise PeerUsageError(f"--json {a.json}: not a file in an existing directory")
    if not a.weights.is_dir():
        raise PeerUsageError(f"--weights {a.weights}: not a checkpoint directory")
    try:
        config_path, _files = checkpoint_files([a.weights])
        config = read_config(config_path)
    except PeerConfigError as exc:
        raise PeerUsageError(str(exc)) from None
    need = a.system + a.question + a.max_tokens
    if need > config.max_pos:
        raise PeerUsageError(f"--system + --question + --max-tokens is {need} positions; the model holds "
                             f"{config.max_pos} (max_position_embeddings)")
    workload = Workload(clients, a.system, a.question, a.max_tokens, a.rounds, vocab=min(1000, config.vocab))
    return ServeArgs(a.weights, workload, a.gpu, a.json)


def _log(msg: str) -> None:
    print(f"{PROG}: {msg}", file=sys.stderr, flush=True)


def run(args: ServeArgs) -> dict[str, Any]:
    """Load the checkpoint with transformers (bf16) and measure every level."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, GenerationConfig

    from kern_peer.serve import measure

    device = torch.device("cuda", args.gpu)
    torch.cuda.set_device(device)
    _log(f"loading {args.checkpoint}")
    model = AutoModelForCausalLM.from_pretrained(args.checkpoint, dtype=torch.bfloat16).to(device).eval()
    w = args.workload
    # NOTE: greedy, no stop id (-1 is no token), as kern bench serve's requests run
    config = GenerationConfig(max_new_tokens=w.max_tokens, do_sample=False, eos_token_id=-1, pad_token_id=0)
    with torch.no_grad():
        levels = measure(model.init_continuous_batching(generation_config=config), w, _log)
    return {"peer": f"transformers {transformers.__version__} continuous batching (init_continuous_batching)",
            "torch": torch.__version__, "transformers": transformers.__version__,
            "device": torch.cuda.get_device_name(device), "workload": asdict(args.workload),
            "levels": [level.row() for level in levels]}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m kern_peer.serve_cli` / `kern-peer-serve`."""
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
        check_torch(args.gpu, "transformers")
    except PeerUsageError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    result = run(args)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    _log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
