"""GPU correctness of the decode attention entries over rows of their own lengths, against a float64
reference over the gathered pages: kern_attn_decode_rows (attention.cu, the batched step's) and
kern_attn_decode_one (attention_one.cu, the fused one-row step's; the same arguments).

Tolerance, from the kernel's two bf16 roundings (unit roundoff u = 2^-8): each weight p = 2^(s - m)
is rounded to bf16 for the P.V product (the row sums add the rounded weights), so the f32 output is
sum_i p_i (1 + d_i) v_i / sum_i p_i (1 + d_i), |d_i| <= u, within u / (1 - u) * sum_i w_i |v_i - o| of
the exact o (w the exact softmax weights); the output is then rounded once more, within u |o|. The
f32 scores and sums add far less (about 1e-6 relative at these sizes): a 1 % margin and an absolute
1e-5 cover them. Masked tokens of a row's last page hold NaN in the pages (and the k / v part of the
qkv rows too), so a token past seq_len that leaks into a sum shows."""

from __future__ import annotations

import math

import pytest
from helpers.gpu_deps import gpu_import

torch = gpu_import("torch")
cupy = gpu_import("cupy")

from helpers import kernel_harness as h  # noqa: E402 (it needs torch and cupy, checked above)
from helpers.kernel_cases import BF16, DEV, PAGE, bits, randn  # noqa: E402

pytestmark = pytest.mark.gpu

U = 2.0**-8
LAYERS, LAYER = 2, 1
ROWS, ONE = "kern_attn_decode_rows", "kern_attn_decode_one"
ENTRIES = (ROWS, ONE)
WARPS, STAGES = 4, 3  # attention.cuh's ROWS_WARPS, ROWS_STAGES
LENGTHS = (1, 15, 16, 17, 64, 65, 256, 257, 1000, 4097, 32768)


