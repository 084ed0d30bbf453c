"""kern_qwen3.entries: the entry scan of the kernel sources and the GEMV table against gemv.cu."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

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
    """GEMV_ENTRIES' (columns per block, threads) follow from each entry's template arguments
    (warps, columns per group, unroll, split) and launch bounds in gemv.cu."""

    text = (TOOLS / "kernels-src" / "gemv.cu").read_text() + (TOOLS / "kernels-src" / "gemv.cuh").read_text()
    found = {}
    for bounds, entry, warps, cols, _unroll, split in re.findall(
            r"__launch_bounds__\((\d+)\)\s*(kern_gemv_bf16_\w+)\([^)]*\)\s*\{\s*gemv(?:_seq)?<(\d+), (\d+), (\d+), (\d+)", text):
        assert int(bounds) == int(warps) * 32, entry
        found[entry] = (int(warps) // int(split) * int(cols), int(bounds))
    table = {e: (v.columns, v.threads) for e, v in gen.GEMV_ENTRIES.items()}
    by = {layout: {e for e, v in gen.GEMV_ENTRIES.items() if v.layout is layout} for layout in gen.Layout}
    streaming, band, prefetched = by[gen.Layout.STREAM], by[gen.Layout.BAND], by[gen.Layout.PREFETCH]
    assert not by[gen.Layout.RING]  # the ring entries are the lab's
    assert found == {e: table[e] for e in by[gen.Layout.COLUMNS] if e != "kern_gemv_bf16"}
    silu = set(gen.silu_entries(gen.GEMV_ENTRIES))
    # The prefetched entry: 4 warps (kern_gemv_bf16_s4's split), its rows in dynamic shared memory.
    p4 = re.findall(r"__launch_bounds__\((\d+)\)\s*(kern_gemv_bf16_\w+)\([^)]*\)\s*\{\s*with_rows\(rows, "
                    r"\[&\]\(auto r\) \{ gemv_p4_rows<", text)
    assert {e: int(b) for b, e in p4} == {e: gen.GEMV_ENTRIES[e].threads for e in prefetched} == {
        "kern_gemv_bf16_p4": 128, "kern_gemv_bf16_p4_silu": 128}
    assert re.search(r"kern_gemv_bf16_p4_silu\([^)]*\)\s*\{\s*with_rows\(rows, \[&\]\(auto r\) \{ "
                     r"gemv_p4_rows<GEMV_SILU,", text)
    # Band entries: block = SPLIT warps, and the blocks per SM their launch bounds promise.
    bands = {e: (int(b), int(per_sm), int(split), epi) for b, per_sm, e, split, epi in re.findall(
        r"__launch_bounds__\((\d+), (\d+)\)\s*(kern_gemv_bf16_\w+)\([^)]*\)\s*\{\s*gemv_(?:band|deep)<(\d+), "
        r"(?:\d+, )+(GEMV_\w+)>", text)}
    assert set(bands) == band
    for e, (threads, per_sm, split, epi) in bands.items():
        v = gen.GEMV_ENTRIES[e]
        assert v.threads == threads == 32 * split and v.per_sm == per_sm
        assert (epi == "GEMV_SILU") == (e in silu)
    assert table["kern_gemv_bf16"] == (4, 128)  # the GEMV_* macros as built (docs/qwen3.md)
    # The streaming entries: 8 warps, the stage cap the generator sizes launches with.
    assert re.search(r"constexpr int TMA_WARPS = 16;", text)
    assert re.search(rf"#define GEMV_TMA_CAP {gen.GEMV_TMA_STAGE_CAP}\n", text)
    tma = dict(re.findall(r"__launch_bounds__\(TMA_WARPS \* 32, 1\)\s*(kern_gemv_bf16_\w+)\([^)]*\)\s*\{\s*gemv_tma<(\w+)>",
                          text))
    assert tma == {"kern_gemv_bf16_tma": "GEMV_STORE", "kern_gemv_bf16_tma_silu": "GEMV_SILU"}
    assert streaming == set(tma) and {e for e in silu if e in streaming} == {"kern_gemv_bf16_tma_silu"}
    assert all(gen.GEMV_ENTRIES[e].threads == 512 for e in streaming)




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
