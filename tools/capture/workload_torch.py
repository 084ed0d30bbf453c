"""A capture workload: a plain PyTorch eager model (embedding, 4 pre-norm MLP blocks, head) run
like a decoder: per request one forward over the prompt, then STEPS one-token forwards, each
followed by argmax().item() (the host sync a sampler makes) and HOST_STEP_S of host work (a serving
engine's scheduler spends about that between steps). Requests are 200 ms apart.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from torch import nn

WARMUP = 9
PROMPTS = (64, 17, 200)
STEPS = 3
IDLE_S = 0.2
HOST_STEP_S = 0.001
WIDTH = 256


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.up = nn.Linear(WIDTH, 4 * WIDTH)
        self.down = nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.down(torch.nn.functional.gelu(self.up(self.norm(h))))


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(1000, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(4))
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, 1000)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))


def request(m: Model, length: int) -> float:
    ids = torch.randint(0, 1000, (length,), device="cuda")
    start = time.perf_counter()
    with torch.inference_mode():
        token = int(m(ids)[-1].argmax().item())
        for _ in range(STEPS):
            time.sleep(HOST_STEP_S)
            token = int(m(torch.tensor([token], device="cuda"))[-1].argmax().item())
    torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--timing", type=Path, required=True)
    parser.add_argument("--expected", type=Path)
    args = parser.parse_args()
    torch.manual_seed(0)
    m = Model().cuda().eval()
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
        timed_windows = [[n, *[1] * STEPS] for n in PROMPTS]
        args.expected.write_text(
            json.dumps({"windows": timed_windows, "warmup": [[WARMUP, *[1] * STEPS]]})
        )


if __name__ == "__main__":
    main()
