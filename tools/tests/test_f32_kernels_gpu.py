"""GPU correctness of qwen3_f32.cu (kern-qwen3 --precision f32) entry by entry, against float64 torch
references on the same inputs: f32 activations and KV, bf16 weights widened exactly. The kernels sum
in another order than the references, so results agree to a few f32 ulps of the sums, bounded here
as relative errors (the embedding gather and the argmax are exact)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.gpu_deps import gpu_import

torch = gpu_import("torch")
cupy = gpu_import("cupy")

from helpers import kernel_harness as h  # noqa: E402 (it needs torch and cupy, checked above)

BF16, F32, F64 = torch.bfloat16, torch.float32, torch.float64
DEV = "cuda"
EPS = 1e-6
PAGE = 16
LAYERS = 3
LAYER = 1
REL = 1e-5
"""Relative L2 bound of an f32 result against its float64 reference: a sequential f32 sum of k
random terms is off by about 2^-24 * sqrt(k / 2) relative (4e-6 at k = 9728)."""

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def k(tmp_path_factory: pytest.TempPathFactory) -> object:
    return h.Kernels(tmp_path_factory.mktemp("kernels"))


@pytest.fixture
def gen() -> torch.Generator:
    g = torch.Generator(device=DEV)
    g.manual_seed(4321)
    return g


def randn(*shape: int, gen: torch.Generator, dtype: torch.dtype = F32, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen, device=DEV) * scale).to(dtype)


def rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float(torch.linalg.norm((out.double() - ref).flatten()) / torch.linalg.norm(ref.flatten()))


def rms64(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    x = x.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w.double()


@pytest.mark.parametrize("rows", [1, 709])
def test_embed_widens_the_bf16_rows(k: object, gen: torch.Generator, rows: int) -> None:
    vocab, hidden = 4096, 2560
    table = randn(vocab, hidden, gen=gen, dtype=BF16)
    ids = torch.randint(0, vocab, (rows,), generator=gen, device=DEV, dtype=torch.int64)
    out = torch.full((rows, hidden), float("nan"), device=DEV)
    k.launch("kern_f32_embed", (rows,), (256,), h.ptr(ids), h.ptr(table), h.ptr(out), h.i32(hidden))
    torch.cuda.synchronize()
    assert torch.equal(out, table.float()[ids])


@pytest.mark.parametrize("rows", [1, 37])
@pytest.mark.parametrize("hidden", [256, 2560])
def test_rmsnorm_and_add_rmsnorm(k: object, gen: torch.Generator, rows: int, hidden: int) -> None:
    x, y = randn(rows, hidden, gen=gen, scale=3.0), randn(rows, hidden, gen=gen)
    w = randn(hidden, gen=gen, dtype=BF16)
    out = torch.full_like(x, float("nan"))
    k.launch("kern_f32_rmsnorm", (rows,), (256,), h.ptr(x), h.ptr(w), h.ptr(out), h.i32(hidden), h.f32(EPS))
    torch.cuda.synchronize()
    assert rel(out, rms64(x, w)) < REL
    res = x.clone()
    k.launch("kern_f32_add_rmsnorm", (rows,), (256,), h.ptr(res), h.ptr(y), h.ptr(w), h.ptr(out), h.i32(hidden),
             h.f32(EPS))
    torch.cuda.synchronize()
    assert torch.equal(res, x + y)  # one f32 add per element
    assert rel(out, rms64(x + y, w)) < REL


def _tables(maxpos: int, half: int) -> tuple[torch.Tensor, torch.Tensor]:
    cos = torch.full((maxpos, half), float("nan"), device=DEV)
    sin = torch.full_like(cos, float("nan"))
    return cos, sin


@pytest.mark.parametrize(("maxpos", "head_dim", "theta"), [(40960, 128, 1e6), (2048, 64, 1e4)])
def test_rope_table_is_transformers_float32_rotary(k: object, maxpos: int, head_dim: int, theta: float) -> None:
    """cos / sin of f32(p) * inv_freq, inv_freq from the correctly rounded power (transformers' f32 pow
    is within one ulp of it): within a few f32 ulps of the float64 cos / sin of that f32 angle."""
    half = head_dim // 2
    cos, sin = _tables(maxpos, half)
    k.launch("kern_f32_rope_table", (maxpos,), (half,), h.ptr(cos), h.ptr(sin), h.i32(maxpos), h.i32(half),
             h.f32(theta))
    torch.cuda.synchronize()
    expo = (np.arange(half, dtype=np.float32) * 2) / np.float32(head_dim)
    inv = (np.float32(1.0) / np.power(np.float64(theta), expo.astype(np.float64)).astype(np.float32))
    angle = torch.from_numpy(np.arange(maxpos, dtype=np.float32)[:, None] * inv[None, :]).to(DEV).double()
    assert (cos.double() - torch.cos(angle)).abs().max().item() < 1e-6
    assert (sin.double() - torch.sin(angle)).abs().max().item() < 1e-6


def _paged(pages: int, nkv: int, d: int, gen: torch.Generator) -> torch.Tensor:
    """The f32 state [page][layer][k|v][P][NKV][D], random."""
    return randn(pages, LAYERS, 2, PAGE, nkv, d, gen=gen)


def _page_stride(nkv: int, d: int) -> int:
    return LAYERS * 2 * PAGE * nkv * d


def _layer(kv: torch.Tensor) -> np.uint64:
    """The pointer the manifest passes: the state at LAYER's k block of page 0."""
    return h.ptr(kv, LAYER * 2 * PAGE * kv.shape[-2] * kv.shape[-1])


