"""Building kernel sources into cubins: one `.cu` module -> one `<module>-<sha12>.cubin`.

Builds are reproducible (fixed flags, no line info, the source compiled by its bare name from its
own directory; a module that needs another architecture than sm_90, such as sm_90a for wgmma, says
so in a line of its own source, `// kern-arch: sm_90a`) and cached: a module is rebuilt only when the hash of (its source, every header beside it, its flags,
the compiler's version) changes. `kern kernels` is the command line over it; providers call
`build_kernels` to pin what they build.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import tempfile
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CACHE_FILE",
    "DEFAULT_COMPILER",
    "NVCC_FLAGS",
    "CompileError",
    "CompilerNotFoundError",
    "KernelArchError",
    "KernelBuildError",
    "KernelOutputError",
    "KernelSourceError",
    "build_kernels",
    "module_arch",
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


class KernelArchError(KernelSourceError):
    """A module's `// kern-arch:` line is malformed or repeated."""


class KernelOutputError(KernelBuildError):
    """The output directory is a file, lies under one, or cannot be written."""


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
        modules: the modules to build (`.cu` stems); None builds every module in `src_dir`. A
            module whose source declares `// kern-arch: sm_90a` (`module_arch`) builds for that
            architecture in place of NVCC_FLAGS' `sm_90`; every other module builds with
            NVCC_FLAGS as they are.

    Returns:
        module -> (cubin path, sha256 hex of the cubin bytes) of the selected modules, sorted.

    Raises:
        KernelSourceError: no sources, a bad module name, or a selected module with no source.
        KernelArchError: a selected module's `kern-arch` line is malformed or repeated.
        CompilerNotFoundError: the compiler cannot be run.
        CompileError: a module failed to compile (nothing written).
        KernelOutputError: `out_dir` is a file or cannot be written (found before compiling).
    """
    _check_out_dir(out_dir)
    sources = _select(_sources(src_dir), modules, src_dir)
    flags = {m: _module_flags(p) for m, p in sources.items()}
    version = _compiler_version(compiler)
    headers = _headers_digest(src_dir)
    cache = _load_cache(out_dir)
    keys = {m: _cache_key(_with_included_sources(p), headers, version, flags[m]) for m, p in sources.items()}
    stale = [m for m in sources if not _is_fresh(cache.get(m), keys[m], out_dir)]
    built = _compile_all(compiler, sources, stale, flags)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for module, data in built.items():
            sha = hashlib.sha256(data).hexdigest()
            name = f"{module}-{sha[:12]}.cubin"
            _write_atomic(out_dir / name, data)
            cache[module] = _Entry(keys[module], sha, name)
        _save_cache(out_dir, cache)
    except OSError as exc:
        raise KernelOutputError(f"kernels directory {out_dir}: {exc.strerror or exc}") from exc
    return {m: (out_dir / cache[m].file, cache[m].sha256) for m in sorted(sources)}


def _check_out_dir(out_dir: Path) -> None:
    """Refuses an output directory that is a file or lies under one (nothing is created)."""
    ancestor = out_dir
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        where = "" if ancestor == out_dir else f" ({ancestor} is a file)"
        raise KernelOutputError(f"kernels directory {out_dir} is not a directory{where}")


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


_ARCH_LINE = re.compile(r"^[ \t]*(//[ \t]*kern-arch\b(.*))$", re.MULTILINE)
_ARCH = re.compile(r"^sm_[0-9]+a?$")


def module_arch(source: Path) -> str | None:
    """The GPU architecture a module's source declares in a line of its own, `// kern-arch: sm_90a`
    (None: it declares none and builds for NVCC_FLAGS' sm_90). A mention inside another line is no
    declaration.

    Raises:
        KernelArchError: a `kern-arch` line without `: sm_<digits>[a]`, or more than one such line.
    """
    lines = _ARCH_LINE.findall(source.read_text(encoding="utf-8", errors="replace"))
    if len(lines) > 1:
        raise KernelArchError(f"{source.name} has {len(lines)} kern-arch lines: keep one")
    if not lines:
        return None
    line, rest = lines[0]
    rest = rest.strip()
    arch = rest[1:].strip() if rest.startswith(":") else ""
    if not _ARCH.match(arch):
        raise KernelArchError(
            f"{source.name}: {line.strip()!r} names no architecture: write the line as `// kern-arch: sm_90a`"
        )
    return arch


def _module_flags(source: Path) -> tuple[str, ...]:
    """A module's compiler flags: NVCC_FLAGS, with `-arch=` set from its kern-arch line if it has one."""
    arch = module_arch(source)
    if arch is None:
        return NVCC_FLAGS
    return tuple(f"-arch={arch}" if f.startswith("-arch=") else f for f in NVCC_FLAGS)


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


def _cache_key(source: bytes, headers: str, version: str, flags: Sequence[str]) -> str:
    digest = hashlib.sha256()
    for part in (source, headers.encode(), "\0".join(flags).encode(), version.encode()):
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
    compiler: Sequence[str],
    sources: Mapping[str, Path],
    modules: Sequence[str],
    flags: Mapping[str, Sequence[str]],
) -> dict[str, bytes]:
    """Every module in `modules`, compiled side by side (one nvcc process per module, at most one per
    CPU); the first failure in `modules`' order is raised once all have finished."""
    if not modules:
        return {}
    workers = min(len(modules), os.cpu_count() or 1)
    with tempfile.TemporaryDirectory(prefix="kern-kernels-") as tmp, ThreadPoolExecutor(workers) as pool:
        jobs = {
            m: pool.submit(_compile_one, compiler, flags[m], sources[m], Path(tmp) / f"{m}.cubin") for m in modules
        }
        return {m: job.result() for m, job in jobs.items()}


def _compile_one(compiler: Sequence[str], flags: Sequence[str], source: Path, out: Path) -> bytes:
    # NOTE: compiling the bare file name from its own directory keeps paths out of the output.
    cmd = [*compiler, *flags, "-o", str(out), source.name]
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
