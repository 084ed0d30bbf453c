"""The trust boundary of peer buffers: a kernel handed a peer buffer is scanned (cuobjdump -sass)
at load, and one with multicast instructions is refused.

A multicast address comes only from cuMulticastCreate, which kern never calls; but a kernel that
issues multicast loads through an address it is handed could put GPUs that others share out of
service, so such a kernel is not loaded next to peer buffers at all. On sm_90 and sm_100,
`multimem.ld_reduce` compiles to `LDGMC` (load-global-multicast-reduce); `multimem.st` and
`multimem.red` compile to the same `STG` / `REDG` encodings as ordinary stores and reductions and
cannot be told apart in SASS (their target address decides), so the scan names the opcodes that are
multicast by themselves: the `*GMC` family and any `MULTIMEM*` mnemonic.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

from .errors import KernelArtifactError, MissingToolError

__all__ = ["MULTICAST_OPCODE", "cuobjdump_path", "dump_sass", "multicast_lines", "sass_functions", "scan_kernel"]

MULTICAST_OPCODE = re.compile(r"^(?:[A-Z0-9]*GMC|MULTIMEM[A-Z0-9_]*)$")
"""A SASS base mnemonic (before the first '.') that is a multicast memory instruction."""

_FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)\s*$")
_INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)(?:\.[A-Z0-9_.]+)?\b")


def sass_functions(text: str) -> dict[str, list[str]]:
    """The instruction lines of each function in cuobjdump -sass output, by function name."""
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        m = _FUNCTION.match(line)
        if m:
            current = out.setdefault(m.group(1), [])
        elif current is not None and _INSTRUCTION.search(line):
            current.append(line.strip())
    return out


def multicast_lines(lines: list[str]) -> list[str]:
    """The instruction lines whose base mnemonic is a multicast memory instruction."""
    hits: list[str] = []
    for line in lines:
        m = _INSTRUCTION.search(line)
        if m and MULTICAST_OPCODE.match(m.group(1)):
            hits.append(line)
    return hits


def scan_kernel(functions: Mapping[str, list[str]], module: str, entry: str) -> None:
    """Refuses `entry` of `module` when its SASS holds a multicast instruction.

    Raises:
        KernelArtifactError: the entry is absent from the dump, or it issues multicast instructions.
    """
    lines = functions.get(entry)
    if lines is None:
        raise KernelArtifactError(
            f"module {module!r}: entry {entry!r} is not in its SASS (functions: {sorted(functions)}); re-extract it"
        )
    hits = multicast_lines(lines)
    if hits:
        first = hits[0].split(";")[0].split("*/", 1)[-1].strip()
        raise KernelArtifactError(
            f"module {module!r} entry {entry!r} is handed a peer buffer and issues multicast instructions "
            f"({len(hits)}, first: {first}); kern loads no multicast kernel beside peer buffers: re-extract "
            "a unicast one"
        )


def cuobjdump_path() -> str:
    """cuobjdump from NVIDIA's wheels (cuda-pathfinder) or PATH.

    Raises:
        MissingToolError: neither has it.
    """
    try:
        from cuda.pathfinder import find_nvidia_binary_utility

        found = find_nvidia_binary_utility("cuobjdump")
    except (ImportError, RuntimeError):
        found = None
    found = found or shutil.which("cuobjdump")
    if not found:
        raise MissingToolError(
            "cuobjdump not found (needed to scan kernels handed peer buffers): install kern-runtime[gpu] "
            "(nvidia-cuda-cuobjdump) or put a CUDA toolkit's bin on PATH"
        )
    return found


def _nvdisasm_env(tool: str) -> dict[str, str]:
    env = dict(os.environ)
    beside = Path(tool).with_name("nvdisasm")
    if "NVDISASM_PATH" not in env and beside.exists():
        env["NVDISASM_PATH"] = str(beside.parent)
    return env


def dump_sass(image: bytes, module: str) -> str:
    """cuobjdump -sass of a module image (cubin or fatbin).

    Raises:
        MissingToolError: no cuobjdump. KernelArtifactError: cuobjdump cannot read the image.
    """
    tool = cuobjdump_path()
    with tempfile.TemporaryDirectory(prefix="kern-sass-") as tmp:
        path = Path(tmp) / "module.cubin"
        path.write_bytes(image)
        proc = subprocess.run([tool, "-sass", str(path)], capture_output=True, text=True, env=_nvdisasm_env(tool),
                              check=False)
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        raise KernelArtifactError(
            f"module {module!r}: cuobjdump -sass failed ({detail[-1] if detail else proc.returncode}); "
            "re-extract it, or install nvidia-cuda-nvdisasm beside cuobjdump"
        )
    return proc.stdout
