"""Build the lab's kernel modules (tools/lab/kernels-src) against the product's headers
(tools/kernels-src/*.cuh) and the lab's own: all are staged into one directory and built by `kern
kernels`' builder, exactly as it builds the product's (a module's `// kern-arch: ...` line
included). A lab header may not take a product header's name."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Collection
from pathlib import Path

from kern_mining.build import build_kernels

__all__ = ["LAB_SRC", "PRODUCT_SRC", "build_lab_kernels", "lab_entry_modules"]

LAB_SRC = Path("tools/lab/kernels-src")
"""The lab's modules, relative to the repository root."""
PRODUCT_SRC = Path("tools/kernels-src")
"""The product's modules and headers, relative to the repository root."""


def _stage(dst: Path, lab_src: Path, product_src: Path) -> None:
    for header in (*product_src.glob("*.cuh"), *product_src.glob("*.h")):
        shutil.copy2(header, dst / header.name)
    for source in (*lab_src.glob("*.cuh"), *lab_src.glob("*.cu")):
        if (dst / source.name).exists():
            raise ValueError(f"lab source {source.name} shadows the product header of that name: rename it")
        shutil.copy2(source, dst / source.name)


def build_lab_kernels(out_dir: Path, *, lab_src: Path = LAB_SRC, product_src: Path = PRODUCT_SRC,
                      compiler: tuple[str, ...] = ("nvcc",),
                      modules: Collection[str] | None = None) -> dict[str, tuple[Path, str]]:
    """Builds the lab modules (`modules`, or all of them) into `out_dir` (cached by hash, as `kern
    kernels` does).

    Returns:
        module -> (cubin path, sha256), as `build_kernels` returns it.
    """
    with tempfile.TemporaryDirectory(prefix="kern-lab-src-") as tmp:
        _stage(Path(tmp), lab_src, product_src)
        return build_kernels(Path(tmp), out_dir, compiler=compiler, modules=modules)


def lab_entry_modules(*, lab_src: Path = LAB_SRC, product_src: Path = PRODUCT_SRC) -> dict[str, str]:
    """Kernel entry -> module over the product's and the lab's sources.

    Raises:
        KernelsError: an entry is defined twice.
    """
    from kern_qwen3 import entry_modules

    return entry_modules(product_src, lab_src)
