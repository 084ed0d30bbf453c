// The FP8-weight entries of a manifest over a Qwen FP8 checkpoint's weights as they are downloaded:
// W float8 e4m3 row-major [n, k] and `s` its float32 block scales ("weight_scale_inv")
// [ceil(n / 128), ceil(k / 128)], the weight's value being W[c, j] * s[c / 128, j / 128].
// Activations stay bf16 (weights-only FP8): the decode step's GEMV reads the e4m3 bytes and their
// scales; a prefill chunk dequantises a weight to bf16 once and runs the bf16 GEMM over it.
//
// The `_row` forms of the GEMV and the dequantiser take compressed-tensors' channel-wise scales
// instead (FP8-dynamic checkpoints: `weight_scale` [n, 1], the weight's value W[c, j] * s[c]).
//
// kern_gemv_e4m3_b128: x bf16 [rows, k] (row stride k), y bf16 [rows, *] (row stride y_stride),
// rows 1..4 (others write nothing).
//
//   y[r, c] = bf16( sum over 128-wide k blocks b of s[c / 128, b] * (sum_{j in b} x[r, j] * W[c, j]) )
//
// f32 throughout: e4m3 -> f16 -> f32 is exact, the products and the block partial sums are f32
// fmas in the lanes' order, each 16-byte piece's partial sum is scaled by its block's scale once.
// k must be a multiple of 16 (a piece: 16 e4m3 bytes), W and x 16-byte aligned.
//
// Layout: one warp per column (4 per block of 128 threads); lane l streams the pieces l, l + 32,
// ... of its W row, UNROLL per round, the next round issued before the current one is summed, with
// the bf16 GEMV's streaming load (gemv.cuh: no L1 allocation, L2 evict-first). A warp shuffle adds
// the lanes' sums. Grid [ceil_div(n, 4), 1, 1], block [128, 1, 1].
//
// PDL: every block lets the next launch start, issues its first round of W loads (weights are
// never written by a decode step), then waits for the previous launch before it reads x.
//
// kern_dequant_e4m3_b128: out bf16 [n, k] = bf16_rn(W[c, j] * s[c / 128, j / 128]) (the value a
// dequantised checkpoint holds). One thread per 16 e4m3 bytes; k a multiple of 16.
// Grid [ceil_div(n * k / 16, 256), 1, 1], block [256, 1, 1].
//
// kern_quant_e4m3_b128: a bf16 weight src [n, k] -> W e4m3 [n, k] and s f32 [ceil(n / 128),
// ceil(k / 128)], Qwen FP8's quantisation: each 128 x 128 block's scale is its amax / 448 (1 for an
// all-zero block), each weight e4m3_rn(w / scale) saturated to +-448: the bytes a Qwen FP8
// checkpoint of these weights holds (kern_qwen3.quantize_blocks, bit for bit). One block of 256
// threads per 128 x 128 block, each thread 64 weights (8 pieces of 8 bf16 along a row); k a multiple
// of 8. Grid [ceil_div(k, 128), ceil_div(n, 128), 1], block [256, 1, 1].
#include "gemv.cuh"

#include <cuda_fp16.h>
#include <cuda_fp8.h>

// 16 e4m3 values held in a uint4 as floats (exact), in memory order.
static __device__ __forceinline__ void unpack16_e4m3(const uint4 v, float* out) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const __nv_fp8x2_storage_t pair = (__nv_fp8x2_storage_t)((w[i] >> (16 * h)) & 0xffffu);
            const __half2_raw raw = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
            const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&raw));
            out[4 * i + 2 * h] = f.x;
            out[4 * i + 2 * h + 1] = f.y;
        }
    }
}

