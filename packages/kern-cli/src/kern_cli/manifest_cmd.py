"""`kern manifest verify FILE`, `kern manifest digest FILE` and `kern manifest expand FILE`.

verify: exit 0 and a short summary (vars, buffers by kind with bytes at the vars' maxima, states,
modules, ops, programs with call counts) on stdout; exit 2 and one `kern manifest: <pointer>:
<message> (<hint>)` line per problem on stderr (the first `PROBLEM_LIMIT`, then `... and N more
problems`), then `kern manifest: FILE: N problems`. digest: the sha256 of the canonical JSON of a
manifest that verifies. expand: that canonical JSON itself (wire-only constants replaced by their
numbers, defaults left out), indented, on stdout. A file that is missing, not a regular file or
over `MAX_BYTES` is one `kern manifest: FILE: ...` line before anything is read. None ever shows a
traceback for bad input.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from kern_cli.console import fail
from kern_manifest import (
    Manifest,
    ManifestRejected,
    digest,
    load_manifest,
    manifest_to_json,
    printable,
    short,
)

__all__ = ["MAX_BYTES", "PROG", "format_bytes", "register", "summary"]

PROG = "kern manifest"
MAX_BYTES = 256 << 20
"""The largest manifest file read (a Qwen3-4B manifest is 0.3 MB)."""

_KIND_ORDER = ("input", "output", "weight", "source", "workspace", "carry", "peer")


def register(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],  # pyright: ignore[reportPrivateUsage]
) -> None:
    """Adds `kern manifest {verify,digest,expand}` to the `kern` dispatcher."""
    parser = subparsers.add_parser("manifest", help="verify a manifest or print its digest")
    sub = parser.add_subparsers(dest="manifest_command", metavar="{verify,digest,expand}", required=True)
    verify = sub.add_parser("verify", help="check a manifest and summarise it")
    verify.add_argument("file", type=Path, help="manifest JSON file")
    verify.set_defaults(handler=_verify)
    dig = sub.add_parser("digest", help="sha256 of a verified manifest's canonical JSON")
    dig.add_argument("file", type=Path, help="manifest JSON file")
    dig.set_defaults(handler=_digest)
    expand = sub.add_parser("expand", help="a verified manifest's canonical JSON (constants expanded)")
    expand.add_argument("file", type=Path, help="manifest JSON file")
    expand.set_defaults(handler=_expand)


def format_bytes(n: int) -> str:
    """Bytes in binary units with three significant digits (`1.50 MiB`)."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{value:.3g} {unit}"
        value /= 1024
    return f"{n} B"


def summary(manifest: Manifest) -> list[str]:
    """The lines `kern manifest verify` prints for a manifest that verifies."""
    m = manifest
    lines = [f"model {short(m.model)!r}, schema_version {m.schema_version}"]
    var_text = ", ".join(f"{short(n)} in [1, {v.max}]" for n, v in m.vars.items()) or "none"
    lines.append(f"vars: {var_text}")
    by_kind: dict[str, list[int]] = defaultdict(list)
    for name, buf in m.buffers.items():
        by_kind[buf.kind].append(m.buffer_max_bytes(name))
    total = sum(sum(sizes) for sizes in by_kind.values())
    lines.append(f"buffers: {len(m.buffers)}, {format_bytes(total)} at the vars' maxima")
    for kind in _KIND_ORDER:
        if kind in by_kind:
            sizes = by_kind[kind]
            lines.append(f"  {kind:<10} {len(sizes):>5}  {format_bytes(sum(sizes))}")
    states = ", ".join(f"{short(n)} ({k} {v})" for n, s in m.states.items() for k, v in s.sizes.items())
    lines.append(f"states: {states or 'none'}")
    lines.append(f"modules: {len(m.modules)}; ops: {len(m.ops)}")
    lines.append(f"programs: {len(m.programs)}")
    for name, program in m.programs.items():
        flags = [f for f in ("once", "derive", "graph") if getattr(program, f)]
        if program.batch is not None:
            flags.append(f"batch {program.batch.groups}x{program.batch.rows}")
        extra = f" ({', '.join(flags)})" if flags else ""
        lines.append(f"  {short(name):<16} {len(program.calls):>5} calls{extra}")
    return [printable(line) for line in lines]


def _plural(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def _read(path: Path) -> bytes | None:
    try:
        if not path.exists():
            fail(PROG, f"{path}: no such file")
            return None
        if not path.is_file():
            fail(PROG, f"{path}: " + ("is a directory" if path.is_dir() else "not a regular file"))
            return None
        size = path.stat().st_size
        if size > MAX_BYTES:
            fail(PROG, f"{path}: {format_bytes(size)}, over the {format_bytes(MAX_BYTES)} a manifest may be")
            return None
        return path.read_bytes()
    except OSError as exc:
        fail(PROG, f"{path}: cannot read ({exc.strerror or exc})")
        return None


def _load(path: Path) -> Manifest | None:
    data = _read(path)
    if data is None:
        return None
    try:
        return load_manifest(data)
    except ManifestRejected as exc:
        for line in exc.lines():
            fail(PROG, line)
        fail(PROG, f"{path}: {_plural(len(exc.problems), 'problem')}")
        return None


def _verify(args: argparse.Namespace) -> int:
    manifest = _load(args.file)
    if manifest is None:
        return 2
    print(printable(f"{args.file}: ok"))
    for line in summary(manifest):
        print(line)
    return 0


def _digest(args: argparse.Namespace) -> int:
    manifest = _load(args.file)
    if manifest is None:
        return 2
    print(printable(f"{digest(manifest)}  {args.file}"))
    return 0


def _expand(args: argparse.Namespace) -> int:
    manifest = _load(args.file)
    if manifest is None:
        return 2
    print(json.dumps(manifest_to_json(manifest), indent=1))
    return 0
