"""kern_prefill_attn + kern_prefill_combine (prefill.cu, wgmma) against an f32 reference over the
gathered pages: chunks of 1 to 4,096 rows from position 0 and short chunks over long prefixes (14k,
30k: the key split), lengths crossing pages and 64-key tiles, scattered block tables, GQA groups 1,
2, 4, 5, 8 and 16, head_dim 128 and 64; the split count the device chose against the model's plan
(kern_interp), one chunk against several, one block per SM without local memory.

The first tests isolate the two products: with every key zero the scores are uniform, so only
O = P V (the V descriptors, the P fragments, the causal mask) decides the output; with V one-hot
per key the output is P itself, so only S = Q K^T (the Q and K descriptors) and the softmax decide.
A failure there names the half that is wrong."""

from __future__ import annotations

import itertools

import pytest
from helpers.gpu_deps import gpu_import

torch = gpu_import("torch")
cupy = gpu_import("cupy")

from helpers import kernel_harness as h  # noqa: E402 (it needs torch and cupy, checked above)
from helpers.prefill_cases import PAGE, Chunk, PrefillCase, attention_ref, new_case  # noqa: E402

from kern_interp.qwen3 import prefill_splits  # noqa: E402
from kern_qwen3 import PREFILL_THREADS, prefill_smem  # noqa: E402

pytestmark = pytest.mark.gpu

# NOTE: bf16 inputs are exact in both; the kernel rounds P to bf16 for P.V (relative 2^-9 per weight)
# and the output once (2^-9): errors stay well inside 1e-2 of outputs of magnitude ~1.
ATOL = RTOL = 1e-2
CHUNKS = [(0, 1), (0, 15), (0, 16), (0, 17), (0, 709), (0, 4096), (14000, 37), (14000, 200), (30000, 1),
          (30000, 512)]
HEADS = [(32, 8, 128), (8, 8, 128), (16, 8, 64), (8, 1, 64)]
CROSSING = [(0, 63), (0, 64), (0, 65), (0, 129), (5, 123), (50, 100), (1000, 1), (1023, 1), (1024, 1), (4095, 2)]
SPLITS = [  # (nq, nkv, head_dim, start, rows, the key splits the plan takes)
    (32, 8, 128, 0, 1, 1), (32, 8, 128, 0, 4096, 1), (32, 8, 128, 0, 709, 1), (32, 8, 128, 511, 1, 2),
    (32, 8, 128, 14000, 37, 8), (32, 8, 128, 14000, 200, 2), (32, 8, 128, 30000, 1, 16),
    (4, 2, 128, 700, 300, 2), (8, 1, 64, 3000, 5, 11), (16, 8, 64, 30000, 512, 1),
]


@pytest.fixture(scope="module")
def k(tmp_path_factory: pytest.TempPathFactory) -> h.Kernels:
    return h.Kernels(tmp_path_factory.mktemp("kernels"))


@pytest.fixture
def gen() -> torch.Generator:
    g = torch.Generator(device="cuda")
    g.manual_seed(4321)
    return g


def _launch(k: h.Kernels, case: PrefillCase, start: int, rows: int) -> Chunk:
    chunk = Chunk(case, start, rows)
    chunk.launch_new(k)
    torch.cuda.synchronize()
    unwritten = int(chunk.out.isnan().any(dim=1).sum())
    assert unwritten == 0, f"{unwritten} of {rows} rows left unwritten (NaN)"
    return chunk


def _run(k: h.Kernels, case: PrefillCase, start: int, rows: int) -> torch.Tensor:
    return _launch(k, case, start, rows).out


def _where(out: torch.Tensor, ref: torch.Tensor, nq: int, d: int) -> str:
    """The worst element as (row, head, dim) and how many elements break the bound."""
    err = (out.float() - ref).abs().nan_to_num(float("inf"))
    bad = int((err > ATOL + RTOL * ref.abs()).sum())
    row, col = divmod(int(err.argmax()), nq * d)
    return f"max |err| {float(err.max()):.3e} at row {row}, head {col // d}, dim {col % d}; {bad} elements out of bound"


def _check(k: h.Kernels, case: PrefillCase, start: int, rows: int, what: str = "") -> None:
    out = _run(k, case, start, rows)
    ref = attention_ref(case, start, rows)
    ok = bool(((out.float() - ref).abs() <= ATOL + RTOL * ref.abs()).all())
    assert ok, (f"{what}(nq {case.nq}, nkv {case.nkv}, d {case.d}, start {start}, rows {rows}) against the f32 "
                f"reference: {_where(out, ref, case.nq, case.d)}")


@pytest.mark.parametrize(("nq", "nkv", "d", "start", "rows"), [(8, 8, 128, 0, 16), (32, 8, 128, 0, 300),
                                                               (32, 8, 128, 3000, 5), (8, 1, 64, 0, 97)])
def test_pv_alone_with_uniform_scores(k: h.Kernels, gen: torch.Generator, nq: int, nkv: int, d: int, start: int,
                                      rows: int) -> None:
    """Every key zero: S = 0, each row the mean of the values it sees; a failure is in P V."""
    case = new_case(nq, nkv, d, start + rows, gen)
    case.state[:, 0] = 0
    _check(k, case, start, rows, what="[P V path: V descriptors, P fragments, mask] ")


