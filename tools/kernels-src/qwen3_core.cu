// Qwen3 elementwise and per-row kernels: embedding, RMSNorm, q/k head norm + rotary, SiLU-and-mul,
// K/V write into the paged state, and the load program's rotary tables.
// Rounding mirrors transformers' eager Qwen3 (docs/qwen3.md "Numerics").
#include "kern_common.cuh"

// out[r, :] = table[ids[r], :]; hidden % 8 == 0. grid [t], block [256].
extern "C" __global__ void kern_embed(const int64_t* __restrict__ ids, const bf16* __restrict__ table,
                                      bf16* __restrict__ out, int hidden) {
    kern_pdl_launch_dependents();
    kern_pdl_wait();
    const int64_t row = blockIdx.x;
    const uint4* src = reinterpret_cast<const uint4*>(table + ids[row] * (int64_t)hidden);
    uint4* dst = reinterpret_cast<uint4*>(out + row * (int64_t)hidden);
    for (int c = threadIdx.x; c < hidden / 8; c += blockDim.x) dst[c] = src[c];
}

#include "row_ops.cuh"

static __device__ __forceinline__ void norm_row(const bf16* x, const bf16* w, bf16* out, int hidden,
                                                float eps, float sumsq) {
    const float r = rsqrtf(block_sum(sumsq) / (float)hidden + eps);
    const uint4* xs = reinterpret_cast<const uint4*>(x);
    const uint4* ws = reinterpret_cast<const uint4*>(w);
    uint4* os = reinterpret_cast<uint4*>(out);
    for (int c = threadIdx.x; c < hidden / 8; c += blockDim.x) os[c] = norm8(xs[c], ws[c], r);
}

// out = RMSNorm(x) * w, one row per block; hidden % 8 == 0. grid [t], block [256].
extern "C" __global__ void kern_rmsnorm(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                        bf16* __restrict__ out, int hidden, float eps) {
    kern_pdl_launch_dependents();
    kern_pdl_wait();
    const int64_t off = (int64_t)blockIdx.x * hidden;
    const uint4* xs = reinterpret_cast<const uint4*>(x + off);
    float s = 0.0f;
    for (int c = threadIdx.x; c < hidden / 8; c += blockDim.x) s += sumsq8(xs[c]);
    norm_row(x + off, w, out + off, hidden, eps, s);
}

// res = bf16(res + y); out = RMSNorm(res) * w. grid [t], block [256].
// The first ADD_NORM_KEEP chunks of each thread keep their weight (loaded before the PDL wait: no
// launch writes a weight) and their rounded sum in registers, so the norm pass loads nothing for
// them (hidden <= ADD_NORM_KEEP * 8 * blockDim, 4096 at 256 threads); later chunks are re-read.
#define ADD_NORM_KEEP 2
extern "C" __global__ void kern_add_rmsnorm(bf16* __restrict__ res, const bf16* __restrict__ y,
                                            const bf16* __restrict__ w, bf16* __restrict__ out,
                                            int hidden, float eps) {
    kern_pdl_launch_dependents();
    const int64_t off = (int64_t)blockIdx.x * hidden;
    const int chunks = hidden / 8;
    uint4* rs = reinterpret_cast<uint4*>(res + off);
    const uint4* ys = reinterpret_cast<const uint4*>(y + off);
    const uint4* ws = reinterpret_cast<const uint4*>(w);
    uint4* os = reinterpret_cast<uint4*>(out + off);
    uint4 wkeep[ADD_NORM_KEEP], skeep[ADD_NORM_KEEP];
#pragma unroll
    for (int j = 0; j < ADD_NORM_KEEP; ++j) {
        const int c = threadIdx.x + j * blockDim.x;
        wkeep[j] = c < chunks ? ws[c] : make_uint4(0u, 0u, 0u, 0u);
    }
    kern_pdl_wait();
    float s = 0.0f;
    // NOTE: chunks in the same order as one loop c = tid, tid + blockDim, ...: the same f32 sum.
#pragma unroll
    for (int j = 0; j < ADD_NORM_KEEP; ++j) {
        const int c = threadIdx.x + j * blockDim.x;
        skeep[j] = make_uint4(0u, 0u, 0u, 0u);
        if (c < chunks) {
            skeep[j] = add8(rs[c], ys[c]);
            rs[c] = skeep[j];
            s += sumsq8(skeep[j]);
        }
    }
    for (int c = threadIdx.x + ADD_NORM_KEEP * blockDim.x; c < chunks; c += blockDim.x) {
        const uint4 sum = add8(rs[c], ys[c]);
        rs[c] = sum;
        s += sumsq8(sum);
    }
    const float r = rsqrtf(block_sum(s) / (float)hidden + eps);
#pragma unroll
    for (int j = 0; j < ADD_NORM_KEEP; ++j) {
        const int c = threadIdx.x + j * blockDim.x;
        if (c < chunks) os[c] = norm8(skeep[j], wkeep[j], r);
    }
    // NOTE: each thread re-reads only the chunks it wrote itself, so no barrier is needed here.
    for (int c = threadIdx.x + ADD_NORM_KEEP * blockDim.x; c < chunks; c += blockDim.x) {
        os[c] = norm8(rs[c], ws[c], r);
    }
}

