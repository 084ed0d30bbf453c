// kern-arch: sm_90a
// The FP8-weight entries of a manifest over a Qwen FP8 checkpoint's weights as they are downloaded:
// W float8 e4m3 row-major [n, k] and `s` its float32 block scales ("weight_scale_inv")
// [ceil(n / 128), ceil(k / 128)], the weight's value being W[c, j] * s[c / 128, j / 128].
// Activations stay bf16 (weights-only FP8): the decode step's GEMV reads the e4m3 bytes and their
// scales; a prefill chunk dequantises a weight to bf16 once and runs the bf16 GEMM over it.
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

template <int R, int UNROLL>
static __device__ __forceinline__ void gemv_e4m3_rows(const bf16* __restrict__ x, const uint8_t* __restrict__ w,
                                                      const float* __restrict__ s, bf16* __restrict__ y, int n,
                                                      int k, int y_stride) {
    const int lane = threadIdx.x & 31;
    const int c = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const bool live = c < n;  // NOTE: uniform over the warp: every lane joins the shuffles
    const int pieces = k >> 4;
    const int scale_cols = (k + 127) >> 7;
    const uint8_t* row = w + (size_t)(live ? c : 0) * k;
    const float* srow = s + (size_t)((live ? c : 0) >> 7) * scale_cols;
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
                const float scale = srow[p >> 3];  // 8 pieces per 128-wide block
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
    with_rows(rows, [&](auto r) { gemv_e4m3_rows<decltype(r)::value, 4>(x, w, s, y, n, k, y_stride); });
}

// The dequantiser above: one thread converts one 16-byte piece (16 weights of one row and block).
extern "C" __global__ void __launch_bounds__(256)
    kern_dequant_e4m3_b128(const uint8_t* __restrict__ w, const float* __restrict__ s, bf16* __restrict__ out,
        int n, int k) {
    const size_t piece = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t pieces = ((size_t)n * k) >> 4;
    kern_pdl_launch_dependents();
    if (piece >= pieces) return;
    const size_t at = piece << 4;
    const int c = (int)(at / (size_t)k);
    const int j = (int)(at - (size_t)c * k);
    const float scale = s[(size_t)(c >> 7) * ((k + 127) >> 7) + (j >> 7)];
    float v[16];
    unpack16_e4m3(*reinterpret_cast<const uint4*>(w + at), v);
#pragma unroll
    for (int e = 0; e < 16; ++e) v[e] *= scale;
    kern_pdl_wait();  // NOTE: out may still be read by the previous launch (the GEMM of the last weight)
    uint4* dst = reinterpret_cast<uint4*>(out + at);
    dst[0] = pack8(v);
    dst[1] = pack8(v + 8);
}
