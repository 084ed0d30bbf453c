"""kern_prefill_attn + kern_prefill_combine (prefill.cu) against an f32 reference over the gathered
pages: chunks from position 0 and short chunks over long prefixes (the key split), scattered block
tables, GQA groups 4, 2 and 1, head_dim 128 and 64; one chunk against several."""

from __future__ import annotations

import itertools

import pytest
from helpers.gpu_deps import gpu_import

torch = gpu_import("torch")
cupy = gpu_import("cupy")

from helpers import kernel_harness as h  # noqa: E402 (it needs torch and cupy, checked above)
from helpers.prefill_cases import Chunk, attention_ref, new_case  # noqa: E402

pytestmark = pytest.mark.gpu

# NOTE: bf16 inputs are exact in both; the kernel rounds P to bf16 for P.V (relative 2^-9 per weight)
# and the output once (2^-9): errors stay well inside 1e-2 of outputs of magnitude ~1.
ATOL = RTOL = 1e-2
CHUNKS = [(0, 1), (0, 15), (0, 16), (0, 17), (0, 709), (0, 4096), (14000, 37), (14000, 200), (30000, 512)]


@pytest.fixture(scope="module")
def k(tmp_path_factory: pytest.TempPathFactory) -> h.Kernels:
    return h.Kernels(tmp_path_factory.mktemp("kernels"))


@pytest.fixture
def gen() -> torch.Generator:
    g = torch.Generator(device="cuda")
    g.manual_seed(4321)
    return g


def _run(k: h.Kernels, case: object, start: int, rows: int) -> torch.Tensor:
    chunk = Chunk(case, start, rows)  # type: ignore[arg-type]
    chunk.launch_new(k)
    torch.cuda.synchronize()
    assert not chunk.out.isnan().any(), "every row of the chunk must be written"
    return chunk.out


@pytest.mark.parametrize(("start", "rows"), CHUNKS)
@pytest.mark.parametrize(("nq", "nkv"), [(32, 8), (8, 8)], ids=["group4", "group1"])
def test_prefill_matches_reference(k: h.Kernels, gen: torch.Generator, start: int, rows: int, nq: int,
                                   nkv: int) -> None:
    case = new_case(nq, nkv, 128, start + rows, gen)
    out = _run(k, case, start, rows)
    torch.testing.assert_close(out.float(), attention_ref(case, start, rows), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize(("nq", "nkv", "d"), [(4, 2, 128), (8, 1, 64), (16, 8, 64)])
@pytest.mark.parametrize(("start", "rows"), [(0, 97), (3000, 5), (700, 300)])
def test_prefill_other_shapes(k: h.Kernels, gen: torch.Generator, nq: int, nkv: int, d: int, start: int,
                              rows: int) -> None:
    """The tiny model's heads (group 2), head_dim 64, group 8."""
    case = new_case(nq, nkv, d, start + rows, gen)
    out = _run(k, case, start, rows)
    torch.testing.assert_close(out.float(), attention_ref(case, start, rows), atol=ATOL, rtol=RTOL)


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
