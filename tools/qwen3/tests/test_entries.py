"""kern_qwen3.entries: the entry scan of the kernel sources and the GEMV table against gemv.cu."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers.gemv_source import source_table

import kern_qwen3 as gen

TOOLS = Path(__file__).resolve().parents[2]


def test_entry_modules_scans_sources(tmp_path: Path) -> None:
    (tmp_path / "a.cu").write_text('extern "C" __global__ void kern_embed(int x) {}\n'
                                   'extern "C" __global__ void __launch_bounds__(256) kern_rmsnorm(int x) {}\n')
    (tmp_path / "b.cu").write_text('extern "C" __global__ void kern_argmax_final(int x) {}\n')
    assert gen.entry_modules(tmp_path) == {"kern_embed": "a", "kern_rmsnorm": "a", "kern_argmax_final": "b"}
    (tmp_path / "c.cu").write_text('extern "C" __global__ void kern_embed(int x) {}\n')
    with pytest.raises(gen.KernelsError, match="kern_embed"):
        gen.entry_modules(tmp_path)


def test_gemv_entries_table_matches_gemv_cu() -> None:
    """GEMV_ENTRIES is the launch shape each entry of gemv.cu declares (its template arguments and
    launch bounds), and gemv.cu defines no other GEMV entry."""
    text = (TOOLS / "kernels-src" / "gemv.cu").read_text()
    assert source_table(text) == dict(gen.GEMV_ENTRIES)
    assert set(re.findall(r"\b(kern_\w+)\(", text)) == set(gen.GEMV_ENTRIES)
    assert gen.SILU_ENTRIES == ("kern_gemv_bf16_silu",) and dict(gen.GEMV_BAND) == {"kern_gemv_bf16_b4": 7}


def test_product_gemv_modules_define_only_what_the_examples_launch() -> None:
    """Every entry of gemv.cu and gemv_defer.cu runs in a shipped manifest (the other
    configurations and layouts are the lab's, tools/lab/kernels-src)."""
    root = TOOLS.parent
    launched = {la["entry"] for p in (root / "examples").glob("*.json")
                for op in json.loads(p.read_text())["ops"].values() for la in op["impl"]["launches"]}
    defined = {e for e, m in gen.entry_modules(TOOLS / "kernels-src").items() if m in ("gemv", "gemv_defer")}
    assert defined == set(gen.GEMV_ENTRIES) | set(gen.DEFER_ENTRIES.values())
    assert defined <= launched, sorted(defined - launched)


def test_the_product_sources_hold_only_modules_a_shipped_manifest_pins() -> None:
    """`kern kernels` builds every module of tools/kernels-src: each is one an example pins, and the
    experiment modules are the lab's; device code shared between modules is in headers."""
    root = Path(__file__).resolve().parents[3]
    pinned = {m for p in (root / "examples").glob("qwen3-*.json") for m in json.loads(p.read_text())["modules"]}
    product = {p.stem for p in (root / "tools" / "kernels-src").glob("*.cu")}
    lab = {p.stem for p in (root / "tools" / "lab" / "kernels-src").glob("*.cu")}
    assert product == pinned and not product & lab
    for src in (*(root / "tools" / "kernels-src").glob("*.c*"), *(root / "tools" / "lab" / "kernels-src").glob("*.cu")):
        includes = re.findall(r'#include "([^"]+)"', src.read_text())
        assert all(inc.endswith(".cuh") for inc in includes), (src.name, includes)
