"""Capture: build the CUPTI injection library and run any command under it.

The library (native/kern_capture.c) is compiled once per source and toolchain into a cache
($KERN_CACHE_DIR/capture or ~/.cache/kern/capture) and loaded by the CUDA driver of the child
process through CUDA_INJECTION64_PATH. Every process of the command that initializes CUDA writes
its own DIR/pid<N>/ (format: docs/mining.md).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kern_mining.dump import find_process_dirs
from kern_mining.errors import CaptureBuildError, CaptureError, ToolchainNotFoundError

__all__ = [
    "SOURCE",
    "CaptureResult",
    "Toolchain",
    "build_library",
    "capture_env",
    "find_toolchain",
    "run_capture",
]

SOURCE = Path(__file__).parent / "native" / "kern_capture.c"
CFLAGS = ("-std=gnu11", "-O2", "-fPIC", "-shared", "-Wall", "-Wextra", "-Werror", "-pthread")
HOST_POINTEES_ENV = "KERN_CAPTURE_HOST_POINTEES"
DIR_ENV = "KERN_CAPTURE_DIR"


@dataclass(frozen=True)
class Toolchain:
    """What building the injection library needs: a C compiler, cuda.h + cupti.h, libcupti."""

    compiler: Path
    include_dirs: tuple[Path, ...]
    cupti_library: Path


@dataclass(frozen=True)
class CaptureResult:
    """The command's exit status and the process dumps it wrote."""

    returncode: int
    process_dirs: tuple[Path, ...]


def _roots(env: Mapping[str, str]) -> list[Path]:
    roots = [Path(env[k]) for k in ("KERN_CUDA_HOME", "CUDA_HOME", "CUDA_PATH") if env.get(k)]
    nvcc = shutil.which("nvcc", path=env.get("PATH"))
    if nvcc:
        roots.append(Path(nvcc).resolve().parent.parent)
    roots.append(Path("/usr/local/cuda"))
    roots += sorted(Path("/usr/local").glob("cuda-*"), reverse=True)
    return list(dict.fromkeys(roots))


def _candidates(root: Path, kind: str) -> list[Path]:
    if kind == "include":
        return [
            root / "include",
            *sorted(root.glob("targets/*/include")),
            root / "extras/CUPTI/include",
        ]
    return [
        root / "lib64",
        root / "lib",
        *sorted(root.glob("targets/*/lib")),
        root / "extras/CUPTI/lib64",
    ]


def _find_in(roots: list[Path], kind: str, names: Sequence[str]) -> Path | None:
    for root in roots:
        for folder in _candidates(root, kind):
            for name in names:
                hits = sorted(folder.glob(name))
                if hits:
                    return hits[0]
    return None


def find_toolchain(
    env: Mapping[str, str] | None = None, roots: Sequence[Path] | None = None
) -> Toolchain:
    """Locate a C compiler, cuda.h, cupti.h and libcupti.

    Args:
        env: the environment to read (KERN_CUDA_HOME, CUDA_HOME, CUDA_PATH, PATH, CC); os.environ by default.
        roots: CUDA install roots to search instead of those env names, nvcc's and /usr/local/cuda*.

    Raises:
        ToolchainNotFoundError: one of them is missing; the message names what and where it looked.
    """
    env = os.environ if env is None else env
    roots = list(roots) if roots is not None else _roots(env)
    cuda_h = _find_in(roots, "include", ["cuda.h"])
    cupti_h = _find_in(roots, "include", ["cupti.h"])
    library = _find_in(roots, "lib", ["libcupti.so", "libcupti.so.*"])
    compilers = [env.get("CC", ""), "gcc", "cc", "clang"]
    compiler = next(
        (
            shutil.which(c, path=env.get("PATH"))
            for c in compilers
            if c and shutil.which(c, path=env.get("PATH"))
        ),
        None,
    )
    missing = [
        n
        for n, v in (
            ("cuda.h", cuda_h),
            ("cupti.h", cupti_h),
            ("libcupti.so", library),
            ("a C compiler", compiler),
        )
        if v is None
    ]
    if missing or cuda_h is None or cupti_h is None or library is None or compiler is None:
        where = ", ".join(str(r) for r in roots)
        raise ToolchainNotFoundError(
            f"no {', '.join(missing)} found under {where} or PATH; set KERN_CUDA_HOME or CC"
        )
    includes = tuple(dict.fromkeys([cuda_h.parent, cupti_h.parent]))
    return Toolchain(Path(compiler), includes, library)


