// Per-row sampling for the batched decode step over rows: greedy, temperature, top-k, top-p, a
// draw keyed by (seed, position), logprobs; and the per-row feed of the step's next inputs.
#include "kern_common.cuh"

#define ARGMAX_NONE 0x7fffffff

// (value, index) with index ARGMAX_NONE for "nothing seen"; ties go to the lower index.
struct ArgBest {
    float val;
    int idx;
};

static __device__ __forceinline__ ArgBest arg_better(ArgBest a, ArgBest b) {
    if (b.idx == ARGMAX_NONE) return a;
    if (a.idx == ARGMAX_NONE) return b;
    if (a.val > b.val || (a.val == b.val && a.idx < b.idx)) return a;
    return b;
}

#define SAMPLE_THREADS 1024
#define SAMPLE_PARAMS 4  // per row: temperature, top_p, top_k, logprobs (f32; integers exact)

// Philox4x32-10 (Salmon et al., SC'11): four 32-bit words from a 128-bit counter and a 64-bit key.
static __device__ __forceinline__ uint4 philox4x32(uint4 c, uint2 k) {
#pragma unroll
    for (int r = 0; r < 10; ++r) {
        const uint32_t hi0 = __umulhi(0xD2511F53u, c.x), lo0 = 0xD2511F53u * c.x;
        const uint32_t hi1 = __umulhi(0xCD9E8D57u, c.z), lo1 = 0xCD9E8D57u * c.z;
        c = make_uint4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
        k.x += 0x9E3779B9u;
        k.y += 0xBB67AE85u;
    }
    return c;
}

// Orders floats as unsigned integers (a < b <=> key(a) < key(b) for non-NaN floats).
static __device__ __forceinline__ uint32_t float_key(float f) {
    const uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Block-wide reductions for any blockDim.x that is a multiple of 32 (at most 1024); every thread
// gets the result. Fixed order for a fixed blockDim, so the same bits every launch.
static __device__ __forceinline__ float rows_block_sum(float v) {
    __shared__ float part[32];
    v = warp_sum(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
    __syncthreads();
    v = (threadIdx.x & 31) < (blockDim.x >> 5) ? part[threadIdx.x & 31] : 0.0f;
    return warp_sum(v);
}

static __device__ __forceinline__ ArgBest rows_warp_best(ArgBest b) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        ArgBest other;
        other.val = __shfl_xor_sync(0xffffffffu, b.val, o);
        other.idx = __shfl_xor_sync(0xffffffffu, b.idx, o);
        b = arg_better(b, other);
    }
    return b;
}

static __device__ __forceinline__ ArgBest rows_block_best(ArgBest b) {
    __shared__ float vals[32];
    __shared__ int idxs[32];
    b = rows_warp_best(b);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) {
        vals[threadIdx.x >> 5] = b.val;
        idxs[threadIdx.x >> 5] = b.idx;
    }
    __syncthreads();
    const bool have = (threadIdx.x & 31) < (blockDim.x >> 5);
    b.val = have ? vals[threadIdx.x & 31] : 0.0f;
    b.idx = have ? idxs[threadIdx.x & 31] : ARGMAX_NONE;
    return rows_warp_best(b);
}

// (max, sum of exp(x - max)) pairs, merged.
static __device__ __forceinline__ float2 lse_merge(float2 a, float2 b) {
    if (a.x == KERN_NEG_INF) return b;
    if (b.x == KERN_NEG_INF) return a;
    const float m = fmaxf(a.x, b.x);
    return make_float2(m, a.y * expf(a.x - m) + b.y * expf(b.x - m));
}

static __device__ __forceinline__ float rows_block_logsumexp(float2 p) {
    __shared__ float2 part[32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float2 other;
        other.x = __shfl_xor_sync(0xffffffffu, p.x, o);
        other.y = __shfl_xor_sync(0xffffffffu, p.y, o);
        p = lse_merge(p, other);
    }
    __syncthreads();
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = p;
    __syncthreads();
    p = (threadIdx.x & 31) < (blockDim.x >> 5) ? part[threadIdx.x & 31] : make_float2(KERN_NEG_INF, 0.0f);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float2 other;
        other.x = __shfl_xor_sync(0xffffffffu, p.x, o);
        other.y = __shfl_xor_sync(0xffffffffu, p.y, o);
        p = lse_merge(p, other);
    }
    return p.x + logf(p.y);
}

