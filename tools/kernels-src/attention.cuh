// Paged attention for Qwen3-style GQA: split-KV decode (partials + reduce) and causal prefill.
// KV layout (docs/qwen3.md): `kv` points at this layer's k block of page 0; a page holds
// [k|v][page_tokens][nkv][head_dim] for this layer, pages `page_stride` elements apart, and the
// logical page j of the sequence is physical page block_table[j].
// Softmax runs in f32 in log2 units (scores times scale * log2(e)); outputs round to bf16 once.
#pragma once
#include "kern_common.cuh"

#define LOG2E 1.4426950408889634f

struct PagedKV {
    const bf16* kv;
    const int* block_table;
    int nkv;
    int head_dim;
    int page_tokens;
    int64_t page_stride;

    // Address of token `tok`'s k row for kv head `head`; v is at + v_offset().
    __device__ __forceinline__ const bf16* k_row(int tok, int head) const {
        const int64_t page = block_table[tok / page_tokens];
        return kv + page * page_stride + ((int64_t)(tok % page_tokens) * nkv + head) * head_dim;
    }
    __device__ __forceinline__ int64_t v_offset() const {
        return (int64_t)page_tokens * nkv * head_dim;
    }
};

// ------------------------------------------------------------------------------------------------
// Decode: one block per (kv head, split) serves the kv head's query heads, GC of them per pass.
// Warp w takes tokens w, w + 4, ...; lane l owns elements [l * EPL, (l + 1) * EPL) of a head.

constexpr int DEC_WARPS = 4;
constexpr int DEC_UNROLL = 4;

template <int EPL>
__device__ __forceinline__ void load_row(const bf16* p, float* out) {
    if constexpr (EPL == 4) {
        const uint2 v = *reinterpret_cast<const uint2*>(p);
        out[0] = __uint_as_float(v.x << 16);
        out[1] = __uint_as_float(v.x & 0xffff0000u);
        out[2] = __uint_as_float(v.y << 16);
        out[3] = __uint_as_float(v.y & 0xffff0000u);
    } else {
        const uint32_t v = *reinterpret_cast<const uint32_t*>(p);
        out[0] = __uint_as_float(v << 16);
        out[1] = __uint_as_float(v & 0xffff0000u);
    }
}

template <int EPL, int GC>
struct DecodeState {
    float m[GC];
    float l[GC];
    float acc[GC][EPL];
};

// Folds up to DEC_UNROLL tokens (n valid) into the warp's running softmax state.
template <int EPL, int GC>
__device__ __forceinline__ void decode_fold(DecodeState<EPL, GC>& st, const float (&q)[GC][EPL],
                                            const float (&k)[DEC_UNROLL][EPL],
                                            const float (&v)[DEC_UNROLL][EPL], int n,
                                            float scale_log2) {
#pragma unroll
    for (int g = 0; g < GC; ++g) {
        float s[DEC_UNROLL];
#pragma unroll
        for (int u = 0; u < DEC_UNROLL; ++u) {
            float d = 0.0f;
#pragma unroll
            for (int e = 0; e < EPL; ++e) d += q[g][e] * k[u][e];
            s[u] = d;
        }
#pragma unroll
        for (int u = 0; u < DEC_UNROLL; ++u) s[u] = warp_sum(s[u]) * scale_log2;
        float mx = st.m[g];
#pragma unroll
        for (int u = 0; u < DEC_UNROLL; ++u)
            if (u < n) mx = fmaxf(mx, s[u]);
        const float alpha = exp2f(st.m[g] - mx);
        st.m[g] = mx;
        st.l[g] *= alpha;
#pragma unroll
        for (int e = 0; e < EPL; ++e) st.acc[g][e] *= alpha;
#pragma unroll
        for (int u = 0; u < DEC_UNROLL; ++u) {
            const float p = u < n ? exp2f(s[u] - mx) : 0.0f;
            st.l[g] += p;
#pragma unroll
            for (int e = 0; e < EPL; ++e) st.acc[g][e] += p * v[u][e];
        }
    }
}

// Cross-warp combine area: m and l per (warp, head), then acc per (warp, head, element).
constexpr int DEC_MAX_GC = 8;
constexpr int DEC_MAX_D = 128;
constexpr int DEC_SMEM_FLOATS = DEC_WARPS * DEC_MAX_GC * (2 + DEC_MAX_D);

