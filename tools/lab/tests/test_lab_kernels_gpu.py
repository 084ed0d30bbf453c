"""GPU correctness of the lab's kernels (tools/lab/kernels-src: attention_cluster, attention_qkn, attention_wide,
gemv_defer_p4, gemv_norm, gemv_pnorm, gemv_ring, gemv_tail; gemv_alt's in test_gemv_alt_gpu.py)
against the shipped kernels and torch references, bit for bit wherever their designs promise it."""

from __future__ import annotations

import math

import pytest
from helpers.gpu_deps import gpu_import

torch = gpu_import("torch")
cupy = gpu_import("cupy")
transformers = gpu_import("transformers")

from helpers import kernel_harness as h  # noqa: E402 (it needs torch and cupy, checked above)
from helpers.kernel_cases import (  # noqa: E402
    BF16,
    DECODE_CLUSTER,
    DECODE_CLUSTER_FLOATS,
    DEV,
    EPS,
    LAYER,
    LAYERS,
    PAGE,
    RING_GRIDS,
    RING_SMEM_MAX,
    assert_folded,
    bits,
    block_table,
    gate_up_ref,
    norm_gemv_case,
    on_cluster_path,
    qkv_case,
    randn,
    ring_launch,
    rope_tables,
    run_folded,
    used_splits,
)

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def k(tmp_path_factory: pytest.TempPathFactory) -> object:
    return h.Kernels(tmp_path_factory.mktemp("kernels"), lab=True)


@pytest.fixture
def gen() -> torch.Generator:
    g = torch.Generator(device=DEV)
    g.manual_seed(1234)
    return g


@pytest.mark.parametrize(("nq", "nkv", "d", "seq_len", "splits"), [
    (32, 8, 128, 1, 32), (32, 8, 128, 17, 32), (32, 8, 128, 128, 32), (32, 8, 128, 129, 32),
    (32, 8, 128, 395, 32), (32, 8, 128, 513, 32), (32, 8, 128, 8192, 32), (32, 8, 128, 129, 8),
    (40, 8, 128, 128, 32), (64, 2, 128, 100, 32), (8, 1, 64, 531, 32), (24, 8, 64, 100, 32), (24, 8, 64, 1, 8),
    (8, 8, 128, 128, 32), (16, 8, 64, 100, 32), (16, 1, 128, 200, 32), (32, 1, 64, 50, 8), (40, 8, 64, 100, 32)])