// Per-head addressing of a fused qkv row: heads [0, nq) are q, [nq, nq + nkv) are k.
struct HeadRef {
    bf16* base;
    const bf16* weight;
};

static __device__ __forceinline__ HeadRef head_ref(bf16* qkv, const bf16* wq, const bf16* wk, int nq,
                                                   int nkv, int head_dim) {
    const int64_t row_stride = (int64_t)(nq + 2 * nkv) * head_dim;
    const int head = blockIdx.y;
    HeadRef ref;
    ref.base = qkv + blockIdx.x * row_stride + (int64_t)head * head_dim;
    ref.weight = head < nq ? wq : wk;
    return ref;
}

// Thread i of a head's block owns elements i and i + head_dim / 2 (the rotary pair).
static __device__ __forceinline__ void head_norm_pair(const HeadRef& ref, int half, float eps,
                                                      float& x1, float& x2) {
    const int i = threadIdx.x;
    x1 = to_f(ref.base[i]);
    x2 = to_f(ref.base[i + half]);
    const float r = rsqrtf(block_sum(x1 * x1 + x2 * x2) / (float)(2 * half) + eps);
    x1 = bf(bf(x1 * r) * to_f(ref.weight[i]));
    x2 = bf(bf(x2 * r) * to_f(ref.weight[i + half]));
}

static __device__ __forceinline__ void rope_pair(const bf16* cos_t, const bf16* sin_t, int64_t pos,
                                                 int half, float& x1, float& x2) {
    const int i = threadIdx.x;
    const float c = to_f(cos_t[pos * half + i]);
    const float s = to_f(sin_t[pos * half + i]);
    const float o1 = bf(bf(x1 * c) - bf(x2 * s));
    const float o2 = bf(bf(x2 * c) + bf(x1 * s));
    x1 = o1;
    x2 = o2;
}

// In place on q and k heads: per-head RMSNorm, then neox rotary at pos[row].
// grid [t, nq + nkv], block [head_dim / 2] (head_dim / 2 a multiple of 32).
extern "C" __global__ void kern_qk_norm_rope(bf16* __restrict__ qkv, const bf16* __restrict__ wq,
                                             const bf16* __restrict__ wk,
                                             const int64_t* __restrict__ pos,
                                             const bf16* __restrict__ cos_t,
                                             const bf16* __restrict__ sin_t, int nq, int nkv,
                                             int head_dim, float eps) {
    kern_pdl_launch_dependents();
    kern_pdl_wait();
    const HeadRef ref = head_ref(qkv, wq, wk, nq, nkv, head_dim);
    const int half = head_dim / 2;
    float x1, x2;
    head_norm_pair(ref, half, eps, x1, x2);
    rope_pair(cos_t, sin_t, pos[blockIdx.x], half, x1, x2);
    ref.base[threadIdx.x] = to_bf(x1);
    ref.base[threadIdx.x + half] = to_bf(x2);
}

// The k row of `slot` for kv head `head` in this layer's pages (`kv`: the layer's k block of page 0).
static __device__ __forceinline__ bf16* kv_row(bf16* kv, int64_t slot, int head, int nkv, int head_dim,
                                              int page_tokens, int64_t page_stride) {
    return kv + (slot / page_tokens) * page_stride + ((slot % page_tokens) * nkv + head) * (int64_t)head_dim;
}

