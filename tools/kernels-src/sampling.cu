// Greedy sampling on the device: two-stage argmax over bf16 logits and the decode step's feed of
// its own next inputs (ids / pos / slot / seq_len) so a captured graph needs no host writes.
#include "kern_common.cuh"

#define ARGMAX_THREADS 256
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

static __device__ __forceinline__ ArgBest arg_block_reduce(ArgBest best) {
    __shared__ float vals[ARGMAX_THREADS / 32];
    __shared__ int idxs[ARGMAX_THREADS / 32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        ArgBest other;
        other.val = __shfl_xor_sync(0xffffffffu, best.val, o);
        other.idx = __shfl_xor_sync(0xffffffffu, best.idx, o);
        best = arg_better(best, other);
    }
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    if (lane == 0) {
        vals[warp] = best.val;
        idxs[warp] = best.idx;
    }
    __syncthreads();
    if (warp == 0) {
        best.val = lane < ARGMAX_THREADS / 32 ? vals[lane] : 0.0f;
        best.idx = lane < ARGMAX_THREADS / 32 ? idxs[lane] : ARGMAX_NONE;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            ArgBest other;
            other.val = __shfl_xor_sync(0xffffffffu, best.val, o);
            other.idx = __shfl_xor_sync(0xffffffffu, best.idx, o);
            best = arg_better(best, other);
        }
    }
    return best;
}

// Block b scans its contiguous share of the n logits (a multiple of 8 elements, 16-byte loads)
// and writes its best value and index; an empty share writes (-inf, INT32_MAX).
// grid [parts] (64), block [256]; logits 16-byte aligned.
extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS)
kern_argmax_partial(const bf16* __restrict__ logits, float* __restrict__ pval,
                    int* __restrict__ pidx, int n) {
    kern_pdl_launch_dependents();
    kern_pdl_wait();
    const int per = ((n + gridDim.x - 1) / gridDim.x + 7) / 8 * 8;
    const int lo = min(blockIdx.x * per, n);
    const int hi = min(lo + per, n);
    ArgBest best{KERN_NEG_INF, ARGMAX_NONE};
    const int vec_hi = lo + (hi - lo) / 8 * 8;
    for (int i = lo + threadIdx.x * 8; i < vec_hi; i += ARGMAX_THREADS * 8) {
        float v[8];
        unpack8(*reinterpret_cast<const uint4*>(logits + i), v);
#pragma unroll
        for (int e = 0; e < 8; ++e) best = arg_better(best, ArgBest{v[e], i + e});
    }
    for (int i = vec_hi + threadIdx.x; i < hi; i += ARGMAX_THREADS) {
        best = arg_better(best, ArgBest{to_f(logits[i]), i});
    }
    best = arg_block_reduce(best);
    if (threadIdx.x == 0) {
        pval[blockIdx.x] = best.val;
        pidx[blockIdx.x] = best.idx;
    }
}

// next[0] = the index of the best of the `parts` partials (ties to the lower index).
// grid [1], block [256].
extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS)
kern_argmax_final(const float* __restrict__ pval, const int* __restrict__ pidx,
                  int64_t* __restrict__ next, int parts) {
    kern_pdl_launch_dependents();
    kern_pdl_wait();
    ArgBest best{KERN_NEG_INF, ARGMAX_NONE};
    for (int i = threadIdx.x; i < parts; i += ARGMAX_THREADS) {
        best = arg_better(best, ArgBest{pval[i], pidx[i]});
    }
    best = arg_block_reduce(best);
    if (threadIdx.x == 0) next[0] = best.idx;
}

// Feeds the next decode step: ids = next, pos += 1, slot = block_table[pos / P] * P + pos % P,
// seq_len += 1. grid [1], block [1].
extern "C" __global__ void kern_decode_advance(const int64_t* __restrict__ next,
                                               int64_t* __restrict__ ids, int64_t* __restrict__ pos,
                                               int64_t* __restrict__ slots,
                                               int* __restrict__ seq_len,
                                               const int* __restrict__ block_table,
                                               int page_tokens) {
    kern_pdl_launch_dependents();
    kern_pdl_wait();
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    const int64_t p = pos[0] + 1;
    ids[0] = next[0];
    pos[0] = p;
    slots[0] = (int64_t)block_table[p / page_tokens] * page_tokens + p % page_tokens;
    seq_len[0] = seq_len[0] + 1;
}

// dst[i] = src[i] for i < n (seeds the device-fed decode carries from the staged inputs).
// grid [1], block [32] (any grid / block covers n).
extern "C" __global__ void kern_copy_i64(const int64_t* __restrict__ src, int64_t* __restrict__ dst,
                                         int n) {
    kern_pdl_launch_dependents();
    kern_pdl_wait();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        dst[i] = src[i];
    }
}

// dst[i] = src[i] for i < n. grid [1], block [32] (any grid / block covers n).
extern "C" __global__ void kern_copy_i32(const int* __restrict__ src, int* __restrict__ dst, int n) {
    kern_pdl_launch_dependents();
    kern_pdl_wait();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        dst[i] = src[i];
    }
}

// dst[i] = 0 for i < n (the load program zeroes kern_attn_decode's counters). grid [1], block [32]
// (any grid / block covers n).
extern "C" __global__ void kern_zero_i32(int* __restrict__ dst, int n) {
    kern_pdl_launch_dependents();
    kern_pdl_wait();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        dst[i] = 0;
    }
}
