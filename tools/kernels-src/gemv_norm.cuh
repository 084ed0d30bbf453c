// Band GEMVs with the add + RMSNorm before them folded into their prologue: where the decode step
// had kern_add_rmsnorm(res, y_add, w_norm -> x) and then a GEMV of x, one launch does both. Its own
// module, so that adding it leaves gemv.cu's cubin as it was.
//
// Every block that owns columns, after its PDL wait: h = bf16(res_in + y_add) and its sum of squares
// in kern_add_rmsnorm's order (that kernel's 256 threads each add the chunks t, t + 256, ... in turn;
// here each of the 128 threads plays threads t and t + 128, and the 8 warp sums are combined as
// block_sum combines them), then x = bf16(bf16(h * r) * w_norm) into shared memory: the same bits
// as kern_add_rmsnorm's output. The block that owns column 0 writes h to res_out (a different
// buffer from res_in: every other block still reads res_in). Then the columns as the band entry
// sums them, reading x from shared memory (`gemv_band_rows` with XS). rows 1..4; k % 8 == 0;
// dynamic shared memory 2 * rows * k * 2 bytes (h and x), else the launch writes nothing.
#pragma once
#include "gemv.cuh"
#include "row_ops.cuh"

template <int R>
static __device__ __forceinline__ void add_norm_prologue(const bf16* __restrict__ res_in,
                                                         const bf16* __restrict__ y_add,
                                                         const bf16* __restrict__ w_norm,
                                                         bf16* __restrict__ res_out, bf16* h_s, bf16* x_s,
                                                         int k, float eps, bool writer) {
    __shared__ float partial[8];
    const int chunks = k / 8;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const uint4* ws = reinterpret_cast<const uint4*>(w_norm);
#pragma unroll 1
    for (int r = 0; r < R; ++r) {
        const uint4* rs = reinterpret_cast<const uint4*>(res_in + (size_t)r * k);
        const uint4* ys = reinterpret_cast<const uint4*>(y_add + (size_t)r * k);
        uint4* hs = reinterpret_cast<uint4*>(h_s + (size_t)r * k);
        uint4* xs = reinterpret_cast<uint4*>(x_s + (size_t)r * k);
        float s[2] = {0.0f, 0.0f};  // kern_add_rmsnorm's threads t and t + 128
#pragma unroll
        for (int v = 0; v < 2; ++v) {
            for (int c = threadIdx.x + v * 128; c < chunks; c += 256) {
                const uint4 h = add8(ld_after_wait(reinterpret_cast<const bf16*>(rs + c)),
                                     ld_after_wait(reinterpret_cast<const bf16*>(ys + c)));
                hs[c] = h;
                s[v] += sumsq8(h);
            }
        }
        const float s0 = warp_sum(s[0]);
        const float s1 = warp_sum(s[1]);
        __syncthreads();  // partial is free (the previous row's readers are done)
        if (lane == 0) {
            partial[warp] = s0;
            partial[warp + 4] = s1;
        }
        __syncthreads();
        const float total = warp_sum(lane < 8 ? partial[lane] : 0.0f);
        const float rn = rsqrtf(total / (float)k + eps);
        for (int c = threadIdx.x; c < chunks; c += 128) {
            xs[c] = norm8(hs[c], ws[c], rn);
            if (writer) reinterpret_cast<uint4*>(res_out + (size_t)r * k)[c] = hs[c];
        }
    }
    __syncthreads();  // x_s is complete for every warp
}

template <int UNROLL, int EPI>
static __device__ __forceinline__ void gemv_band_norm(const bf16* __restrict__ res_in,
                                                      const bf16* __restrict__ y_add,
                                                      const bf16* __restrict__ w_norm,
                                                      bf16* __restrict__ res_out,
                                                      const bf16* __restrict__ w, bf16* __restrict__ y,
                                                      int rows, int n, int k, int y_stride, float eps) {
    extern __shared__ __align__(16) unsigned char norm_smem[];
    if (blockDim.x != 128) __trap();  // the sum order emulates kern_add_rmsnorm with 4 warps of 2 threads each
    with_rows(rows, [&](auto rr) {
        constexpr int R = decltype(rr)::value;
        if (dynamic_smem_bytes() < (uint32_t)(2 * R * k * 2)) {
            kern_pdl_launch_dependents();
            kern_pdl_wait();  // NOTE: so that the grid still completes after the launch before it
            return;  // block-uniform: no room for h and x
        }
        bf16* h_s = reinterpret_cast<bf16*>(norm_smem);
        bf16* x_s = h_s + (size_t)R * k;
        const bool writer = (int64_t)blockIdx.x * n / gridDim.x == 0 && (int64_t)(blockIdx.x + 1) * n / gridDim.x > 0;
        // NOTE: gemv_band_rows' x is __restrict__ and the prologue writes it through h_s / x_s; its
        // last __syncthreads (a compiler memory barrier too) orders those writes before every read.
        gemv_band_rows<4, UNROLL, EPI, R, true>(x_s, w, y, n, k, y_stride, [&] {
            add_norm_prologue<R>(res_in, y_add, w_norm, res_out, h_s, x_s, k, eps, writer);
        });
    });
}
