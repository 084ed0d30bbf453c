// Qwen3 at reference precision (`kern-qwen3 --precision f32`): bf16 weights as the checkpoint holds
// them, every activation, the residual stream, the logits and the paged KV state in float32, f32
// accumulation everywhere; the arithmetic of transformers' float32 Qwen3 (docs/qwen3.md "Reference
// precision (f32)"). A correctness mode: plain kernels, no PDL, no fusion options.
// Page layout as the bf16 path's ([page][layer][k|v][P][NKV][D]) with 4-byte elements.
#include "kern_common.cuh"

#define F32_ROW_THREADS 256

// out[r, :] = f32(table[ids[r], :]). grid [t], block [256].
extern "C" __global__ void __launch_bounds__(F32_ROW_THREADS)
kern_f32_embed(const int64_t* __restrict__ ids, const bf16* __restrict__ table, float* __restrict__ out,
               int hidden) {
    const int64_t row = blockIdx.x;
    const bf16* src = table + ids[row] * (int64_t)hidden;
    float* dst = out + row * (int64_t)hidden;
    for (int c = threadIdx.x; c < hidden; c += blockDim.x) dst[c] = to_f(src[c]);
}

// out = x * rsqrt(sum(x^2) / hidden + eps) * w over one row x (f32, w bf16).
static __device__ __forceinline__ void f32_norm_row(const float* x, const bf16* w, float* out, int hidden,
                                                    float eps, float sumsq) {
    const float r = rsqrtf(block_sum(sumsq) / (float)hidden + eps);
    for (int c = threadIdx.x; c < hidden; c += blockDim.x) out[c] = (x[c] * r) * to_f(w[c]);
}

// out = RMSNorm(x) * w, one row per block. grid [t], block [256].
extern "C" __global__ void __launch_bounds__(F32_ROW_THREADS)
kern_f32_rmsnorm(const float* __restrict__ x, const bf16* __restrict__ w, float* __restrict__ out, int hidden,
                 float eps) {
    const int64_t off = (int64_t)blockIdx.x * hidden;
    float s = 0.0f;
    for (int c = threadIdx.x; c < hidden; c += blockDim.x) s += x[off + c] * x[off + c];
    f32_norm_row(x + off, w, out + off, hidden, eps, s);
}

// res = res + y; out = RMSNorm(res) * w. grid [t], block [256].
// NOTE: each thread re-reads only the elements of res it wrote itself: no barrier before the norm.
extern "C" __global__ void __launch_bounds__(F32_ROW_THREADS)
kern_f32_add_rmsnorm(float* __restrict__ res, const float* __restrict__ y, const bf16* __restrict__ w,
                     float* __restrict__ out, int hidden, float eps) {
    const int64_t off = (int64_t)blockIdx.x * hidden;
    float s = 0.0f;
    for (int c = threadIdx.x; c < hidden; c += blockDim.x) {
        const float v = res[off + c] + y[off + c];
        res[off + c] = v;
        s += v * v;
    }
    f32_norm_row(res + off, w, out + off, hidden, eps, s);
}

// The k row of `slot` for kv head `head` in this layer's pages (`kv`: the layer's k block of page 0).
static __device__ __forceinline__ float* f32_kv_row(float* kv, int64_t slot, int head, int nkv, int head_dim,
                                                    int page_tokens, int64_t page_stride) {
    return kv + (slot / page_tokens) * page_stride + ((slot % page_tokens) * nkv + head) * (int64_t)head_dim;
}

