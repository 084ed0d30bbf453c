// Prefetched GEMVs with the add + RMSNorm before them in their prologue (`_p4_n`, `_p4_silu_n`):
// gemv.cu's `_p4` blocks (each bulk-copies its columns' W rows into shared memory before its PDL
// wait), where every block with columns, after the wait and while its copies are still landing,
// forms h and x as gemv_norm.cu's prologue does (kern_add_rmsnorm's order: the same bits as that
// launch followed by `_p4` / `_p4_silu`) and reads x from shared memory. The block that owns column
// 0 writes h to res_out (another buffer than res_in). Its own module, so that adding it leaves
// gemv.cu's and gemv_norm.cu's cubins as they were.
// rows 1..4; k % 8 == 0; dynamic shared memory: nc columns' rows (nc * NR * 2k bytes, NR 2 for the
// SiLU form), then h and x (4 * rows * k bytes); less than one column and h and x writes nothing.
// Grid [ceil_div(n, nc), 1, 1], block [128, 1, 1].
#include "gemv_norm.cuh"

template <int EPI>
static __device__ __forceinline__ void gemv_p4_norm(const bf16* __restrict__ res_in, const bf16* __restrict__ y_add,
                                                    const bf16* __restrict__ w_norm, bf16* __restrict__ res_out,
                                                    const bf16* __restrict__ w, bf16* __restrict__ y, int rows, int n,
                                                    int k, int y_stride, float eps) {
    extern __shared__ __align__(128) unsigned char pnorm_smem[];
    constexpr int NR = EPI == GEMV_SILU ? 2 : 1;
    if (blockDim.x != 128) __trap();  // the norm's order emulates kern_add_rmsnorm with 4 warps
    with_rows(rows, [&](auto rr) {
        constexpr int R = decltype(rr)::value;
        const uint32_t norm = (uint32_t)(2 * R * k * 2);
        const uint32_t dyn = dynamic_smem_bytes();
        if (dyn < norm + (uint32_t)(NR * k * 2) || dyn % 16 != 0) {
            kern_pdl_launch_dependents();
            kern_pdl_wait();  // NOTE: so that the grid still completes after the launch before it
            return;  // block-uniform: no room for a column and h and x
        }
        bf16* h_s = reinterpret_cast<bf16*>(pnorm_smem + (dyn - norm));
        bf16* x_s = h_s + (size_t)R * k;
        // NOTE: gemv_p4_rows' x is __restrict__ and the prologue writes it through x_s; the
        // prologue's last __syncthreads (a compiler memory barrier too) orders those writes first.
        gemv_p4_rows<EPI, R, true>(x_s, w, y, n, k, y_stride, norm, [&] {
            add_norm_prologue<R>(res_in, y_add, w_norm, res_out, h_s, x_s, k, eps, blockIdx.x == 0);
        });
    });
}

// kern_add_rmsnorm(res_in + y_add -> res_out, w_norm) then kern_gemv_bf16_p4 of its output, in one
// launch (the same bits as that pair). Grid [ceil_div(n, nc), 1, 1], block [128, 1, 1], dynamic
// shared memory nc * 2k + 4 * rows * k bytes.
extern "C" __global__ void __launch_bounds__(128)
    kern_gemv_bf16_p4_n(const bf16* __restrict__ res_in, const bf16* __restrict__ y_add,
        const bf16* __restrict__ w_norm, bf16* __restrict__ res_out, const bf16* __restrict__ w,
        bf16* __restrict__ y, int rows, int n, int k, int y_stride, float eps) {
    gemv_p4_norm<GEMV_STORE>(res_in, y_add, w_norm, res_out, w, y, rows, n, k, y_stride, eps);
}

// The same before kern_gemv_bf16_p4_silu (W [2n, k]: gate rows, then up rows). Dynamic shared
// memory nc * 4k + 4 * rows * k bytes.
extern "C" __global__ void __launch_bounds__(128)
    kern_gemv_bf16_p4_silu_n(const bf16* __restrict__ res_in, const bf16* __restrict__ y_add,
        const bf16* __restrict__ w_norm, bf16* __restrict__ res_out, const bf16* __restrict__ w,
        bf16* __restrict__ y, int rows, int n, int k, int y_stride, float eps) {
    gemv_p4_norm<GEMV_SILU>(res_in, y_add, w_norm, res_out, w, y, rows, n, k, y_stride, eps);
}