// Folds tokens [tok0, tok1) for the GC query heads from head0 and writes each head g's normalized
// output row to o_rows[g * D ..] and its log2-sum-exp to lse_rows[g] (global partials or, in
// the lab's kern_attn_decode cluster path, this block's shared memory: generic stores).
template <int EPL, int GC>
__device__ void decode_heads(const bf16* qkv, const PagedKV& kv, int head0, int tok0, int tok1,
                             float* o_rows, float* lse_rows, float scale_log2, float* smem) {
    constexpr int D = EPL * 32;
    float(*sm_m)[GC] = reinterpret_cast<float(*)[GC]>(smem);
    float(*sm_l)[GC] = reinterpret_cast<float(*)[GC]>(smem + DEC_WARPS * GC);
    float(*sm_acc)[GC][D] = reinterpret_cast<float(*)[GC][D]>(smem + 2 * DEC_WARPS * GC);
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    float q[GC][EPL];
#pragma unroll
    for (int g = 0; g < GC; ++g) load_row<EPL>(qkv + (int64_t)(head0 + g) * D + lane * EPL, q[g]);
    DecodeState<EPL, GC> st;
#pragma unroll
    for (int g = 0; g < GC; ++g) {
        st.m[g] = KERN_NEG_INF;
        st.l[g] = 0.0f;
#pragma unroll
        for (int e = 0; e < EPL; ++e) st.acc[g][e] = 0.0f;
    }
    const int head = blockIdx.x;
    for (int t = tok0 + warp; t < tok1; t += DEC_WARPS * DEC_UNROLL) {
        float k[DEC_UNROLL][EPL], v[DEC_UNROLL][EPL];
        int n = 0;
#pragma unroll
        for (int u = 0; u < DEC_UNROLL; ++u) {
            const int tok = t + u * DEC_WARPS;
            if (tok < tok1) {
                const bf16* kp = kv.k_row(tok, head) + lane * EPL;
                load_row<EPL>(kp, k[u]);
                load_row<EPL>(kp + kv.v_offset(), v[u]);
                n = u + 1;
            } else {
#pragma unroll
                for (int e = 0; e < EPL; ++e) k[u][e] = v[u][e] = 0.0f;
            }
        }
        decode_fold<EPL, GC>(st, q, k, v, n, scale_log2);
    }
    __syncthreads();
#pragma unroll
    for (int g = 0; g < GC; ++g) {
        if (lane == 0) {
            sm_m[warp][g] = st.m[g];
            sm_l[warp][g] = st.l[g];
        }
#pragma unroll
        for (int e = 0; e < EPL; ++e) sm_acc[warp][g][lane * EPL + e] = st.acc[g][e];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < GC * D; i += blockDim.x) {
        const int g = i / D;
        const int d = i % D;
        float mx = KERN_NEG_INF;
#pragma unroll
        for (int w = 0; w < DEC_WARPS; ++w) mx = fmaxf(mx, sm_m[w][g]);
        float l = 0.0f, o = 0.0f;
        if (mx != KERN_NEG_INF) {
#pragma unroll
            for (int w = 0; w < DEC_WARPS; ++w) {
                const float f = exp2f(sm_m[w][g] - mx);
                l += sm_l[w][g] * f;
                o += sm_acc[w][g][d] * f;
            }
        }
        o_rows[g * D + d] = l > 0.0f ? o / l : 0.0f;
        if (d == 0) lse_rows[g] = l > 0.0f ? mx + log2f(l) : KERN_NEG_INF;
    }
}

// The kv head blockIdx.x's `group` query heads, GC per pass; rows[h * head_dim ..] / lse[h] for
// its query head h < group.
template <int EPL, int GC>
__device__ void decode_split(const bf16* qkv, const PagedKV& kv, int tok0, int tok1, float* rows,
                             float* lse, int group, float scale_log2, float* smem) {
    for (int h = 0; h < group; h += GC) {
        decode_heads<EPL, GC>(qkv, kv, blockIdx.x * group + h, tok0, tok1, rows + h * EPL * 32,
                              lse + h, scale_log2, smem);
        __syncthreads();
    }
}

template <int EPL>
__device__ void decode_dispatch_group(const bf16* qkv, const PagedKV& kv, int tok0, int tok1,
                                      float* rows, float* lse, int group, float scale_log2,
                                      float* smem) {
    switch (group) {
#define KERN_GROUP_CASE(G)                                                                      \
    case G:                                                                                     \
        decode_split<EPL, G>(qkv, kv, tok0, tok1, rows, lse, group, scale_log2, smem);          \
        return;
        KERN_GROUP_CASE(1)
        KERN_GROUP_CASE(2)
        KERN_GROUP_CASE(3)
        KERN_GROUP_CASE(4)
        KERN_GROUP_CASE(5)
        KERN_GROUP_CASE(6)
        KERN_GROUP_CASE(7)
#undef KERN_GROUP_CASE
        default:
            // NOTE: groups above 8 must be multiples of 8 (checked by the generator).
            decode_split<EPL, 8>(qkv, kv, tok0, tok1, rows, lse, group, scale_log2, smem);
    }
}

// One block's split: rows / lse of the kv head blockIdx.x's query heads (head_dim 64 or 128).
__device__ __forceinline__ void decode_split_rows(const bf16* qkv, const PagedKV& kv, int tok0,
                                                  int tok1, float* rows, float* lse, int group,
                                                  float scale_log2, float* smem) {
    if (kv.head_dim == 64) {
        decode_dispatch_group<2>(qkv, kv, tok0, tok1, rows, lse, group, scale_log2, smem);
    } else {
        decode_dispatch_group<4>(qkv, kv, tok0, tok1, rows, lse, group, scale_log2, smem);
    }
}


