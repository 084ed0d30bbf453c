"""A capture workload: transformers' Qwen3 with random weights, eager, greedy generate.

One warm-up request, then PROMPTS requests of growing length with NEW_TOKENS tokens each (one
prefill forward and NEW_TOKENS-1 one-token decode forwards), requests separated by 200 ms of idle.
Writes --expected (token counts per forward, per request) and --timing (seconds spent in the timed
requests, excluding the idle time).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, Qwen3Config

WARMUP = 11
PROMPTS = (6, 23, 64)  # NOTE: mixed parity, so ceil(t/2)-shaped grids cannot pass for t
NEW_TOKENS = 4
IDLE_S = 0.2


def model() -> torch.nn.Module:
    config = Qwen3Config(
        vocab_size=2048,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=1024,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    return m.to(device="cuda", dtype=torch.bfloat16).eval()


def request(m: torch.nn.Module, length: int) -> float:
    ids = torch.randint(1, 2048, (1, length), device="cuda")
    start = time.perf_counter()
    with torch.inference_mode():
        m.generate(  # type: ignore[operator]
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            do_sample=False,
            pad_token_id=0,
        )
    torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--timing", type=Path, required=True)
    parser.add_argument("--expected", type=Path)
    args = parser.parse_args()
    m = model()
    torch.cuda.synchronize()
    time.sleep(IDLE_S)
    request(m, WARMUP)
    timed = 0.0
    for length in PROMPTS:
        time.sleep(IDLE_S)
        timed += request(m, length)
    args.timing.write_text(json.dumps({"seconds": timed}))
    if args.expected:
        # NOTE: the warm-up request absorbs lazy loading; only the timed requests are compared.
        timed_windows = [[n, *[1] * (NEW_TOKENS - 1)] for n in PROMPTS]
        args.expected.write_text(
            json.dumps({"windows": timed_windows, "warmup": [[WARMUP, *[1] * (NEW_TOKENS - 1)]]})
        )


if __name__ == "__main__":
    main()