// Where the scale of weight (c, j) lives: Qwen FP8's 128 x 128 blocks (`weight_scale_inv`
// [ceil(n / 128), ceil(k / 128)]), or one per output row (compressed-tensors' channel-wise
// `weight_scale` [n, 1]). `row` finds output row c's scales, `at` column j's among them.
struct ScaleBlocks {
    static __device__ __forceinline__ const float* row(const float* s, int c, int k) {
        return s + (size_t)(c >> 7) * ((k + 127) >> 7);
    }
    static __device__ __forceinline__ float at(const float* srow, int j) { return srow[j >> 7]; }
};
struct ScaleRows {
    static __device__ __forceinline__ const float* row(const float* s, int c, int) { return s + c; }
    static __device__ __forceinline__ float at(const float* srow, int) { return srow[0]; }
};

template <int UNROLL>
static __device__ __forceinline__ void gemv_e4m3_load(uint4 (&wv)[UNROLL], const uint8_t* row, int first,
                                                      int pieces, bool live) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        const int p = first + u * 32;
        wv[u] = live && p < pieces ? ld_stream(reinterpret_cast<const bf16*>(row + 16 * p))
                                   : make_uint4(0u, 0u, 0u, 0u);
    }
}

template <class S, int R, int UNROLL>
static __device__ __forceinline__ void gemv_e4m3_rows(const bf16* __restrict__ x, const uint8_t* __restrict__ w,
                                                      const float* __restrict__ s, bf16* __restrict__ y, int n,
                                                      int k, int y_stride) {
    const int lane = threadIdx.x & 31;
    const int c = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const bool live = c < n;  // NOTE: uniform over the warp: every lane joins the shuffles
    const int pieces = k >> 4;
    const uint8_t* row = w + (size_t)(live ? c : 0) * k;
    const float* srow = S::row(s, live ? c : 0, k);
    kern_pdl_launch_dependents();
    uint4 cur[UNROLL];
    gemv_e4m3_load<UNROLL>(cur, row, lane, pieces, live);
    kern_pdl_wait();
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
    for (int base = lane; base < pieces; base += 32 * UNROLL) {
        uint4 nxt[UNROLL];
        gemv_e4m3_load<UNROLL>(nxt, row, base + 32 * UNROLL, pieces, live);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int p = base + u * 32;
            if (live && p < pieces) {
                float wf[16];
                unpack16_e4m3(cur[u], wf);
                const float scale = S::at(srow, 16 * p);  // NOTE: a piece never straddles a 128-wide block
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    float xf[16];
                    unpack8(ld_after_wait(x + (size_t)r * k + 16 * p), xf);
                    unpack8(ld_after_wait(x + (size_t)r * k + 16 * p + 8), xf + 8);
                    float part = 0.0f;
#pragma unroll
                    for (int e = 0; e < 16; ++e) part = fmaf(xf[e], wf[e], part);
                    acc[r] = fmaf(part, scale, acc[r]);
                }
            }
            cur[u] = nxt[u];
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const float sum = warp_sum(acc[r]);
        if (live && lane == 0) y[(size_t)r * y_stride + c] = to_bf(sum);
    }
}

// The GEMV above: 4 warps, one column each, 4 pieces (64 bytes of W) per lane per round.
extern "C" __global__ void __launch_bounds__(128)
    kern_gemv_e4m3_b128(const bf16* __restrict__ x, const uint8_t* __restrict__ w, const float* __restrict__ s,
        bf16* __restrict__ y, int rows, int n, int k, int y_stride) {
    with_rows(rows, [&](auto r) { gemv_e4m3_rows<ScaleBlocks, decltype(r)::value, 4>(x, w, s, y, n, k, y_stride); });
}

// The same GEMV over one scale per output row (s [n]): y[r, c] = bf16(s[c] * sum_j x[r, j] W[c, j]),
// each piece's partial sum scaled as above (the same code, the scale read from s[c]).
extern "C" __global__ void __launch_bounds__(128)
    kern_gemv_e4m3_row(const bf16* __restrict__ x, const uint8_t* __restrict__ w, const float* __restrict__ s,
        bf16* __restrict__ y, int rows, int n, int k, int y_stride) {
    with_rows(rows, [&](auto r) { gemv_e4m3_rows<ScaleRows, decltype(r)::value, 4>(x, w, s, y, n, k, y_stride); });
}

