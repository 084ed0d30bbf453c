"""`kern kernels`: build kernel sources (`.cu` modules) into sm_90 cubins named <module>-<sha12>.cubin.

The sources come from `--kernel-sources` or kern.toml's `[kernels] sources`; by default only the
modules the manifests of kern.toml's targets pin are built. A module is one `.cu` file and one cubin. Builds are reproducible (fixed flags, no line info, the
source compiled by its bare name from its own directory) and cached: a module is rebuilt only when
the hash of (its source, every header beside it, the flags, the compiler's version) changes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from kern_cli.config import KernConfig, KernTomlError, config_for

__all__ = [
    "CACHE_FILE",
    "DEFAULT_COMPILER",
    "NVCC_FLAGS",
    "CompileError",
    "CompilerNotFoundError",
    "KernelBuildError",
    "KernelSourceError",
    "build_kernels",
    "pinned_by_targets",
    "register",
]

NVCC_FLAGS: tuple[str, ...] = ("-cubin", "-arch=sm_90", "-O3")
"""Fixed compiler flags; part of the cache key."""

DEFAULT_COMPILER: tuple[str, ...] = ("nvcc",)
"""The compiler command (a prefix: flags, `-o OUT` and the source name follow)."""

CACHE_FILE = ".kern-kernels-cache.json"
"""Per output directory: module -> {key, sha256, file} of the last build."""

_HEADER_SUFFIXES = (".cuh", ".h")
_MODULE_NAME = re.compile(r"^[A-Za-z0-9_]+$")


class KernelBuildError(Exception):
    """Base of the errors `build_kernels` raises; the message is one actionable line."""


class KernelSourceError(KernelBuildError):
    """The source directory is missing, empty, or holds a badly named module."""


class CompilerNotFoundError(KernelBuildError):
    """The compiler command cannot be run."""


class CompileError(KernelBuildError):
    """The compiler rejected a module."""


@dataclass(frozen=True, slots=True)
class _Entry:
    key: str
    sha256: str
    file: str


def build_kernels(
    src_dir: Path,
    out_dir: Path,
    *,
    compiler: Sequence[str] = DEFAULT_COMPILER,
    modules: Collection[str] | None = None,
) -> dict[str, tuple[Path, str]]:
    """Builds the `*.cu` modules under `src_dir` into `out_dir/<module>-<sha12>.cubin`.

    Modules whose cache key is unchanged and whose cubin is still in place are not rebuilt. Either
    every selected module builds and `out_dir` is updated, or nothing in `out_dir` changes; a
    module outside the selection is neither compiled nor able to fail the build.

    Args:
        src_dir: directory of `.cu` modules and the headers they include.
        out_dir: where cubins and the cache record go (created if missing).
        compiler: command prefix of the compiler, `nvcc` by default.
        modules: the modules to build (`.cu` stems); None builds every module in `src_dir`.

    Returns:
        module -> (cubin path, sha256 hex of the cubin bytes) of the selected modules, sorted.

    Raises:
        KernelSourceError: no sources, a bad module name, or a selected module with no source.
        CompilerNotFoundError: the compiler cannot be run.
        CompileError: a module failed to compile (nothing written).
    """
    sources = _select(_sources(src_dir), modules, src_dir)
    version = _compiler_version(compiler)
    headers = _headers_digest(src_dir)
    cache = _load_cache(out_dir)
    keys = {m: _cache_key(_with_included_sources(p), headers, version) for m, p in sources.items()}
    stale = [m for m in sources if not _is_fresh(cache.get(m), keys[m], out_dir)]
    built = _compile_all(compiler, sources, stale)
    out_dir.mkdir(parents=True, exist_ok=True)
    for module, data in built.items():
        sha = hashlib.sha256(data).hexdigest()
        name = f"{module}-{sha[:12]}.cubin"
        _write_atomic(out_dir / name, data)
        cache[module] = _Entry(keys[module], sha, name)
    _save_cache(out_dir, cache)
    return {m: (out_dir / cache[m].file, cache[m].sha256) for m in sorted(sources)}


def _sources(src_dir: Path) -> dict[str, Path]:
    if not src_dir.is_dir():
        raise KernelSourceError(f"kernel source directory {src_dir} does not exist")
    found = {p.stem: p for p in sorted(src_dir.glob("*.cu"))}
    if not found:
        raise KernelSourceError(f"no .cu modules in {src_dir}")
    for module in found:
        if not _MODULE_NAME.match(module):
            raise KernelSourceError(
                f"module name {module!r} in {src_dir}: use letters, digits and '_' only"
            )
    return found


def _select(sources: Mapping[str, Path], modules: Collection[str] | None, src_dir: Path) -> dict[str, Path]:
    if modules is None:
        return dict(sources)
    unknown = sorted(set(modules) - set(sources))
    if unknown:
        raise KernelSourceError(
            f"no source for module(s) {', '.join(unknown)} in {src_dir} (modules there: {', '.join(sources)})"
        )
    return {m: p for m, p in sources.items() if m in modules}


def _headers_digest(src_dir: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in src_dir.iterdir() if p.suffix in _HEADER_SUFFIXES):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


_INCLUDE = re.compile(rb'^\s*#\s*include\s*"([^"/]+\.cu)"', re.MULTILINE)


def _with_included_sources(path: Path) -> bytes:
    """A module's source followed by the `.cu` sources it includes from its own directory,
    transitively (a module may include another for its device code); headers are keyed apart."""
    seen: list[Path] = []
    todo = [path]
    while todo:
        p = todo.pop()
        if p in seen or not p.is_file():
            continue
        seen.append(p)
        todo += [p.parent / m.decode() for m in _INCLUDE.findall(p.read_bytes())]
    return b"\0".join(p.name.encode() + b"\0" + p.read_bytes() for p in seen)


def _cache_key(source: bytes, headers: str, version: str) -> str:
    digest = hashlib.sha256()
    for part in (source, headers.encode(), "\0".join(NVCC_FLAGS).encode(), version.encode()):
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()


def _compiler_version(compiler: Sequence[str]) -> str:
    try:
        done = subprocess.run([*compiler, "--version"], capture_output=True, text=True, check=False)
    except OSError as exc:
        raise CompilerNotFoundError(
            f"cannot run {' '.join(compiler)!r} ({exc.strerror}): install the CUDA toolkit or put nvcc on PATH"
        ) from exc
    if done.returncode != 0:
        raise CompilerNotFoundError(
            f"{' '.join(compiler)!r} --version exited {done.returncode}: check the CUDA toolkit install"
        )
    return done.stdout.strip()


def _is_fresh(entry: _Entry | None, key: str, out_dir: Path) -> bool:
    if entry is None or entry.key != key:
        return False
    path = out_dir / entry.file
    return path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == entry.sha256


def _compile_all(
    compiler: Sequence[str], sources: Mapping[str, Path], modules: Sequence[str]
) -> dict[str, bytes]:
    """Every module in `modules`, compiled side by side (one nvcc process per module, at most one per
    CPU); the first failure in `modules`' order is raised once all have finished."""
    if not modules:
        return {}
    workers = min(len(modules), os.cpu_count() or 1)
    with tempfile.TemporaryDirectory(prefix="kern-kernels-") as tmp, ThreadPoolExecutor(workers) as pool:
        jobs = {m: pool.submit(_compile_one, compiler, sources[m], Path(tmp) / f"{m}.cubin") for m in modules}
        return {m: job.result() for m, job in jobs.items()}