// The reducing block of kern_attn_decode_rows (and the lab's kern_attn_decode): out[h] for the
// `group` query heads from head0, over the splits [0, used), with kern_attn_decode_reduce's
// arithmetic in its order (so the same bits).
// The weights 2^(lse - max) go through shared memory first; then each thread sums 4 heads of one
// element with the loads of 4 splits in flight, instead of a chain of dependent L2 round trips.
// The partials are read through L2 (__ldcg): other blocks wrote them during this launch.
__device__ __forceinline__ void decode_reduce_heads(const float* part_o, const float* part_lse,
                                                    bf16* out, int head0, int group, int used,
                                                    int nq, int head_dim, float* smem) {
    constexpr int G4 = 4;
    const int nw = used * group;
    if (nw + group > DEC_SMEM_FLOATS) {
        // NOTE: more splits x heads than the shared area holds: the plain loop.
        for (int i = threadIdx.x; i < group * head_dim; i += blockDim.x) {
            const int h = head0 + i / head_dim;
            const int d = i % head_dim;
            float mx = KERN_NEG_INF;
            for (int s = 0; s < used; ++s) mx = fmaxf(mx, __ldcg(part_lse + s * nq + h));
            float num = 0.0f, den = 0.0f;
            for (int s = 0; s < used; ++s) {
                const float w = exp2f(__ldcg(part_lse + s * nq + h) - mx);
                den += w;
                num += w * __ldcg(part_o + ((int64_t)s * nq + h) * head_dim + d);
            }
            out[(int64_t)h * head_dim + d] = to_bf(num / den);
        }
        return;
    }
    float* wts = smem;       // wts[s * group + g]: lse, then 2^(lse - max) of head head0 + g
    float* den = smem + nw;  // den[g] = sum over s of wts, in split order
    for (int i = threadIdx.x; i < nw; i += blockDim.x)
        wts[i] = __ldcg(part_lse + (i / group) * nq + head0 + i % group);
    __syncthreads();
    for (int g = threadIdx.x; g < group; g += blockDim.x) {
        float mx = KERN_NEG_INF;
        for (int s = 0; s < used; ++s) mx = fmaxf(mx, wts[s * group + g]);
        float sum = 0.0f;
        for (int s = 0; s < used; ++s) {
            const float w = exp2f(wts[s * group + g] - mx);
            wts[s * group + g] = w;
            sum += w;
        }
        den[g] = sum;
    }
    __syncthreads();
    const int quads = (group + G4 - 1) / G4;
    for (int i = threadIdx.x; i < quads * head_dim; i += blockDim.x) {
        const int d = i % head_dim;
        const int g0 = i / head_dim * G4;
        float num[G4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 4
        for (int s = 0; s < used; ++s) {
#pragma unroll
            for (int gg = 0; gg < G4; ++gg) {
                if (g0 + gg < group) {
                    const float o = __ldcg(part_o + ((int64_t)s * nq + head0 + g0 + gg) * head_dim + d);
                    num[gg] += wts[s * group + g0 + gg] * o;
                }
            }
        }
#pragma unroll
        for (int gg = 0; gg < G4; ++gg)
            if (g0 + gg < group)
                out[(int64_t)(head0 + g0 + gg) * head_dim + d] = to_bf(num[gg] / den[g0 + gg]);
    }
}

// ------------------------------------------------------------------------------------------------
// Prefill: causal attention of `rows` new query rows (row i at position seq_len - rows + i) over
// every cached token, tensor cores (mma.m16n8k16 bf16 -> f32), flash-style online softmax.
// Block = 4 warps x 16 query rows of one query head; keys in tiles of PF_BN from the pages.

constexpr int PF_BM = 64;
constexpr int PF_BN = 64;

static __device__ __forceinline__ uint32_t pair_u16(const bf16* lo, const bf16* hi) {
    return (uint32_t)__bfloat16_as_ushort(*lo) | ((uint32_t)__bfloat16_as_ushort(*hi) << 16);
}

template <int D>
struct PrefillTile {
    static constexpr int LD = D + 8;  // NOTE: padding keeps the fragment loads bank-conflict free.
    bf16 k[PF_BN][LD];
    bf16 v[PF_BN][LD];
};

template <int D>
__device__ __forceinline__ void prefill_load_tile(PrefillTile<D>& tile, const PagedKV& kv, int kb,
                                                  int len, int head) {
    constexpr int CH = D / 8;
    for (int c = threadIdx.x; c < PF_BN * CH; c += blockDim.x) {
        const int key = c / CH;
        const int ch = c % CH;
        const int tok = kb + key;
        uint4 kval = make_uint4(0, 0, 0, 0), vval = make_uint4(0, 0, 0, 0);
        if (tok < len) {
            const bf16* kp = kv.k_row(tok, head) + ch * 8;
            kval = *reinterpret_cast<const uint4*>(kp);
            vval = *reinterpret_cast<const uint4*>(kp + kv.v_offset());
        }
        *reinterpret_cast<uint4*>(&tile.k[key][ch * 8]) = kval;
        *reinterpret_cast<uint4*>(&tile.v[key][ch * 8]) = vval;
    }
}

// Masks and scales one score tile, updates the running max / sum, and turns scores into P.
__device__ __forceinline__ void prefill_softmax(float (&s)[PF_BN / 8][4], float (&m)[2],
                                                float (&l)[2], float (&alpha)[2], int kb,
                                                const int (&qpos)[2], float scale_log2) {
    const int tq = threadIdx.x & 3;
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int nt = 0; nt < PF_BN / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int key = kb + nt * 8 + 2 * tq + (e & 1);
            const int r = e >> 1;
            const float v = key <= qpos[r] ? s[nt][e] * scale_log2 : KERN_NEG_INF;
            s[nt][e] = v;
            mx[r] = fmaxf(mx[r], v);
        }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        alpha[r] = exp2f(m[r] - mx[r]);
        m[r] = mx[r];
        l[r] *= alpha[r];
    }
#pragma unroll
    for (int nt = 0; nt < PF_BN / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float p = exp2f(s[nt][e] - m[e >> 1]);
            s[nt][e] = p;
            l[e >> 1] += p;
        }
    }
}

template <int D>
__device__ void prefill_impl(const bf16* qkv, const PagedKV& kv, int len, bf16* out, int rows,
                             int nq, float scale_log2, uint4* smem) {
    PrefillTile<D>& tile = *reinterpret_cast<PrefillTile<D>*>(smem);
    constexpr int KS = D / 16;
    constexpr int NO = D / 8;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int g = lane >> 2;
    const int tq = lane & 3;
    const int h = blockIdx.y;
    const int head = h / (nq / kv.nkv);
    const int m0 = blockIdx.x * PF_BM;
    const int64_t qstride = (int64_t)(nq + 2 * kv.nkv) * D;
    const int base = len - rows;
    const int r_lo = m0 + warp * 16 + g;
    const int rr[2] = {min(r_lo, rows - 1), min(r_lo + 8, rows - 1)};
    const int qpos[2] = {base + rr[0], base + rr[1]};
    uint32_t qa[KS][4];
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int col = ks * 16 + 2 * tq + (i >> 1) * 8;
            qa[ks][i] = *reinterpret_cast<const uint32_t*>(qkv + rr[i & 1] * qstride +
                                                           (int64_t)h * D + col);
        }
    }
    float o[NO][4];
