"""`kern-run --tp N`: one generation of a tensor-parallel manifest on N GPUs in one process.

Every input is checked first (as kern-run does), then the manifest's topology and the GPU count:
fewer than N visible GPUs is one line and exit 2 before any GPU is touched further. Rank r loads on
GPU `--gpu` + r with `{"tp": r}` and the ranks join the group's communicator
(`kern_runtime.loading.load_ranks`); `kern_runtime.generate_ranks` runs the same generation on
every rank at once (one thread each, so each rank's collectives meet the others' on the GPUs) and
refuses ranks whose tokens differ (`RanksDisagreeError`, exit 1).
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
    runtimes = loading.load_ranks(opts.load, tokens, weights, tp, log, lambda: Bar(sys.stderr))
    try:
        run = kr.generate_ranks(runtimes, inputs.roles, capacity, prompt, opts.steps, chunk=opts.chunk,
                                eager=opts.eager)
    finally:
        for rt in runtimes:
            rt.close()
    out.write((" ".join(map(str, run.tokens)) if opts.output == "ids" else loading.decode_text(tok, run.tokens)) + "\n")
    out.flush()
    log(f"tp {tp}: load and run {time.perf_counter() - t0:.2f} s; prefill {len(prompt) - 1} tokens "
        f"{1e3 * run.prefill_s:.1f} ms; decode {opts.steps} steps {1e3 * run.decode_s / opts.steps:.3f} ms/token "
        f"({'eager' if opts.eager else 'graph'})")
    return 0
