"""How far kern bench's PyTorch peer (tools/peer) is from transformers, and whether it repeats.

    PYTHONPATH=tools/gpu:tools/tests python3 tools/lab/peer_error.py OUT [--model 4b] [--prompts 37,709,2200]

On a random-weight checkpoint (qwen3_checks.write_checkpoint, the Qwen3-4B shape by default), for
each prompt: the first-step logits of transformers float32 (eager), transformers bf16 (eager, twice:
its repeatability) and the peer under several inductor settings, each compiled afresh
(torch._dynamo.reset) and run twice; per run the relative L2 error of the first-step logits against
float32, the largest logit error in bf16 ulps of the logit, and the greedy tokens against
transformers bf16 (where they part and transformers' top-1 minus top-2 gap there). Prints a table
and writes OUT/peer_error.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import qwen3_checks as checks
import torch

from kern_peer import checkpoint_files, read_config
from kern_peer.model import Peer

SETTINGS: dict[str, dict[str, Any]] = {
    "default": {},
    "no-autotune": {"triton.autotune_pointwise": False, "coordinate_descent_tuning": False},
}
STEPS = 32


@contextlib.contextmanager
def _inductor(settings: dict[str, Any]) -> Iterator[None]:
    import torch._inductor.config as cfg

    with cfg.patch(settings):
        yield


def _errors(logits: np.ndarray, ref32: np.ndarray) -> dict[str, float]:
    diff = logits.astype(np.float64) - ref32
    ulps = np.abs(diff) / np.array([checks.bf16_ulp(float(v)) for v in ref32])
    return {
        "rel_l2": float(np.linalg.norm(diff) / np.linalg.norm(ref32)),
        "max_ulps": float(ulps.max()),
        "max_abs": float(np.abs(diff).max()),
        "logit_absmax": float(np.abs(ref32).max()),
    }


def _tokens(got: list[int], ref: list[int], gaps: list[float]) -> dict[str, Any]:
    j = next((i for i, (a, b) in enumerate(zip(got, ref, strict=True)) if a != b), None)
    return {"diverge_at": j, "gap_ulps": None if j is None else round(gaps[j], 2)}


def _peer_run(peer: Peer, prompt: list[int]) -> tuple[list[int], np.ndarray]:
    n = len(prompt)
    peer.prefill(torch.tensor(prompt[:-1], dtype=torch.long, device=peer.device))
    g = peer.graph(n + STEPS)
    peer.set_state(prompt[-1], n - 1)
    g.replay()
    first = peer.logits[0].float().cpu().numpy()
    out = [int(peer.tok.item())]
    for _ in range(STEPS - 1):
        g.replay()
        out.append(int(peer.tok.item()))
    return out, first


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--model", default="4b", choices=("tiny", "4b"))
    ap.add_argument("--prompts", default="37,709,2200")
    args = ap.parse_args()
    from kern_qwen3 import QWEN3_4B_CONFIG, QWEN3_TINY_CONFIG

    cfg = dict(QWEN3_4B_CONFIG if args.model == "4b" else QWEN3_TINY_CONFIG)
    rec = checks.Recorder(args.out)
    ckpt = checks.write_checkpoint(rec, args.model, cfg)
    assert ckpt is not None, rec.checks[-1].detail
    config_path, files = checkpoint_files([ckpt])
    pcfg = read_config(config_path)
    ps = checks.prompts(pcfg.vocab, [int(x) for x in args.prompts.split(",")])
    rows: list[dict[str, Any]] = []
    with torch.no_grad():
        model = checks._hf(ckpt, torch.float32)  # pyright: ignore[reportPrivateUsage]
        ref32 = {n: checks.hf_logits32(model, p).astype(np.float64) for n, p in ps.items()}
        del model
        checks._free()  # pyright: ignore[reportPrivateUsage]
        model = checks._hf(ckpt, torch.bfloat16)  # pyright: ignore[reportPrivateUsage]
        ref: dict[int, tuple[list[int], list[float]]] = {}
        for rep in range(2):
            for n, p in ps.items():
                toks, gaps, first = checks.hf_greedy(model, p, STEPS)
                ref.setdefault(n, (toks, gaps))
                rows.append(
                    {
                        "who": "transformers-bf16",
                        "run": rep,
                        "prompt": n,
                        **_errors(first, ref32[n]),
                        **_tokens(toks, *ref[n]),
                        "top_gap_ulps": round(gaps[0], 2),
                    }
                )
        del model
        checks._free()  # pyright: ignore[reportPrivateUsage]
        for name, settings in SETTINGS.items():
            for rep in range(2):
                torch._dynamo.reset()  # pyright: ignore[reportPrivateUsage]
                with _inductor(settings):
                    peer = Peer(pcfg, files, torch.device("cuda", 0), max(ps) + STEPS + 16)
                    for n, p in ps.items():
                        toks, first = _peer_run(peer, p)
                        rows.append(
                            {
                                "who": f"peer-{name}",
                                "run": rep,
                                "prompt": n,
                                **_errors(first, ref32[n]),
                                **_tokens(toks, *ref[n]),
                            }
                        )
                del peer
                checks._free()  # pyright: ignore[reportPrivateUsage]
    (args.out / "peer_error.json").write_text(json.dumps(rows, indent=1) + "\n")
    print(f"{'who':22} run prompt  rel_l2    max_ulps  max_abs  |logit|max diverge gap")
    for r in rows:
        print(
            f"{r['who']:22} {r['run']:3} {r['prompt']:6} {r['rel_l2']:.3e} {r['max_ulps']:8.1f} {r['max_abs']:8.4f} "
            f"{r['logit_absmax']:8.3f} {r['diverge_at']!s:>7} {r['gap_ulps']!s:>5}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