#pragma unroll
    for (int nt = 0; nt < NO; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
    float m[2] = {KERN_NEG_INF, KERN_NEG_INF}, l[2] = {0.0f, 0.0f}, alpha[2];
    const int kv_end = base + min(m0 + PF_BM, rows);
    for (int kb = 0; kb < kv_end; kb += PF_BN) {
        __syncthreads();
        prefill_load_tile<D>(tile, kv, kb, len, head);
        __syncthreads();
        float s[PF_BN / 8][4];
#pragma unroll
        for (int nt = 0; nt < PF_BN / 8; ++nt) {
            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < KS; ++ks) {
                const bf16* kr = &tile.k[nt * 8 + g][ks * 16 + 2 * tq];
                mma_bf16(s[nt], qa[ks], *reinterpret_cast<const uint32_t*>(kr),
                         *reinterpret_cast<const uint32_t*>(kr + 8));
            }
        }
        prefill_softmax(s, m, l, alpha, kb, qpos, scale_log2);
#pragma unroll
        for (int nt = 0; nt < NO; ++nt) {
            o[nt][0] *= alpha[0];
            o[nt][1] *= alpha[0];
            o[nt][2] *= alpha[1];
            o[nt][3] *= alpha[1];
        }
#pragma unroll
        for (int kk = 0; kk < PF_BN / 16; ++kk) {
            const uint32_t pa[4] = {pack2(s[2 * kk][0], s[2 * kk][1]),
                                    pack2(s[2 * kk][2], s[2 * kk][3]),
                                    pack2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                    pack2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
            const int key = kk * 16 + 2 * tq;
#pragma unroll
            for (int nt = 0; nt < NO; ++nt) {
                const int col = nt * 8 + g;
                const uint32_t b0 = pair_u16(&tile.v[key][col], &tile.v[key + 1][col]);
                const uint32_t b1 = pair_u16(&tile.v[key + 8][col], &tile.v[key + 9][col]);
                mma_bf16(o[nt], pa, b0, b1);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
    const int rows_out[2] = {r_lo, r_lo + 8};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        if (rows_out[r] >= rows) continue;
        const float inv = 1.0f / l[r];
        bf16* dst = out + (int64_t)rows_out[r] * nq * D + (int64_t)h * D + 2 * tq;
#pragma unroll
        for (int nt = 0; nt < NO; ++nt) {
            *reinterpret_cast<uint32_t*>(dst + nt * 8) =
                pack2(o[nt][2 * r] * inv, o[nt][2 * r + 1] * inv);
        }
    }
}

// ------------------------------------------------------------------------------------------------
// Decode over rows (kern_attn_decode_rows): one block per (kv head, split, row); each of its
// ROWS_WARPS warps streams whole pages of the split (warp w: the split's pages w, w + 4, ...)
// through its own ring of ROWS_STAGES page slots in shared memory (cp.async, 16-byte chunks), and
// runs both products on the tensor cores (mma.m16n8k16, bf16 -> f32), the kv head's query heads
// as the 16 rows (8 per head tile) of S = Q K^T and as the 8 columns of O^T = V^T P^T.
//
// Fragments straight from the copied chunks: lane (g = lane / 4, t = lane % 4) copies
// - K of tokens g and g + 8, dims [32 c + 8 t, 32 c + 8 t + 8) for chunk c < D / 32: the 16 dims of
//   k-step j are {32 (j / 2) + 8 t + 4 (j % 2) + i, i < 4, t < 4} (the dot product's order, q
//   loaded in the same pattern);
// - V of tokens 2t, 2t + 1, 2t + 8, 2t + 9 (the k rows of the P.V step), dims [h D / 2 + 8 g, +8)
//   for h < D / 64: value i of a token is dim vdim(g, i) = (i / 8) D / 2 + 8 g + i % 8; m-tile mt
//   takes value mt for row g and D / 16 + mt for row g + 8, so lane (g, t) accumulates heads
//   2t, 2t + 1 (+ 8) of dims vdim(g, mt) and vdim(g, D / 16 + mt).
// Chunk c of lane l sits at byte (c * 32 + l) * 16 of its slot: each lane reads back only what it
// copied (no barrier between the copy and the use), and a warp's 16-byte accesses never conflict.
// P is rounded to bf16 for the P.V product and the row sums add the rounded weights, so each
// split's output is an exact convex combination of its V rows with those weights.

// Warps per block and page slots per warp (a lab build may define KERN_ROWS_WARPS /
// KERN_ROWS_STAGES before including this header; the product takes the defaults).
#ifndef KERN_ROWS_WARPS
#define KERN_ROWS_WARPS 4
#endif
#ifndef KERN_ROWS_STAGES
#define KERN_ROWS_STAGES 3
#endif
constexpr int ROWS_WARPS = KERN_ROWS_WARPS;
constexpr int ROWS_STAGES = KERN_ROWS_STAGES;
constexpr int ROWS_MAX_GROUP = 16;  // query heads per kv head: two head tiles of 8
// Pages per split at least. In a launch of several rows, 16 (256 tokens): a block streams 4 pages a
// warp or more, so short rows take few blocks (one, up to 256 tokens) instead of many one-page
// splits and their combine. A launch of one row (the one-row step) takes 4: its few blocks would
// otherwise leave the GPU idle below 4,096 tokens, where a warp's chain of pages, not the bytes,
// sets the time.
constexpr int ROWS_MIN_PAGES = 16;
constexpr int ROWS_MIN_PAGES_ONE = 4;
constexpr int ROWS_PAGE = 16;  // tokens per page: the 16 rows of an m16n8k16 tile

// Dynamic shared memory of kern_attn_decode_rows at head_dim d (the launch must give it).
__host__ __device__ constexpr int rows_smem_bytes(int d) { return ROWS_WARPS * ROWS_STAGES * (d / 8) * 32 * 16; }

static __device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
    // NOTE: src-size 0 copies nothing and zero-fills the 16 bytes (tokens past the sequence).
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
}

static __device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;" ::: "memory");
}

