// The GEMV entries (their device code: gemv.cuh).
#include "gemv.cuh"

// y[r, c] = bf16(sum_k x[r, k] * W[c, k]). Configuration: the GEMV_* macros.
extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)
    kern_gemv_bf16(const bf16* __restrict__ x, const bf16* __restrict__ w,
        bf16* __restrict__ y, int rows, int n, int k, int y_stride) {
    gemv<GEMV_WARPS, GEMV_RPW, GEMV_UNROLL, GEMV_SPLIT, GEMV_STORE>(x, w, y, rows, n, k, y_stride);
}

// y[r, c] = bf16(f32(y[r, c]) + sum_k x[r, k] * W[c, k]): one rounding (a fused residual add).
extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)
    kern_gemv_bf16_acc(const bf16* __restrict__ x, const bf16* __restrict__ w,
        bf16* __restrict__ y, int rows, int n, int k, int y_stride) {
    gemv<GEMV_WARPS, GEMV_RPW, GEMV_UNROLL, GEMV_SPLIT, GEMV_ACC>(x, w, y, rows, n, k, y_stride);
}

// As kern_gemv_bf16; 4 warps split k of one column. Grid [n, 1, 1], block [128, 1, 1].
extern "C" __global__ void __launch_bounds__(128)
    kern_gemv_bf16_s4(const bf16* __restrict__ x, const bf16* __restrict__ w,
        bf16* __restrict__ y, int rows, int n, int k, int y_stride) {
    gemv<4, 1, 4, 4, GEMV_STORE>(x, w, y, rows, n, k, y_stride);
}

// As kern_gemv_bf16; 2 groups of 2 warps, each group splits k of one column.
// Grid [ceil_div(n, 2), 1, 1], block [128, 1, 1].
extern "C" __global__ void __launch_bounds__(128)
    kern_gemv_bf16_s2(const bf16* __restrict__ x, const bf16* __restrict__ w,
        bf16* __restrict__ y, int rows, int n, int k, int y_stride) {
    gemv<4, 1, 4, 2, GEMV_STORE>(x, w, y, rows, n, k, y_stride);
}

// As kern_gemv_bf16; 8 warps split k of one column. Grid [n, 1, 1], block [256, 1, 1].
extern "C" __global__ void __launch_bounds__(256)
    kern_gemv_bf16_s8(const bf16* __restrict__ x, const bf16* __restrict__ w,
        bf16* __restrict__ y, int rows, int n, int k, int y_stride) {
    gemv<8, 1, 4, 8, GEMV_STORE>(x, w, y, rows, n, k, y_stride);
}

