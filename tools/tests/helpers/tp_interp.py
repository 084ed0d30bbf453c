"""A TP-N manifest on the float32 numpy interpreter (`kern_interp.qwen3.Interp`): one interpreter per
rank with that rank's weight windows, run call by call in lock step, the NCCL collectives done
across the ranks' buffers by their definitions. Shaped like an `Interp` (`m`, `capacity`,
`write_input`, `read_output`, `run`), so `kern_interp.qwen3.greedy` drives it unchanged."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kern_interp import collectives
from kern_interp import qwen3 as interp
from kern_interp.ranks import rank_tensors

__all__ = ["World"]


class World:
    """The ranks of a TP-N manifest on interpreters, run in lock step."""

    def __init__(self, manifest: Mapping[str, Any], tensors: Mapping[str, np.ndarray], capacity: int) -> None:
        self.n = int(manifest["topology"]["groups"]["tp"])
        self.m = manifest
        self.model = interp.model_of(manifest)
        self.capacity = capacity
        self.ranks = [interp.Interp(*rank_tensors(manifest, tensors, r), capacity=capacity) for r in range(self.n)]
        self.collectives = 0

    def write_input(self, name: str, values: Sequence[int] | np.ndarray) -> None:
        for r in self.ranks:
            r.write_input(name, values)

    def read_output(self, name: str) -> np.ndarray:
        got = [r.read_output(name) for r in self.ranks]
        for r, g in enumerate(got[1:], 1):
            assert np.array_equal(g, got[0]), f"rank {r} output {name} differs from rank 0's"
        return got[0]

    def run(self, program: str, vars: Mapping[str, int]) -> None:
        env = {v: vars.get(v, 1) for v in self.m["vars"]}
        for call in self.m["programs"][program]["calls"]:
            op = self.m["ops"][call["op"]]
            per_rank = [[r._arg(a, env) for a in call["args"]] for r in self.ranks]  # pyright: ignore[reportPrivateUsage]
            for launch in op["impl"]["launches"]:
                args = [vals if "args" not in launch else
                        [r._launch_arg(call["op"], la, vals) for la in launch["args"]]  # pyright: ignore[reportPrivateUsage]
                        for r, vals in zip(self.ranks, per_rank, strict=True)]
                self._launch(launch["entry"], args, env)

    def _launch(self, entry: str, args: Sequence[Sequence[Any]], env: Mapping[str, int]) -> None:
        tokens = env.get("tokens", 1)
        if not entry.startswith("extern:nccl_"):
            for a in args:
                if entry == "extern:cublaslt_bf16_tn":
                    interp.k_linear(tokens, *a)
                else:
                    interp.KERNELS[entry](tokens, *a)
            return
        self.collectives += 1
        count = collectives.count_of(args[0][2], env)
        sends = [np.array(s[0][s[1]:], copy=True) for s, *_ in args]
        for (_, (recv, off), *_), value in zip(args, collectives.results(collectives.verb_of(entry), sends, count),
                                               strict=True):
            recv[off:off + value.size] = value
