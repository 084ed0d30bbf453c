"""`kern-run --tp N`: one generation of a tensor-parallel manifest on N GPUs in one process.

Every input is checked first (as kern-run does), then the manifest's topology and the GPU count:
fewer than N visible GPUs is one line and exit 2 before any GPU is touched further. Rank r loads on
GPU `--gpu` + r with `{"tp": r}` and the ranks join the group's communicator
(`kern_runtime.loading.load_ranks`); then one thread per rank runs the same session (prefill, then
greedy decode steps, each a graph replay): each rank's collectives meet the others' on the GPUs.
Every rank's argmax reads the same gathered logits, so the ranks' tokens are equal; a difference is
reported as a failure.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TextIO

from kern_cli.options import Bar, RunError, RunOptions, logger

if TYPE_CHECKING:
    from kern_runtime import Runtime, ServingRoles
    from kern_runtime.loading import LoadInputs

__all__ = ["execute_tp"]


def _rank(rt: Runtime, roles: ServingRoles, capacity: int, opts: RunOptions,
          prompt: Sequence[int]) -> tuple[list[int], float, float]:
    import kern_runtime as kr

    rt.make_current()
    s = kr.Session(rt, roles, capacity)
    chunk, steps, eager = opts.chunk, opts.steps, opts.eager
    if not eager:
        s.rt.capture_graph(s.roles.step_program, s.roles.step_vars)
    t1 = time.perf_counter()
    s.prefill(prompt, chunk)
    s.rt.synchronize()
    t2 = time.perf_counter()
    ids = list(s.decode(steps, eager))
    return ids, t2 - t1, time.perf_counter() - t2


def execute_tp(opts: RunOptions, out: TextIO, prepared: tuple[LoadInputs, list[int], Any, int]) -> int:
    """One generation on `opts.tp` GPUs of what `kern_cli.run.prepare` checked; returns the exit
    status.

    Raises:
        LoadError: the manifest is not a TP manifest of that size. NoGpuError: fewer GPUs than ranks.
        RunError: the ranks disagree.
    """
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
        with ThreadPoolExecutor(max_workers=tp) as pool:
            futures = [pool.submit(_rank, rt, inputs.roles, capacity, opts, prompt) for rt in runtimes]
            results = [f.result() for f in futures]
    finally:
        for rt in runtimes:
            rt.close()
    ids = results[0][0]
    differ = [r for r, res in enumerate(results) if res[0] != ids]
    if differ:
        raise RunError(f"ranks {differ} generated other tokens than rank 0: the TP manifest or its collectives are wrong")
    out.write((" ".join(map(str, ids)) if opts.output == "ids" else loading.decode_text(tok, ids)) + "\n")
    out.flush()
    pre, dec = max(r[1] for r in results), max(r[2] for r in results)
    log(f"tp {tp}: load and run {time.perf_counter() - t0:.2f} s; prefill {len(prompt) - 1} tokens "
        f"{1e3 * pre:.1f} ms; decode {opts.steps} steps {1e3 * dec / opts.steps:.3f} ms/token "
        f"({'eager' if opts.eager else 'graph'})")
    return 0
