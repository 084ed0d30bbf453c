"""Builds the GPU tests' kernels: CUDA C with nvcc, a same-named Triton pair packed in one fatbin."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from .fatbin import pack_fatbin

KERNELS = Path(__file__).resolve().parent.parent / "kernels"


def nvcc() -> str:
    found = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not Path(found).exists():
        raise RuntimeError("nvcc not found: GPU tests build their kernels with it")
    return found


def build_cuda(out: Path, kind: str = "cubin") -> Path:
    """rt_test.cu compiled for sm_90 as a cubin (or a fatbin)."""
    target = out / f"rt_test.{kind}"
    subprocess.run([nvcc(), f"-{kind}", "-arch=sm_90", "-o", str(target), str(KERNELS / "rt_test.cu")], check=True)
    return target


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_manifest(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(json.dumps(doc))
    return path


def build_triton_pair(out: Path) -> tuple[Path, dict[str, Any]]:
    """Two Triton kernels named add_k (n a runtime i32 vs n constexpr, SCALE 2 vs 3) in one fatbin."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def add_k(x, y, out, n, SCALE: tl.constexpr, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        tl.store(out + i, tl.load(x + i, mask=m) * SCALE + tl.load(y + i, mask=m), mask=m)

    def make_const():  # type: ignore[no-untyped-def]
        @triton.jit
        def add_k(x, y, out, n: tl.constexpr, SCALE: tl.constexpr, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
            i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            m = i < n
            tl.store(out + i, tl.load(x + i, mask=m) * SCALE + tl.load(y + i, mask=m), mask=m)

        return add_k

    x = torch.zeros(1024, device="cuda")
    a = add_k[(4,)](x, x, x, 1000, SCALE=2, BLOCK=256, num_warps=4)
    b = make_const()[(4,)](x, x, x, 1024, SCALE=3, BLOCK=256, num_warps=4)
    torch.cuda.synchronize()
    cubins = [k.asm["cubin"] for k in (a, b)]
    names = [k.metadata.name for k in (a, b)]
    fat = out / "pair.fatbin"
    fat.write_bytes(pack_fatbin([(90, c) for c in cubins]))
    return fat, {"names": names, "shared": [k.metadata.shared for k in (a, b)]}