template <int N>
static __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

static __device__ __forceinline__ uint4 lds128(uint32_t addr) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(addr));
    return v;
}

static __device__ __forceinline__ uint32_t u4_word(const uint4& v, int w) {
    return w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w;
}

// bf16 pair (lo from a, hi from b): the low halves (hi_half = false) or the high halves of a, b.
static __device__ __forceinline__ uint32_t pair_of(uint32_t a, uint32_t b, bool hi_half) {
    return __byte_perm(a, b, hi_half ? 0x7632 : 0x5410);
}

template <int D>
struct RowsGeom {
    static constexpr int KC = D / 32;        // K chunks per token per lane
    static constexpr int VC = D / 64;        // V chunks per token per lane
    static constexpr int CH = D / 8;         // chunks per page per lane
    static constexpr int MT = D / 16;        // m-tiles of P.V, k-steps of Q.K
    static constexpr int SLOT = CH * 32 * 16;  // bytes of a page slot
};

// The split's pages, as one block sees them.
struct RowsSplit {
    const bf16* kv;           // this layer's k block of page 0
    const int* table;         // the row's block-table row
    int64_t page_stride;
    int nkv;
    int head;                 // kv head
    int len;                  // the row's tokens
    int pages;                // the row's pages
    int page0;                // the split's first page
    int npages;               // the split's pages
};

// Copies the warp's page `gp` (physical `phys`) into the slot at shared address `slot`.
template <int D>
__device__ __forceinline__ void rows_issue(const RowsSplit& sp, uint32_t slot, int gp, int phys) {
    using G = RowsGeom<D>;
    const int lane = threadIdx.x & 31;
    const int g = lane >> 2;
    const int t = lane & 3;
    const int valid = min(ROWS_PAGE, sp.len - gp * ROWS_PAGE);
#ifdef KERN_ROWS_HEAD_MAJOR
    // NOTE: a lab layout, [k|v][nkv][page_tokens][head_dim]: a head's 16 k (v) rows contiguous.
    const int64_t row = D;
    const bf16* k0 = sp.kv + phys * sp.page_stride + (int64_t)sp.head * ROWS_PAGE * D;
    const bf16* v0 = k0 + (int64_t)ROWS_PAGE * sp.nkv * D;
#else
    const int64_t row = (int64_t)sp.nkv * D;
    const bf16* k0 = sp.kv + phys * sp.page_stride + (int64_t)sp.head * D;
    const bf16* v0 = k0 + ROWS_PAGE * row;
#endif
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
        const int tok = g + 8 * nt;
        const bf16* src = k0 + (tok < valid ? tok : 0) * row;
#pragma unroll
        for (int c = 0; c < G::KC; ++c)
            cp_async16(slot + ((nt * G::KC + c) * 32 + lane) * 16, src + 32 * c + 8 * t, tok < valid);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
        const int tok = 2 * t + (u & 1) + 8 * (u >> 1);
        const bf16* src = v0 + (tok < valid ? tok : 0) * row;
#pragma unroll
        for (int h = 0; h < G::VC; ++h)
            cp_async16(slot + ((2 * G::KC + u * G::VC + h) * 32 + lane) * 16, src + h * (D / 2) + 8 * g,
                       tok < valid);
    }
}

// A warp's running softmax state over its pages: head row g (+ 8 r) max / rounded-weight sum
// (per lane: its 4 columns; the quad's sum at the end), and O^T accumulators of heads
// 8 ht + 2t (+1) at dims vdim(g, mt) (c0, c1) and vdim(g, D/16 + mt) (c2, c3).
template <int D, int HT>
struct RowsState {
    float m[HT];
    float l[HT];
    float acc[HT][RowsGeom<D>::MT][4];
};

// Folds the page in `slot` (its first `valid` tokens) into the warp's state.
template <int D, int HT>
__device__ __forceinline__ void rows_fold(RowsState<D, HT>& st, const uint4 (&q)[HT][D / 32],
                                          uint32_t slot, int valid, float scale_log2) {
    using G = RowsGeom<D>;
    const int lane = threadIdx.x & 31;
    const int t = lane & 3;
    uint4 kc[2 * G::KC], vc[4 * G::VC];
#pragma unroll
    for (int i = 0; i < 2 * G::KC; ++i) kc[i] = lds128(slot + (i * 32 + lane) * 16);
#pragma unroll
    for (int i = 0; i < 4 * G::VC; ++i) vc[i] = lds128(slot + ((2 * G::KC + i) * 32 + lane) * 16);
    // S = Q K^T: two chains per token tile (even / odd k-steps) for fewer dependent mma.
    float s[2][2][4];
#pragma unroll
    for (int p = 0; p < 2; ++p)
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) s[p][nt][0] = s[p][nt][1] = s[p][nt][2] = s[p][nt][3] = 0.0f;
#pragma unroll
    for (int j = 0; j < G::MT; ++j) {
        const int c = j / 2;
        const bool odd = j & 1;
        uint32_t a[4];
        a[0] = odd ? q[0][c].z : q[0][c].x;
        a[2] = odd ? q[0][c].w : q[0][c].y;
        if constexpr (HT == 2) {
            a[1] = odd ? q[1][c].z : q[1][c].x;
            a[3] = odd ? q[1][c].w : q[1][c].y;
        } else {
            a[1] = a[3] = 0u;
        }
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
            const uint4& k = kc[nt * G::KC + c];
            mma_bf16(s[j & 1][nt], a, odd ? k.z : k.x, odd ? k.w : k.y);
        }
    }
    // Online softmax per head row; P as the bf16 B fragments of the P.V step.
    uint32_t pb[HT][2];
    float alpha[HT];