// In place on the q and k heads of qkv: per-head RMSNorm (weights wq / wk), then neox rotary at
// pos[r] with the f32 tables; the k blocks also write the rotated head into the page at slots[r],
// the v blocks copy their head there. grid [t, nq + 2 * nkv], block [head_dim / 2] (a multiple of 32).
extern "C" __global__ void __launch_bounds__(64)
kern_f32_qk_norm_rope_kv(float* __restrict__ qkv, const bf16* __restrict__ wq, const bf16* __restrict__ wk,
                         const int64_t* __restrict__ pos, const float* __restrict__ cos_t,
                         const float* __restrict__ sin_t, float* __restrict__ kv,
                         const int64_t* __restrict__ slots, int nq, int nkv, int head_dim, float eps,
                         int page_tokens, int64_t page_stride) {
    const int64_t row = blockIdx.x;
    const int head = blockIdx.y;
    const int half = head_dim / 2;
    const int i = threadIdx.x;
    float* base = qkv + row * (int64_t)(nq + 2 * nkv) * head_dim + (int64_t)head * head_dim;
    if (head >= nq + nkv) {
        float* v_dst = f32_kv_row(kv, slots[row], head - nq - nkv, nkv, head_dim, page_tokens, page_stride) +
                       (int64_t)page_tokens * nkv * head_dim;
        v_dst[i] = base[i];
        v_dst[i + half] = base[i + half];
        return;
    }
    const bf16* w = head < nq ? wq : wk;
    float x1 = base[i];
    float x2 = base[i + half];
    const float r = rsqrtf(block_sum(x1 * x1 + x2 * x2) / (float)head_dim + eps);
    x1 = (x1 * r) * to_f(w[i]);
    x2 = (x2 * r) * to_f(w[i + half]);
    const int64_t at = pos[row] * half + i;
    const float c = cos_t[at];
    const float s = sin_t[at];
    const float o1 = x1 * c - x2 * s;
    const float o2 = x2 * c + x1 * s;
    base[i] = o1;
    base[i + half] = o2;
    if (head >= nq) {
        float* k_dst = f32_kv_row(kv, slots[row], head - nq, nkv, head_dim, page_tokens, page_stride);
        k_dst[i] = o1;
        k_dst[i + half] = o2;
    }
}

#define F32_ATT_WARPS 8
#define F32_ATT_MAX_DIM 128

// out[i, h * D:(h + 1) * D] = softmax(q_i . K^T * scale) V over the keys 0 .. seq_len - rows + i of
// the pages (the call's `rows` rows are the last of the sequence; their own k / v are already in
// the pages), GQA: query head h reads kv head h / (nq / nkv). Decode is rows = 1. Each warp runs an
// online softmax over every 8th key; the block combines the warps' (max, sum, output) at the end.
// head_dim a multiple of 32, at most 128. grid [rows, nq], block [256].
extern "C" __global__ void __launch_bounds__(F32_ATT_WARPS * 32)
kern_f32_attn(const float* __restrict__ qkv, const float* __restrict__ kv, const int* __restrict__ block_table,
              const int* __restrict__ seq_len, float* __restrict__ out, int rows, int nq, int nkv, int head_dim,
              int page_tokens, int64_t page_stride, float scale) {
    constexpr int PER = F32_ATT_MAX_DIM / 32;
    __shared__ float wmax[F32_ATT_WARPS], wsum[F32_ATT_WARPS], wout[F32_ATT_WARPS][F32_ATT_MAX_DIM];
    const int row = blockIdx.x;
    const int head = blockIdx.y;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int per = head_dim / 32;
    const float* q = qkv + (int64_t)row * (nq + 2 * nkv) * head_dim + (int64_t)head * head_dim;
    const int64_t head_off = (int64_t)(head / (nq / nkv)) * head_dim;
    const int64_t v_off = (int64_t)page_tokens * nkv * head_dim;
    float qv[PER], acc[PER];
#pragma unroll
    for (int e = 0; e < PER; ++e) {
        qv[e] = e < per ? q[lane + 32 * e] : 0.0f;
        acc[e] = 0.0f;
    }
    const int keys = seq_len[0] - rows + row + 1;
    float m = KERN_NEG_INF, l = 0.0f;
    for (int j = warp; j < keys; j += F32_ATT_WARPS) {
        const float* kp = kv + (int64_t)block_table[j / page_tokens] * page_stride +
                          (int64_t)(j % page_tokens) * nkv * head_dim + head_off;
        float s = 0.0f;
#pragma unroll
        for (int e = 0; e < PER; ++e) {
            if (e < per) s += qv[e] * kp[lane + 32 * e];
        }
        s = warp_sum(s) * scale;
        const float m_new = fmaxf(m, s);
        const float corr = expf(m - m_new);
        const float p = expf(s - m_new);
        l = l * corr + p;
#pragma unroll
        for (int e = 0; e < PER; ++e) {
            if (e < per) acc[e] = acc[e] * corr + p * kp[v_off + lane + 32 * e];
        }
        m = m_new;
    }
    if (lane == 0) {
        wmax[warp] = m;
        wsum[warp] = l;
    }
#pragma unroll
    for (int e = 0; e < PER; ++e) {
        if (e < per) wout[warp][lane + 32 * e] = acc[e];
    }
    __syncthreads();
    const int d = threadIdx.x;
    if (d >= head_dim) return;
    float top = KERN_NEG_INF;
    for (int w = 0; w < F32_ATT_WARPS; ++w) top = fmaxf(top, wmax[w]);
    float total = 0.0f, o = 0.0f;
    // NOTE: a warp that saw no key has max -inf, sum 0: its weight expf(-inf) is 0.
    for (int w = 0; w < F32_ATT_WARPS; ++w) {
        const float f = expf(wmax[w] - top);
        total += wsum[w] * f;
        o += wout[w][d] * f;
    }
    out[(int64_t)row * nq * head_dim + (int64_t)head * head_dim + d] = o / total;
}