def test_decode_attention_with_q_k_norm_is_qk_norm_rope_kv_then_attention(
    k: object, gen: torch.Generator, nq: int, nkv: int, d: int, seq_len: int, splits: int
) -> None:
    """kern_attn_decode_qkn (attention_qkn.cu) = kern_qk_norm_rope_kv then kern_attn_decode, bit for
    bit: the attention output and every page (the step's k / v row written by the split that holds
    it), both combine paths, groups of 1, 2, 3, 4, 5, 8, 16 and 32 query heads per kv head, head_dim
    64 and 128; qkv keeps the GEMV's raw values and the counters are zero again. Each launch gets its
    own NaN scratch, so the fused one cannot pass on the pair's partials."""
    maxpos = 8192 + 16
    pages = math.ceil(seq_len / PAGE) + 3
    kv = h.new_paged(LAYERS, pages, PAGE, nkv, d, gen)
    table = block_table(pages, gen)
    qkv, wq, wk, _pos = qkv_case(gen, 1, nq, nkv, d, maxpos)
    cos, sin = rope_tables(maxpos, d, 1e6)
    pos = torch.tensor([seq_len - 1], dtype=torch.int64, device=DEV)
    slots = table.long()[pos // PAGE] * PAGE + pos % PAGE
    seq = torch.tensor([seq_len], dtype=torch.int32, device=DEV)
    scale = d**-0.5
    counters = torch.zeros(nkv, dtype=torch.int32, device=DEV)

    def scratch() -> list[torch.Tensor]:
        return [torch.full((splits, nq, d), float("nan"), device=DEV), torch.full((splits, nq), float("nan"), device=DEV)]

    geometry = (h.i32(nq), h.i32(nkv), h.i32(d), h.i32(PAGE), h.i64(kv.page_stride), h.i32(splits), h.f32(scale))
    # the pair
    qkv_a, kv_a = qkv.clone(), h.Paged(kv.state.clone(), LAYERS, pages, PAGE, nkv, d)
    layer_a = h.ptr(kv_a.state, kv_a.layer_offset(LAYER))
    k.launch("kern_qk_norm_rope_kv", (1, nq + 2 * nkv), (d // 2,), h.ptr(qkv_a), h.ptr(wq), h.ptr(wk),
             h.ptr(pos), h.ptr(cos), h.ptr(sin), layer_a, h.ptr(slots), h.i32(nq), h.i32(nkv), h.i32(d),
             h.f32(EPS), h.i32(PAGE), h.i64(kv_a.page_stride))
    pair = torch.full((1, nq * d), float("nan"), dtype=BF16, device=DEV)
    sa = scratch()
    k.launch("kern_attn_decode", (nkv, splits), (128,), h.ptr(qkv_a), layer_a, h.ptr(table), h.ptr(seq),
             h.ptr(sa[0]), h.ptr(sa[1]), h.ptr(counters), h.ptr(pair), *geometry)
    torch.cuda.synchronize()
    # the fused launch
    qkv_b, kv_b = qkv.clone(), h.Paged(kv.state.clone(), LAYERS, pages, PAGE, nkv, d)
    one = torch.full((1, nq * d), float("nan"), dtype=BF16, device=DEV)
    sb = scratch()
    k.launch("kern_attn_decode_qkn", (nkv, splits), (128,), h.ptr(qkv_b), h.ptr(wq), h.ptr(wk), h.ptr(pos),
             h.ptr(cos), h.ptr(sin), h.ptr(kv_b.state, kv_b.layer_offset(LAYER)), h.ptr(slots), h.ptr(table),
             h.ptr(seq), h.ptr(sb[0]), h.ptr(sb[1]), h.ptr(counters), h.ptr(one), *geometry, h.f32(EPS))
    torch.cuda.synchronize()
    assert torch.equal(bits(one), bits(pair))
    assert torch.equal(bits(kv_b.state), bits(kv_a.state)), "the step's k / v row differs"
    assert torch.equal(bits(qkv_b), bits(qkv)), "qkv must keep the GEMV's values"
    assert not counters.any()


@pytest.mark.parametrize(("nq", "nkv", "d", "seq_len", "splits"), [
    (32, 8, 128, 128, 32), (32, 8, 128, 395, 32), (32, 8, 128, 512, 128), (32, 8, 128, 513, 32),
    (32, 8, 128, 600, 256), (32, 8, 128, 1025, 64), (32, 8, 128, 2053, 128), (32, 8, 128, 4096, 128),
    (32, 8, 128, 8192, 32), (32, 8, 128, 8192, 128), (32, 8, 128, 8192, 256), (8, 1, 64, 531, 32),
    (24, 8, 64, 3000, 64), (40, 8, 128, 2000, 128), (16, 1, 128, 8192, 256), (64, 2, 128, 531, 32),
    (64, 2, 128, 4000, 128)])


def test_wide_decode_attention_combines_per_cluster_then_over_the_clusters(
    k: object, gen: torch.Generator, nq: int, nkv: int, d: int, seq_len: int, splits: int
) -> None:
    """kern_attn_decode_wide (attention_wide.cu): on the cluster path (up to 512 tokens) and on the
    global path of groups wider than a cluster block's rows (group * head_dim > 2048) it is
    kern_attn_decode bit for bit; on the two-level path (longer contexts) it writes one partial per
    cluster of 8 splits (part_lse rows [0, ceil(used / 8)) and no others), its output agrees with
    kern_attn_decode's to bf16 rounding (another f32 order over the same partial rows) and with the
    reference attention, and three launches in a row leave the counters at zero. Edges: the last
    cluster with 1 used split (2053 tokens at 128 splits: 65 used), 6 (600 at 256), groups 1, 3, 4,
    5, 16 and 32, head_dim 64 and 128. kern_attn_decode_late / kern_attn_decode_wide_late give their
    plain entries' bits."""
    pages = math.ceil(seq_len / PAGE) + 3
    kv = h.new_paged(LAYERS, pages, PAGE, nkv, d, gen)
    table = block_table(pages, gen)
    qkv = randn(1, (nq + 2 * nkv) * d, gen=gen)
    seq = torch.tensor([seq_len], dtype=torch.int32, device=DEV)
    scale = d**-0.5
    layer = h.ptr(kv.state, kv.layer_offset(LAYER))
    geometry = (h.i32(nq), h.i32(nkv), h.i32(d), h.i32(PAGE), h.i64(kv.page_stride), h.i32(splits), h.f32(scale))
    counters = torch.zeros(nkv, dtype=torch.int32, device=DEV)

    def launch(entry: str) -> tuple[torch.Tensor, torch.Tensor]:
        out = torch.full((1, nq * d), float("nan"), dtype=BF16, device=DEV)
        po, pl = torch.full((splits, nq, d), float("nan"), device=DEV), torch.full((splits, nq), float("nan"), device=DEV)
        k.launch(entry, (nkv, splits), (128,), h.ptr(qkv), layer, h.ptr(table), h.ptr(seq), h.ptr(po), h.ptr(pl),
                 h.ptr(counters), h.ptr(out), *geometry)
        torch.cuda.synchronize()
        assert not counters.any(), f"{entry} must set its counters back to 0"
        return out, pl

    flat, _ = launch("kern_attn_decode")
    clustered = on_cluster_path(seq_len, nq // nkv, d)
    two_level = not clustered and (nq // nkv) * d <= DECODE_CLUSTER_FLOATS
    for _ in range(3):
        wide, pl = launch("kern_attn_decode_wide")
        if not two_level:
            assert torch.equal(bits(wide), bits(flat))
            continue
        clusters = math.ceil(used_splits(seq_len, splits) / DECODE_CLUSTER)
        assert not pl[:clusters].isnan().any() and pl[clusters:].isnan().all(), "one partial per used cluster"
        torch.testing.assert_close(wide.float(), flat.float(), atol=1e-3, rtol=8e-3)
    keys, vals = kv.gather(LAYER, table, seq_len)
    ref = h.attention_ref(qkv[:, : nq * d].view(1, nq, d), keys, vals, torch.tensor([seq_len - 1], device=DEV), scale)
    torch.testing.assert_close(wide.float(), ref, atol=4e-3, rtol=1e-2)
    # The `_late` entries (the PDL trigger after the fold) compute exactly what their plain entries do.
    for _ in range(2):
        assert torch.equal(bits(launch("kern_attn_decode_late")[0]), bits(flat))
        assert torch.equal(bits(launch("kern_attn_decode_wide_late")[0]), bits(wide))


@pytest.mark.parametrize(("entry", "band", "silu"), [("kern_gemv_bf16_b4_n", "kern_gemv_bf16_b4", False),
                                                     ("kern_gemv_bf16_b4_silu_n", "kern_gemv_bf16_b4_silu", True)])


@pytest.mark.parametrize(("rows", "n", "kk"), [(1, 6144, 2560), (1, 9728, 2560), (1, 300, 256), (2, 77, 4096),
                                               (4, 33, 264), (3, 5, 2568)])


def test_norm_folded_gemv_is_add_rmsnorm_then_the_band_gemv(
    k: object, gen: torch.Generator, entry: str, band: str, silu: bool, rows: int, n: int, kk: int
) -> None:
    """gemv_norm.cu: kern_add_rmsnorm (256 threads) then the band GEMV of its output, bit for bit, on
    several grids (the band's one wave, 1 block, 7, a block per column, more blocks than columns):
    the GEMV's output, the new residual in res_out (res_in untouched); with less dynamic shared
    memory than h and x need, it writes nothing."""
    case = norm_gemv_case(k, gen, band, rows, n, kk)
    smem = 4 * rows * kk
    for grid in (min(n, 924), 1, 7, n, n + 5):
        assert_folded(k, entry, case, n, kk, grid, smem, f"grid {grid}")
    got, res_out = run_folded(k, entry, case, n, kk, 7, smem - 16)
    assert got.isnan().all() and res_out.isnan().all(), "no room for h and x: nothing written"


@pytest.mark.parametrize("entry", ["kern_gemv_bf16_s4_an", "kern_gemv_bf16_p4_an"])
@pytest.mark.parametrize(("rows", "n", "kk"), [(1, 2560, 4096), (1, 2560, 9728), (2, 77 * 8, 264), (4, 40, 2568),
                                               (3, 8, 40)])


def test_tail_gemv_is_the_gemv_then_add_rmsnorm(
    k: object, gen: torch.Generator, entry: str, rows: int, n: int, kk: int
) -> None:
    """gemv_tail.cu: the GEMV (`_s4` / `_p4`, bit for bit), then kern_add_rmsnorm in its last block:
    x_out and the new residual in res_out bit for bit (res_in untouched), on several grids (a
    `_p4` block holding 1, 3 or every column), three launches in a row each leaving the block
    counter (both levels) at zero; without room for h and x, or with y_stride != n, nothing is written."""
    base = entry.removesuffix("_an")
    x = randn(rows, kk, gen=gen)
    w = randn(n, kk, gen=gen, scale=0.05)
    res = randn(rows, n, gen=gen, scale=2.0)
    w_norm = randn(n, gen=gen)
    y_want = torch.full((rows, n), float("nan"), dtype=BF16, device=DEV)
    k.launch("kern_gemv_bf16_s4", (n,), (128,), h.ptr(x), h.ptr(w), h.ptr(y_want), h.i32(rows), h.i32(n), h.i32(kk),
             h.i32(n))
    res_want, x_want = res.clone(), torch.empty(rows, n, dtype=BF16, device=DEV)
    k.launch("kern_add_rmsnorm", (rows,), (256,), h.ptr(res_want), h.ptr(y_want), h.ptr(w_norm), h.ptr(x_want),
             h.i32(n), h.f32(EPS))
    torch.cuda.synchronize()
    norm = 4 * rows * n
    if base == "kern_gemv_bf16_s4":
        launches = [(n, norm), (n, norm + 4096)]
    else:
        column = 2 * kk
        launches = [(-(-n // max(1, max(norm, c * column) // column)), max(norm, c * column)) for c in (1, 3, n)
                    if max(norm, c * column) <= 200 * 1024]
    counter = torch.zeros(1 + 32 * -(-n // 64), dtype=torch.int32, device=DEV)  # kern_lab.tail_counters(grid <= n)

    def run(grid: int, smem: int, y_stride: int = n) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        res_in = res.clone()
        y = torch.full((rows, y_stride), float("nan"), dtype=BF16, device=DEV)
        res_out = torch.full_like(res, float("nan"))
        x_out = torch.full_like(res, float("nan"))
        k.launch(entry, (grid,), (128,), h.ptr(x), h.ptr(w), h.ptr(y), h.i32(rows), h.i32(n), h.i32(kk),
                 h.i32(y_stride), h.ptr(res_in), h.ptr(w_norm), h.ptr(res_out), h.ptr(x_out), h.ptr(counter),
                 h.f32(EPS), shared_mem=smem)
        torch.cuda.synchronize()
        assert torch.equal(bits(res_in), bits(res)), "res_in must stay as it was"
        return y, res_out, x_out, counter.clone()

    for grid, smem in launches:
        for _ in range(3):
            y, res_out, x_out, count = run(grid, smem)
            assert not count.any(), f"grid {grid}: the counter must be back at 0"
            assert torch.equal(bits(y), bits(y_want)), f"grid {grid}, {smem} bytes: y"
            assert torch.equal(bits(res_out), bits(res_want)), f"grid {grid}, {smem} bytes: the new residual"
            assert torch.equal(bits(x_out), bits(x_want)), f"grid {grid}, {smem} bytes: x"
    for smem, y_stride in ((norm - 16, n), (launches[0][1], n + 8)):
        y, res_out, x_out, count = run(launches[0][0], max(smem, 2 * kk) if y_stride != n else smem, y_stride)
        assert y.isnan().all() and res_out.isnan().all() and x_out.isnan().all() and not count.any()


@pytest.mark.parametrize("silu", [False, True])
@pytest.mark.parametrize(("rows", "n", "kk"), [(1, 6144, 2560), (1, 9728, 2560), (1, 300, 256), (2, 77, 4096),
                                               (4, 33, 264), (3, 5, 2568)])


def test_prefetched_norm_gemv_is_add_rmsnorm_then_the_gemv(
    k: object, gen: torch.Generator, silu: bool, rows: int, n: int, kk: int
) -> None:
    """gemv_pnorm.cu (`_p4_n`, `_p4_silu_n`): kern_add_rmsnorm then `_b4` / `_b4_silu` of its output,
    bit for bit, with 1, 3 and 6 columns per block (a grid with blocks past the columns): the GEMV's
    output and the new residual in res_out (res_in untouched); with room for h and x but not for
    one column besides, nothing is written."""
    entry, band = ("kern_gemv_bf16_p4_silu_n", "kern_gemv_bf16_b4_silu") if silu else ("kern_gemv_bf16_p4_n",
                                                                                        "kern_gemv_bf16_b4")
    case = norm_gemv_case(k, gen, band, rows, n, kk)
    norm = 4 * rows * kk
    column = (2 if silu else 1) * 2 * kk
    for cols in (1, 3, 6):
        smem = min(cols, n) * column + norm
        if smem <= RING_SMEM_MAX:
            assert_folded(k, entry, case, n, kk, -(-n // min(cols, n)) + 2, smem, f"{cols} columns per block")
    got, res_out = run_folded(k, entry, case, n, kk, 7, norm + column - 16)
    assert got.isnan().all() and res_out.isnan().all(), "no room for a column: nothing written"


@pytest.mark.parametrize("silu", [False, True])
@pytest.mark.parametrize(("rows", "n", "kk"), [(1, 6144, 2560), (1, 2560, 9728), (1, 9728, 2560), (4, 1001, 2568),
                                               (2, 37, 40), (3, 925, 4096), (1, 5, 8)])


def test_ring_gemv_is_s4_bit_for_bit_on_any_grid_and_ring(
    k: object, gen: torch.Generator, silu: bool, rows: int, n: int, kk: int
) -> None:
    """gemv_ring.cu: `_r4` gives kern_gemv_bf16_s4's bits and `_r4_silu` `_b4_silu`'s (s4 over
    [gate; up], then act(gate) * up), on any grid and any ring (stages that wrap every column, every
    few, never); a grid larger than the columns leaves the rest alone; with less dynamic shared
    memory than one stage the launch writes nothing."""
    entry = "kern_gemv_bf16_r4_silu" if silu else "kern_gemv_bf16_r4"
    x = randn(rows, kk, gen=gen)
    w = randn(2 * n if silu else n, kk, gen=gen, scale=0.05)
    if silu:
        want = gate_up_ref(k, x, w, n)
    else:
        want = torch.full((rows, n), float("nan"), dtype=BF16, device=DEV)
        k.launch("kern_gemv_bf16_s4", (n,), (128,), h.ptr(x), h.ptr(w), h.ptr(want), h.i32(rows), h.i32(n),
                 h.i32(kk), h.i32(n))
    torch.cuda.synchronize()
    column = (2 if silu else 1) * 2 * kk
    for grid0, stages in RING_GRIDS:
        grid, smem = ring_launch(grid0, stages, n, column)
        y = torch.full((rows, n), float("nan"), dtype=BF16, device=DEV)
        k.launch(entry, (grid,), (128,), h.ptr(x), h.ptr(w), h.ptr(y), h.i32(rows), h.i32(n), h.i32(kk), h.i32(n),
                 shared_mem=smem)
        torch.cuda.synchronize()
        assert torch.equal(bits(y), bits(want)), f"grid {grid}, {smem} bytes"
    y = torch.full((rows, n), float("nan"), dtype=BF16, device=DEV)
    k.launch(entry, (7,), (128,), h.ptr(x), h.ptr(w), h.ptr(y), h.i32(rows), h.i32(n), h.i32(kk), h.i32(n),
             shared_mem=column - 16)
    torch.cuda.synchronize()
    assert y.isnan().all(), "no room for a stage: nothing written"


@pytest.mark.parametrize("silu", [False, True])
@pytest.mark.parametrize(("rows", "n", "kk"), [(1, 6144, 2560), (1, 9728, 2560), (1, 300, 256), (2, 77, 4096),
                                               (4, 33, 264), (3, 5, 2568)])


def test_ring_norm_gemv_is_add_rmsnorm_then_the_band_gemv(
    k: object, gen: torch.Generator, silu: bool, rows: int, n: int, kk: int
) -> None:
    """gemv_ring.cu's folded entries (`_r4_n`, `_r4_silu_n`): kern_add_rmsnorm then `_b4` /
    `_b4_silu` of its output, bit for bit, on any grid and ring: the GEMV's output and the new
    residual in res_out (res_in untouched); with room for h and x but not for one stage after them,
    nothing is written, res_out included."""
    entry, band = ("kern_gemv_bf16_r4_silu_n", "kern_gemv_bf16_b4_silu") if silu else ("kern_gemv_bf16_r4_n",
                                                                                        "kern_gemv_bf16_b4")
    case = norm_gemv_case(k, gen, band, rows, n, kk)
    norm = 4 * rows * kk
    column = (2 if silu else 1) * 2 * kk
    for grid0, stages in RING_GRIDS:
        grid, smem = ring_launch(grid0, stages, n, column, norm)
        assert_folded(k, entry, case, n, kk, grid, smem, f"grid {grid}, {smem} bytes")
    got, res_out = run_folded(k, entry, case, n, kk, 7, norm + column - 16)
    assert got.isnan().all() and res_out.isnan().all(), "no room for a stage: nothing written"


@pytest.mark.parametrize("silu", [False, True])
@pytest.mark.parametrize(("rows", "n", "kk"), [(1, 6144, 2560), (1, 9728, 2560), (2, 77, 4096), (1, 300, 256),
                                               (2, 5, 2568), (1, 33, 40)])


def test_prefetched_deferred_norm_gemv_is_the_band_deferred_gemv(
    k: object, gen: torch.Generator, silu: bool, rows: int, n: int, kk: int
) -> None:
    """gemv_defer_p4.cu (`_p4_d`, `_p4_silu_d`): the product's deferred band (`_b4_d`,
    `_b4_silu_d`) bit for bit, the two forms summing the same pieces in the same order, with 1, 3 or
    every column per block (where they fit) and a grid past the columns; the new residual is
    kern_add_rmsnorm's. 3 rows, k above 4096 or no room for one column write nothing."""
    band_d, p4_d, band = (("kern_gemv_bf16_b4_silu_d", "kern_gemv_bf16_p4_silu_d", "kern_gemv_bf16_b4_silu") if silu
                          else ("kern_gemv_bf16_b4_d", "kern_gemv_bf16_p4_d", "kern_gemv_bf16_b4"))
    case = norm_gemv_case(k, gen, band, rows, n, kk)
    res_a = case[4]
    column = (2 if silu else 1) * 2 * kk
    want, _res = run_folded(k, band_d, case, n, kk, -(-n // -(-n // (132 * 4))), 0)
    assert not want.isnan().any()
    for cols in sorted({1, 3, n}):
        if cols * column > RING_SMEM_MAX:
            continue
        got, res_out = run_folded(k, p4_d, case, n, kk, -(-n // cols) + 2, cols * column)
        assert torch.equal(bits(res_out), bits(res_a)), f"{cols} columns per block: the new residual"
        assert torch.equal(bits(got), bits(want)), f"{cols} columns per block"
    got, res_out = run_folded(k, p4_d, case, n, kk, 7, column - 16)
    assert got.isnan().all() and res_out.isnan().all(), "no room for a column: nothing written"
    for bad_rows, bad_k in ((1, 4104), (3, 256)):  # k beyond the registers' 4096; 3 rows
        bad = norm_gemv_case(k, gen, band, bad_rows, 8, bad_k)
        got, res_out = run_folded(k, p4_d, bad, 8, bad_k, 3, (2 if silu else 1) * 2 * bad_k)
        assert got.isnan().all() and res_out.isnan().all(), f"rows {bad_rows}, k {bad_k}: nothing written"


@pytest.mark.parametrize(("nq", "nkv", "d", "seq_len", "splits"), [
    (32, 8, 128, 1, 32), (32, 8, 128, 15, 32), (32, 8, 128, 16, 32), (32, 8, 128, 17, 32),
    (32, 8, 128, 112, 32), (32, 8, 128, 127, 32), (32, 8, 128, 128, 32), (32, 8, 128, 129, 32),
    (32, 8, 128, 255, 32), (32, 8, 128, 256, 32), (32, 8, 128, 257, 32), (32, 8, 128, 300, 32),
    (32, 8, 128, 395, 32), (32, 8, 128, 497, 32), (32, 8, 128, 512, 32), (32, 8, 128, 513, 32),
    (32, 8, 128, 1024, 32), (32, 8, 128, 1025, 32), (32, 8, 128, 2053, 32),
    (32, 8, 128, 4096, 32), (32, 8, 128, 8192, 32), (32, 8, 128, 128, 16), (32, 8, 128, 129, 16),
    (32, 8, 128, 513, 16), (32, 8, 128, 129, 8), (32, 8, 128, 255, 8), (32, 8, 128, 257, 8),
    (32, 8, 128, 8192, 8), (40, 8, 128, 531, 32), (40, 8, 128, 128, 32), (64, 4, 128, 531, 32),
    (64, 4, 128, 100, 32), (64, 4, 128, 100, 8), (64, 2, 128, 100, 32), (64, 2, 128, 531, 32),
    (8, 1, 64, 531, 32), (8, 1, 64, 128, 32), (32, 1, 64, 50, 8), (24, 8, 64, 100, 32),
    (24, 8, 64, 1, 8)])


def test_one_launch_decode_attention_is_the_two_launch_pair(
    k: object, gen: torch.Generator, nq: int, nkv: int, d: int, seq_len: int, splits: int
) -> None:
    """kern_attn_decode: bit-identical to partial + reduce (same partials, same order over the
    splits that hold tokens; groups 1..32), three launches in a row each leave the counters at zero
    again, and kern_zero_i32 zeroes them to start with. Split counts are multiples of 8 only (8,
    16, 32): the kernel's clusters are 8 blocks along grid y and the driver refuses any other grid
    (test_one_launch_decode_attention_refuses_splits_off_the_cluster). Both combine paths: the
    cluster path (up to 32 pages, i.e. contexts 1..512, and group * head_dim <= 2048) equals the
    pair at 8 splits and leaves part_o / part_lse unwritten; the global path (longer contexts, or
    the 32-head groups of nkv 2) equals the pair at `splits` and goes through them and the
    counters."""
    pages = math.ceil(seq_len / PAGE) + 3
    kv = h.new_paged(LAYERS, pages, PAGE, nkv, d, gen)
    table = block_table(pages, gen)
    qkv = randn(1, (nq + 2 * nkv) * d, gen=gen)
    seq = torch.tensor([seq_len], dtype=torch.int32, device=DEV)
    scale = d**-0.5
    layer = h.ptr(kv.state, kv.layer_offset(LAYER))
    clustered = on_cluster_path(seq_len, nq // nkv, d)
    plan = DECODE_CLUSTER if clustered else splits  # the pair's split count that kern_attn_decode equals
    shape = (h.i32(nq), h.i32(nkv), h.i32(d), h.i32(PAGE), h.i64(kv.page_stride))
    geometry = (*shape, h.i32(splits), h.f32(scale))
    part_o = torch.zeros(plan, nq, d, device=DEV)
    part_lse = torch.zeros(plan, nq, device=DEV)
    pair = torch.empty(1, nq * d, dtype=BF16, device=DEV)
    k.launch("kern_attn_decode_partial", (nkv, plan), (128,), h.ptr(qkv), layer, h.ptr(table), h.ptr(seq),
             h.ptr(part_o), h.ptr(part_lse), *shape, h.i32(plan), h.f32(scale))
    k.launch("kern_attn_decode_reduce", (nq,), (128,), h.ptr(part_o), h.ptr(part_lse), h.ptr(pair),
             h.i32(nq), h.i32(d), h.i32(plan))
    counters = torch.full((nkv,), 7, dtype=torch.int32, device=DEV)
    k.launch("kern_zero_i32", (1,), (32,), h.ptr(counters), h.i32(nkv))
    torch.cuda.synchronize()
    assert not counters.any()
    for _ in range(3):
        one = torch.full((1, nq * d), float("nan"), dtype=BF16, device=DEV)
        # NOTE: fresh NaN scratch each time (kept alive until the sync): nothing may read stale partials.
        po, pl = torch.full_like(part_o, float("nan")), torch.full_like(part_lse, float("nan"))
        k.launch("kern_attn_decode", (nkv, splits), (128,), h.ptr(qkv), layer, h.ptr(table), h.ptr(seq),
                 h.ptr(po), h.ptr(pl), h.ptr(counters), h.ptr(one), *geometry)
        torch.cuda.synchronize()
        assert torch.equal(bits(one), bits(pair))
        assert not counters.any(), "the reducing block must set its counter back to 0"
        if clustered:
            assert po.isnan().all() and pl.isnan().all(), "the cluster path must not write global partials"
        else:
            used = used_splits(seq_len, splits)
            assert torch.equal(pl[:used], part_lse[:used]), "the global path writes the pair's partials"
    keys, vals = kv.gather(LAYER, table, seq_len)
    ref = h.attention_ref(qkv[:, : nq * d].view(1, nq, d), keys, vals, torch.tensor([seq_len - 1], device=DEV), scale)
    torch.testing.assert_close(one.float(), ref, atol=4e-3, rtol=1e-2)


# NOTE: last in the module: a refused launch is a launch-configuration error (not sticky), but if a
# driver ever made it sticky only this test would see the broken context.
@pytest.mark.parametrize("splits", [2, 12, 36])
def test_one_launch_decode_attention_refuses_splits_off_the_cluster(k: object, gen: torch.Generator, splits: int) -> None:
    """kern_attn_decode's grid y must be a multiple of its cluster size (8): the driver refuses the
    launch, and nothing is written (out, counters and the partials stay as they were)."""
    nq, nkv, d, seq_len = 32, 8, 128, 128
    pages = math.ceil(seq_len / PAGE)
    kv = h.new_paged(LAYERS, pages, PAGE, nkv, d, gen)
    table = block_table(pages, gen)
    qkv = randn(1, (nq + 2 * nkv) * d, gen=gen)
    seq = torch.tensor([seq_len], dtype=torch.int32, device=DEV)
    po = torch.full((splits, nq, d), 3.0, device=DEV)
    pl = torch.full((splits, nq), 3.0, device=DEV)
    counters = torch.zeros(nkv, dtype=torch.int32, device=DEV)
    out = torch.full((1, nq * d), 5.0, dtype=BF16, device=DEV)
    with pytest.raises(cupy.cuda.driver.CUDADriverError):
        k.launch("kern_attn_decode", (nkv, splits), (128,), h.ptr(qkv), h.ptr(kv.state, kv.layer_offset(LAYER)),
                 h.ptr(table), h.ptr(seq), h.ptr(po), h.ptr(pl), h.ptr(counters), h.ptr(out), h.i32(nq),
                 h.i32(nkv), h.i32(d), h.i32(PAGE), h.i64(kv.page_stride), h.i32(splits), h.f32(d**-0.5))
    torch.cuda.synchronize()
    assert (out.float() == 5.0).all() and (po == 3.0).all() and (pl == 3.0).all() and not counters.any()