// kern_qk_norm_rope fused with kern_kv_write: q and k heads are normed and rotated in place in
// qkv; the rotated k head and the v head of row r are also written into the paged state at
// slots[r] (page slot / P, row slot % P; `kv` points at this layer's k block of page 0).
// grid [t, nq + 2 * nkv], block [head_dim / 2] (head_dim / 2 a multiple of 32).
extern "C" __global__ void kern_qk_norm_rope_kv(bf16* __restrict__ qkv, const bf16* __restrict__ wq,
                                                const bf16* __restrict__ wk,
                                                const int64_t* __restrict__ pos,
                                                const bf16* __restrict__ cos_t,
                                                const bf16* __restrict__ sin_t,
                                                bf16* __restrict__ kv,
                                                const int64_t* __restrict__ slots, int nq, int nkv,
                                                int head_dim, float eps, int page_tokens,
                                                int64_t page_stride) {
    kern_pdl_launch_dependents();
    kern_pdl_wait();
    const HeadRef ref = head_ref(qkv, wq, wk, nq, nkv, head_dim);
    const int half = head_dim / 2;
    const int head = blockIdx.y;
    if (head >= nq + nkv) {
        bf16* v_dst = kv_row(kv, slots[blockIdx.x], head - nq - nkv, nkv, head_dim, page_tokens,
                             page_stride) +
                      (int64_t)page_tokens * nkv * head_dim;
        v_dst[threadIdx.x] = ref.base[threadIdx.x];
        v_dst[threadIdx.x + half] = ref.base[threadIdx.x + half];
        return;
    }
    float x1, x2;
    head_norm_pair(ref, half, eps, x1, x2);
    rope_pair(cos_t, sin_t, pos[blockIdx.x], half, x1, x2);
    ref.base[threadIdx.x] = to_bf(x1);
    ref.base[threadIdx.x + half] = to_bf(x2);
    if (head >= nq) {
        bf16* k_dst = kv_row(kv, slots[blockIdx.x], head - nq, nkv, head_dim, page_tokens, page_stride);
        k_dst[threadIdx.x] = to_bf(x1);
        k_dst[threadIdx.x + half] = to_bf(x2);
    }
}

// kern_qk_norm_rope_kv for many rows: one warp per head, QKR_HEADS heads per block, the same
// bits. Lane l owns the E = head_dim / 64 adjacent elements E l .. E l + E - 1 of each half (the
// rotary pairs), so each load and store of a warp is one contiguous run. The sum of squares is
// added in the order of kern_qk_norm_rope_kv's block_sum over threads (element i, i + half):
// per element within each 16-lane half of the warp (that block's warp of 32 threads), then the E
// elements, then the two halves.
#define QKR_HEADS 8

template <int E>
struct QkrVec;
template <>
struct QkrVec<1> {
    static __device__ __forceinline__ void load(const bf16* p, float (&x)[1]) { x[0] = to_f(*p); }
    static __device__ __forceinline__ void store(bf16* p, const float (&x)[1]) { *p = to_bf(x[0]); }
};
template <>
struct QkrVec<2> {
    static __device__ __forceinline__ void load(const bf16* p, float (&x)[2]) {
        const __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(p);
        x[0] = __low2float(v);
        x[1] = __high2float(v);
    }
    static __device__ __forceinline__ void store(bf16* p, const float (&x)[2]) {
        *reinterpret_cast<uint32_t*>(p) = pack2(x[0], x[1]);
    }
};

// The head's sum of squares over its 2 * 32 * E elements (x1: first half, x2: second half).
template <int E>
static __device__ __forceinline__ float qkr_sumsq(const float (&x1)[E], const float (&x2)[E]) {
    float v[E];
#pragma unroll
    for (int e = 0; e < E; ++e) v[e] = x1[e] * x1[e] + x2[e] * x2[e];
    // NOTE: E == 1 is head_dim 64: kern_qk_norm_rope_kv's one warp, its lanes as here.
    constexpr int FIRST = E == 1 ? 16 : 8;
#pragma unroll
    for (int o = FIRST; o > 0; o >>= 1) {
#pragma unroll
        for (int e = 0; e < E; ++e) v[e] += __shfl_xor_sync(0xffffffffu, v[e], o);
    }
    if (E == 1) return v[0];
    float w = v[0];
#pragma unroll
    for (int e = 1; e < E; ++e) w += v[e];
    return w + __shfl_xor_sync(0xffffffffu, w, 16);
}