// The dequantiser above: one thread converts one 16-byte piece (16 weights of one row and block).
template <class S>
static __device__ __forceinline__ void dequant_e4m3(const uint8_t* __restrict__ w, const float* __restrict__ s,
                                                    bf16* __restrict__ out, int n, int k) {
    const size_t piece = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t pieces = ((size_t)n * k) >> 4;
    kern_pdl_launch_dependents();
    if (piece >= pieces) return;
    const size_t at = piece << 4;
    const int c = (int)(at / (size_t)k);
    const int j = (int)(at - (size_t)c * k);
    const float scale = S::at(S::row(s, c, k), j);
    float v[16];
    unpack16_e4m3(*reinterpret_cast<const uint4*>(w + at), v);
#pragma unroll
    for (int e = 0; e < 16; ++e) v[e] *= scale;
    kern_pdl_wait();  // NOTE: out may still be read by the previous launch (the GEMM of the last weight)
    uint4* dst = reinterpret_cast<uint4*>(out + at);
    dst[0] = pack8(v);
    dst[1] = pack8(v + 8);
}

extern "C" __global__ void __launch_bounds__(256)
    kern_dequant_e4m3_b128(const uint8_t* __restrict__ w, const float* __restrict__ s, bf16* __restrict__ out,
        int n, int k) {
    dequant_e4m3<ScaleBlocks>(w, s, out, n, k);
}

// The dequantiser over one scale per output row (s [n]): out[c, j] = bf16_rn(W[c, j] * s[c]).
extern "C" __global__ void __launch_bounds__(256)
    kern_dequant_e4m3_row(const uint8_t* __restrict__ w, const float* __restrict__ s, bf16* __restrict__ out,
        int n, int k) {
    dequant_e4m3<ScaleRows>(w, s, out, n, k);
}

// The quantiser above. Thread t owns rows t / 16 + 16 * i (i < 8) of the block, columns 8 * (t % 16)
// .. + 7: its 64 values stay in registers between the amax and the conversion.
extern "C" __global__ void __launch_bounds__(256)
    kern_quant_e4m3_b128(const bf16* __restrict__ src, uint8_t* __restrict__ w, float* __restrict__ s, int n, int k) {
    const int col = blockIdx.x * 128 + 8 * (threadIdx.x & 15);
    const int row0 = blockIdx.y * 128 + (threadIdx.x >> 4);
    const bool col_live = col < k;
    float v[8][8];
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int r = row0 + 16 * i;
        const uint4 raw = col_live && r < n ? *reinterpret_cast<const uint4*>(src + (size_t)r * k + col)
                                            : make_uint4(0u, 0u, 0u, 0u);
        unpack8(raw, v[i]);
#pragma unroll
        for (int e = 0; e < 8; ++e) amax = fmaxf(amax, fabsf(v[i][e]));
    }
    __shared__ float warp_max[8];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = amax;
    __syncthreads();
    amax = warp_max[0];
#pragma unroll
    for (int i = 1; i < 8; ++i) amax = fmaxf(amax, warp_max[i]);
    const float scale = amax > 0.0f ? __fdiv_rn(amax, 448.0f) : 1.0f;
    if (threadIdx.x == 0) s[(size_t)blockIdx.y * gridDim.x + blockIdx.x] = scale;
    if (!col_live) return;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int r = row0 + 16 * i;
        if (r >= n) break;
        uint32_t packed[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            uint32_t word = 0;
#pragma unroll
            for (int e = 0; e < 4; e += 2) {
                const float2 pair = make_float2(__fdiv_rn(v[i][4 * h + e], scale), __fdiv_rn(v[i][4 * h + e + 1], scale));
                const __nv_fp8x2_storage_t q = __nv_cvt_float2_to_fp8x2(pair, __NV_SATFINITE, __NV_E4M3);
                word |= (uint32_t)q << (8 * e);
            }
            packed[h] = word;
        }
        *reinterpret_cast<uint2*>(w + (size_t)r * k + col) = make_uint2(packed[0], packed[1]);
    }
}
