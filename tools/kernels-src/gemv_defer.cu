// The deferred-norm band GEMVs the decode step launches (their device code: gemv_defer.cuh). Its
// own module, so that adding it left the other cubins as they were.
#include "gemv_defer.cuh"

template <int EPI, int R>
static __device__ __forceinline__ void gemv_defer_rows(const bf16* __restrict__ res_in,
                                                       const bf16* __restrict__ y_add,
                                                       const bf16* __restrict__ w_norm, bf16* __restrict__ res_out,
                                                       const bf16* __restrict__ w, bf16* __restrict__ y, int n, int k,
                                                       int y_stride, float eps) {
    constexpr int SPLIT = 4;
    constexpr int STEP = DEFER_STEP;
    constexpr int NR = EPI == GEMV_SILU ? 2 : 1;
    __shared__ float sums[2][SPLIT][R * NR];
    __shared__ float ssq[SPLIT][R];
    if (blockDim.x != SPLIT * 32) __trap();  // the k split is `_s4`'s
    kern_pdl_launch_dependents();
    const int c0 = (int)((int64_t)blockIdx.x * n / gridDim.x);
    const int c1 = (int)((int64_t)(blockIdx.x + 1) * n / gridDim.x);
    if (c0 >= c1 || k % 8 != 0 || k > STEP * DEFER_MAXP) {  // block-uniform
        kern_pdl_wait();  // NOTE: so that the grid completes only after the launch before it
        return;
    }
    const int lane = threadIdx.x & 31;
    const int part = threadIdx.x >> 5;
    const int first = (part * 32 + lane) * 8;
    auto rows_of = [&](int c, const bf16* (&r)[NR]) {
#pragma unroll
        for (int g = 0; g < NR; ++g) r[g] = w + ((size_t)g * n + c) * (size_t)k;
    };
    const bf16* row[NR];
    rows_of(c0, row);
    uint4 nxt[DEFER_MAXP][NR];
    gemv_load<DEFER_MAXP, NR, STEP>(nxt, row, first, k);
    // NOTE: weights are read before the wait (no launch of a step writes them); h and y after.
    kern_pdl_wait();
    uint4 hw[R][DEFER_MAXP];  // bf16(h * w_norm): x's rounding, without r
    float ss[R];
    defer_load_h<R>(res_in, y_add, w_norm, c0 == 0 ? res_out : nullptr, first, k, hw, ss);
    float rn[R];  // thread 0's: r of each row, from the first column's barrier on
#pragma unroll 1
    for (int c = c0; c < c1; ++c) {
        uint4 cur[DEFER_MAXP][NR];
#pragma unroll
        for (int j = 0; j < DEFER_MAXP; ++j)
#pragma unroll
            for (int g = 0; g < NR; ++g) cur[j][g] = nxt[j][g];
        if (c + 1 < c1) {
            rows_of(c + 1, row);
            gemv_load<DEFER_MAXP, NR, STEP>(nxt, row, first, k);
        }
        float acc[R][NR];
        defer_fma<R, NR>(hw, [&](int j, int g) { return cur[j][g]; }, acc);
        // NOTE: two buffers: column c + 2 writes c's buffer only after column c + 1's barrier,
        // which thread 0 passes after its reads of column c's.
        defer_column_end<EPI, R, NR>(acc, ss, c == c0, sums[c & 1], ssq, rn, y, y_stride, c, k, eps);
    }
}

// kern_add_rmsnorm(res_in + y_add -> res_out, w_norm) then the GEMV of its output (kern_gemv_bf16_b4's
// layout), with the norm's scale applied to each column sum (above). Grid [any, 1, 1], block
// [128, 1, 1].
extern "C" __global__ void __launch_bounds__(128, 4)
    kern_gemv_bf16_b4_d(const bf16* __restrict__ res_in, const bf16* __restrict__ y_add,
        const bf16* __restrict__ w_norm, bf16* __restrict__ res_out, const bf16* __restrict__ w,
        bf16* __restrict__ y, int rows, int n, int k, int y_stride, float eps) {
    defer_with_rows(rows, [&](auto r) {
        gemv_defer_rows<GEMV_STORE, decltype(r)::value>(res_in, y_add, w_norm, res_out, w, y, n, k, y_stride, eps);
    });
}

// The same before kern_gemv_bf16_b4_silu's epilogue (W [2n, k]: gate rows, then up rows; the gate
// and up sums each scaled by r before SiLU-and-mul's roundings). Grid [any, 1, 1], block [128, 1, 1].
extern "C" __global__ void __launch_bounds__(128, 4)
    kern_gemv_bf16_b4_silu_d(const bf16* __restrict__ res_in, const bf16* __restrict__ y_add,
        const bf16* __restrict__ w_norm, bf16* __restrict__ res_out, const bf16* __restrict__ w,
        bf16* __restrict__ y, int rows, int n, int k, int y_stride, float eps) {
    defer_with_rows(rows, [&](auto r) {
        gemv_defer_rows<GEMV_SILU, decltype(r)::value>(res_in, y_add, w_norm, res_out, w, y, n, k, y_stride, eps);
    });
}
