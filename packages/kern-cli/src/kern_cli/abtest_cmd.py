"""`kern test A B`: does candidate manifest B compute what reference manifest A computes, and how
fast? (docs/test.md)

    kern test A B [--config C] [--kernels K --kernel-sources S --weights W... --weights-b W...] [--gpu N]
        [--capacity T] [--seed S] [--runs N] [--decode-steps N] [--logit-kl NATS] [--iters N]
        [--no-noise] [--no-perf] [--json]

A and B are manifest files or kern.toml targets. Flags in, `kern_runtime.abtest` called, the report
out: one fact per line, the verdict last (`--json`: one JSON object). Every flag and both manifests
are checked before the GPU is looked for. Exit 0 PASS, 1 FAIL, 3 INCONCLUSIVE, 2 bad input (or an
error of the reference or the machine: 1, one line).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kern_cli.config import KernConfig, Target, config_for
from kern_cli.console import first_paragraph
from kern_cli.options import Bar, RunError, guarded, logger

if TYPE_CHECKING:
    from kern_runtime.abtest import AbOptions, Pair

__all__ = ["DEFAULT_CAPACITY", "register"]

PROG = "kern test"
DEFAULT_CAPACITY = 4096
# NOTE: kern_runtime.abtest.DEFAULT_CAPACITY; importing it here would load the runtime for every
# `kern` command.


@dataclass(frozen=True, slots=True)
class _Side:
    manifest: Path
    target: Target


@dataclass(frozen=True, slots=True)
class _Plan:
    a: _Side
    b: _Side
    pair: Pair
    options: AbOptions
    kernels: Path
    kernel_sources: Path | None
    weights: tuple[Path, ...] | None
    weights_b: tuple[Path, ...] | None
    gpu: int
    json: bool


def _side(text: str, cfg: KernConfig, who: str) -> _Side:
    """A manifest file, else a kern.toml target's manifest."""
    path = Path(text)
    if path.is_file():
        return _Side(path, Target(name=""))
    if text in cfg.targets and (target := cfg.targets[text]).manifest is not None:
        return _Side(target.manifest, target)
    known = ", ".join(sorted(cfg.targets)) or "none"
    raise RunError(f"{who} {text}: no such manifest file or kern.toml target (targets: {known})")


def _pick(flag: Any, toml: Any, default: Any) -> Any:
    return flag if flag is not None else (toml if toml is not None else default)


def _options(args: argparse.Namespace, cfg: KernConfig) -> AbOptions:
    import kern_runtime.abtest as ab

    t = cfg.test
    options = ab.AbOptions(
        seed=_pick(args.seed, t.seed, ab.DEFAULT_SEED), runs=_pick(args.runs, t.runs, ab.DEFAULT_RUNS),
        decode_steps=_pick(args.decode_steps, t.decode_steps, ab.DEFAULT_DECODE_STEPS),
        logit_kl=_pick(args.logit_kl, t.logit_kl, ab.DEFAULT_LOGIT_KL),
        capacity=_pick(args.capacity, cfg.capacity, DEFAULT_CAPACITY), noise=not args.no_noise,
        perf=not args.no_perf, iters=_pick(args.iters, t.iters, ab.DEFAULT_ITERS))
    ab.check_options(options)
    return options


def _plan(args: argparse.Namespace) -> _Plan:
    """Every check that needs no GPU: flags, kern.toml, both manifests, their kernels and weights."""
    import kern_runtime.abtest as ab
    from kern_runtime.loading import LoadOptions, check_inputs

    cfg = config_for(args.config, Path.cwd())
    a, b = _side(args.reference, cfg, "A"), _side(args.candidate, cfg, "B")
    options = _options(args, cfg)
    gpu = _pick(args.gpu, cfg.gpu, 0)
    if gpu < 0:
        raise RunError(f"--gpu must not be negative, got {gpu}")
    kernels = args.kernels or a.target.kernels or b.target.kernels or a.manifest.parent.parent / "kernels"
    sources = args.kernel_sources or cfg.kernel_sources
    # NOTE: none named: each side's seeded random checkpoint (one and the same for two bf16 manifests)
    weights = tuple(args.weights or a.target.weights or b.target.weights or ())
    weights_b = tuple(args.weights_b or args.weights or b.target.weights or a.target.weights or ())
    inputs = [check_inputs(LoadOptions(s.manifest, kernels, sources, w, gpu, None))
              for s, w in ((a, weights), (b, weights_b))]
    pair = ab.check_pair(inputs[0].manifest, inputs[1].manifest, options.capacity)
    return _Plan(a, b, pair, options, kernels, sources, inputs[0].weights, inputs[1].weights, gpu, bool(args.json))


