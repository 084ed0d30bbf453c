"""`kern kernels`: build kernel sources (`.cu` modules) into sm_90 cubins named <module>-<sha12>.cubin.

The sources come from `--kernel-sources` or kern.toml's `[kernels] sources`; by default only the
modules the manifests of kern.toml's targets pin are built. The build itself (reproducible,
cached by hash) is `kern_mining.build`, which providers call too. Bad input (flags, kern.toml, an
nvcc that cannot be found or run, an output directory that is a file, a module that fails to
compile) is one `kern kernels: ...` line and exit 2.
"""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kern_cli.config import KernConfig, KernTomlError, config_for
from kern_cli.console import fail, output_dir_problem
from kern_mining.build import KernelBuildError, build_kernels

__all__ = ["pinned_by_targets", "register"]


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
    if not src.is_dir():
        what = "is not a directory" if src.exists() else "does not exist"
        raise _UsageError(f"kernel source directory {src} {what}")
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
    parser.add_argument("--nvcc", help="the nvcc to build with (default: nvcc on PATH)")
    parser.add_argument(
        "--from",
        dest="extract",
        nargs=2,
        type=Path,
        metavar=("DUMP", "MANIFEST"),
        help="instead of building, copy the cubins MANIFEST pins out of a capture DUMP into --out",
    )
    parser.set_defaults(handler=_handle)


def _check_outs(jobs: list[_Job], what: str) -> None:
    for job in jobs:
        problem = output_dir_problem(job.out)
        if problem is not None:
            raise _UsageError(f"{what} {problem}")


def _compiler(nvcc: str | None) -> str:
    """The nvcc to run: `--nvcc` when it names a program, else nvcc on PATH.

    Raises:
        _UsageError: no such program.
    """
    found = shutil.which(nvcc or "nvcc")
    if found is not None:
        return nvcc or found
    if nvcc is None:
        raise _UsageError("nvcc is not on PATH: install the CUDA toolkit or pass --nvcc PATH")
    raise _UsageError(f"--nvcc {nvcc}: no such program (or not executable)")


def _log(msg: str) -> None:
    fail("kern kernels", msg)


def _handle(args: argparse.Namespace) -> int:
    if args.extract is not None:
        if args.modules or args.all:
            _log("--from copies what MANIFEST pins: name no modules and no --all with it")
            return 2
        return _extract(args.extract[0], args.extract[1], args.out or Path("kernels"))
    try:
        config = config_for(args.config, Path.cwd())
        src = _sources_dir(args, config)
        plans: list[str] = []
        jobs = _plan(args, config, plans.append)
        nvcc = _compiler(args.nvcc)
        _check_outs(jobs, "--out" if args.out is not None else "kernels directory")
        for line in plans:
            _log(line)
        built = {j.out: build_kernels(src, j.out, compiler=(nvcc,), modules=j.modules) for j in jobs}
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
        return fail("kern kernels", str(exc))
    for path in report.added:
        print(f"added {path}")
    for path in report.present:
        print(f"present {path}")
    return 0