@pytest.mark.parametrize(("rows", "nq", "nkv", "d"), [(1, 32, 8, 128), (37, 32, 8, 128), (5, 16, 8, 64)])
def test_qk_norm_rope_kv(k: object, gen: torch.Generator, rows: int, nq: int, nkv: int, d: int) -> None:
    half, maxpos, pages = d // 2, 4096, 8
    cos, sin = _tables(maxpos, half)
    k.launch("kern_f32_rope_table", (maxpos,), (half,), h.ptr(cos), h.ptr(sin), h.i32(maxpos), h.i32(half),
             h.f32(1e6))
    qkv = randn(rows, (nq + 2 * nkv) * d, gen=gen, scale=2.0)
    wq, wk = randn(d, gen=gen, dtype=BF16), randn(d, gen=gen, dtype=BF16)
    pos = torch.randint(0, maxpos, (rows,), generator=gen, device=DEV, dtype=torch.int64)
    slots = torch.randperm(pages * PAGE, generator=gen, device=DEV)[:rows].to(torch.int64)
    kv = _paged(pages, nkv, d, gen)
    before, heads = kv.clone(), qkv.clone().view(rows, nq + 2 * nkv, d)
    k.launch("kern_f32_qk_norm_rope_kv", (rows, nq + 2 * nkv), (half,), h.ptr(qkv), h.ptr(wq), h.ptr(wk), h.ptr(pos),
             h.ptr(cos), h.ptr(sin), _layer(kv), h.ptr(slots), h.i32(nq), h.i32(nkv), h.i32(d),
             h.f32(EPS), h.i32(PAGE), h.i64(_page_stride(nkv, d)))
    torch.cuda.synchronize()
    c = torch.cat((cos[pos], cos[pos]), -1)[:, None].double()
    s = torch.cat((sin[pos], sin[pos]), -1)[:, None].double()

    def rope(x: torch.Tensor) -> torch.Tensor:
        return x * c + torch.cat((-x[..., half:], x[..., :half]), -1) * s

    q_ref = rope(rms64(heads[:, :nq], wq))
    k_ref = rope(rms64(heads[:, nq : nq + nkv], wk))
    got = qkv.view(rows, nq + 2 * nkv, d)
    assert rel(got[:, :nq], q_ref) < REL and rel(got[:, nq : nq + nkv], k_ref) < REL
    assert torch.equal(got[:, nq + nkv :], heads[:, nq + nkv :])  # v untouched
    expect = before.clone()
    pg, rw = slots // PAGE, slots % PAGE
    expect[pg, LAYER, 0, rw] = got[:, nq : nq + nkv]
    expect[pg, LAYER, 1, rw] = heads[:, nq + nkv :]
    assert torch.equal(kv, expect)  # the rotated k and the v rows, nothing else


