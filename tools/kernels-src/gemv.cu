// The GEMV entries the decode step launches (their device code: gemv.cuh; other configurations
// and layouts: the lab's gemv_alt.cu).
#include "gemv.cuh"

// y[r, c] = bf16(sum_k x[r, k] * W[c, k]); 4 warps split k of one column. Grid [n, 1, 1],
// block [128, 1, 1].
extern "C" __global__ void __launch_bounds__(128)
    kern_gemv_bf16_s4(const bf16* __restrict__ x, const bf16* __restrict__ w,
        bf16* __restrict__ y, int rows, int n, int k, int y_stride) {
    gemv<4, 1, 4, 4, GEMV_STORE>(x, w, y, rows, n, k, y_stride);
}

// Gate/up GEMV + SiLU-and-mul: W is [2n, k] (gate rows, then up rows), y[r, c] for c < n is
// bf16(bf16(silu(g)) * u) with g = bf16(x W[c]), u = bf16(x W[n + c]) (kern_silu_mul's rounding
// of the unfused GEMV's output). Each warp streams the 2 rows of one column.
// Grid [ceil_div(n, 4), 1, 1], block [128, 1, 1].
extern "C" __global__ void __launch_bounds__(128)
    kern_gemv_bf16_silu(const bf16* __restrict__ x, const bf16* __restrict__ w,
        bf16* __restrict__ y, int rows, int n, int k, int y_stride) {
    gemv<4, 1, 4, 1, GEMV_SILU>(x, w, y, rows, n, k, y_stride);
}

// As kern_gemv_bf16_s4 (the same bits), over balanced column bands: 4 warps split k of each
// column of the block's band in turn. Grid [any, 1, 1] (kern_qwen3 sizes it to one resident wave:
// at least 7 blocks per SM fit), block [128, 1, 1].
extern "C" __global__ void __launch_bounds__(128, 7)
    kern_gemv_bf16_b4(const bf16* __restrict__ x, const bf16* __restrict__ w,
        bf16* __restrict__ y, int rows, int n, int k, int y_stride) {
    gemv_band<4, 4, GEMV_STORE>(x, w, y, rows, n, k, y_stride);
}

// As kern_gemv_bf16_s4 (the same bits), with each block's W rows copied into shared memory before
// the PDL wait (gemv.cuh's "Prefetched GEMV"). Grid [ceil_div(n, nc), 1, 1], block [128, 1, 1], dynamic shared memory
// nc * 2k bytes (kern_qwen3's gemv_launch).
extern "C" __global__ void __launch_bounds__(128)
    kern_gemv_bf16_p4(const bf16* __restrict__ x, const bf16* __restrict__ w,
        bf16* __restrict__ y, int rows, int n, int k, int y_stride) {
    with_rows(rows, [&](auto r) { gemv_p4_rows<GEMV_STORE, decltype(r)::value>(x, w, y, n, k, y_stride); });
}