#pragma unroll
    for (int r = 0; r < HT; ++r) {
        float v[2][2];
        float mx = KERN_NEG_INF;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int tok = 8 * nt + 2 * t + e;
                const float x = (s[0][nt][2 * r + e] + s[1][nt][2 * r + e]) * scale_log2;
                v[nt][e] = tok < valid ? x : KERN_NEG_INF;
                mx = fmaxf(mx, v[nt][e]);
            }
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(st.m[r], mx);  // the page holds a valid token: finite
        alpha[r] = exp2f(st.m[r] - m_new);
        st.m[r] = m_new;
        float sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
            const uint32_t pk = pack2(exp2f(v[nt][0] - m_new), exp2f(v[nt][1] - m_new));
            sum += __uint_as_float(pk << 16) + __uint_as_float(pk & 0xffff0000u);
            pb[r][nt] = pk;
        }
        st.l[r] = st.l[r] * alpha[r] + sum;
    }
    // O^T += V^T P^T, after rescaling by each column head's alpha (held by the quad of its row).
#pragma unroll
    for (int ht = 0; ht < HT; ++ht) {
        const float a_lo = __shfl_sync(0xffffffffu, alpha[ht], 8 * t);
        const float a_hi = __shfl_sync(0xffffffffu, alpha[ht], 8 * t + 4);
#pragma unroll
        for (int mt = 0; mt < G::MT; ++mt) {
            st.acc[ht][mt][0] *= a_lo;
            st.acc[ht][mt][1] *= a_hi;
            st.acc[ht][mt][2] *= a_lo;
            st.acc[ht][mt][3] *= a_hi;
        }
    }
#pragma unroll
    for (int mt = 0; mt < G::MT; ++mt) {
        // value index i of token u: word (i % 8) / 2 of chunk u * VC + i / 8, half i % 2
        const int lo = mt, hi = G::MT + mt;
        const bool half = mt & 1;
        uint32_t a[4];
        a[0] = pair_of(u4_word(vc[0 * G::VC + lo / 8], (lo % 8) / 2), u4_word(vc[1 * G::VC + lo / 8], (lo % 8) / 2), half);
        a[1] = pair_of(u4_word(vc[0 * G::VC + hi / 8], (hi % 8) / 2), u4_word(vc[1 * G::VC + hi / 8], (hi % 8) / 2), half);
        a[2] = pair_of(u4_word(vc[2 * G::VC + lo / 8], (lo % 8) / 2), u4_word(vc[3 * G::VC + lo / 8], (lo % 8) / 2), half);
        a[3] = pair_of(u4_word(vc[2 * G::VC + hi / 8], (hi % 8) / 2), u4_word(vc[3 * G::VC + hi / 8], (hi % 8) / 2), half);
#pragma unroll
        for (int ht = 0; ht < HT; ++ht) mma_bf16(st.acc[ht][mt], a, pb[ht][0], pb[ht][1]);
    }
}