// z = x * inv_t, rounded once (no contraction with a later add).
static __device__ __forceinline__ float scaled(const bf16* x, int i, float inv_t) {
    return __fmul_rn(to_f(x[i]), inv_t);
}

// How many z have key >= t.
static __device__ __forceinline__ int count_at_least(const bf16* x, int n, float inv_t, uint32_t t) {
    float c = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) c += float_key(scaled(x, i, inv_t)) >= t ? 1.0f : 0.0f;
    return (int)rows_block_sum(c);
}

// sum of exp(z - zmax) over the z with key >= t.
static __device__ __forceinline__ float mass_at_least(const bf16* x, int n, float inv_t, float zmax, uint32_t t) {
    float m = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float z = scaled(x, i, inv_t);
        if (float_key(z) >= t) m += expf(__fsub_rn(z, zmax));
    }
    return rows_block_sum(m);
}

// The largest key t in [lo, hi) with keep(t) (keep(lo) holds, keep(hi) does not; keep monotone).
template <typename Keep>
static __device__ __forceinline__ uint32_t largest_key(uint32_t lo, uint32_t hi, Keep&& keep) {
    while (hi - lo > 1) {
        const uint32_t mid = lo + (hi - lo) / 2;
        if (keep(mid)) lo = mid; else hi = mid;
    }
    return lo;
}

// One row's token: greedy (temperature <= 0) is the argmax of x (ties to the lower index); else
// z = x * (1 / temperature) (f32), kept: key(z) >= the k-th largest key (top_k > 0; ties kept),
// then the largest key threshold whose kept mass sum exp(z - zmax) is >= top_p times the mass
// kept so far (top_p < 1; ties kept), and the token is the kept argmax of (z - zmax) + g_i with
// g_i = -log(-log(u_i)), u_i = ((w >> 8) + 0.5) / 2^24 for the word i % 4 of
// philox4x32((i / 4, pos, pos >> 32, 0), (seed, seed >> 32)): a Gumbel-max draw from
// softmax(z) over the kept tokens, keyed by (seed, position) only.
static __device__ int sample_row(const bf16* x, int n, const float* prm, int64_t seed, int64_t pos,
                                 ArgBest greedy) {
    const float temp = prm[0];
    if (!(temp > 0.0f)) return greedy.idx;
    const float inv_t = 1.0f / temp;
    const float zmax = __fmul_rn(greedy.val, inv_t);
    const int top_k = (int)prm[2];
    const float top_p = prm[1];
    const uint32_t top = float_key(zmax) + 1;
    uint32_t thr = 0;
    if (top_k > 0 && top_k < n)
        thr = largest_key(0u, top, [&](uint32_t t) { return count_at_least(x, n, inv_t, t) >= top_k; });
    if (top_p < 1.0f) {
        const float target = top_p * mass_at_least(x, n, inv_t, zmax, thr);
        thr = largest_key(thr, top, [&](uint32_t t) { return mass_at_least(x, n, inv_t, zmax, t) >= target; });
    }
    const uint2 key = make_uint2((uint32_t)seed, (uint32_t)((uint64_t)seed >> 32));
    ArgBest best{KERN_NEG_INF, ARGMAX_NONE};
    for (int g = threadIdx.x; 4 * g < n; g += blockDim.x) {
        const uint4 w = philox4x32(make_uint4(g, (uint32_t)pos, (uint32_t)((uint64_t)pos >> 32), 0u), key);
        const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int i = 4 * g + e;
            if (i >= n) break;
            const float z = scaled(x, i, inv_t);
            if (float_key(z) < thr) continue;
            const float u = ((float)(ws[e] >> 8) + 0.5f) * (1.0f / 16777216.0f);
            const float gumbel = -logf(-logf(u));
            best = arg_better(best, ArgBest{__fadd_rn(__fsub_rn(z, zmax), gumbel), i});
        }
    }
    return rows_block_best(best).idx;
}