#define F32_GEMM_BM 64
#define F32_GEMM_BN 64
#define F32_GEMM_BK 32

// y[m, n] = x[m, k] . w[n, k]^T: x and y f32, w bf16, f32 accumulation. A 64 x 64 tile of y per
// block, 16 x 16 threads of 4 x 4 outputs each (rows ty + 16 i, columns tx + 16 j); k a multiple of
// 8, x and w 16-byte aligned. Any m (prefill chunks). grid [ceil_div(n, 64), ceil_div(m, 64)], block [256].
extern "C" __global__ void __launch_bounds__(256)
kern_f32_gemm(const float* __restrict__ x, const bf16* __restrict__ w, float* __restrict__ y, int m, int n,
              int k) {
    __shared__ float xs[F32_GEMM_BK][F32_GEMM_BM + 4];
    __shared__ float ws[F32_GEMM_BK][F32_GEMM_BN + 4];
    const int row0 = blockIdx.y * F32_GEMM_BM;
    const int col0 = blockIdx.x * F32_GEMM_BN;
    const int tx = threadIdx.x % 16;
    const int ty = threadIdx.x / 16;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < k; k0 += F32_GEMM_BK) {
        // x: 64 rows x 32 k as 512 float4, two per thread, stored transposed (xs[k][row]).
        for (int i = threadIdx.x; i < F32_GEMM_BM * F32_GEMM_BK / 4; i += blockDim.x) {
            const int r = i / (F32_GEMM_BK / 4);
            const int kk = (i % (F32_GEMM_BK / 4)) * 4;
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (row0 + r < m && k0 + kk < k) v = *reinterpret_cast<const float4*>(x + (int64_t)(row0 + r) * k + k0 + kk);
            xs[kk][r] = v.x;
            xs[kk + 1][r] = v.y;
            xs[kk + 2][r] = v.z;
            xs[kk + 3][r] = v.w;
        }
        // w: 64 columns x 32 k as 256 pieces of 8 bf16, one per thread (ws[k][column]).
        {
            const int c = threadIdx.x / (F32_GEMM_BK / 8);
            const int kk = (threadIdx.x % (F32_GEMM_BK / 8)) * 8;
            float v[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
            if (col0 + c < n && k0 + kk < k) unpack8(*reinterpret_cast<const uint4*>(w + (int64_t)(col0 + c) * k + k0 + kk), v);
#pragma unroll
            for (int e = 0; e < 8; ++e) ws[kk + e][c] = v[e];
        }
        __syncthreads();
#pragma unroll 8
        for (int kk = 0; kk < F32_GEMM_BK; ++kk) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                a[i] = xs[kk][ty + 16 * i];
                b[i] = ws[kk][tx + 16 * i];
            }
#pragma unroll
            for (int i = 0; i < 4; ++i) {
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int r = row0 + ty + 16 * i;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int c = col0 + tx + 16 * j;
            if (r < m && c < n) y[(int64_t)r * n + c] = acc[i][j];
        }
    }
}

#define F32_GEMV_WARPS 8

// y[m, n] = x[m, k] . w[n, k]^T as kern_f32_gemm, for the few rows of a decode step: one warp per
// output column, 8 columns per block, the rows one after another (w re-read from cache). k a
// multiple of 8, x and w 16-byte aligned. grid [ceil_div(n, 8)], block [256].
extern "C" __global__ void __launch_bounds__(F32_GEMV_WARPS * 32)
kern_f32_gemv(const float* __restrict__ x, const bf16* __restrict__ w, float* __restrict__ y, int m, int n,
              int k) {
    const int lane = threadIdx.x & 31;
    const int col = blockIdx.x * F32_GEMV_WARPS + (threadIdx.x >> 5);
    if (col >= n) return;
    const uint4* wr = reinterpret_cast<const uint4*>(w + (int64_t)col * k);
    const int pieces = k / 8;
    for (int r = 0; r < m; ++r) {
        const float4* xr = reinterpret_cast<const float4*>(x + (int64_t)r * k);
        float s = 0.0f;
#pragma unroll 4
        for (int c = lane; c < pieces; c += 32) {
            float wv[8];
            unpack8(wr[c], wv);
            const float4 a = xr[2 * c];
            const float4 b = xr[2 * c + 1];
            s += a.x * wv[0] + a.y * wv[1] + a.z * wv[2] + a.w * wv[3] + b.x * wv[4] + b.y * wv[5] +
                 b.z * wv[6] + b.w * wv[7];
        }
        s = warp_sum(s);
        if (lane == 0) y[(int64_t)r * n + col] = s;
    }
}