def _attend64(q: torch.Tensor, keys: torch.Tensor, vals: torch.Tensor, limit: torch.Tensor, scale: float) -> torch.Tensor:
    """q [rows, NQ, D], keys / vals [n, NKV, D]; row i sees keys < limit[i]; float64."""
    nq, nkv = q.shape[1], keys.shape[1]
    kk = keys.double().repeat_interleave(nq // nkv, 1)
    vv = vals.double().repeat_interleave(nq // nkv, 1)
    scores = torch.einsum("rhd,nhd->rhn", q.double(), kk) * scale
    mask = torch.arange(keys.shape[0], device=DEV)[None, None, :] >= limit[:, None, None]
    probs = torch.softmax(scores.masked_fill(mask, float("-inf")), -1)
    return torch.einsum("rhn,nhd->rhd", probs, vv).reshape(q.shape[0], -1)


@pytest.mark.parametrize(("rows", "seq_len", "nq", "nkv", "d"),
                         [(1, 1, 32, 8, 128), (1, 773, 32, 8, 128), (1, 4097, 32, 8, 128), (37, 37, 32, 8, 128),
                          (97, 709, 32, 8, 128), (5, 100, 16, 8, 64), (3, 40, 8, 1, 64)])
def test_attention_over_scattered_pages(k: object, gen: torch.Generator, rows: int, seq_len: int, nq: int, nkv: int,
                                        d: int) -> None:
    """The call's rows are the sequence's last (positions seq_len - rows ..); decode is rows = 1."""
    pages = -(-seq_len // PAGE) + 2
    kv = _paged(pages, nkv, d, gen)
    table = torch.randperm(pages, generator=gen, device=DEV).to(torch.int32)
    qkv = randn(rows, (nq + 2 * nkv) * d, gen=gen)
    seq = torch.tensor([seq_len], dtype=torch.int32, device=DEV)
    out = torch.full((rows, nq * d), float("nan"), device=DEV)
    scale = d**-0.5
    k.launch("kern_f32_attn", (rows, nq), (256,), h.ptr(qkv), _layer(kv), h.ptr(table), h.ptr(seq),
             h.ptr(out), h.i32(rows), h.i32(nq), h.i32(nkv), h.i32(d), h.i32(PAGE), h.i64(_page_stride(nkv, d)),
             h.f32(scale))
    torch.cuda.synchronize()
    tok = torch.arange(seq_len, device=DEV)
    page_of = table.long()[tok // PAGE]
    keys, vals = kv[page_of, LAYER, 0, tok % PAGE], kv[page_of, LAYER, 1, tok % PAGE]
    limit = seq_len - rows + torch.arange(rows, device=DEV) + 1
    ref = _attend64(qkv[:, : nq * d].view(rows, nq, d), keys, vals, limit, scale)
    assert rel(out, ref) < REL


_GEMM_SHAPES = [(1, 1000, 264), (37, 1536, 256), (709, 6144, 2560), (64, 2560, 9728)]


# NOTE: the GEMV re-reads W per row, so it gets the shapes with few rows (decode has one).
@pytest.mark.parametrize(("entry", "m", "n", "k_dim"), [("kern_f32_gemm", *s) for s in _GEMM_SHAPES]
                         + [("kern_f32_gemv", *s) for s in _GEMM_SHAPES if s[0] <= 37])
def test_linear_is_x_times_w_transposed(k: object, gen: torch.Generator, entry: str, m: int, n: int,
                                        k_dim: int) -> None:
    """Any rows, columns not a multiple of the tile, depths a multiple of 8 but not of the k tile."""
    x = randn(m, k_dim, gen=gen)
    w = randn(n, k_dim, gen=gen, dtype=BF16, scale=0.05)
    y = torch.full((m, n), float("nan"), device=DEV)
    grid = (-(-n // 64), -(-m // 64)) if entry == "kern_f32_gemm" else (-(-n // 8),)
    k.launch(entry, grid, (256,), h.ptr(x), h.ptr(w), h.ptr(y), h.i32(m), h.i32(n), h.i32(k_dim))
    torch.cuda.synchronize()
    assert rel(y, x.double() @ w.double().T) < REL


@pytest.mark.parametrize("rows", [1, 3])
def test_silu_mul(k: object, gen: torch.Generator, rows: int) -> None:
    inter = 9728
    gu = randn(rows, 2 * inter, gen=gen, scale=3.0)
    out = torch.full((rows, inter), float("nan"), device=DEV)
    k.launch("kern_f32_silu_mul", (rows, -(-inter // 1024)), (256,), h.ptr(gu), h.ptr(out), h.i32(inter))
    torch.cuda.synchronize()
    g, u = gu[:, :inter].double(), gu[:, inter:].double()
    assert rel(out, g / (1 + torch.exp(-g)) * u) < REL


@pytest.mark.parametrize("n", [151936, 4096, 100])
def test_argmax_ties_go_to_the_lowest_index(k: object, gen: torch.Generator, n: int) -> None:
    """Ties across the 64 partial blocks (kern_argmax_final's rule) and, from n // 3 + 1 on, inside
    one partial block: the next lane, the next warp (+ 32) and the same thread's next pass (+ 256),
    where the share ceil(n / 64) holds them (kern_f32_argmax_partial's rule)."""
    logits = randn(n, gen=gen)
    top = float(logits.max()) + 1.0
    lo = n // 3 + 1
    hits = sorted({h for h in (n - 1, n // 2, lo + 256, lo + 32, lo + 1, lo) if h < n})
    logits[hits] = top
    pval = torch.full((64,), float("nan"), device=DEV)
    pidx = torch.zeros(64, dtype=torch.int32, device=DEV)
    nxt = torch.full((1,), -1, dtype=torch.int64, device=DEV)
    k.launch("kern_f32_argmax_partial", (64,), (256,), h.ptr(logits), h.ptr(pval), h.ptr(pidx), h.i32(n))
    k.launch("kern_argmax_final", (1,), (256,), h.ptr(pval), h.ptr(pidx), h.ptr(nxt), h.i32(64))
    torch.cuda.synchronize()
    assert int(nxt.item()) == hits[0] == int(np.argmax(logits.cpu().numpy()))
