"""`kern-run --tp N`: one generation of a tensor-parallel manifest on N GPUs in one process.

Every input is checked first (as kern-run does), then the manifest's topology and the GPU count:
fewer than N visible GPUs is one line and exit 2 before any GPU is touched further. Rank r loads on
GPU `--gpu` + r with `{"tp": r}` and the ranks join the group's communicator
(`kern_runtime.loading.open_ranks`); one turn of `kern_runtime.Ranks`, the engine over the ranks,
runs it on every rank at once (one thread each, so each rank's collectives meet the others' on the
GPUs) and refuses ranks whose tokens differ (`RanksDisagreeError`, exit 1).
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

from kern_cli.options import Bar, RunOptions, logger

if TYPE_CHECKING:
    from kern_runtime.loading import LoadInputs

__all__ = ["execute_tp"]


def execute_tp(opts: RunOptions, out: TextIO, prepared: tuple[LoadInputs, list[int], Any, int]) -> int:
    """One generation on `opts.tp` GPUs of what `kern_cli.run.prepare` checked; returns the exit
    status.

    Raises:
        LoadError: the manifest is not a TP manifest of that size. NoGpuError: fewer GPUs than ranks.
        RanksDisagreeError: the ranks generated different tokens.
    """
    import kern_runtime as kr
    from kern_runtime import loading

    tp = opts.tp or 1
    inputs, prompt, tok, capacity = prepared
    loading.check_topology(inputs.manifest, tp)
    loading.check_gpus(tp, opts.load.gpu)
    log = logger(opts.prog)
    weights = loading.prepare_load(opts.load, inputs, log, Bar(sys.stderr))
    t0 = time.perf_counter()
    # NOTE: the pool holds whole pages: room for `capacity` tokens is its pages rounded up.
    tokens = -(-capacity // inputs.roles.page_tokens) * inputs.roles.page_tokens
    config = kr.EngineConfig(chunk=opts.chunk, eager=opts.eager)
    with loading.open_ranks(opts.load, tokens, weights, tp, inputs.roles, config, log, lambda: Bar(sys.stderr)) as group:
        t1 = time.perf_counter()
        turn = group.turn(group.sequence(), prompt, opts.steps)
    out.write((" ".join(map(str, turn.tokens)) if opts.output == "ids" else loading.decode_text(tok, turn.tokens)) + "\n")
    out.flush()
    log(f"tp {tp}: load {t1 - t0:.2f} s; prefill {turn.prefill.prefilled} tokens, first token {turn.ttft_ms:.1f} ms; "
        f"decode {turn.decode_ms_per_token:.3f} ms/token ({len(turn.tokens)} tokens, {'eager' if opts.eager else 'graph'})")
    return 0