def _cache_dir(env: Mapping[str, str]) -> Path:
    base = env.get("KERN_CACHE_DIR")
    return (Path(base) if base else Path.home() / ".cache" / "kern") / "capture"


def _command(toolchain: Toolchain, output: Path) -> list[str]:
    includes = [f"-I{d}" for d in toolchain.include_dirs]
    rpath = f"-Wl,-rpath,{toolchain.cupti_library.parent}"
    return [
        str(toolchain.compiler),
        *CFLAGS,
        *includes,
        str(SOURCE),
        "-o",
        str(output),
        str(toolchain.cupti_library),
        rpath,
        "-ldl",
    ]


def build_library(
    cache_dir: Path | None = None, *, toolchain: Toolchain | None = None, force: bool = False
) -> Path:
    """Compile the injection library, or return the cached build for this source and toolchain.

    Raises:
        ToolchainNotFoundError: see `find_toolchain`.
        CaptureBuildError: the compiler failed; the message ends with its last output line.
    """
    toolchain = toolchain or find_toolchain()
    cache = cache_dir or _cache_dir(os.environ)
    key = hashlib.sha256(SOURCE.read_bytes() + repr((toolchain, CFLAGS)).encode()).hexdigest()[:16]
    target = cache / f"kern_capture-{key}.so"
    if target.is_file() and not force:
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        built = Path(tmp) / target.name
        proc = subprocess.run(
            _command(toolchain, built), capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            lines = (proc.stderr or proc.stdout).strip().splitlines() or ["(no output)"]
            raise CaptureBuildError(
                f"{toolchain.compiler} failed to build {SOURCE.name}: {lines[-1]}"
            )
        os.replace(built, target)
    return target


def capture_env(
    out_dir: Path,
    library: Path,
    *,
    host_pointees: bool = False,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment that makes a CUDA process load the injection library and write to `out_dir`."""
    env = dict(os.environ if base is None else base)
    env["CUDA_INJECTION64_PATH"] = str(library.resolve())
    env[DIR_ENV] = str(out_dir.resolve())
    env[HOST_POINTEES_ENV] = "1" if host_pointees else "0"
    return env


def run_capture(
    command: Sequence[str],
    out_dir: Path,
    *,
    host_pointees: bool = False,
    library: Path | None = None,
) -> CaptureResult:
    """Run `command` with the capture attached; each CUDA process writes out_dir/pid<N>/.

    Raises:
        CaptureError: the command is empty or cannot be started, or `out_dir` cannot be made.
        ToolchainNotFoundError, CaptureBuildError: see `build_library`.
    """
    if not command:
        raise CaptureError(
            "no command to capture: give it after `--`, e.g. kern-mine capture -o DIR -- python x.py"
        )
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CaptureError(f"{out_dir}: cannot create the capture directory ({exc.strerror})") from exc
    library = library or build_library()
    before = set(find_process_dirs(out_dir))
    try:
        proc = subprocess.run(
            list(command),
            env=capture_env(out_dir, library, host_pointees=host_pointees),
            check=False,
        )
    except OSError as exc:
        raise CaptureError(f"cannot start {command[0]!r}: {exc.strerror}") from exc
    written = tuple(p for p in find_process_dirs(out_dir) if p not in before)
    return CaptureResult(proc.returncode, written)