// As kern_gemv_bf16; each of 4 warps owns 2 columns. Grid [ceil_div(n, 8), 1, 1], block [128, 1, 1].
extern "C" __global__ void __launch_bounds__(128)
    kern_gemv_bf16_c2(const bf16* __restrict__ x, const bf16* __restrict__ w,
        bf16* __restrict__ y, int rows, int n, int k, int y_stride) {
    gemv<4, 2, 4, 1, GEMV_STORE>(x, w, y, rows, n, k, y_stride);
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

// As kern_gemv_bf16; each warp streams 4 columns one after another.
// Grid [ceil_div(n, 16), 1, 1], block [128, 1, 1].
extern "C" __global__ void __launch_bounds__(128)
    kern_gemv_bf16_q4(const bf16* __restrict__ x, const bf16* __restrict__ w,
        bf16* __restrict__ y, int rows, int n, int k, int y_stride) {
    gemv_seq<4, 4, 4, 1>(x, w, y, rows, n, k, y_stride);
}

// As kern_gemv_bf16; 2 groups of 2 warps, each group splits k of 4 columns in turn.
// Grid [ceil_div(n, 8), 1, 1], block [128, 1, 1].
extern "C" __global__ void __launch_bounds__(128)
    kern_gemv_bf16_s2q4(const bf16* __restrict__ x, const bf16* __restrict__ w,
        bf16* __restrict__ y, int rows, int n, int k, int y_stride) {
    gemv_seq<4, 4, 4, 2>(x, w, y, rows, n, k, y_stride);
}

// As kern_gemv_bf16; 4 warps split k of 4 columns in turn. Grid [ceil_div(n, 4), 1, 1],
// block [128, 1, 1].
extern "C" __global__ void __launch_bounds__(128)
    kern_gemv_bf16_s4q4(const bf16* __restrict__ x, const bf16* __restrict__ w,
        bf16* __restrict__ y, int rows, int n, int k, int y_stride) {
    gemv_seq<4, 4, 4, 4>(x, w, y, rows, n, k, y_stride);
}

// As kern_gemv_bf16, streaming W through the shared-memory ring above. Grid [any, 1, 1],
// block [512, 1, 1], dynamic shared memory: the ring (at least one stage) and the partials.
extern "C" __global__ void __launch_bounds__(TMA_WARPS * 32, 1)
    kern_gemv_bf16_tma(const bf16* __restrict__ x, const bf16* __restrict__ w,
        bf16* __restrict__ y, int rows, int n, int k, int y_stride) {
    gemv_tma<GEMV_STORE>(x, w, y, rows, n, k, y_stride);
}

// kern_gemv_bf16_silu's arithmetic (W [2n, k]: gate rows, then up rows) on the streaming ring.
extern "C" __global__ void __launch_bounds__(TMA_WARPS * 32, 1)
    kern_gemv_bf16_tma_silu(const bf16* __restrict__ x, const bf16* __restrict__ w,
        bf16* __restrict__ y, int rows, int n, int k, int y_stride) {
    gemv_tma<GEMV_SILU>(x, w, y, rows, n, k, y_stride);
}

// As kern_gemv_bf16_s4 (the same bits), over balanced column bands: 4 warps split k of each
// column of the block's band in turn. Grid [any, 1, 1] (kern_qwen3 sizes it to one resident wave:
// at least 7 blocks per SM fit), block [128, 1, 1].
extern "C" __global__ void __launch_bounds__(128, 7)
    kern_gemv_bf16_b4(const bf16* __restrict__ x, const bf16* __restrict__ w,
        bf16* __restrict__ y, int rows, int n, int k, int y_stride) {
    gemv_band<4, 4, GEMV_STORE>(x, w, y, rows, n, k, y_stride);
}

// kern_gemv_bf16_silu's epilogue on the balanced bands (W [2n, k]: gate rows, then up rows; each
// column's gate and up sums are kern_gemv_bf16_s4's). Grid [any, 1, 1] (at least 6 blocks per SM
// fit), block [128, 1, 1].
extern "C" __global__ void __launch_bounds__(128, 6)
    kern_gemv_bf16_b4_silu(const bf16* __restrict__ x, const bf16* __restrict__ w,
        bf16* __restrict__ y, int rows, int n, int k, int y_stride) {
    gemv_band<4, 2, GEMV_SILU>(x, w, y, rows, n, k, y_stride);
}

// As kern_gemv_bf16_b4 (the same bits: `_s4`'s), with 4 units of 4 pieces per lane in flight
// (deep bands above). Grid [any, 1, 1] (kern_qwen3 sizes it to one resident wave: at least 4 blocks
// per SM fit), block [128, 1, 1].
extern "C" __global__ void __launch_bounds__(128, 4)
    kern_gemv_bf16_d4(const bf16* __restrict__ x, const bf16* __restrict__ w,
        bf16* __restrict__ y, int rows, int n, int k, int y_stride) {
    gemv_deep<4, 4, 4, GEMV_STORE>(x, w, y, rows, n, k, y_stride);
}

// As kern_gemv_bf16_d4 with 8 units of 2 pieces per lane (finer units: less of the ring is idle
// in a column's last, partial segment). Grid [any, 1, 1] (at least 4 blocks per SM fit), block
// [128, 1, 1].
extern "C" __global__ void __launch_bounds__(128, 4)
    kern_gemv_bf16_d8(const bf16* __restrict__ x, const bf16* __restrict__ w,
        bf16* __restrict__ y, int rows, int n, int k, int y_stride) {
    gemv_deep<4, 8, 2, GEMV_STORE>(x, w, y, rows, n, k, y_stride);
}

// kern_gemv_bf16_b4_silu's arithmetic (the same bits) on deep bands: 4 units of 2 pieces of the
// gate and the up row per lane in flight. Grid [any, 1, 1] (at least 4 blocks per SM fit), block
// [128, 1, 1].
extern "C" __global__ void __launch_bounds__(128, 4)
    kern_gemv_bf16_d4_silu(const bf16* __restrict__ x, const bf16* __restrict__ w,
        bf16* __restrict__ y, int rows, int n, int k, int y_stride) {
    gemv_deep<4, 4, 2, GEMV_SILU>(x, w, y, rows, n, k, y_stride);
}

// As kern_gemv_bf16_s4 (the same bits), with each block's W rows copied into shared memory before
// the PDL wait (above). Grid [ceil_div(n, nc), 1, 1], block [128, 1, 1], dynamic shared memory
// nc * 2k bytes (kern_qwen3's gemv_launch).
extern "C" __global__ void __launch_bounds__(128)
    kern_gemv_bf16_p4(const bf16* __restrict__ x, const bf16* __restrict__ w,
        bf16* __restrict__ y, int rows, int n, int k, int y_stride) {
    with_rows(rows, [&](auto r) { gemv_p4_rows<GEMV_STORE, decltype(r)::value>(x, w, y, n, k, y_stride); });
}

// kern_gemv_bf16_b4_silu's arithmetic (the same bits) with each block's gate and up rows copied
// into shared memory before the PDL wait (W [2n, k]: gate rows, then up rows). Grid
// [ceil_div(n, nc), 1, 1], block [128, 1, 1], dynamic shared memory nc * 2 * 2k bytes.
extern "C" __global__ void __launch_bounds__(128)
    kern_gemv_bf16_p4_silu(const bf16* __restrict__ x, const bf16* __restrict__ w,
        bf16* __restrict__ y, int rows, int n, int k, int y_stride) {
    with_rows(rows, [&](auto r) { gemv_p4_rows<GEMV_SILU, decltype(r)::value>(x, w, y, n, k, y_stride); });
}