// The block's split: folds its pages (warp w: the split's pages w, w + ROWS_WARPS, ...), combines
// the warps, and writes each of the kv head's `group` query heads' normalized row to
// o_dst[h * D ..] and its log2-sum-exp to lse_dst[h]. The block-table entries and the k / v rows
// of every page but the row's last are copied before the PDL wait (earlier steps wrote them);
// q and the last page after it.
template <int D, int HT>
__device__ void rows_fold_split(const bf16* qrow, const RowsSplit& sp, int group, float scale_log2,
                                float* o_dst, float* lse_dst, unsigned char* smem) {
    using G = RowsGeom<D>;
    constexpr int S = ROWS_STAGES;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int g = lane >> 2;
    const int t = lane & 3;
    const uint32_t base = (uint32_t)__cvta_generic_to_shared(smem) + warp * S * G::SLOT;
    const int n = sp.npages > warp ? (sp.npages - warp + ROWS_WARPS - 1) / ROWS_WARPS : 0;
    // lane j holds the physical page of the warp's page cache0 + j
    int cache0 = 0;
    int cache = lane < n ? sp.table[sp.page0 + warp + lane * ROWS_WARPS] : 0;
    auto page_of = [&](int i) { return sp.page0 + warp + i * ROWS_WARPS; };
    auto phys = [&](int i) {
        if (i >= cache0 + 32) {
            cache0 += 32;
            cache = cache0 + lane < n ? sp.table[page_of(cache0 + lane)] : 0;
        }
        return __shfl_sync(0xffffffffu, cache, i - cache0);
    };
    bool deferred = false;
#pragma unroll
    for (int i = 0; i < S - 1; ++i) {
        if (i < n) {
            if (page_of(i) == sp.pages - 1)
                deferred = true;  // NOTE: holds this step's k / v row, written by the launch before
            else
                rows_issue<D>(sp, base + i * G::SLOT, page_of(i), phys(i));
        }
        cp_async_commit();
    }
    kern_pdl_wait();
    if (deferred) {
        // NOTE: the warp's last page (n - 1 < S - 1); the loop waits for every group there.
        rows_issue<D>(sp, base + ((n - 1) % S) * G::SLOT, page_of(n - 1), phys(n - 1));
        cp_async_commit();
    }
    uint4 q[HT][D / 32];
#pragma unroll
    for (int r = 0; r < HT; ++r) {
        const int h = g + 8 * r;
        const bf16* qh = qrow + (int64_t)(sp.head * group + h) * D;
#pragma unroll
        for (int c = 0; c < D / 32; ++c)
            q[r][c] = h < group ? *reinterpret_cast<const uint4*>(qh + 32 * c + 8 * t) : make_uint4(0, 0, 0, 0);
    }
    RowsState<D, HT> st;
#pragma unroll
    for (int r = 0; r < HT; ++r) {
        st.m[r] = KERN_NEG_INF;
        st.l[r] = 0.0f;
#pragma unroll
        for (int mt = 0; mt < G::MT; ++mt) st.acc[r][mt][0] = st.acc[r][mt][1] = st.acc[r][mt][2] = st.acc[r][mt][3] = 0.0f;
    }
    for (int i = 0; i < n; ++i) {
        const int next = i + S - 1;
        if (next < n) rows_issue<D>(sp, base + (next % S) * G::SLOT, page_of(next), phys(next));
        cp_async_commit();
        if (i == n - 1)
            cp_async_wait<0>();
        else
            cp_async_wait<S - 1>();
        rows_fold<D, HT>(st, q, base + (i % S) * G::SLOT, min(ROWS_PAGE, sp.len - page_of(i) * ROWS_PAGE),
                         scale_log2);
    }
#pragma unroll
    for (int r = 0; r < HT; ++r) {
        st.l[r] += __shfl_xor_sync(0xffffffffu, st.l[r], 1);
        st.l[r] += __shfl_xor_sync(0xffffffffu, st.l[r], 2);
    }
    // Combine the warps: m, l per (warp, head row), then O per (warp, head row, dim).
    constexpr int R = 8 * HT;
    float* sm_m = reinterpret_cast<float*>(smem);
    float* sm_l = sm_m + ROWS_WARPS * R;
    float* sm_acc = sm_l + ROWS_WARPS * R;
    __syncthreads();  // every warp is done with its slots
    if (t == 0) {
#pragma unroll
        for (int r = 0; r < HT; ++r) {
            sm_m[warp * R + g + 8 * r] = st.m[r];
            sm_l[warp * R + g + 8 * r] = st.l[r];
        }
    }
#pragma unroll
    for (int ht = 0; ht < HT; ++ht) {
#pragma unroll
        for (int mt = 0; mt < G::MT; ++mt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int head = 8 * ht + 2 * t + (e & 1);
                const int i = e < 2 ? mt : G::MT + mt;
                const int dim = (i / 8) * (D / 2) + 8 * g + i % 8;
                sm_acc[(warp * R + head) * D + dim] = st.acc[ht][mt][e];
            }
        }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < group * D; idx += blockDim.x) {
        const int h = idx / D;
        const int d = idx % D;
        float mx = KERN_NEG_INF;
#pragma unroll
        for (int w = 0; w < ROWS_WARPS; ++w) mx = fmaxf(mx, sm_m[w * R + h]);
        float l = 0.0f, o = 0.0f;
#pragma unroll
        for (int w = 0; w < ROWS_WARPS; ++w) {
            const float f = exp2f(sm_m[w * R + h] - mx);  // a warp without pages: m = -inf, f = 0
            l += sm_l[w * R + h] * f;
            o += sm_acc[(w * R + h) * D + d] * f;
        }
        o_dst[h * D + d] = o / l;
        if (d == 0) lse_dst[h] = mx + log2f(l);
    }
}

// Float offset of a whole row's output rows / lse in kern_attn_decode_rows' dynamic shared memory
// (past the warps' combine area of rows_fold_split): ROWS_MAX_GROUP * D rows, then the lse.
template <int D>
__host__ __device__ constexpr int rows_whole_offset() { return ROWS_WARPS * 16 * (2 + D); }
static_assert(rows_whole_offset<128>() + ROWS_MAX_GROUP * (128 + 1) <= rows_smem_bytes(128) / 4 &&
                  rows_whole_offset<64>() + ROWS_MAX_GROUP * (64 + 1) <= rows_smem_bytes(64) / 4,
              "a whole row's outputs fit the launch's shared memory");

// A row of one split (used 1: `sp` holds all its pages) or none (used 0) written by one block: the
// split folded into shared memory past the warps' combine area, then its rows to `dst` (the kv
// head's group * D outputs) as bf16 (the split's normalized rows rounded once); zeros for none.
template <int D, int HT>
__device__ __forceinline__ void rows_write_whole(const bf16* qrow, const RowsSplit& sp, int group, float scale, int used,
                                                 bf16* dst, unsigned char* smem) {
    float* o = reinterpret_cast<float*>(smem) + rows_whole_offset<D>();
    if (used == 1) {
        rows_fold_split<D, HT>(qrow, sp, group, scale * LOG2E, o, o + ROWS_MAX_GROUP * D, smem);
        __syncthreads();
    } else {
        kern_pdl_wait();
    }
    for (int i = threadIdx.x; i < group * D; i += blockDim.x) dst[i] = to_bf(used == 1 ? o[i] : 0.0f);
}