template <int E>
static __device__ __forceinline__ void qkr_head(bf16* qkv, const bf16* wq, const bf16* wk,
                                                const int64_t* pos, const bf16* cos_t,
                                                const bf16* sin_t, bf16* kv, const int64_t* slots,
                                                int head, int nq, int nkv, float eps,
                                                int page_tokens, int64_t page_stride) {
    constexpr int HALF = 32 * E;
    constexpr int D = 2 * HALF;
    const int lane = threadIdx.x & 31;
    const int64_t row = blockIdx.x;
    bf16* base = qkv + row * (int64_t)(nq + 2 * nkv) * D + (int64_t)head * D + E * lane;
    float x1[E], x2[E];
    QkrVec<E>::load(base, x1);
    QkrVec<E>::load(base + HALF, x2);
    if (head >= nq + nkv) {
        bf16* v_dst = kv_row(kv, slots[row], head - nq - nkv, nkv, D, page_tokens, page_stride) +
                      (int64_t)page_tokens * nkv * D + E * lane;
        QkrVec<E>::store(v_dst, x1);
        QkrVec<E>::store(v_dst + HALF, x2);
        return;
    }
    const bf16* w = (head < nq ? wq : wk) + E * lane;
    float w1[E], w2[E], c[E], s[E];
    QkrVec<E>::load(w, w1);
    QkrVec<E>::load(w + HALF, w2);
    const int64_t p = pos[row];
    QkrVec<E>::load(cos_t + p * HALF + E * lane, c);
    QkrVec<E>::load(sin_t + p * HALF + E * lane, s);
    const float r = rsqrtf(qkr_sumsq<E>(x1, x2) / (float)D + eps);
#pragma unroll
    for (int e = 0; e < E; ++e) {
        const float a = bf(bf(x1[e] * r) * w1[e]);
        const float b = bf(bf(x2[e] * r) * w2[e]);
        x1[e] = bf(bf(a * c[e]) - bf(b * s[e]));
        x2[e] = bf(bf(b * c[e]) + bf(a * s[e]));
    }
    QkrVec<E>::store(base, x1);
    QkrVec<E>::store(base + HALF, x2);
    if (head >= nq) {
        bf16* k_dst = kv_row(kv, slots[row], head - nq, nkv, D, page_tokens, page_stride) + E * lane;
        QkrVec<E>::store(k_dst, x1);
        QkrVec<E>::store(k_dst + HALF, x2);
    }
}

// kern_qk_norm_rope_kv's result (the same parameters) for a chunk of rows: warp w of block (x, y)
// does head y * QKR_HEADS + w of row x. head_dim in {64, 128}.
// grid [t, ceil_div(nq + 2 * nkv, QKR_HEADS)], block [32 * QKR_HEADS].
extern "C" __global__ void __launch_bounds__(32 * QKR_HEADS)
kern_qk_norm_rope_kv_rows(bf16* __restrict__ qkv, const bf16* __restrict__ wq,
                          const bf16* __restrict__ wk, const int64_t* __restrict__ pos,
                          const bf16* __restrict__ cos_t, const bf16* __restrict__ sin_t,
                          bf16* __restrict__ kv, const int64_t* __restrict__ slots, int nq, int nkv,
                          int head_dim, float eps, int page_tokens, int64_t page_stride) {
    kern_pdl_launch_dependents();
    kern_pdl_wait();
    const int head = blockIdx.y * QKR_HEADS + (threadIdx.x >> 5);
    if (head >= nq + 2 * nkv) return;
    if (head_dim == 64) {
        qkr_head<1>(qkv, wq, wk, pos, cos_t, sin_t, kv, slots, head, nq, nkv, eps, page_tokens,
                    page_stride);
    } else {
        qkr_head<2>(qkv, wq, wk, pos, cos_t, sin_t, kv, slots, head, nq, nkv, eps, page_tokens,
                    page_stride);
    }
}

// In place per-head RMSNorm of the q and k heads. grid [t, nq + nkv], block [head_dim / 2].
extern "C" __global__ void kern_head_rmsnorm(bf16* __restrict__ qkv, const bf16* __restrict__ wq,
                                             const bf16* __restrict__ wk, int nq, int nkv,
                                             int head_dim, float eps) {
    kern_pdl_launch_dependents();
    kern_pdl_wait();
    const HeadRef ref = head_ref(qkv, wq, wk, nq, nkv, head_dim);
    const int half = head_dim / 2;
    float x1, x2;
    head_norm_pair(ref, half, eps, x1, x2);
    ref.base[threadIdx.x] = to_bf(x1);
    ref.base[threadIdx.x + half] = to_bf(x2);
}

