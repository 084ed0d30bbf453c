"""Reading a capture dump: DIR/pid<N>/{launches.jsonl, modules.jsonl, module_<id>.cubin}.

The format is documented in docs/mining.md; launches.jsonl may be stored gzipped as
launches.jsonl.gz (the committed fixtures are). Loading is strict about records in the middle of a
file (a corrupt line is a typed error naming the line) and lenient about the last line of
launches.jsonl when the file does not end in a newline: a process killed mid-write leaves a
truncated tail, which is dropped with a note.
"""

from __future__ import annotations

import gzip
import json
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from kern_mining.errors import AmbiguousDumpError, CorruptDumpError, EmptyDumpError

__all__ = [
    "UNKNOWN_LAYOUT",
    "Dump",
    "ModuleRecord",
    "Param",
    "Pointer",
    "RecordedLaunch",
    "find_process_dirs",
    "load_dump",
    "resolve_dump_dir",
]

UNKNOWN_LAYOUT: Literal["unknown-layout"] = "unknown-layout"
MEMORY_TYPES = ("device", "host", "managed")


@dataclass(slots=True, frozen=True)
class Pointer:
    """The CUDA allocation a pointer-sized parameter points into."""

    memory_type: str
    range_start: int
    range_size: int


@dataclass(slots=True, frozen=True)
class Param:
    """One kernel parameter of one launch: its bytes and, for pointers, the allocation."""

    offset: int
    size: int
    data: str
    pointer: Pointer | None

    @property
    def value(self) -> int:
        """The parameter's bytes as an unsigned little-endian integer."""
        return int.from_bytes(bytes.fromhex(self.data), "little")


Params = tuple[Param, ...] | Literal["unknown-layout"] | None


@dataclass(slots=True, frozen=True)
class RecordedLaunch:
    """One kernel launch, as recorded on return of cuLaunchKernel / cuLaunchKernelEx."""

    index: int
    t_ns: int
    symbol: str
    module: int | None
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int
    cluster: tuple[int, int, int] | None
    params: Params


@dataclass(slots=True, frozen=True)
class ModuleRecord:
    """One loaded module: its id, hash, size, entry kernels and whether its cubin file exists."""

    id: int
    sha256: str
    bytes: int
    functions: tuple[str, ...]
    path: Path
    present: bool


@dataclass(frozen=True)
class Dump:
    """A loaded process dump; `notes` says what was dropped or is missing."""

    path: Path
    launches: tuple[RecordedLaunch, ...]
    modules: dict[int, ModuleRecord]
    notes: tuple[str, ...]


LAUNCH_FILES = ("launches.jsonl", "launches.jsonl.gz")


def _launches_file(base: Path) -> Path | None:
    return next((base / n for n in LAUNCH_FILES if (base / n).is_file()), None)


