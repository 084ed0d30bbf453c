"""`kern-run --tp N`: one generation of a tensor-parallel manifest on N GPUs in one process.

Every input is checked first (as kern-run does), then the GPU count: fewer than N visible GPUs is
one line and exit 2 before any GPU is touched further. Rank r loads on GPU `--gpu` + r with
`{"tp": r}`; `kern_runtime.connect_local` joins the group's communicator; then one thread per rank
runs the same session (prefill, then greedy decode steps, each a graph replay): each rank's
collectives meet the others' on the GPUs. Every rank's argmax reads the same gathered logits, so
the ranks' tokens are equal; a difference is reported as a failure.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TextIO

from kern_cli import run
from kern_cli.run import (
    Bar,
    NoGpuError,
    RunError,
    RunOptions,
    decode_text,
    logger,
    no_gpu,
    prepare,
    prepare_load,
)

if TYPE_CHECKING:
    from kern_runtime import Runtime, ServingRoles

__all__ = ["TP_GROUP", "check_gpus", "check_topology", "execute_tp"]

TP_GROUP = "tp"
"""The topology group a TP manifest splits over."""


def check_topology(manifest: Mapping[str, Any], tp: int) -> None:
    """Refuses a manifest whose topology is not one group `tp` of `tp` ranks (the line names the
    family's generator, `Provider.generator`).

    Raises:
        RunError: no topology, another group, or another size.
    """
    groups = (manifest.get("topology") or {}).get("groups") or {}
    if groups != {TP_GROUP: tp}:
        raise RunError(f"--tp {tp} needs a manifest with topology {{\"groups\": {{\"{TP_GROUP}\": {tp}}}}}, this one "
                       f"declares {groups or 'none'}: generate one with {_generator(manifest)} --tp {tp}")


def _generator(manifest: Mapping[str, Any]) -> str:
    import kern_runtime as kr

    try:
        return run.family(manifest).generator
    except kr.ProviderError:
        return "the model family's manifest generator"


def check_gpus(tp: int, first: int, count: Callable[[], int] | None = None) -> None:
    """Refuses a run of `tp` ranks from GPU `first` on when fewer GPUs are visible (`count`:
    `kern_cli.run.device_count`, over `kern_runtime.device_count`).

    Raises:
        NoGpuError: no driver, or fewer than `first + tp` GPUs.
    """
    have = (count or run.device_count)()
    if have < first + tp:
        raise NoGpuError(f"--tp {tp} from --gpu {first} needs {first + tp} GPUs; this machine shows {have}")


def _load(opts: RunOptions, tokens: int, weights: Sequence[Any], tp: int) -> list[Runtime]:
    import kern_runtime as kr

    runtimes: list[Runtime] = []
    try:
        for r in range(tp):
            logger(opts.prog)(f"rank {r}: loading on gpu {opts.load.gpu + r}")
            rt = kr.Runtime.load(opts.load.manifest, opts.load.kernels, gpu=opts.load.gpu + r,
                                 capacity=kr.Capacity(tokens=tokens, seqs=1), ranks={TP_GROUP: r})
            runtimes.append(rt)
            rt.load_weights(kr.Safetensors.open(list(weights)), progress=Bar(sys.stderr))
        kr.connect_local(runtimes)
    except BaseException:
        for rt in runtimes:
            rt.close()
        raise
    return runtimes


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


def execute_tp(opts: RunOptions, out: TextIO) -> int:
    """One generation on `opts.tp` GPUs; returns the exit status.

    Raises:
        RunError: the manifest is not a TP manifest of that size, or the ranks disagree.
        NoGpuError: fewer GPUs than ranks.
    """
    import kern_runtime as kr

    tp = opts.tp or 1
    inputs, prompt, tok, capacity = prepare(opts)
    check_topology(inputs.manifest, tp)
    check_gpus(tp, opts.load.gpu)
    log = logger(opts.prog)
    weights = prepare_load(opts.load, inputs, log)
    t0 = time.perf_counter()
    # NOTE: the pool holds whole pages: room for `capacity` tokens is its pages rounded up.
    tokens = -(-capacity // inputs.roles.page_tokens) * inputs.roles.page_tokens
    try:
        runtimes = _load(opts, tokens, weights, tp)
    except kr.NoDriverError as exc:
        raise no_gpu(exc) from exc
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
    out.write((" ".join(map(str, ids)) if opts.output == "ids" else decode_text(tok, ids)) + "\n")
    out.flush()
    pre, dec = max(r[1] for r in results), max(r[2] for r in results)
    log(f"tp {tp}: load and run {time.perf_counter() - t0:.2f} s; prefill {len(prompt) - 1} tokens "
        f"{1e3 * pre:.1f} ms; decode {opts.steps} steps {1e3 * dec / opts.steps:.3f} ms/token "
        f"({'eager' if opts.eager else 'graph'})")
    return 0