// Row r = blockIdx.x of `logits` [rows, n] (bf16): tokens[r] = its token (sample_row with the row's
// params[r, :] = (temperature, top_p, top_k, logprobs), seeds[r] and positions[r]); when
// logprobs >= 0, lp[r, 0] = x[token] - logsumexp(x) (the model's distribution: no temperature, no
// masks); when logprobs = N > 0 (N <= top_n), lp[r, 1 + j] and top[r, j] for j < N are the N
// largest x (ties to the lower index) as x - logsumexp(x) and ids. lp is [rows, 1 + top_n], top
// [rows, top_n]; entries not asked for are left as they are. grid [rows], block [1024].
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
kern_sample_rows(const bf16* __restrict__ logits, const float* __restrict__ params,
                 const int64_t* __restrict__ seeds, const int64_t* __restrict__ positions,
                 int64_t* __restrict__ tokens, float* __restrict__ lp, int64_t* __restrict__ top,
                 int n, int top_n) {
    kern_pdl_launch_dependents();
    kern_pdl_wait();
    const int r = blockIdx.x;
    const bf16* x = logits + (int64_t)r * n;
    const float* prm = params + r * SAMPLE_PARAMS;
    ArgBest best{KERN_NEG_INF, ARGMAX_NONE};
    float2 acc = make_float2(KERN_NEG_INF, 0.0f);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = to_f(x[i]);
        best = arg_better(best, ArgBest{v, i});
        acc = lse_merge(acc, make_float2(v, 1.0f));
    }
    best = rows_block_best(best);
    const float lse = rows_block_logsumexp(acc);
    const int token = sample_row(x, n, prm, seeds[r], positions[r], best);
    const int want = (int)prm[3];
    float* row_lp = lp + (int64_t)r * (1 + top_n);
    if (threadIdx.x == 0) {
        tokens[r] = token;
        if (want >= 0) row_lp[0] = to_f(x[token]) - lse;
    }
    ArgBest prev = best;
    for (int j = 0; j < min(want, top_n); ++j) {
        if (j > 0) {
            ArgBest next{KERN_NEG_INF, ARGMAX_NONE};
            for (int i = threadIdx.x; i < n; i += blockDim.x) {
                const float v = to_f(x[i]);
                if (v < prev.val || (v == prev.val && i > prev.idx)) next = arg_better(next, ArgBest{v, i});
            }
            prev = rows_block_best(next);
        }
        if (threadIdx.x == 0) {
            row_lp[1 + j] = prev.val - lse;
            top[(int64_t)r * top_n + j] = prev.idx;
        }
    }
}

// Feeds the batched step's next inputs, for r < rows: ids[r] = next[r], pos[r] += 1,
// slot[r] = table[r, pos / P] * P + pos % P (table rows of `stride` entries), lens[r] += 1.
// grid [1], block [256] (any grid / block covers rows).
extern "C" __global__ void kern_rows_advance(const int64_t* __restrict__ next, int64_t* __restrict__ ids,
                                             int64_t* __restrict__ pos, int64_t* __restrict__ slots,
                                             int* __restrict__ lens, const int* __restrict__ table,
                                             int stride, int page_tokens, int rows) {
    kern_pdl_launch_dependents();
    kern_pdl_wait();
    for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += gridDim.x * blockDim.x) {
        const int64_t p = pos[r] + 1;
        ids[r] = next[r];
        pos[r] = p;
        slots[r] = (int64_t)table[(int64_t)r * stride + p / page_tokens] * page_tokens + p % page_tokens;
        lens[r] = lens[r] + 1;
    }
}

// Seeds the rows the host staged: for r < rows with valid[r] != 0, the carries ids / pos / slots /
// lens [r] = the staged inputs [r]; other rows keep what the device fed them.
// grid [1], block [256] (any grid / block covers rows).
extern "C" __global__ void kern_rows_seed(const int64_t* __restrict__ ids_in, const int64_t* __restrict__ pos_in,
                                          const int64_t* __restrict__ slots_in, const int* __restrict__ lens_in,
                                          const int* __restrict__ valid, int64_t* __restrict__ ids,
                                          int64_t* __restrict__ pos, int64_t* __restrict__ slots,
                                          int* __restrict__ lens, int rows) {
    kern_pdl_launch_dependents();
    kern_pdl_wait();
    for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += gridDim.x * blockDim.x) {
        if (valid[r] == 0) continue;
        ids[r] = ids_in[r];
        pos[r] = pos_in[r];
        slots[r] = slots_in[r];
        lens[r] = lens_in[r];
    }
}
