"""kern_mining.build.module_arch: the `// kern-arch: sm_90a` line a module declares its GPU
architecture with (the builder's flags follow it: packages/kern-cli/tests/test_kernels_cmd.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kern_mining.build import KernelArchError, KernelSourceError, module_arch

REPO = Path(__file__).resolve().parents[3]


def _module(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "mod.cu"
    path.write_text(text)
    return path


@pytest.mark.parametrize(("text", "arch"), [
    ('extern "C" __global__ void k() {}\n', None),
    ('// kern-arch: sm_90a\nextern "C" __global__ void k() {}\n', "sm_90a"),
    ("#include <x>\n  //kern-arch:sm_100a   \n", "sm_100a"),
    ("// kern-arch: sm_90\n", "sm_90"),
    ("// a comment that mentions // kern-arch: sm_100a mid-line\n", None),
    ("int x; // kern-arch: sm_90a\n", None),
    ("// kern-architecture of this file: none\n", None),
])
def test_the_declared_architecture(tmp_path: Path, text: str, arch: str | None) -> None:
    assert module_arch(_module(tmp_path, text)) == arch


@pytest.mark.parametrize(("text", "message"), [
    ("// kern-arch sm_90a\n", "mod.cu: '// kern-arch sm_90a' names no architecture"),
    ("// kern-arch:\n", "mod.cu: '// kern-arch:' names no architecture"),
    ("// kern-arch: 90a\n", "mod.cu: '// kern-arch: 90a' names no architecture"),
    ("// kern-arch: sm_90a -G\n", "mod.cu: '// kern-arch: sm_90a -G' names no architecture"),
    ("// kern-arch: compute_90a\n", "mod.cu: '// kern-arch: compute_90a' names no architecture"),
    ("// kern-arch: sm_90a\n// kern-arch: sm_90a\n", "mod.cu has 2 kern-arch lines: keep one"),
    ("// kern-arch: sm_90a\n// kern-arch: sm_100a\n", "mod.cu has 2 kern-arch lines: keep one"),
])
def test_a_malformed_or_repeated_line_is_a_typed_error(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(KernelArchError, match=re.escape(message)) as info:
        module_arch(_module(tmp_path, text))
    assert isinstance(info.value, KernelSourceError)
    assert len(str(info.value).splitlines()) == 1


def test_the_product_modules_declare_sm_90a_only_where_they_issue_wgmma() -> None:
    """prefill.cu includes wgmma.cuh and declares sm_90a; every other product module builds for
    sm_90 (no line)."""
    found = {p.stem: module_arch(p) for p in sorted((REPO / "tools" / "kernels-src").glob("*.cu"))}
    assert found.pop("prefill") == "sm_90a"
    assert set(found.values()) == {None}
    assert '#include "wgmma.cuh"' in (REPO / "tools" / "kernels-src" / "prefill.cuh").read_text()
