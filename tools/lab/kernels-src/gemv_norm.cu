// The folded-norm band GEMV entries (their device code: gemv_norm.cuh).
#include "gemv_norm.cuh"

// kern_add_rmsnorm(res_in + y_add -> res_out, w_norm) then kern_gemv_bf16_b4 of its output, in one
// launch (the same bits as that pair, with res_out in place of the updated res). Grid [any, 1, 1]
// (kern_qwen3 sizes it as `_b4`'s band), block [128, 1, 1], dynamic shared memory 4 * rows * k bytes.
extern "C" __global__ void __launch_bounds__(128, 7)
    kern_gemv_bf16_b4_n(const bf16* __restrict__ res_in, const bf16* __restrict__ y_add,
        const bf16* __restrict__ w_norm, bf16* __restrict__ res_out, const bf16* __restrict__ w,
        bf16* __restrict__ y, int rows, int n, int k, int y_stride, float eps) {
    gemv_band_norm<4, GEMV_STORE>(res_in, y_add, w_norm, res_out, w, y, rows, n, k, y_stride, eps);
}

// The same before kern_gemv_bf16_b4_silu (W [2n, k]: gate rows, then up rows). Grid [any, 1, 1]
// (`_b4_silu`'s band), block [128, 1, 1], dynamic shared memory 4 * rows * k bytes.
extern "C" __global__ void __launch_bounds__(128, 6)
    kern_gemv_bf16_b4_silu_n(const bf16* __restrict__ res_in, const bf16* __restrict__ y_add,
        const bf16* __restrict__ w_norm, bf16* __restrict__ res_out, const bf16* __restrict__ w,
        bf16* __restrict__ y, int rows, int n, int k, int y_stride, float eps) {
    gemv_band_norm<2, GEMV_SILU>(res_in, y_add, w_norm, res_out, w, y, rows, n, k, y_stride, eps);
}