def _compile_one(compiler: Sequence[str], source: Path, out: Path) -> bytes:
    # NOTE: compiling the bare file name from its own directory keeps paths out of the output.
    cmd = [*compiler, *NVCC_FLAGS, "-o", str(out), source.name]
    done = subprocess.run(cmd, cwd=source.parent, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not out.is_file():
        lines = [ln for ln in (done.stderr + done.stdout).splitlines() if ln.strip()]
        first = next((ln for ln in lines if "error" in ln), lines[0] if lines else "no output")
        raise CompileError(
            f"{source.name} failed to compile (exit {done.returncode}): {first.strip()}"
        )
    return out.read_bytes()


def _load_cache(out_dir: Path) -> dict[str, _Entry]:
    path = out_dir / CACHE_FILE
    if not path.is_file():
        return {}
    try:
        raw = json.loads(path.read_text())
        return {m: _Entry(str(e["key"]), str(e["sha256"]), str(e["file"])) for m, e in raw.items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        # NOTE: an unreadable cache record only costs a rebuild.
        return {}


def _save_cache(out_dir: Path, cache: Mapping[str, _Entry]) -> None:
    raw = {m: {"key": e.key, "sha256": e.sha256, "file": e.file} for m, e in sorted(cache.items())}
    _write_atomic(out_dir / CACHE_FILE, (json.dumps(raw, indent=1) + "\n").encode())


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class _UsageError(Exception):
    """Bad `kern kernels` arguments or configuration (exit 2)."""


@dataclass(frozen=True, slots=True)
class _Job:
    out: Path
    modules: tuple[str, ...] | None  # None: every module in the sources


def pinned_by_targets(config: KernConfig, out: Path | None) -> dict[Path, dict[str, list[str]]]:
    """kernels directory -> module -> the targets whose manifests pin it (`out` replaces every
    target's kernels directory when given).

    Raises:
        KernTomlError: a target's manifest is missing or does not parse.
    """
    from kern_manifest import ManifestRejected, parse_manifest

    plan: dict[Path, dict[str, list[str]]] = {}
    for name, target in config.targets.items():
        if target.manifest is None:
            continue
        try:
            modules = parse_manifest(target.manifest.read_bytes()).modules
        except OSError as exc:
            raise KernTomlError(f"target {name}: manifest {target.manifest}: {exc.strerror or exc}") from None
        except ManifestRejected as exc:
            raise KernTomlError(f"target {name}: manifest {target.manifest}: {exc.line()}") from None
        kernels = out or target.kernels or target.manifest.parent.parent / "kernels"
        for module in modules:
            plan.setdefault(kernels, {}).setdefault(module, []).append(name)
    return plan


def _plan(args: argparse.Namespace, config: KernConfig, log: Callable[[str], None]) -> list[_Job]:
    if args.all and args.modules:
        raise _UsageError("name modules or pass --all, not both")
    if args.all or args.modules:
        modules = None if args.all else tuple(dict.fromkeys(args.modules))
        dirs = {t.kernels for t in config.targets.values() if t.kernels is not None}
        outs = [args.out] if args.out else sorted(dirs) or [Path("kernels")]
        return [_Job(o, modules) for o in outs]
    plan = pinned_by_targets(config, args.out)
    if not plan:
        raise _UsageError("no kern.toml target pins a module: name the modules to build, pass --all, "
                          "or --config a kern.toml with [targets]")
    jobs: list[_Job] = []
    for out, pins in sorted(plan.items()):
        targets = sorted({t for names in pins.values() for t in names})
        log(f"building the modules pinned by target(s) {', '.join(targets)}: {', '.join(sorted(pins))} into {out}")
        jobs.append(_Job(out, tuple(sorted(pins))))
    return jobs


def _sources_dir(args: argparse.Namespace, config: KernConfig) -> Path:
    src: Path | None = args.sources or config.kernel_sources
    if src is None:
        raise _UsageError("no kernel sources: pass --kernel-sources DIR or set [kernels] sources in kern.toml")
    return src


def register(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],  # pyright: ignore[reportPrivateUsage]
) -> None:
    """Adds `kern kernels` to the `kern` dispatcher."""
    parser = subparsers.add_parser(
        "kernels",
        help="build the kernel modules kern.toml's manifests pin into sm_90 cubins (cached by hash)",
        description="Build kernel modules (.cu files of the kernel sources) into sm_90 cubins named "
        "<module>-<sha12>.cubin. With no MODULE and no --all: the modules the manifests of "
        "kern.toml's targets pin, each into its target's kernels directory.",
    )
    parser.add_argument("modules", nargs="*", metavar="MODULE", help="a module to build (a .cu file's stem)")
    parser.add_argument("--all", action="store_true", help="build every module in the kernel sources")
    parser.add_argument("--config", type=Path, help="kern.toml (default: the nearest one upward)")
    parser.add_argument(
        "--kernel-sources", dest="sources", type=Path,
        help="directory of .cu modules (default: kern.toml [kernels] sources)",
    )
    parser.add_argument(
        "--out", type=Path,
        help="cubin output directory (default: each target's kernels directory, else kernels/)",
    )
    parser.add_argument(
        "--nvcc", default=shutil.which("nvcc") or "nvcc", help="the nvcc to build with"
    )
    parser.add_argument(
        "--from",
        dest="extract",
        nargs=2,
        type=Path,
        metavar=("DUMP", "MANIFEST"),
        help="instead of building, copy the cubins MANIFEST pins out of a capture DUMP into --out",
    )
    parser.set_defaults(handler=_handle)


def _log(msg: str) -> None:
    print(f"kern kernels: {msg}", file=sys.stderr, flush=True)


def _handle(args: argparse.Namespace) -> int:
    if args.extract is not None:
        if args.modules or args.all:
            _log("--from copies what MANIFEST pins: name no modules and no --all with it")
            return 2
        return _extract(args.extract[0], args.extract[1], args.out or Path("kernels"))
    try:
        config = config_for(args.config, Path.cwd())
        src = _sources_dir(args, config)
        jobs = _plan(args, config, _log)
        built = {j.out: build_kernels(src, j.out, compiler=(args.nvcc,), modules=j.modules) for j in jobs}
    except CompilerNotFoundError as exc:
        _log(str(exc))
        return 1
    except (KernelBuildError, KernTomlError, _UsageError) as exc:
        _log(str(exc))
        return 2
    for result in built.values():
        for module, (path, sha) in result.items():
            print(f"{module} {sha} {path}")
    return 0


def _extract(dump_dir: Path, manifest: Path, out_dir: Path) -> int:
    from kern_mining.errors import MiningError
    from kern_mining.extract import extract_kernels

    try:
        report = extract_kernels(dump_dir, manifest, out_dir)
    except MiningError as exc:
        print(f"kern kernels: {exc}", file=sys.stderr)
        return 2
    for path in report.added:
        print(f"added {path}")
    for path in report.present:
        print(f"present {path}")
    return 0