// out[r, j] = silu(gu[r, j]) * gu[r, inter + j], silu(g) = g / (1 + exp(-g)).
// grid [t, ceil_div(inter, 1024)], block [256] (4 columns per thread).
extern "C" __global__ void __launch_bounds__(256)
kern_f32_silu_mul(const float* __restrict__ gu, float* __restrict__ out, int inter) {
    const int64_t row = blockIdx.x;
    const float* g = gu + row * 2 * (int64_t)inter;
    const float* u = g + inter;
    for (int e = 0; e < 4; ++e) {
        const int c = blockIdx.y * 1024 + e * 256 + threadIdx.x;
        if (c < inter) out[row * (int64_t)inter + c] = g[c] / (1.0f + expf(-g[c])) * u[c];
    }
}

#define F32_ARGMAX_THREADS 256
#define F32_ARGMAX_NONE 0x7fffffff

// (value, index) with index F32_ARGMAX_NONE for "nothing seen"; ties go to the lower index
// (sampling.cu's contract: kern_argmax_final reduces these partials).
struct F32Best {
    float val;
    int idx;
};

static __device__ __forceinline__ F32Best f32_better(F32Best a, F32Best b) {
    if (b.idx == F32_ARGMAX_NONE) return a;
    if (a.idx == F32_ARGMAX_NONE) return b;
    if (a.val > b.val || (a.val == b.val && a.idx < b.idx)) return a;
    return b;
}

static __device__ __forceinline__ F32Best f32_warp_best(F32Best best) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        F32Best other;
        other.val = __shfl_xor_sync(0xffffffffu, best.val, o);
        other.idx = __shfl_xor_sync(0xffffffffu, best.idx, o);
        best = f32_better(best, other);
    }
    return best;
}

// Block b scans its contiguous share ceil(n / parts) of the f32 logits and writes its best value
// and index; an empty share writes (-inf, INT32_MAX). The second stage is sampling.cu's
// kern_argmax_final. grid [parts] (64), block [256].
extern "C" __global__ void __launch_bounds__(F32_ARGMAX_THREADS)
kern_f32_argmax_partial(const float* __restrict__ logits, float* __restrict__ pval, int* __restrict__ pidx,
                        int n) {
    __shared__ float vals[F32_ARGMAX_THREADS / 32];
    __shared__ int idxs[F32_ARGMAX_THREADS / 32];
    const int per = (n + gridDim.x - 1) / gridDim.x;
    const int lo = min((int)blockIdx.x * per, n);
    const int hi = min(lo + per, n);
    F32Best best{KERN_NEG_INF, F32_ARGMAX_NONE};
    for (int i = lo + threadIdx.x; i < hi; i += F32_ARGMAX_THREADS) best = f32_better(best, F32Best{logits[i], i});
    best = f32_warp_best(best);
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    if (lane == 0) {
        vals[warp] = best.val;
        idxs[warp] = best.idx;
    }
    __syncthreads();
    if (warp != 0) return;
    best.val = lane < F32_ARGMAX_THREADS / 32 ? vals[lane] : 0.0f;
    best.idx = lane < F32_ARGMAX_THREADS / 32 ? idxs[lane] : F32_ARGMAX_NONE;
    best = f32_warp_best(best);
    if (lane == 0) {
        pval[blockIdx.x] = best.val;
        pidx[blockIdx.x] = best.idx;
    }
}

// cos/sin[p, i] = cos/sin(f32(p) * inv_freq[i]) in f32, inv_freq[i] = 1 / theta^(2i / D) in f32 as
// transformers computes it (the power correctly rounded). grid [maxpos], block [min(half_dim, 1024)].
extern "C" __global__ void __launch_bounds__(1024)
kern_f32_rope_table(float* __restrict__ cos_t, float* __restrict__ sin_t, int maxpos, int half_dim, float theta) {
    const int p = blockIdx.x;
    if (p >= maxpos) return;
    for (int i = threadIdx.x; i < half_dim; i += blockDim.x) {
        const float expo = (float)(2 * i) / (float)(2 * half_dim);
        const float inv_freq = 1.0f / (float)pow((double)theta, (double)expo);
        const float angle = (float)p * inv_freq;
        cos_t[(int64_t)p * half_dim + i] = cosf(angle);
        sin_t[(int64_t)p * half_dim + i] = sinf(angle);
    }
}
