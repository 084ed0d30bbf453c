"""GPU correctness of kern's Qwen3 kernels (tools/kernels-src) against torch references that mirror
transformers' eager Qwen3 modules. Bit-exact wherever docs/qwen3.md mirrors the rounding; the norms
are exact up to the f32 reduction order of mean(x^2), which the test bounds explicitly."""

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
    DEV,
    EPS,
    LAYER,
    LAYERS,
    PAGE,
    bits,
    block_table,
    norm_gemv_case,
    qkv_case,
    randn,
    rope_tables,
    rotary_embedding,
    run_folded,
)

# NOTE: the kernel's rsqrt(mean + eps) may differ from torch's by a few f32 ulps (summation order,
# rsqrtf); outputs must lie between the references computed at rsqrt * (1 -+ DELTA).
DELTA = 2e-6
SHAPE_4B = {"hidden": 2560, "nq": 32, "nkv": 8, "head_dim": 128, "inter": 9728, "vocab": 151936}

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def k(tmp_path_factory: pytest.TempPathFactory) -> object:
    return h.Kernels(tmp_path_factory.mktemp("kernels"))


@pytest.fixture
def gen() -> torch.Generator:
    g = torch.Generator(device=DEV)
    g.manual_seed(1234)
    return g


def assert_between(out: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, mid: torch.Tensor) -> None:
    a, b = torch.minimum(lo.float(), hi.float()), torch.maximum(lo.float(), hi.float())
    o = out.float()
    bad = (o < a) | (o > b)
    assert not bad.any(), f"{int(bad.sum())} elements outside the rounding bound"
    exact = (bits(out) == bits(mid)).float().mean().item()
    assert exact > 0.999, f"only {exact:.5f} of elements bit-equal to the reference"


def qwen3_norm(weight: torch.Tensor) -> torch.nn.Module:
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    norm = Qwen3RMSNorm(weight.shape[0], eps=EPS).to(DEV, BF16)
    with torch.no_grad():
        norm.weight.copy_(weight)
    return norm


# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rows", [1, 7, 709])
def test_embed_is_a_gather(k: object, gen: torch.Generator, rows: int) -> None:
    vocab, hidden = 4096, SHAPE_4B["hidden"]
    table = randn(vocab, hidden, gen=gen)
    ids = torch.randint(0, vocab, (rows,), generator=gen, device=DEV, dtype=torch.int64)
    out = torch.empty(rows, hidden, dtype=BF16, device=DEV)
    k.launch("kern_embed", (rows,), (256,), h.ptr(ids), h.ptr(table), h.ptr(out), h.i32(hidden))
    torch.cuda.synchronize()
    assert torch.equal(bits(out), bits(torch.nn.functional.embedding(ids, table)))


@pytest.mark.parametrize("rows", [1, 5, 709])
@pytest.mark.parametrize("hidden", [2560, 1024, 5120])
def test_rmsnorm_matches_qwen3_rmsnorm(k: object, gen: torch.Generator, rows: int, hidden: int) -> None:
    x = randn(rows, hidden, gen=gen, scale=3.0)
    w = randn(hidden, gen=gen)
    out = torch.empty_like(x)
    k.launch("kern_rmsnorm", (rows,), (256,), h.ptr(x), h.ptr(w), h.ptr(out), h.i32(hidden), h.f32(EPS))
    torch.cuda.synchronize()
    with torch.no_grad():
        mid = qwen3_norm(w)(x)
    assert torch.equal(bits(h.rms_ref(x, w, EPS)), bits(mid)), "reference mirror drifted"
    assert_between(out, h.rms_ref(x, w, EPS, 1 - DELTA), h.rms_ref(x, w, EPS, 1 + DELTA), mid)


@pytest.mark.parametrize("rows", [1, 709])
def test_add_rmsnorm_updates_residual_then_norms(k: object, gen: torch.Generator, rows: int) -> None:
    hidden = SHAPE_4B["hidden"]
    res = randn(rows, hidden, gen=gen, scale=4.0)
    y = randn(rows, hidden, gen=gen)
    w = randn(hidden, gen=gen)
    res0 = res.clone()
    out = torch.empty_like(res)
    k.launch("kern_add_rmsnorm", (rows,), (256,), h.ptr(res), h.ptr(y), h.ptr(w), h.ptr(out),
             h.i32(hidden), h.f32(EPS))
    torch.cuda.synchronize()
    summed = res0 + y  # decoder layer: hidden_states = residual + hidden_states (bf16)
    assert torch.equal(bits(res), bits(summed))
    with torch.no_grad():
        mid = qwen3_norm(w)(summed)
    assert_between(out, h.rms_ref(summed, w, EPS, 1 - DELTA), h.rms_ref(summed, w, EPS, 1 + DELTA), mid)