def _test(args: argparse.Namespace) -> int:
    import kern_runtime.abtest as ab
    from kern_runtime import loading, weight_files

    log = logger(PROG)
    plan = _plan(args)
    loading.probe_gpu(plan.gpu)
    weights = plan.weights or tuple(weight_files(loading.default_weights(plan.pair.a.manifest, log, Bar(sys.stderr))))
    weights_b = plan.weights_b or tuple(weight_files(loading.default_weights(plan.pair.b.manifest, log,
                                                                             Bar(sys.stderr))))
    for f in (plan.pair.a, plan.pair.b):
        loading.ensure_kernels(f.manifest, plan.kernels, plan.kernel_sources, log)
    loader = ab.GpuLoader(plan.pair.a, plan.pair.b, plan.kernels, weights, plan.gpu, Bar(sys.stderr),
                          weights_b=weights_b)
    log(f"seed {plan.options.seed:#x}")
    report = ab.report_of(ab.ab_test(loader, plan.pair, plan.options, log))
    print(report.json() if plan.json else report.text(), flush=True)
    return report.verdict.exit_code


def _handle(args: argparse.Namespace) -> int:
    from kern_runtime.abtest import AbTestError

    return guarded(PROG, lambda: _test(args), AbTestError)


def register(subparsers: Any) -> None:
    """Add `kern test` to the `kern` dispatcher."""
    p = subparsers.add_parser("test", help="A/B: does candidate manifest B compute what reference A computes, "
                              "and how fast", description=first_paragraph(__doc__))
    p.add_argument("reference", metavar="A", help="the reference manifest (a file or a kern.toml target)")
    p.add_argument("candidate", metavar="B", help="the candidate manifest (a file or a kern.toml target)")
    p.add_argument("--config", type=Path, help="kern.toml (default: the nearest one upward)")
    p.add_argument("--kernels", type=Path, help="directory of cubins (built when hashes are missing)")
    p.add_argument("--kernel-sources", type=Path,
                   help="kernel sources to build missing cubins from (default: kern.toml [kernels] sources)")
    p.add_argument("--weights", type=Path, nargs="+",
                   help="checkpoint directory or .safetensors files A binds, and B unless --weights-b (default: "
                        "each side's target's, else the model family's seeded random checkpoint for its manifest)")
    p.add_argument("--weights-b", type=Path, nargs="+",
                   help="B's own checkpoint (an FP8 one beside a bf16 A): B then loads alone, its weights read "
                        "from it")
    p.add_argument("--gpu", type=int, help="device ordinal (default 0)")
    p.add_argument("--capacity", type=int, help=f"KV tokens of a run's sequence (default {DEFAULT_CAPACITY})")
    p.add_argument("--seed", type=int, help="the workload's seed (default 0x5eed, or kern.toml [test] seed)")
    p.add_argument("--runs", type=int, help="sequences in the workload (default 16)")
    p.add_argument("--decode-steps", type=int, help="the most teacher-forced decode steps of a run (default 16)")
    p.add_argument("--logit-kl", type=float, metavar="NATS",
                   help="KL(A || B) above which a row carries evidence and an argmax flip fails (default 0.01)")
    p.add_argument("--iters", type=int, help="step replays the graph TPOT is the median of (default 20)")
    p.add_argument("--no-noise", action="store_true", help="skip A against itself with another chunking")
    p.add_argument("--no-perf", action="store_true", help="skip the timing section")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.set_defaults(handler=_handle)
