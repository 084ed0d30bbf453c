// Decode attention with the q/k norm, the rotary embedding and the KV write folded in: one launch
// where the decode step had kern_qk_norm_rope_kv (qwen3_core.cu) then kern_attn_decode
// (attention.cu). Its own module, so that adding it leaves attention.cu's cubin as it was.
//
// Each working block (kv head h = blockIdx.x, split blockIdx.y) computes, after the PDL wait, its
// group's query heads normed and rotated, into shared memory, with kern_qk_norm_rope's arithmetic
// in its order (a head's half-dim threads hold the rotary pair i, i + D/2; the sum of squares goes
// through each warp's shuffle and then the warps' sums in warp order, as block_sum over D/2
// threads does), so the same bf16 values; the block whose split holds the last token also norms
// and rotates k head h and writes it, with v head h, into that token's page rows (slots[0]), then
// folds them in like any other row. Everything else is kern_attn_decode's (attn_decode_run): the
// split plan, the L2 prefetch before the wait, the cluster or global combine. The raw q/k in qkv
// stay as the GEMV wrote them (no later launch of the step reads them).
// head_dim 64 or 128; nq / nkv <= 32 (and <= 8 or a multiple of 8, as kern_attn_decode). grid [nkv, splits] (splits a multiple of 8), block [128].
#include "attention_lab.cuh"

constexpr int QKN_MAX_GROUP = 32;  // query heads per kv head held in shared memory (kern_lab checks)
constexpr int QKN_MAX_D = 128;

// Threads [w0 * 32, w0 * 32 + half) hold head `x`'s rotary pairs (x1 = element i, x2 = element
// i + half); every thread of the block calls it. Returns the pair normed (RMSNorm with weight w)
// and rotated at `pos`, each rounded as kern_qk_norm_rope rounds it.
static __device__ __forceinline__ void qkn_pair(float& x1, float& x2, int i, int half, float eps,
                                                const bf16* __restrict__ w, float c, float s,
                                                float* partial) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int hw = half / 32;  // warps per head: 1 or 2
    // NOTE: the contraction kern_qk_norm_rope's compiled code has (x2 * x2, then an FMA of x1 * x1),
    // written out so that it does not depend on this file's optimizer.
    const float v = warp_sum(__fmaf_rn(x1, x1, __fmul_rn(x2, x2)));
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    // NOTE: block_sum over a head's hw warps: a shuffle sum of [p0, p1, 0, ...], i.e. p0 + p1.
    const int w0 = warp / hw * hw;
    const float total = hw == 1 ? partial[w0] : partial[w0] + partial[w0 + 1];
    const float r = rsqrtf(total / (float)(2 * half) + eps);
    x1 = bf(bf(x1 * r) * to_f(w[i]));
    x2 = bf(bf(x2 * r) * to_f(w[i + half]));
    const float o1 = bf(bf(x1 * c) - bf(x2 * s));
    const float o2 = bf(bf(x2 * c) + bf(x1 * s));
    x1 = o1;
    x2 = o2;
}

extern "C" __global__ void __cluster_dims__(1, DEC_CLUSTER, 1)
kern_attn_decode_qkn(const bf16* __restrict__ qkv, const bf16* __restrict__ wq,
                     const bf16* __restrict__ wk, const int64_t* __restrict__ pos,
                     const bf16* __restrict__ cos_t, const bf16* __restrict__ sin_t,
                     bf16* __restrict__ kv, const int64_t* __restrict__ slots,
                     const int* __restrict__ block_table, const int* __restrict__ seq_len,
                     float* part_o, float* part_lse, int* counters, bf16* __restrict__ out, int nq,
                     int nkv, int head_dim, int page_tokens, int64_t page_stride, int splits,
                     float scale, float eps);

extern "C" __global__ void __launch_bounds__(128)
kern_attn_decode_qkn(const bf16* __restrict__ qkv, const bf16* __restrict__ wq,
                     const bf16* __restrict__ wk, const int64_t* __restrict__ pos,
                     const bf16* __restrict__ cos_t, const bf16* __restrict__ sin_t,
                     bf16* __restrict__ kv, const int64_t* __restrict__ slots,
                     const int* __restrict__ block_table, const int* __restrict__ seq_len,
                     float* part_o, float* part_lse, int* counters, bf16* __restrict__ out, int nq,
                     int nkv, int head_dim, int page_tokens, int64_t page_stride, int splits,
                     float scale, float eps) {
    kern_pdl_launch_dependents();
    if (nq / nkv > QKN_MAX_GROUP || (head_dim != 64 && head_dim != 128)) __trap();  // kern_lab refuses these
    __shared__ __align__(16) bf16 q_s[QKN_MAX_GROUP * QKN_MAX_D];
    __shared__ float partial[4];
    const int half = head_dim / 2;
    const int group = nq / nkv;
    const int h = blockIdx.x;
    // Every block that folds a split: its query heads normed and rotated into q_s; the split that
    // holds the last token also writes that token's k and v rows of head h.
    auto q_rows = [&](int tok0, int tok1, int len) -> const bf16* {
        const int64_t p = pos[0];
        const int per = blockDim.x / half;  // heads per round: 2 (D 128) or 4 (D 64)
        const int i = threadIdx.x % half;
        const float c = to_f(cos_t[p * half + i]);
        const float s = to_f(sin_t[p * half + i]);
        for (int g0 = 0; g0 < group; g0 += per) {
            const int g = g0 + threadIdx.x / half;
            const bf16* src = qkv + (int64_t)(h * group + min(g, group - 1)) * head_dim;
            float x1 = to_f(src[i]);
            float x2 = to_f(src[i + half]);
            qkn_pair(x1, x2, i, half, eps, wq, c, s, partial);
            if (g < group) {
                q_s[g * head_dim + i] = to_bf(x1);
                q_s[g * head_dim + i + half] = to_bf(x2);
            }
        }
        if (tok0 <= len - 1 && len - 1 < tok1) {
            const bf16* k_src = qkv + (int64_t)(nq + h) * head_dim;
            const bf16* v_src = qkv + (int64_t)(nq + nkv + h) * head_dim;
            float x1 = to_f(k_src[i]);
            float x2 = to_f(k_src[i + half]);
            qkn_pair(x1, x2, i, half, eps, wk, c, s, partial);
            const int64_t slot = slots[0];
            bf16* k_dst = kv + (slot / page_tokens) * page_stride + ((slot % page_tokens) * nkv + h) * (int64_t)head_dim;
            bf16* v_dst = k_dst + (int64_t)page_tokens * nkv * head_dim;
            if ((int)threadIdx.x < half) {
                k_dst[i] = to_bf(x1);
                k_dst[i + half] = to_bf(x2);
                v_dst[i] = v_src[i];
                v_dst[i + half] = v_src[i + half];
            }
        }
        // NOTE: the fold reads q_s and the row with ordinary loads (LDS / LDG, not the read-only
        // path), so the barrier makes both visible to every warp of the block.
        __syncthreads();
        return q_s - (int64_t)h * group * head_dim;  // head h * group + g at + (h * group + g) * D
    };
    attn_decode_run(kv, block_table, seq_len, part_o, part_lse, counters, out, nq, nkv, head_dim,
                    page_tokens, page_stride, splits, scale, q_rows);
}
