"""prefill_wgmma.cu's entries (+ the shipped kern_prefill_combine) against the f32 reference over the
gathered pages with the bound of tools/tests/test_prefill_gpu.py, and against the shipped
kern_prefill_attn on the same chunk (the largest difference is recorded as a JUnit property): the
product test's chunks (position 0, short chunks over long prefixes: the key split, empty splits
included), lengths crossing pages and 64-key tiles, GQA groups 8, 4, 2 and 1, head_dim 128 and 64,
one chunk against several.

The first tests isolate the two products: with every key zero the scores are uniform, so only
O = P V (the V descriptors, the P fragments, the causal mask) decides the output; with V one-hot
per key the output is P itself, so only S = Q K^T (the Q and K descriptors) and the softmax decide.
A failure there names the half that is wrong."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
from helpers.gpu_deps import gpu_import

torch = gpu_import("torch")
cupy = gpu_import("cupy")

from helpers import kernel_harness as h  # noqa: E402 (it needs torch and cupy, checked above)
from helpers.prefill_cases import Chunk, PrefillCase, attention_ref, new_case  # noqa: E402
from time_prefill_variants import blocks_per_sm, launch_wgmma  # noqa: E402

from kern_lab import WGMMA_PREFILL  # noqa: E402

pytestmark = pytest.mark.gpu

Record = Callable[[str, object], None]  # the record_property fixture
ATOL = RTOL = 1e-2  # tools/tests/test_prefill_gpu.py's bound
ENTRIES = list(WGMMA_PREFILL)
CHUNKS = [(0, 1), (0, 15), (0, 16), (0, 17), (0, 709), (0, 4096), (14000, 37), (14000, 200), (30000, 512)]
CROSSING = [(0, 63), (0, 64), (0, 65), (0, 129), (5, 123), (50, 100), (1000, 1), (1023, 1), (1024, 1), (4095, 2)]


@pytest.fixture(scope="module")
def k(tmp_path_factory: pytest.TempPathFactory) -> h.Kernels:
    return h.Kernels(tmp_path_factory.mktemp("kernels"), lab=True)


@pytest.fixture
def gen() -> torch.Generator:
    g = torch.Generator(device="cuda")
    g.manual_seed(2468)
    return g


def _run(k: h.Kernels, entry: str, case: PrefillCase, start: int, rows: int) -> torch.Tensor:
    chunk = Chunk(case, start, rows)
    launch_wgmma(k, entry, chunk)
    torch.cuda.synchronize()
    unwritten = int(chunk.out.isnan().any(dim=1).sum())
    assert unwritten == 0, f"{entry}: {unwritten} of {rows} rows left unwritten (NaN)"
    return chunk.out


def _shipped(k: h.Kernels, case: PrefillCase, start: int, rows: int) -> torch.Tensor:
    chunk = Chunk(case, start, rows)
    chunk.launch_new(k)
    torch.cuda.synchronize()
    return chunk.out


def _where(out: torch.Tensor, ref: torch.Tensor, nq: int, d: int) -> str:
    """The worst element as (row, head, dim) and how many elements break the bound."""
    err = (out.float() - ref).abs().nan_to_num(float("inf"))
    bad = int((err > ATOL + RTOL * ref.abs()).sum())
    flat = int(err.argmax())
    row, col = divmod(flat, nq * d)
    return f"max |err| {float(err.max()):.3e} at row {row}, head {col // d}, dim {col % d}; {bad} elements out of bound"


def _check(k: h.Kernels, entry: str, case: PrefillCase, start: int, rows: int,
           record: Record | None = None, what: str = "") -> None:
    out = _run(k, entry, case, start, rows)
    ref = attention_ref(case, start, rows)
    shipped = _shipped(k, case, start, rows)
    vs_shipped = float((out.float() - shipped.float()).abs().max())
    if record is not None:
        record("max_vs_shipped", f"{vs_shipped:.3e}")
        record("max_vs_reference", f"{float((out.float() - ref).abs().max()):.3e}")
    ok = bool(((out.float() - ref).abs() <= ATOL + RTOL * ref.abs()).all())
    assert ok, (f"{entry} {what}(nq {case.nq}, nkv {case.nkv}, d {case.d}, start {start}, rows {rows}) against the "
                f"f32 reference: {_where(out, ref, case.nq, case.d)}; vs the shipped kernel {vs_shipped:.3e}")
    torch.testing.assert_close(out.float(), shipped.float(), atol=2 * ATOL, rtol=2 * RTOL)


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize(("nq", "nkv", "d", "start", "rows"), [(8, 8, 128, 0, 16), (32, 8, 128, 0, 300),
                                                               (32, 8, 128, 3000, 5), (8, 1, 64, 0, 97)])
def test_pv_alone_with_uniform_scores(k: h.Kernels, gen: torch.Generator, entry: str, nq: int, nkv: int, d: int,
                                      start: int, rows: int) -> None:
    """Every key zero: S = 0, each row the mean of the values it sees; a failure is in P V."""
    case = new_case(nq, nkv, d, start + rows, gen)
    case.state[:, 0] = 0
    _check(k, entry, case, start, rows, what="[P V path: V descriptors, P fragments, mask] ")


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize(("nq", "nkv", "d", "start", "rows"), [(8, 8, 128, 0, 16), (32, 8, 128, 0, 100),
                                                               (8, 1, 64, 0, 60)])
def test_scores_alone_with_one_hot_values(k: h.Kernels, gen: torch.Generator, entry: str, nq: int, nkv: int,
                                          d: int, start: int, rows: int) -> None:
    """V of key j is the unit vector e_j (keys < head_dim): each output row is the row's softmax
    itself; a failure is in S = Q K^T (the Q and K descriptors) or the softmax."""
    case = new_case(nq, nkv, d, start + rows, gen, q_scale=0.5)
    eye = torch.eye(d, device="cuda", dtype=torch.bfloat16)
    pos = torch.arange(case.length, device="cuda")
    pages = case.table.long()[pos // 16]
    case.state[pages, 1, pos % 16] = eye[pos][:, None, :].expand(-1, nkv, -1)
    _check(k, entry, case, start, rows, what="[S path: Q/K descriptors, softmax] ")


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize(("start", "rows"), CHUNKS)
@pytest.mark.parametrize(("nq", "nkv"), [(32, 8), (8, 8)], ids=["group4", "group1"])
def test_matches_reference_and_shipped(k: h.Kernels, gen: torch.Generator, record_property: Record,
                                       entry: str, start: int, rows: int, nq: int, nkv: int) -> None:
    _check(k, entry, new_case(nq, nkv, 128, start + rows, gen), start, rows, record_property)


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize(("start", "rows"), CROSSING)
def test_lengths_crossing_pages_and_tiles(k: h.Kernels, gen: torch.Generator, record_property: Record,
                                          entry: str, start: int, rows: int) -> None:
    _check(k, entry, new_case(32, 8, 128, start + rows, gen), start, rows, record_property)


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize(("nq", "nkv", "d"), [(4, 2, 128), (8, 1, 64), (16, 8, 64), (40, 8, 128)])
@pytest.mark.parametrize(("start", "rows"), [(0, 97), (3000, 5), (700, 300)])
def test_other_shapes(k: h.Kernels, gen: torch.Generator, record_property: Record, entry: str,
                      nq: int, nkv: int, d: int, start: int, rows: int) -> None:
    """The tiny model's heads (group 2), head_dim 64, group 8 and group 5."""
    _check(k, entry, new_case(nq, nkv, d, start + rows, gen), start, rows, record_property)


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("cuts", [[0, 1024], [0, 300, 337, 1024], [0, 512, 1000, 1001, 1024]])
def test_one_chunk_and_several_agree(k: h.Kernels, gen: torch.Generator, entry: str, cuts: list[int]) -> None:
    """Positions 0..1023 in one chunk or chunk after chunk (each over the pages of the earlier
    ones; the splits differ) agree within the bound, and with the reference."""
    case = new_case(32, 8, 128, cuts[-1], gen)
    whole = _run(k, entry, case, 0, cuts[-1])
    parts = torch.cat([_run(k, entry, case, a, b - a) for a, b in itertools.pairwise(cuts)])
    torch.testing.assert_close(parts.float(), whole.float(), atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(parts.float(), attention_ref(case, 0, cuts[-1]), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("entry", ENTRIES)
def test_two_blocks_fit_per_sm(k: h.Kernels, entry: str) -> None:
    """The design's occupancy (the other block's wgmmas run while one block is in its softmax)."""
    v = WGMMA_PREFILL[entry]
    for d in (64, 128):
        assert blocks_per_sm(k, entry, v.threads, v.smem(d)) >= v.per_sm, (entry, d, v.smem(d))