def smem_bytes(d: int) -> int:
    """attention.cuh's rows_smem_bytes."""
    return WARPS * STAGES * (d // 8) * 32 * 16


@pytest.fixture(scope="module")
def k(tmp_path_factory: pytest.TempPathFactory) -> object:
    return h.Kernels(tmp_path_factory.mktemp("kernels"))


@pytest.fixture
def gen() -> torch.Generator:
    g = torch.Generator(device=DEV)
    g.manual_seed(4321)
    return g


class Batch:
    """Rows of their own lengths over one paged KV state: disjoint, scattered pages per row; the
    slots past each row's length in its last page hold NaN."""

    def __init__(self, gen: torch.Generator, nq: int, nkv: int, d: int, lens: list[int]) -> None:
        self.nq, self.nkv, self.d, self.lens = nq, nkv, d, lens
        need = [math.ceil(n / PAGE) for n in lens]
        pages = sum(need) + 5
        self.kv = h.new_paged(LAYERS, pages, PAGE, nkv, d, gen)
        self.stride = max(max(need), 1) + 3
        perm = torch.randperm(pages, generator=gen, device=DEV).to(torch.int32)
        table = torch.randint(0, pages, (len(lens), self.stride), generator=gen, device=DEV, dtype=torch.int32)
        at = 0
        view = self.kv.view()
        for r, n in enumerate(need):
            table[r, :n] = perm[at : at + n]
            at += n
            if lens[r] % PAGE:
                view[int(table[r, n - 1]), LAYER, :, lens[r] % PAGE :] = float("nan")
        self.table = table.contiguous()
        self.seq = torch.tensor(lens, dtype=torch.int32, device=DEV)
        width = (nq + 2 * nkv) * d
        self.qkv = randn(len(lens), width, gen=gen)
        self.qkv[:, nq * d :] = float("nan")
        self.scale = d**-0.5

    @property
    def rows(self) -> int:
        return len(self.lens)

    def launch(self, k: object, max_splits: int, rows: slice | list[int] | None = None,
               entry: str = ROWS) -> tuple[torch.Tensor, torch.Tensor]:
        """(out, counters) of one launch of `entry` over `rows` (all by default), NaN scratch and output."""
        sel = rows if rows is not None else slice(0, self.rows)
        qkv, seq, table = self.qkv[sel].contiguous(), self.seq[sel].contiguous(), self.table[sel].contiguous()
        n = qkv.shape[0]
        nq, nkv, d = self.nq, self.nkv, self.d
        part_o = torch.full((n, max_splits, nq, d), float("nan"), device=DEV)
        part_lse = torch.full((n, max_splits, nq), float("nan"), device=DEV)
        counters = torch.zeros(n, nkv, dtype=torch.int32, device=DEV)
        out = torch.full((n, nq * d), float("nan"), dtype=BF16, device=DEV)
        k.launch(entry, (nkv, max_splits, n), (128,), h.ptr(qkv), h.ptr(self.kv.state, self.kv.layer_offset(LAYER)),
                 h.ptr(table), h.ptr(seq), h.ptr(part_o), h.ptr(part_lse), h.ptr(counters), h.ptr(out), h.i32(nq),
                 h.i32(nkv), h.i32(d), h.i32(PAGE), h.i64(self.kv.page_stride), h.i32(self.stride),
                 h.i32(max_splits), h.f32(self.scale), shared_mem=smem_bytes(d))
        torch.cuda.synchronize()
        return out, counters

    def reference(self, r: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Row r's exact output [nq, d] (float64) and the spread sum_i w_i |v_i - o| beside it."""
        n, nq, nkv, d = self.lens[r], self.nq, self.nkv, self.d
        keys, vals = self.kv.gather(LAYER, self.table[r], n)
        kk = keys.double().repeat_interleave(nq // nkv, dim=1)  # [n, nq, d]
        vv = vals.double().repeat_interleave(nq // nkv, dim=1)
        q = self.qkv[r, : nq * d].double().view(nq, d)
        w = torch.softmax(torch.einsum("hd,nhd->hn", q, kk) * self.scale, dim=-1)
        o = torch.einsum("hn,nhd->hd", w, vv)
        spread = torch.einsum("hn,nhd->hd", w, (vv - o[None]).abs())
        return o, spread

    def check(self, out: torch.Tensor) -> None:
        for r in range(self.rows):
            got = out[r].view(self.nq, self.d).double()
            if self.lens[r] == 0:
                assert torch.equal(got, torch.zeros_like(got)), f"row {r}: a row of 0 tokens gets zeros"
                continue
            ref, spread = self.reference(r)
            tol = 1.01 * U * ref.abs() + 1.01 * U / (1 - U) * spread + 1e-5
            err = (got - ref).abs()
            bad = ~(err <= tol)
            assert not bad.any(), (f"row {r} (seq_len {self.lens[r]}): {int(bad.sum())} outputs off, worst "
                                   f"{float((err / tol).nan_to_num(float('inf')).max()):.2f} x the bound")


SHAPES = [(32, 8, 128), (8, 8, 128), (64, 8, 128), (32, 8, 64), (8, 8, 64), (64, 8, 64)]
"""(nq, nkv, head_dim): the Qwen3-4B heads (group 4), groups 1 and 8, at head_dim 128 and 64."""


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("seq_len", LENGTHS)
@pytest.mark.parametrize(("nq", "nkv", "d"), SHAPES)
def test_one_row(k: object, gen: torch.Generator, nq: int, nkv: int, d: int, seq_len: int, entry: str) -> None:
    """One row at the lengths around a page (1, 15, 16, 17) and around one block's whole row (64: one
    split of 4 pages; 65: two; 256 and 257 as a launch of several rows splits them), at 1000, past
    a power of two (4097) and at 32k (kern_attn_decode_one's cluster path ends at 1,024 tokens);
    three launches in a row each give the same bits and leave the counters at zero."""
    b = Batch(gen, nq, nkv, d, [seq_len])
    first, counters = b.launch(k, 32, entry=entry)
    assert not counters.any(), "the reducing block must set its counter back to 0"
    b.check(first)
    for _ in range(2):
        again, counters = b.launch(k, 32, entry=entry)
        assert torch.equal(bits(again), bits(first)) and not counters.any()


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize(("nq", "nkv", "d"), [(32, 2, 128), (16, 1, 64), (40, 8, 128), (24, 8, 64)])
@pytest.mark.parametrize("seq_len", [17, 513, 4097])
def test_other_groups(k: object, gen: torch.Generator, nq: int, nkv: int, d: int, seq_len: int, entry: str) -> None:
    """Groups of 16 (the second head tile), 5 and 3."""
    b = Batch(gen, nq, nkv, d, [seq_len])
    out, counters = b.launch(k, 16, entry=entry)
    assert not counters.any()
    b.check(out)


def _one(b: Batch, r: int) -> Batch:
    """`b` as a batch of its row r alone (for `check`: the same pages, table row, q and length)."""
    one = Batch.__new__(Batch)
    one.__dict__.update(b.__dict__)
    one.lens, one.table, one.seq, one.qkv = [b.lens[r]], b.table[r : r + 1], b.seq[r : r + 1], b.qkv[r : r + 1]
    return one


def _mixed(gen: torch.Generator, rows: int) -> list[int]:
    pool = [1, 15, 16, 17, 100, 511, 513, 1024, 1025, 2049, 4097, 8192]
    picks = torch.randint(0, len(pool), (rows,), generator=gen, device=DEV).tolist()
    lens = [pool[i] for i in picks]
    lens[rows // 2] = 32768  # one long row in every batch
    return lens


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("max_splits", [8, 32])
@pytest.mark.parametrize(("nq", "nkv", "d"), [(32, 8, 128), (8, 8, 64), (64, 8, 128)])
@pytest.mark.parametrize("rows", [1, 3, 7, 64])
def test_rows_of_mixed_lengths(k: object, gen: torch.Generator, rows: int, nq: int, nkv: int, d: int,
                               max_splits: int, entry: str) -> None:
    """Rows of mixed lengths over scattered pages: every row within the bound of its reference, alone
    too, and bit for bit what the row gives in a launch of two rows (the split plan follows the
    row's own length in any launch of several rows; kern_attn_decode_one's in any launch, one row
    included)."""
    b = Batch(gen, nq, nkv, d, _mixed(gen, rows))
    out, counters = b.launch(k, max_splits, entry=entry)
    assert not counters.any(), "every row's reducing block must set its counter back to 0"
    b.check(out)
    for r in range(rows):
        alone, counters = b.launch(k, max_splits, slice(r, r + 1), entry=entry)
        assert not counters.any()
        _one(b, r).check(alone)
        if entry == ONE:
            assert torch.equal(bits(alone[0]), bits(out[r])), f"row {r} (seq_len {b.lens[r]}) differs alone"
        if rows > 1:
            pair, _ = b.launch(k, max_splits, [r, (r + 1) % rows], entry=entry)
            assert torch.equal(bits(pair[0]), bits(out[r])), f"row {r} (seq_len {b.lens[r]}) differs in a pair"


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_row_of_no_tokens_gets_zeros(k: object, gen: torch.Generator, entry: str) -> None:
    """A row of seq_len 0 (an idle row of a batch) reads nothing and gets zeros; its neighbours
    are unaffected."""
    b = Batch(gen, 32, 8, 128, [700, 0, 33])
    out, counters = b.launch(k, 32, entry=entry)
    assert not counters.any()
    b.check(out)


@pytest.mark.parametrize("max_splits", [1, 5, 12, 20])
def test_any_split_count(k: object, gen: torch.Generator, max_splits: int) -> None:
    """kern_attn_decode_rows has no cluster shape: any grid y runs, a row's splits capped at it (one split for the whole row at
    max_splits 1), every row within its bound and the counters back at zero."""
    b = Batch(gen, 32, 8, 128, [100, 700, 5000, 0, 257])
    out, counters = b.launch(k, max_splits)
    assert not counters.any()
    b.check(out)


@pytest.mark.parametrize("max_splits", [12, 20])
def test_splits_off_the_cluster_are_refused(k: object, gen: torch.Generator, max_splits: int) -> None:
    """kern_attn_decode_one runs in clusters of 8 blocks along y: the driver refuses a grid y that is
    not a multiple of 8."""
    b = Batch(gen, 32, 8, 128, [100])
    with pytest.raises(cupy.cuda.driver.CUDADriverError):
        b.launch(k, max_splits, entry=ONE)