def find_process_dirs(root: Path) -> list[Path]:
    """The pid<N> directories under a capture root that hold a launches.jsonl(.gz), sorted."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and _launches_file(p) is not None)


def resolve_dump_dir(path: Path) -> Path:
    """The process dump a path names: itself if it holds launches.jsonl, else its one pid<N> dir.

    Raises:
        EmptyDumpError: nothing under `path` holds a launches.jsonl.
        AmbiguousDumpError: several process dumps; the message lists them.
    """
    if _launches_file(path) is not None:
        return path
    found = find_process_dirs(path)
    if not found:
        raise EmptyDumpError(
            f"{path}: no launches.jsonl here or in a pid<N>/ subdirectory; capture first"
        )
    if len(found) > 1:
        names = ", ".join(p.name for p in found)
        raise AmbiguousDumpError(f"{path} holds several process dumps ({names}); name one of them")
    return found[0]


def _corrupt(path: Path, line: int, why: str) -> CorruptDumpError:
    return CorruptDumpError(f"{path}:{line}: {why}; re-capture or cut the file before this line")


def _json_line(line: str) -> Any:
    try:
        return json.loads(line)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    except json.JSONDecodeError:
        raise
    except ValueError:
        # NOTE: json's one other ValueError: an integer past sys.get_int_max_str_digits() digits
        raise ValueError("a number too long") from None


def _int(rec: dict[str, Any], key: str) -> int:
    value = rec[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{key!r} must be a non-negative integer")
    return value


def _dim3(value: Any, key: str) -> tuple[int, int, int]:
    if not (isinstance(value, list) and len(value) == 3 and all(isinstance(v, int) for v in value)):
        raise ValueError(f"{key!r} must be a list of three integers")
    return (value[0], value[1], value[2])


def _pointer(value: Any) -> Pointer | None:
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("memory_type") not in MEMORY_TYPES:
        raise ValueError("'pointer' must be null or {memory_type, range_start, range_size}")
    return Pointer(value["memory_type"], _int(value, "range_start"), _int(value, "range_size"))


def _param(value: Any) -> Param:
    if not isinstance(value, dict):
        raise ValueError("each param must be an object")
    data = value["data"]
    size = _int(value, "size")
    if not isinstance(data, str) or len(data) != 2 * size:
        raise ValueError("param 'data' must be hex of 'size' bytes")
    int(data or "0", 16)
    return Param(_int(value, "offset"), size, data, _pointer(value.get("pointer")))


def _params(value: Any) -> Params:
    if value is None or value == UNKNOWN_LAYOUT:
        return value
    if not isinstance(value, list):
        raise ValueError("'params' must be null, \"unknown-layout\" or a list")
    return tuple(_param(p) for p in value)


def _launch(index: int, rec: Any) -> RecordedLaunch:
    if not isinstance(rec, dict):
        raise ValueError("a launch must be a JSON object")
    symbol = rec["symbol"]
    module = rec["module"]
    if not isinstance(symbol, str):
        raise ValueError("'symbol' must be a string")
    if module is not None and (not isinstance(module, int) or isinstance(module, bool)):
        raise ValueError("'module' must be an integer or null")
    cluster = rec["cluster"]
    return RecordedLaunch(
        index=index,
        t_ns=_int(rec, "t_ns"),
        symbol=symbol,
        module=module,
        grid=_dim3(rec["grid"], "grid"),
        block=_dim3(rec["block"], "block"),
        shared_mem=_int(rec, "shared_mem"),
        cluster=None if cluster is None else _dim3(cluster, "cluster"),
        params=_params(rec["params"]),
    )


def _read_launches(path: Path, notes: list[str]) -> list[RecordedLaunch]:
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, zlib.error) as exc:
        raise _corrupt(path, 1, f"not a readable gzip file ({exc})") from exc
    text = raw.decode("utf-8", errors="replace")
    lines = text.split("\n")
    complete = text.endswith("\n")
    if complete:
        lines.pop()
    launches: list[RecordedLaunch] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        last = number == len(lines)
        try:
            launches.append(_launch(len(launches), _json_line(line)))
        except (json.JSONDecodeError, KeyError, ValueError, TypeError) as exc:
            if last and not complete:
                notes.append(f"launches.jsonl: dropped the truncated last line {number} ({exc})")
                continue
            why = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc)
            raise _corrupt(path, number, why) from exc
    return launches


def _module(rec: Any, base: Path) -> ModuleRecord:
    if not isinstance(rec, dict):
        raise ValueError("a module must be a JSON object")
    sha = rec["sha256"]
    functions = rec["functions"]
    if not (isinstance(sha, str) and len(sha) == 64):
        raise ValueError("'sha256' must be 64 hex characters")
    if not (isinstance(functions, list) and all(isinstance(f, str) for f in functions)):
        raise ValueError("'functions' must be a list of strings")
    ident = _int(rec, "id")
    file = base / f"module_{ident}.cubin"
    return ModuleRecord(ident, sha, _int(rec, "bytes"), tuple(functions), file, file.is_file())


def _read_modules(base: Path, notes: list[str]) -> dict[int, ModuleRecord]:
    path = base / "modules.jsonl"
    if not path.is_file():
        notes.append("modules.jsonl is missing: launches cannot be tied to cubins")
        return {}
    modules: dict[int, ModuleRecord] = {}
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise _corrupt(path, line, f"not UTF-8 text (byte {exc.start})") from exc
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = _module(_json_line(line), base)
        except (json.JSONDecodeError, KeyError, ValueError, TypeError) as exc:
            raise _corrupt(path, number, str(exc)) from exc
        modules[record.id] = record
        if not record.present:
            notes.append(
                f"module {record.id}: {record.path.name} is missing (sha256 {record.sha256[:12]})"
            )
    return modules


def load_dump(path: Path) -> Dump:
    """Load one process dump (or a capture root holding exactly one).

    Raises:
        EmptyDumpError: no launches at all.
        CorruptDumpError: a record that is not valid JSON or lacks a key (the line is named).
        AmbiguousDumpError: a capture root with several process dumps.
    """
    base = resolve_dump_dir(path)
    notes: list[str] = []
    launches_file = _launches_file(base)
    assert launches_file is not None
    launches = _read_launches(launches_file, notes)
    if not launches:
        raise EmptyDumpError(
            f"{base}: launches.jsonl holds no launches; did the program launch kernels?"
        )
    modules = _read_modules(base, notes)
    unknown = sorted(
        {la.module for la in launches if la.module is not None and la.module not in modules}
    )
    if unknown and modules:
        notes.append(f"launches name modules missing from modules.jsonl: {unknown}")
    launches.sort(key=lambda la: (la.t_ns, la.index))
    return Dump(base, tuple(launches), modules, tuple(notes))