def _inv_freq_f64_pow(head_dim: int, theta: float) -> torch.Tensor:
    """transformers' inv_freq with the power correctly rounded (f64 pow, then f32), on the CPU."""
    expo = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    return 1.0 / (theta ** expo.double()).float()


def _rope_tables_f64_pow(maxpos: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' rotary path (f32 angle, f32 cos/sin, bf16) over the correctly rounded inv_freq."""
    inv_freq = _inv_freq_f64_pow(head_dim, theta).to(DEV)
    angle = torch.arange(maxpos, device=DEV).float()[:, None] * inv_freq[None, :]
    return angle.cos().to(BF16), angle.sin().to(BF16)


def _count_diff(a: torch.Tensor, b: torch.Tensor) -> int:
    return int((bits(a) != bits(b)).sum())


@pytest.mark.parametrize(("maxpos", "head_dim", "theta"), [(40960, 128, 1e6), (2048, 64, 1e4)])
def test_rope_table_matches_qwen3_rotary_embedding(
    k: object, maxpos: int, head_dim: int, theta: float
) -> None:
    half = head_dim // 2
    cos = torch.empty(maxpos, half, dtype=BF16, device=DEV)
    sin = torch.empty_like(cos)
    k.launch("kern_rope_table", (maxpos,), (half,), h.ptr(cos), h.ptr(sin), h.i32(maxpos),
             h.i32(half), h.f32(theta))
    torch.cuda.synchronize()
    exact_cos, exact_sin = _rope_tables_f64_pow(maxpos, head_dim, theta)
    assert _count_diff(cos, exact_cos) == 0 and _count_diff(sin, exact_sin) == 0
    # transformers takes theta ** x from torch's f32 pow, which is within 1 ulp but not always
    # correctly rounded (theta 1e6, D 128: one of 64 frequencies differs on this CPU, three with
    # CUDA's powf). Every column whose inv_freq agrees must be bit-identical to transformers.
    theirs = rotary_embedding(maxpos, head_dim, theta).inv_freq.float().cpu()
    ulps = (theirs.view(torch.int32) - _inv_freq_f64_pow(head_dim, theta).view(torch.int32)).abs()
    assert ulps.max().item() <= 1
    same = (ulps == 0).to(DEV)
    assert same.sum().item() >= half - 4
    ref_cos, ref_sin = rope_tables(maxpos, head_dim, theta)
    assert _count_diff(cos[:, same], ref_cos[:, same]) == 0
    assert _count_diff(sin[:, same], ref_sin[:, same]) == 0


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """transformers' apply_rotary_pos_emb on x [rows, heads, D] with half tables [maxpos, D/2]."""
    from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

    c = torch.cat((cos[pos], cos[pos]), dim=-1)[None]  # [1, rows, D]
    s = torch.cat((sin[pos], sin[pos]), dim=-1)[None]
    xt = x.transpose(0, 1)[None]  # [1, heads, rows, D]
    out, _ = apply_rotary_pos_emb(xt, xt, c, s)
    return out[0].transpose(0, 1)


@pytest.mark.parametrize("rows", [1, 37])
def test_rope_matches_apply_rotary_pos_emb(k: object, gen: torch.Generator, rows: int) -> None:
    nq, nkv, d, maxpos = 32, 8, 128, 4096
    qkv, _wq, _wk, pos = qkv_case(gen, rows, nq, nkv, d, maxpos)
    cos, sin = rope_tables(maxpos, d, 1e6)
    before = qkv.clone()
    k.launch("kern_rope", (rows, nq + nkv), (d // 2,), h.ptr(qkv), h.ptr(pos), h.ptr(cos), h.ptr(sin),
             h.i32(nq), h.i32(nkv), h.i32(d))
    torch.cuda.synchronize()
    heads = before.view(rows, nq + 2 * nkv, d)
    ref = heads.clone()
    ref[:, : nq + nkv] = _apply_rope(heads[:, : nq + nkv], cos, sin, pos)
    assert torch.equal(bits(qkv.view(rows, -1, d)), bits(ref)), "rope differs (v heads must stay)"


def _normed_heads(heads: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor, nq: int, rscale: float) -> torch.Tensor:
    out = heads.clone()
    out[:, :nq] = h.rms_ref(heads[:, :nq], wq, EPS, rscale)
    nk = heads.shape[1] - nq
    out[:, nq:] = h.rms_ref(heads[:, nq:], wk, EPS, rscale)
    return out[:, : nq + nk]


@pytest.mark.parametrize("rows", [1, 37])
def test_head_rmsnorm_matches_q_norm_k_norm(k: object, gen: torch.Generator, rows: int) -> None:
    nq, nkv, d = 32, 8, 128
    qkv, wq, wk, _pos = qkv_case(gen, rows, nq, nkv, d, 16)
    heads = qkv.view(rows, nq + 2 * nkv, d).clone()
    k.launch("kern_head_rmsnorm", (rows, nq + nkv), (d // 2,), h.ptr(qkv), h.ptr(wq), h.ptr(wk),
             h.i32(nq), h.i32(nkv), h.i32(d), h.f32(EPS))
    torch.cuda.synchronize()
    out = qkv.view(rows, nq + 2 * nkv, d)
    with torch.no_grad():
        mid = torch.cat((qwen3_norm(wq)(heads[:, :nq]), qwen3_norm(wk)(heads[:, nq : nq + nkv])), dim=1)
    lo = _normed_heads(heads[:, : nq + nkv], wq, wk, nq, 1 - DELTA)
    hi = _normed_heads(heads[:, : nq + nkv], wq, wk, nq, 1 + DELTA)
    assert_between(out[:, : nq + nkv], lo, hi, mid)
    assert torch.equal(bits(out[:, nq + nkv :]), bits(heads[:, nq + nkv :])), "v heads changed"


@pytest.mark.parametrize(("rows", "nq", "nkv", "d"), [(1, 32, 8, 128), (37, 32, 8, 128), (5, 16, 8, 64)])
def test_qk_norm_rope_matches_transformers(
    k: object, gen: torch.Generator, rows: int, nq: int, nkv: int, d: int
) -> None:
    maxpos = 4096
    qkv, wq, wk, pos = qkv_case(gen, rows, nq, nkv, d, maxpos)
    cos, sin = rope_tables(maxpos, d, 1e6)
    heads = qkv.view(rows, nq + 2 * nkv, d).clone()
    k.launch("kern_qk_norm_rope", (rows, nq + nkv), (d // 2,), h.ptr(qkv), h.ptr(wq), h.ptr(wk),
             h.ptr(pos), h.ptr(cos), h.ptr(sin), h.i32(nq), h.i32(nkv), h.i32(d), h.f32(EPS))
    torch.cuda.synchronize()
    out = qkv.view(rows, nq + 2 * nkv, d)[:, : nq + nkv]
    with torch.no_grad():
        normed = torch.cat((qwen3_norm(wq)(heads[:, :nq]), qwen3_norm(wk)(heads[:, nq : nq + nkv])), 1)
    mid = _apply_rope(normed, cos, sin, pos)
    exact = (bits(out) == bits(mid)).float().mean().item()
    assert exact > 0.999, f"only {exact:.5f} bit-equal"
    # Where the norm's rounding is ambiguous, the output must match rope over some mix of the
    # lower / upper normed halves (each output reads one element of each half).
    lo = _normed_heads(heads[:, : nq + nkv], wq, wk, nq, 1 - DELTA)
    hi = _normed_heads(heads[:, : nq + nkv], wq, wk, nq, 1 + DELTA)
    half = d // 2
    ok = bits(out) == bits(mid)
    for first in (lo, hi):
        for second in (lo, hi):
            mixed = torch.cat((first[..., :half], second[..., half:]), dim=-1)
            ok |= bits(out) == bits(_apply_rope(mixed, cos, sin, pos))
    assert ok.all(), f"{int((~ok).sum())} elements match no admissible rounding"
    assert torch.equal(bits(qkv.view(rows, nq + 2 * nkv, d)[:, nq + nkv :]), bits(heads[:, nq + nkv :]))


@pytest.mark.parametrize("rows", [1, 3, 709])
def test_silu_mul_matches_qwen3_mlp_activation(k: object, gen: torch.Generator, rows: int) -> None:
    inter = SHAPE_4B["inter"]
    gu = randn(rows, 2 * inter, gen=gen, scale=4.0)
    out = torch.empty(rows, inter, dtype=BF16, device=DEV)
    k.launch("kern_silu_mul", (rows, math.ceil(inter / 1024)), (128,), h.ptr(gu), h.ptr(out), h.i32(inter))
    torch.cuda.synchronize()
    from transformers.activations import ACT2FN

    act = ACT2FN["silu"]
    ref = act(gu[:, :inter]) * gu[:, inter:]
    assert torch.equal(bits(out), bits(ref))
    assert torch.equal(bits(ref), bits(h.silu_mul_ref(gu)))


# ------------------------------------------------------------------------------------------------
# Paged KV.
@pytest.mark.parametrize("rows", [1, 40])
def test_kv_write_lands_in_slot_pages_only(k: object, gen: torch.Generator, rows: int) -> None:
    nq, nkv, d = 32, 8, 128
    pages = 8
    kv = h.new_paged(LAYERS, pages, PAGE, nkv, d, gen)
    before = kv.view().clone()
    table = block_table(pages, gen)
    start = 9
    positions = torch.arange(start, start + rows, device=DEV)
    slots = (table.long()[positions // PAGE] * PAGE + positions % PAGE).contiguous()
    qkv = randn(rows, (nq + 2 * nkv) * d, gen=gen)
    k.launch("kern_kv_write", (rows, nkv), (32,), h.ptr(qkv), h.ptr(kv.state, kv.layer_offset(LAYER)),
             h.ptr(slots), h.i32(nq), h.i32(nkv), h.i32(d), h.i32(PAGE), h.i64(kv.page_stride))
    torch.cuda.synchronize()
    expect = before.clone()
    heads = qkv.view(rows, nq + 2 * nkv, d)
    pg, rw = slots // PAGE, slots % PAGE
    expect[pg, LAYER, 0, rw] = heads[:, nq : nq + nkv]
    expect[pg, LAYER, 1, rw] = heads[:, nq + nkv :]
    assert torch.equal(bits(kv.view()), bits(expect))


def _decode_case(k: object, gen: torch.Generator, nq: int, nkv: int, d: int, seq_len: int, splits: int):
    pages = math.ceil(seq_len / PAGE) + 3
    kv = h.new_paged(LAYERS, pages, PAGE, nkv, d, gen)
    table = block_table(pages, gen)
    qkv = randn(1, (nq + 2 * nkv) * d, gen=gen)
    seq = torch.tensor([seq_len], dtype=torch.int32, device=DEV)
    part_o = torch.full((splits, nq, d), float("nan"), device=DEV)
    part_lse = torch.full((splits, nq), float("nan"), device=DEV)
    out = torch.empty(1, nq * d, dtype=BF16, device=DEV)
    scale = d**-0.5
    k.launch("kern_attn_decode_partial", (nkv, splits), (128,), h.ptr(qkv),
             h.ptr(kv.state, kv.layer_offset(LAYER)), h.ptr(table), h.ptr(seq), h.ptr(part_o),
             h.ptr(part_lse), h.i32(nq), h.i32(nkv), h.i32(d), h.i32(PAGE), h.i64(kv.page_stride),
             h.i32(splits), h.f32(scale))
    k.launch("kern_attn_decode_reduce", (nq,), (128,), h.ptr(part_o), h.ptr(part_lse), h.ptr(out),
             h.i32(nq), h.i32(d), h.i32(splits))
    torch.cuda.synchronize()
    keys, vals = kv.gather(LAYER, table, seq_len)
    q = qkv[:, : nq * d].view(1, nq, d)
    ref = h.attention_ref(q, keys, vals, torch.tensor([seq_len - 1], device=DEV), scale)
    return out, ref


# Edges of the split plan (attention.cu, pages of 16): split s covers pages [s * pps, (s + 1) * pps)
# with pps = ceil(pages / splits), so page and split-size boundaries (16, 32, 256, 512, 1024 tokens
# at S 16 / 32) and contexts past 8 pages per split (4096, 8192).
@pytest.mark.parametrize("seq_len", [1, 15, 16, 17, 31, 32, 33, 112, 127, 128, 129, 160, 161, 255, 256, 257,
                                     300, 512, 513, 1000, 1024, 1025, 2053, 4096, 8192])


@pytest.mark.parametrize("splits", [16, 32])
def test_decode_attention_4b_heads(k: object, gen: torch.Generator, seq_len: int, splits: int) -> None:
    out, ref = _decode_case(k, gen, 32, 8, 128, seq_len, splits)
    torch.testing.assert_close(out.float(), ref, atol=4e-3, rtol=1e-2)


@pytest.mark.parametrize(("nq", "nkv", "d"), [(16, 8, 128), (40, 8, 128), (64, 4, 128), (8, 1, 64), (24, 8, 64)])
@pytest.mark.parametrize("seq_len", [531, 100])
def test_decode_attention_other_gqa_shapes(
    k: object, gen: torch.Generator, nq: int, nkv: int, d: int, seq_len: int
) -> None:
    """531 tokens: 5 pages per split; 100 tokens: one page per split, 7 of the 8 splits used."""
    out, ref = _decode_case(k, gen, nq, nkv, d, seq_len, 8)
    torch.testing.assert_close(out.float(), ref, atol=4e-3, rtol=1e-2)


def test_decode_attention_block_table_beyond_the_cache(k: object, gen: torch.Generator) -> None:
    """Long splits: 4 splits of 132 pages each, head_dim 64, one kv head."""
    out, ref = _decode_case(k, gen, 8, 1, 64, 131 * PAGE * 4 + 5, 4)
    torch.testing.assert_close(out.float(), ref, atol=4e-3, rtol=1e-2)


@pytest.mark.parametrize(("rows", "nq", "nkv", "d"), [(1, 32, 8, 128), (37, 32, 8, 128), (5, 16, 8, 64)])
def test_qk_norm_rope_kv_is_qk_norm_rope_then_kv_write(
    k: object, gen: torch.Generator, rows: int, nq: int, nkv: int, d: int
) -> None:
    """The fused kernel leaves qkv and the pages bit-identical to the two launches it replaces."""
    maxpos, pages = 4096, 8
    qkv, wq, wk, pos = qkv_case(gen, rows, nq, nkv, d, maxpos)
    cos, sin = rope_tables(maxpos, d, 1e6)
    kv = h.new_paged(LAYERS, pages, PAGE, nkv, d, gen)
    table = block_table(pages, gen)
    positions = torch.arange(9, 9 + rows, device=DEV)
    slots = (table.long()[positions // PAGE] * PAGE + positions % PAGE).contiguous()
    qkv2, kv2 = qkv.clone(), h.Paged(kv.state.clone(), LAYERS, pages, PAGE, nkv, d)
    k.launch("kern_qk_norm_rope", (rows, nq + nkv), (d // 2,), h.ptr(qkv), h.ptr(wq), h.ptr(wk),
             h.ptr(pos), h.ptr(cos), h.ptr(sin), h.i32(nq), h.i32(nkv), h.i32(d), h.f32(EPS))
    k.launch("kern_kv_write", (rows, nkv), (32,), h.ptr(qkv), h.ptr(kv.state, kv.layer_offset(LAYER)),
             h.ptr(slots), h.i32(nq), h.i32(nkv), h.i32(d), h.i32(PAGE), h.i64(kv.page_stride))
    k.launch("kern_qk_norm_rope_kv", (rows, nq + 2 * nkv), (d // 2,), h.ptr(qkv2), h.ptr(wq), h.ptr(wk),
             h.ptr(pos), h.ptr(cos), h.ptr(sin), h.ptr(kv2.state, kv2.layer_offset(LAYER)), h.ptr(slots),
             h.i32(nq), h.i32(nkv), h.i32(d), h.f32(EPS), h.i32(PAGE), h.i64(kv2.page_stride))
    torch.cuda.synchronize()
    assert torch.equal(bits(qkv2), bits(qkv))
    assert torch.equal(bits(kv2.state), bits(kv.state))


@pytest.mark.parametrize(("rows", "nq", "nkv", "d"), [
    (1, 32, 8, 128), (37, 32, 8, 128), (700, 32, 8, 128), (5, 16, 8, 64), (3, 40, 8, 128),
    (4, 14, 2, 128), (6, 8, 1, 64)])
def test_qk_norm_rope_kv_rows_is_qk_norm_rope_kv(
    k: object, gen: torch.Generator, rows: int, nq: int, nkv: int, d: int
) -> None:
    """The warp-per-head form (prefill's) leaves qkv and the pages bit-identical to the block-per-head
    kernel, also when the last block of a row holds fewer than 8 heads."""
    maxpos, pages = 4096, -(-(9 + rows) // PAGE) + 2
    qkv, wq, wk, pos = qkv_case(gen, rows, nq, nkv, d, maxpos)
    cos, sin = rope_tables(maxpos, d, 1e6)
    kv = h.new_paged(LAYERS, pages, PAGE, nkv, d, gen)
    table = block_table(pages, gen)
    positions = torch.arange(9, 9 + rows, device=DEV)
    slots = (table.long()[positions // PAGE] * PAGE + positions % PAGE).contiguous()
    qkv2, kv2 = qkv.clone(), h.Paged(kv.state.clone(), LAYERS, pages, PAGE, nkv, d)
    before = qkv.clone()
    k.launch("kern_qk_norm_rope_kv", (rows, nq + 2 * nkv), (d // 2,), h.ptr(qkv), h.ptr(wq), h.ptr(wk),
             h.ptr(pos), h.ptr(cos), h.ptr(sin), h.ptr(kv.state, kv.layer_offset(LAYER)), h.ptr(slots),
             h.i32(nq), h.i32(nkv), h.i32(d), h.f32(EPS), h.i32(PAGE), h.i64(kv.page_stride))
    k.launch("kern_qk_norm_rope_kv_rows", (rows, -(-(nq + 2 * nkv) // 8)), (256,), h.ptr(qkv2), h.ptr(wq),
             h.ptr(wk), h.ptr(pos), h.ptr(cos), h.ptr(sin), h.ptr(kv2.state, kv2.layer_offset(LAYER)),
             h.ptr(slots), h.i32(nq), h.i32(nkv), h.i32(d), h.f32(EPS), h.i32(PAGE), h.i64(kv2.page_stride))
    torch.cuda.synchronize()
    assert not torch.equal(bits(qkv2), bits(before))
    assert torch.equal(bits(qkv2), bits(qkv))
    assert torch.equal(bits(kv2.state), bits(kv.state))


def _prefill_case(
    k: object, gen: torch.Generator, nq: int, nkv: int, d: int, prefix: int, rows: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    seq_len = prefix + rows
    pages = math.ceil(seq_len / PAGE) + 2
    kv = h.new_paged(LAYERS, pages, PAGE, nkv, d, gen)
    table = block_table(pages, gen)
    qkv = randn(rows, (nq + 2 * nkv) * d, gen=gen)
    positions = torch.arange(prefix, seq_len, device=DEV)
    slots = (table.long()[positions // PAGE] * PAGE + positions % PAGE).contiguous()
    layer_ptr = h.ptr(kv.state, kv.layer_offset(LAYER))
    k.launch("kern_kv_write", (rows, nkv), (32,), h.ptr(qkv), layer_ptr, h.ptr(slots), h.i32(nq),
             h.i32(nkv), h.i32(d), h.i32(PAGE), h.i64(kv.page_stride))
    seq = torch.tensor([seq_len], dtype=torch.int32, device=DEV)
    out = torch.full((rows, nq * d), float("nan"), dtype=BF16, device=DEV)
    scale = d**-0.5
    k.launch("kern_attn_prefill", (math.ceil(rows / 64), nq), (128,), h.ptr(qkv), layer_ptr, h.ptr(table),
             h.ptr(seq), h.ptr(out), h.i32(rows), h.i32(nq), h.i32(nkv), h.i32(d), h.i32(PAGE),
             h.i64(kv.page_stride), h.f32(scale))
    torch.cuda.synchronize()
    keys, vals = kv.gather(LAYER, table, seq_len)
    heads = qkv.view(rows, nq + 2 * nkv, d)
    assert torch.equal(bits(keys[prefix:]), bits(heads[:, nq : nq + nkv]))
    assert torch.equal(bits(vals[prefix:]), bits(heads[:, nq + nkv :]))
    ref = h.attention_ref(heads[:, :nq], keys, vals, positions, scale)
    sdpa_bf16 = _sdpa_bf16(heads[:, :nq], keys, vals, prefix)
    return out, ref, sdpa_bf16


def _sdpa_bf16(q: torch.Tensor, keys: torch.Tensor, vals: torch.Tensor, prefix: int) -> torch.Tensor:
    """transformers' sdpa path in bf16: repeat_kv, boolean causal mask shifted by the prefix."""
    rows, nq, d = q.shape
    nkv = keys.shape[1]
    kk = keys.repeat_interleave(nq // nkv, dim=1).transpose(0, 1)[None]
    vv = vals.repeat_interleave(nq // nkv, dim=1).transpose(0, 1)[None]
    mask = torch.arange(keys.shape[0], device=DEV)[None, :] <= (prefix + torch.arange(rows, device=DEV))[:, None]
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1)[None], kk, vv, attn_mask=mask[None, None], scale=d**-0.5
    )
    return out[0].transpose(0, 1).reshape(rows, nq * d)


@pytest.mark.parametrize(("prefix", "rows"), [(0, 1), (0, 37), (0, 709), (512, 197), (37, 97), (96, 64), (1000, 1)])
def test_prefill_attention_4b_heads(k: object, gen: torch.Generator, prefix: int, rows: int) -> None:
    out, ref, sdpa = _prefill_case(k, gen, 32, 8, 128, prefix, rows)
    torch.testing.assert_close(out.float(), ref, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(out.float(), sdpa.float(), atol=1.6e-2, rtol=1e-2)


@pytest.mark.parametrize(("nq", "nkv", "d"), [(16, 8, 128), (40, 8, 128), (8, 1, 64)])
def test_prefill_attention_other_gqa_shapes(k: object, gen: torch.Generator, nq: int, nkv: int, d: int) -> None:
    out, ref, _ = _prefill_case(k, gen, nq, nkv, d, 50, 77)
    torch.testing.assert_close(out.float(), ref, atol=1e-2, rtol=1e-2)


# ------------------------------------------------------------------------------------------------
# Sampling and the device-side feed.
def _argmax(k: object, logits: torch.Tensor) -> int:
    pval = torch.empty(64, device=DEV)
    pidx = torch.empty(64, dtype=torch.int32, device=DEV)
    nxt = torch.full((1,), -5, dtype=torch.int64, device=DEV)
    k.launch("kern_argmax_partial", (64,), (256,), h.ptr(logits), h.ptr(pval), h.ptr(pidx), h.i32(logits.numel()))
    k.launch("kern_argmax_final", (1,), (256,), h.ptr(pval), h.ptr(pidx), h.ptr(nxt), h.i32(64))
    torch.cuda.synchronize()
    return int(nxt.item())


def _cpu_scan(logits: torch.Tensor) -> int:
    values = logits.float().cpu().tolist()
    best = 0
    for i, v in enumerate(values):
        if v > values[best]:
            best = i
    return best


@pytest.mark.parametrize("n", [151936, 151935, 1000, 9, 64 * 8 + 3])
def test_argmax_equals_cpu_scan(k: object, gen: torch.Generator, n: int) -> None:
    logits = randn(n, gen=gen, scale=3.0)
    assert _argmax(k, logits) == _cpu_scan(logits)


def test_argmax_ties_go_to_lowest_index(k: object, gen: torch.Generator) -> None:
    n = 151936
    logits = randn(n, gen=gen)
    top = logits.float().max().item() + 1.0
    for idx in (150000, 77777, 77778, 2375, 2374 + 8 * 256):  # across and within partial blocks
        logits[idx] = top
    assert _argmax(k, logits) == 2375 == _cpu_scan(logits)
    logits[3] = top
    assert _argmax(k, logits) == 3


def test_argmax_all_equal_and_infinite(k: object) -> None:
    same = torch.full((151936,), 0.5, dtype=BF16, device=DEV)
    assert _argmax(k, same) == 0
    neg = torch.full((5000,), float("-inf"), dtype=BF16, device=DEV)
    assert _argmax(k, neg) == 0
    neg[4321] = -1e30
    assert _argmax(k, neg) == 4321


@pytest.mark.parametrize("pos", [0, 14, 15, 16, 1000])
def test_decode_advance_feeds_next_step(k: object, gen: torch.Generator, pos: int) -> None:
    table = block_table(128, gen)
    nxt = torch.tensor([123456], dtype=torch.int64, device=DEV)
    ids = torch.tensor([7], dtype=torch.int64, device=DEV)
    p = torch.tensor([pos], dtype=torch.int64, device=DEV)
    slots = torch.tensor([-1], dtype=torch.int64, device=DEV)
    seq = torch.tensor([pos + 1], dtype=torch.int32, device=DEV)
    k.launch("kern_decode_advance", (1,), (1,), h.ptr(nxt), h.ptr(ids), h.ptr(p), h.ptr(slots), h.ptr(seq),
             h.ptr(table), h.i32(PAGE))
    torch.cuda.synchronize()
    new = pos + 1
    assert ids.item() == 123456
    assert p.item() == new
    assert seq.item() == pos + 2
    assert slots.item() == int(table[new // PAGE].item()) * PAGE + new % PAGE


@pytest.mark.parametrize(("dtype", "entry"), [(torch.int64, "kern_copy_i64"), (torch.int32, "kern_copy_i32")])
@pytest.mark.parametrize("n", [1, 4, 1000])
def test_copy_copies_n_elements_only(k: object, gen: torch.Generator, dtype: torch.dtype, entry: str, n: int) -> None:
    src = torch.randint(-(2**31), 2**31 - 1, (n + 3,), generator=gen, device=DEV, dtype=torch.int64).to(dtype)
    dst = torch.full((n + 3,), 77, dtype=dtype, device=DEV)
    k.launch(entry, (1,), (32,), h.ptr(src), h.ptr(dst), h.i32(n))
    torch.cuda.synchronize()
    assert torch.equal(dst[:n], src[:n])
    assert (dst[n:] == 77).all()


def _rel_l2(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.double() - ref).norm() / ref.norm())


@pytest.mark.parametrize("silu", [False, True])
@pytest.mark.parametrize(("rows", "n", "kk"), [(1, 6144, 2560), (1, 9728, 2560), (2, 77, 4096), (1, 300, 256),
                                               (2, 5, 2568), (1, 33, 40)])


def test_deferred_norm_gemv_is_the_norm_then_the_gemv_to_bf16_rounding(
    k: object, gen: torch.Generator, silu: bool, rows: int, n: int, kk: int
) -> None:
    """gemv_defer.cu (`_b4_d`, `_b4_silu_d`): r * (W (h * w_norm)) with r in the epilogue. The new
    residual in res_out is kern_add_rmsnorm's, bit for bit (res_in untouched); the output is the
    same bits on every band grid (the generator's wave, 1, 7, a block per column, more blocks than
    columns); and it is about as close to a float64 reference of the norm and the GEMV as
    kern_add_rmsnorm + the unfused GEMV (`_b4`, `_silu`) is (relative L2: 25 % and one bf16 rounding
    of slack). 3 rows or k above 4096 write nothing."""
    band_d, band = ("kern_gemv_bf16_b4_silu_d", "kern_gemv_bf16_silu") if silu else ("kern_gemv_bf16_b4_d",
                                                                                    "kern_gemv_bf16_b4")
    case = norm_gemv_case(k, gen, band, rows, n, kk, grid=-(-n // 4) if silu else None)
    _res, _y_add, w_norm, w, res_a, want = case
    h64 = res_a.double()
    x64 = h64 * torch.rsqrt(h64.pow(2).mean(-1, keepdim=True) + EPS) * w_norm.double()
    g64 = x64 @ w.double().T
    ref = torch.nn.functional.silu(g64[:, :n]) * g64[:, n:] if silu else g64
    per_block = -(-n // (132 * 4))
    outs = []
    for grid in (-(-n // per_block), 1, 7, n, n + 5):
        got, res_out = run_folded(k, band_d, case, n, kk, grid, 0)
        assert torch.equal(bits(res_out), bits(res_a)), f"grid {grid}: the new residual"
        assert not got.isnan().any(), f"grid {grid}: every column written"
        outs.append(got)
    assert all(torch.equal(bits(o), bits(outs[0])) for o in outs[1:]), "the same bits on every grid"
    # NOTE: + 2e-3 (about one bf16 rounding, 2^-9): at a few outputs the two errors are samples of
    # the output's own rounding; a wrong r or a missing piece would be off by far more.
    assert _rel_l2(outs[0], ref) <= 1.25 * _rel_l2(want, ref) + 2e-3, (_rel_l2(outs[0], ref), _rel_l2(want, ref))
    for bad_rows, bad_k in ((1, 4104), (3, 256)):  # k beyond the registers' 4096; 3 rows
        bad = norm_gemv_case(k, gen, band, bad_rows, 8, bad_k, grid=2 if silu else None)
        got, res_out = run_folded(k, band_d, bad, 8, bad_k, 3, 0)
        assert got.isnan().all() and res_out.isnan().all(), f"{band_d}, rows {bad_rows}, k {bad_k}: nothing written"
