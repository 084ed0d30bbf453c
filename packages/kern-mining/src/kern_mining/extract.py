"""Extraction: copy the cubins a manifest pins by sha256 out of a capture dump into kernels/.

Files are named <module>-<sha12>.cubin and only ever added: an existing file with the same bytes
is left alone, one with other bytes is an error, and nothing is written unless every module is
found.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from kern_mining.errors import KernelConflictError, ManifestModulesError, MissingModuleError

__all__ = ["ExtractReport", "extract_kernels", "index_cubins"]

SHA256 = re.compile(r"[0-9a-f]{64}")
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


@dataclass(frozen=True)
class ExtractReport:
    """Files written, and files that were already there with the right bytes."""

    added: tuple[Path, ...]
    present: tuple[Path, ...]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def index_cubins(dump_dir: Path) -> dict[str, Path]:
    """sha256 -> file for every module_<id>.cubin in a dump (a pid<N> dir or a capture root)."""
    files = sorted(dump_dir.glob("module_*.cubin")) + sorted(dump_dir.glob("*/module_*.cubin"))
    index: dict[str, Path] = {}
    for f in files:
        index.setdefault(_sha(f), f)
    return index


def _json_file(path: Path) -> object:
    """The JSON value of a file.

    Raises:
        ManifestModulesError: unreadable, not UTF-8, not JSON (a number past Python's digit limit too).
    """
    try:
        text = path.read_bytes().decode("utf-8")
        return json.loads(text)
    except OSError as exc:
        why = exc.strerror or str(exc)
    except UnicodeDecodeError as exc:
        why = f"not UTF-8 text, byte {exc.start}"
    except json.JSONDecodeError as exc:
        why = str(exc)
    except RecursionError:
        why = "nested too deeply"
    except ValueError:
        why = "a number too long"  # NOTE: json's other ValueError: past sys.get_int_max_str_digits()
    raise ManifestModulesError(f"{path}: cannot read it as JSON ({why})")


def _manifest_modules(manifest_path: Path) -> dict[str, str]:
    data = _json_file(manifest_path)
    modules = data.get("modules") if isinstance(data, dict) else None
    if not isinstance(modules, dict) or not modules:
        raise ManifestModulesError(
            f'{manifest_path}: no "modules" table of {{name: {{source, sha256}}}}'
        )
    pins: dict[str, str] = {}
    for name, entry in modules.items():
        sha = entry.get("sha256") if isinstance(entry, dict) else None
        if not isinstance(sha, str) or not SHA256.fullmatch(sha):
            raise ManifestModulesError(
                f"{manifest_path}: module {name!r} has no 64-hex lowercase sha256"
            )
        if not NAME.fullmatch(name):
            raise ManifestModulesError(
                f"{manifest_path}: module name {name!r} is not a plain file-name stem"
            )
        pins[name] = sha
    return pins


def extract_kernels(dump_dir: Path, manifest_path: Path, kernels_dir: Path) -> ExtractReport:
    """Copy every module the manifest names out of the dump into kernels_dir/<module>-<sha12>.cubin.

    Raises:
        ManifestModulesError: the manifest has no valid modules table.
        MissingModuleError: some hashes are in no cubin of the dump (all are listed; nothing written).
        KernelConflictError: a target file exists with other bytes (nothing written).
    """
    pins = _manifest_modules(manifest_path)
    index = index_cubins(dump_dir)
    missing = [f"{n} ({s[:12]})" for n, s in sorted(pins.items()) if s not in index]
    if missing:
        raise MissingModuleError(
            f"{dump_dir} has no cubin for {', '.join(missing)}; capture the process that loads them"
        )
    plan: list[tuple[Path, Path]] = []
    present: list[Path] = []
    for name, sha in sorted(pins.items()):
        target = kernels_dir / f"{name}-{sha[:12]}.cubin"
        if not target.exists():
            plan.append((index[sha], target))
        elif target.is_file() and _sha(target) == sha:
            present.append(target)
        else:
            raise KernelConflictError(
                f"{target} exists with other bytes; extraction only adds, move it away first"
            )
    kernels_dir.mkdir(parents=True, exist_ok=True)
    for source, target in plan:
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_bytes(source.read_bytes())
        os.replace(tmp, target)
    return ExtractReport(tuple(t for _, t in plan), tuple(present))
