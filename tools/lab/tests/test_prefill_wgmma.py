"""prefill_wgmma.cu on the CPU: kern_lab.WGMMA_PREFILL against the source's WG_ENTRY lines, the launch
shapes against kern_prefill_attn's, the lab builder's `lab-arch` lines, and the module built by nvcc
for sm_90a (skipped only where nvcc is absent)."""

from __future__ import annotations

import math
import re
import shutil
from pathlib import Path

import pytest

import kern_lab as lab
from kern_mining.build import CompileError, build_kernels
from kern_qwen3.entries import PREFILL_BM, PREFILL_SPLIT_ROWS, PREFILL_SPLITS

TOOLS = Path(__file__).resolve().parents[2]
LAB_SRC = TOOLS / "lab" / "kernels-src"
PRODUCT_SRC = TOOLS / "kernels-src"
SRC = LAB_SRC / "prefill_wgmma.cu"
SM_SMEM = 228 * 1024  # shared memory of an H100/H200 SM, 1 KiB of it reserved per block
BLOCK_SMEM = 227 * 1024  # the most one block may ask for


def test_table_is_the_sources_entries() -> None:
    found = {name: lab.WgmmaPrefill(int(stages), overlap=bool(int(overlap)))
             for name, stages, overlap in re.findall(r"^WG_ENTRY\((\w+), (\d+), ([01])\)$", SRC.read_text(),
                                                      re.MULTILINE)}
    assert found == dict(lab.WGMMA_PREFILL)
    assert set(found) == {"kern_prefill_attn_wgmma", "kern_prefill_attn_wgmma_s3", "kern_prefill_attn_wgmma_ov"}
    assert all(v.stages == 3 for v in found.values() if v.overlap)  # the overlapped loop's static_assert
    assert lab.lab_arch(LAB_SRC) == {"prefill_wgmma": "sm_90a"}


def test_shared_memory_fits_two_blocks_per_sm() -> None:
    s2, s3 = lab.WGMMA_PREFILL["kern_prefill_attn_wgmma"], lab.WGMMA_PREFILL["kern_prefill_attn_wgmma_s3"]
    # Q 16 KiB, each stage K + V 32 KiB, 1 KiB of alignment slack (head_dim 128)
    assert (s2.smem(128), s3.smem(128), s2.smem(64)) == (82944, 115712, 41984)
    for v in lab.WGMMA_PREFILL.values():
        for d in (64, 128):
            assert v.smem(d) <= BLOCK_SMEM
            assert v.per_sm * (v.smem(d) + 1024) <= SM_SMEM, (v, d)
    text = SRC.read_text()
    assert "__launch_bounds__(WG_THREADS, 2)" in text and "constexpr int WG_THREADS = 128;" in text
    assert "dynamic shared memory 1024 + (1 + 2 * STAGES) * 64 * head_dim * 2" in text


@pytest.mark.parametrize("rows", [1, 5, 15, 16, 17, 37, 97, 200, 300, 511, 512, 709, 4096])
@pytest.mark.parametrize(("nq", "nkv"), [(32, 8), (8, 8), (4, 2), (8, 1), (40, 8)])
def test_grid_is_kern_prefill_attns(rows: int, nq: int, nkv: int) -> None:
    product = (math.ceil(rows * (nq // nkv) / PREFILL_BM), nkv, min(PREFILL_SPLITS, math.ceil(PREFILL_SPLIT_ROWS / rows)))
    for v in lab.WGMMA_PREFILL.values():
        assert v.grid(rows, nq, nkv) == product
        assert (v.threads, v.packed_rows) == (128, PREFILL_BM)


def test_lab_arch_reads_one_line_per_module(tmp_path: Path) -> None:
    (tmp_path / "plain.cu").write_text('extern "C" __global__ void kern_a() {}\n')
    (tmp_path / "hopper.cu").write_text('// lab-arch: sm_90a\nextern "C" __global__ void kern_b() {}\n')
    (tmp_path / "quoted.cu").write_text('// a comment that mentions // lab-arch: sm_100a mid-line\n')
    assert lab.lab_arch(tmp_path) == {"hopper": "sm_90a"}
    (tmp_path / "twice.cu").write_text("// lab-arch: sm_90a\n// lab-arch: sm_100a\n")
    with pytest.raises(ValueError, match=re.escape("twice.cu names architectures sm_100a, sm_90a")):
        lab.lab_arch(tmp_path)


def test_build_lab_kernels_passes_the_arch_of_the_selected_modules(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the modules built get an architecture: a selection without the sm_90a module passes
    none (build_kernels refuses an architecture for a module it does not build)."""
    seen: list[tuple[object, object]] = []

    def fake_build(src: Path, out: Path, *, compiler: object, modules: object, arch: object) -> dict[str, object]:
        seen.append((modules, arch))
        return {}

    monkeypatch.setattr("kern_lab.kernels.build_kernels", fake_build)
    lab.build_lab_kernels(tmp_path, lab_src=LAB_SRC, product_src=PRODUCT_SRC, modules={"gemv_alt"})
    lab.build_lab_kernels(tmp_path, lab_src=LAB_SRC, product_src=PRODUCT_SRC, modules={"prefill_wgmma"})
    lab.build_lab_kernels(tmp_path, lab_src=LAB_SRC, product_src=PRODUCT_SRC)
    assert seen == [({"gemv_alt"}, {}), ({"prefill_wgmma"}, {"prefill_wgmma": "sm_90a"}),
                    (None, {"prefill_wgmma": "sm_90a"})]


@pytest.fixture
def nvcc() -> str:
    found = shutil.which("nvcc")
    if found is None:
        pytest.skip("nvcc is not on PATH")
    return found


def test_the_module_builds_for_sm_90a_and_not_for_sm_90(nvcc: str, tmp_path: Path) -> None:
    """The lab builder compiles prefill_wgmma.cu for sm_90a (the cubin records ptxas' -arch); the
    product's flags alone (sm_90) cannot compile wgmma."""
    built = lab.build_lab_kernels(tmp_path / "lab", lab_src=LAB_SRC, product_src=PRODUCT_SRC, compiler=(nvcc,),
                                  modules={"prefill_wgmma"})
    path, _sha = built["prefill_wgmma"]
    cubin = path.read_bytes()
    assert cubin[:4] == b"\x7fELF" and b"-arch sm_90a" in cubin
    for entry in lab.WGMMA_PREFILL:
        assert entry.encode() in cubin
    staged = tmp_path / "staged"
    staged.mkdir()
    for f in (*PRODUCT_SRC.glob("*.cuh"), *LAB_SRC.glob("*.cuh"), SRC):
        shutil.copy2(f, staged / f.name)
    with pytest.raises(CompileError, match=re.escape("prefill_wgmma.cu failed to compile")):
        build_kernels(staged, tmp_path / "sm90", compiler=(nvcc,))