// In place neox rotary of the q and k heads. grid [t, nq + nkv], block [head_dim / 2].
extern "C" __global__ void kern_rope(bf16* __restrict__ qkv, const int64_t* __restrict__ pos,
                                     const bf16* __restrict__ cos_t, const bf16* __restrict__ sin_t,
                                     int nq, int nkv, int head_dim) {
    kern_pdl_launch_dependents();
    kern_pdl_wait();
    const HeadRef ref = head_ref(qkv, qkv, qkv, nq, nkv, head_dim);
    const int half = head_dim / 2;
    float x1 = to_f(ref.base[threadIdx.x]);
    float x2 = to_f(ref.base[threadIdx.x + half]);
    rope_pair(cos_t, sin_t, pos[blockIdx.x], half, x1, x2);
    ref.base[threadIdx.x] = to_bf(x1);
    ref.base[threadIdx.x + half] = to_bf(x2);
}

// out[r, j] = bf16(bf16(silu(gu[r, j])) * gu[r, inter + j]); inter % 8 == 0.
// grid [t, ceil_div(inter, 1024)], block [128].
extern "C" __global__ void kern_silu_mul(const bf16* __restrict__ gu, bf16* __restrict__ out,
                                         int inter) {
    kern_pdl_launch_dependents();
    kern_pdl_wait();
    const int64_t row = blockIdx.x;
    const int c = blockIdx.y * 128 + threadIdx.x;
    if (c >= inter / 8) return;
    const uint4* g4 = reinterpret_cast<const uint4*>(gu + row * 2 * (int64_t)inter);
    const uint4* u4 = reinterpret_cast<const uint4*>(gu + row * 2 * (int64_t)inter + inter);
    float g[8], u[8], o[8];
    unpack8(g4[c], g);
    unpack8(u4[c], u);
#pragma unroll
    for (int i = 0; i < 8; ++i) o[i] = bf(g[i] / (1.0f + expf(-g[i]))) * u[i];
    reinterpret_cast<uint4*>(out + row * (int64_t)inter)[c] = pack8(o);
}

// Copies row r's k and v heads into the paged state at slots[r] (page slot / P, row slot % P).
// `kv` points at this layer's k block of page 0. grid [t, nkv], block [32].
extern "C" __global__ void kern_kv_write(const bf16* __restrict__ qkv, bf16* __restrict__ kv,
                                         const int64_t* __restrict__ slots, int nq, int nkv,
                                         int head_dim, int page_tokens, int64_t page_stride) {
    kern_pdl_launch_dependents();
    kern_pdl_wait();
    const int64_t row = blockIdx.x;
    const int head = blockIdx.y;
    const int64_t slot = slots[row];
    const int64_t row_stride = (int64_t)(nq + 2 * nkv) * head_dim;
    const bf16* k_src = qkv + row * row_stride + (int64_t)(nq + head) * head_dim;
    const bf16* v_src = k_src + (int64_t)nkv * head_dim;
    bf16* k_dst = kv + (slot / page_tokens) * page_stride +
                  ((slot % page_tokens) * nkv + head) * (int64_t)head_dim;
    bf16* v_dst = k_dst + (int64_t)page_tokens * nkv * head_dim;
    const int chunks = head_dim / 8;
    for (int c = threadIdx.x; c < 2 * chunks; c += blockDim.x) {
        const bool is_v = c >= chunks;
        const int cc = is_v ? c - chunks : c;
        const uint4* src = reinterpret_cast<const uint4*>(is_v ? v_src : k_src);
        uint4* dst = reinterpret_cast<uint4*>(is_v ? v_dst : k_dst);
        dst[cc] = src[cc];
    }
}

// cos/sin[p, i] = bf16(cos/sin(f32(p) * inv_freq[i])), inv_freq[i] = 1 / theta^(2i / D) in f32 as
// transformers computes it (the power correctly rounded). grid [maxpos], block [min(half_dim, 1024)].
extern "C" __global__ void kern_rope_table(bf16* __restrict__ cos_t, bf16* __restrict__ sin_t,
                                           int maxpos, int half_dim, float theta) {
    kern_pdl_launch_dependents();
    kern_pdl_wait();
    const int p = blockIdx.x;
    if (p >= maxpos) return;
    for (int i = threadIdx.x; i < half_dim; i += blockDim.x) {
        const float expo = (float)(2 * i) / (float)(2 * half_dim);
        const float power = (float)pow((double)theta, (double)expo);
        const float inv_freq = 1.0f / power;
        const float angle = (float)p * inv_freq;
        cos_t[(int64_t)p * half_dim + i] = to_bf(cosf(angle));
        sin_t[(int64_t)p * half_dim + i] = to_bf(sinf(angle));
    }
}