@pytest.mark.parametrize(("nq", "nkv", "d", "start", "rows"), [(8, 8, 128, 0, 16), (32, 8, 128, 0, 100),
                                                               (8, 1, 64, 0, 60)])
def test_scores_alone_with_one_hot_values(k: h.Kernels, gen: torch.Generator, nq: int, nkv: int, d: int,
                                          start: int, rows: int) -> None:
    """V of key j is the unit vector e_j (keys < head_dim): each output row is the row's softmax
    itself; a failure is in S = Q K^T (the Q and K descriptors) or the softmax."""
    case = new_case(nq, nkv, d, start + rows, gen, q_scale=0.5)
    eye = torch.eye(d, device="cuda", dtype=torch.bfloat16)
    pos = torch.arange(case.length, device="cuda")
    pages = case.table.long()[pos // PAGE]
    case.state[pages, 1, pos % PAGE] = eye[pos][:, None, :].expand(-1, nkv, -1)
    _check(k, case, start, rows, what="[S path: Q/K descriptors, softmax] ")


@pytest.mark.parametrize(("start", "rows"), CHUNKS)
@pytest.mark.parametrize(("nq", "nkv", "d"), HEADS, ids=["group4", "group1", "group2-d64", "group8-d64"])
def test_prefill_matches_reference(k: h.Kernels, gen: torch.Generator, start: int, rows: int, nq: int,
                                   nkv: int, d: int) -> None:
    _check(k, new_case(nq, nkv, d, start + rows, gen), start, rows)


@pytest.mark.parametrize(("start", "rows"), CROSSING)
def test_lengths_crossing_pages_and_tiles(k: h.Kernels, gen: torch.Generator, start: int, rows: int) -> None:
    _check(k, new_case(32, 8, 128, start + rows, gen), start, rows)


@pytest.mark.parametrize(("nq", "nkv", "d"), [(4, 2, 128), (40, 8, 128), (8, 1, 128), (16, 1, 64)])
@pytest.mark.parametrize(("start", "rows"), [(0, 97), (3000, 5), (700, 300)])
def test_prefill_other_shapes(k: h.Kernels, gen: torch.Generator, nq: int, nkv: int, d: int, start: int,
                              rows: int) -> None:
    """The tiny model's heads (group 2), group 5, group 8 at head_dim 128, group 16 at 64."""
    _check(k, new_case(nq, nkv, d, start + rows, gen), start, rows)


@pytest.mark.parametrize(("nq", "nkv", "d", "start", "rows", "splits"), SPLITS)
def test_the_device_splits_the_keys_as_the_model_plans(k: h.Kernels, gen: torch.Generator, nq: int, nkv: int,
                                                       d: int, start: int, rows: int, splits: int) -> None:
    """The partials the attention wrote (NaN-filled before) are exactly those of the splits
    kern_interp's plan takes: none for one split (bf16 rows straight to `out`), every (row, head) of
    splits 0..n-1 and nothing past them for n; the output is right either way."""
    assert prefill_splits(start + rows, rows, nq, nkv) == splits
    case = new_case(nq, nkv, d, start + rows, gen)
    chunk = _launch(k, case, start, rows)
    written = ~chunk.part_lse.reshape(-1).isnan()
    used = splits * rows * nq if splits > 1 else 0
    assert bool(written[:used].all()) and not bool(written[used:].any()), (
        f"{int(written.sum())} partial rows written, {used} planned ({splits} splits)")
    ref = attention_ref(case, start, rows)
    torch.testing.assert_close(chunk.out.float(), ref, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("cuts", [[0, 1024], [0, 300, 337, 1024], [0, 512, 1000, 1001, 1024]])
def test_one_chunk_and_several_agree(k: h.Kernels, gen: torch.Generator, cuts: list[int]) -> None:
    """The rows of positions 0..1023 prefilled in one chunk or chunk after chunk (each chunk sees
    the pages of the earlier ones; the splits differ) agree within the bf16 tolerance."""
    case = new_case(32, 8, 128, cuts[-1], gen)
    whole = _run(k, case, 0, cuts[-1])
    parts = torch.cat([_run(k, case, a, b - a) for a, b in itertools.pairwise(cuts)])
    torch.testing.assert_close(parts.float(), whole.float(), atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(parts.float(), attention_ref(case, 0, cuts[-1]), atol=ATOL, rtol=RTOL)


def test_long_prefix_chunk_matches_the_old_kernel(k: h.Kernels, gen: torch.Generator) -> None:
    """attention.cu's kern_attn_prefill and the new entry on the same 37-row chunk over a 14k
    prefix (the split path) agree within the tolerance."""
    case = new_case(32, 8, 128, 14037, gen)
    new = _run(k, case, 14000, 37)
    old = Chunk(case, 14000, 37)
    old.launch_old(k)
    torch.cuda.synchronize()
    torch.testing.assert_close(new.float(), old.out.float(), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("d", [128, 64])
def test_a_block_fits_per_sm_without_spills(k: h.Kernels, d: int) -> None:
    """The design's occupancy: one block of three warpgroups per SM at its shared memory (its
    gatherer's registers go to the consumers), and no local memory."""
    fn = k.fn("kern_prefill_attn")
    smem = prefill_smem(d)
    if fn.max_dynamic_shared_size_bytes < smem:
        fn.max_dynamic_shared_size_bytes = smem
    assert int(cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.kernel.ptr, PREFILL_THREADS, smem)) == 1
    assert int(fn.local_size_bytes) == 0