// kern_attn_decode_rows' body for one (kv head, split, row) block, head_dim D, HT head tiles. The
// split plan is the row's own (the same in any launch of two rows or more): its pages =
// ceil(len / 16), pps = max(min_pages, ceil(pages / max_splits)) pages per split (min_pages:
// ROWS_MIN_PAGES_ONE in a launch of one row, else ROWS_MIN_PAGES), used = ceil(pages / pps)
// splits. A row of one split (or none) is written by its block at y = 0 alone; otherwise each
// split writes its normalized rows and log2-sum-exps to part_o[row, s] / part_lse[row, s], counts
// itself in counters[row, kv head], and the last block to count reduces the splits in order
// (decode_reduce_heads) and sets the counter back to 0. Blocks past the row's splits exit after
// the PDL wait.
template <int D, int HT>
__device__ void attn_rows_run(const bf16* qkv, const bf16* kv, const int* block_table, const int* seq_lens,
                              float* part_o, float* part_lse, int* counters, bf16* out, int nq, int nkv,
                              int64_t page_stride, int table_stride, int max_splits, float scale,
                              unsigned char* smem) {
    const int row = blockIdx.z;
    const int split = blockIdx.y;
    const int head = blockIdx.x;
    const int group = nq / nkv;
    // NOTE: seq_lens, the block table and the k / v rows before each row's last token are read
    // before the PDL wait (see rows_fold_split): no launch of the step before this one may write
    // them.
    const int len = seq_lens[row];
    const int pages = (len + ROWS_PAGE - 1) / ROWS_PAGE;
    const int min_pages = gridDim.z == 1 ? ROWS_MIN_PAGES_ONE : ROWS_MIN_PAGES;
    const int pps = max(min_pages, (pages + max_splits - 1) / max_splits);
    const int used = (pages + pps - 1) / pps;
    if (split >= max(used, 1)) {
        kern_pdl_wait();
        return;
    }
    bf16* out_row = out + (int64_t)row * nq * D;
    const bf16* qrow = qkv + (int64_t)row * (nq + 2 * nkv) * D;
    const int* table = block_table + (int64_t)row * table_stride;
    if (used <= 1) {
        const RowsSplit sp{kv, table, page_stride, nkv, head, len, pages, 0, pages};
        rows_write_whole<D, HT>(qrow, sp, group, scale, used, out_row + (int64_t)head * group * D, smem);
        return;
    }
    float* po = part_o + (int64_t)row * max_splits * nq * D;
    float* pl = part_lse + (int64_t)row * max_splits * nq;
    const RowsSplit sp{kv, table, page_stride, nkv, head, len, pages, split * pps, min(pps, pages - split * pps)};
    rows_fold_split<D, HT>(qrow, sp, group, scale * LOG2E, po + ((int64_t)split * nq + head * group) * D,
                           pl + split * nq + head * group, smem);
    __threadfence();
    __syncthreads();
    __shared__ int is_last;
    int* count = counters + (int64_t)row * nkv + head;
    if (threadIdx.x == 0) is_last = atomicAdd(count, 1) == used - 1;
    __syncthreads();
    if (!is_last) return;
    __threadfence();
    decode_reduce_heads(po, pl, out_row, head * group, group, used, nq, D, reinterpret_cast<float*>(smem));
    if (threadIdx.x == 0) *count = 0;
}

// The body of a rows entry (kern_attn_decode_rows, kern_attn_decode_one): the shape checks, then
// `Run::go<D, HT>` at the launch's head_dim (64 or 128) and head tiles (1 up to 8 query heads per
// kv head, 2 up to ROWS_MAX_GROUP). Anything else traps.
template <class Run>
__device__ __forceinline__ void rows_entry(const bf16* qkv, const bf16* kv, const int* block_table, const int* seq_lens,
                                           float* part_o, float* part_lse, int* counters, bf16* out, int nq, int nkv,
                                           int head_dim, int page_tokens, int64_t page_stride, int table_stride,
                                           int max_splits, float scale, unsigned char* smem) {
    const int group = nq / nkv;
    if (page_tokens != ROWS_PAGE || group * nkv != nq || group > ROWS_MAX_GROUP ||
        (head_dim != 64 && head_dim != 128))
        __trap();
    if (head_dim == 64) {
        if (group <= 8)
            Run::template go<64, 1>(qkv, kv, block_table, seq_lens, part_o, part_lse, counters, out, nq, nkv,
                                    page_stride, table_stride, max_splits, scale, smem);
        else
            Run::template go<64, 2>(qkv, kv, block_table, seq_lens, part_o, part_lse, counters, out, nq, nkv,
                                    page_stride, table_stride, max_splits, scale, smem);
    } else {
        if (group <= 8)
            Run::template go<128, 1>(qkv, kv, block_table, seq_lens, part_o, part_lse, counters, out, nq, nkv,
                                     page_stride, table_stride, max_splits, scale, smem);
        else
            Run::template go<128, 2>(qkv, kv, block_table, seq_lens, part_o, part_lse, counters, out, nq, nkv,
                                     page_stride, table_stride, max_splits, scale, smem);
    }
}

// kern_attn_decode_rows' plan for rows_entry.
struct RowsFlat {
    template <int D, int HT>
    static __device__ __forceinline__ void go(const bf16* qkv, const bf16* kv, const int* block_table,
                                              const int* seq_lens, float* part_o, float* part_lse, int* counters,
                                              bf16* out, int nq, int nkv, int64_t page_stride, int table_stride,
                                              int max_splits, float scale, unsigned char* smem) {
        attn_rows_run<D, HT>(qkv, kv, block_table, seq_lens, part_o, part_lse, counters, out, nq, nkv, page_stride,
                             table_stride, max_splits, scale, smem);
    }
};
