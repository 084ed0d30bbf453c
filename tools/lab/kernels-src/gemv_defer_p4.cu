// The deferred-norm GEMVs on the prefetched layout (`_p4_d`, `_p4_silu_d`): the product's
// gemv_defer.cuh before gemv.cuh's `_p4` blocks. kern_lab's DEFER_P4 maps a `_p4` pick to them.
#include "gemv_defer.cuh"

// The prefetched form (`_p4_d`, `_p4_silu_d`): gemv.cu's `_p4` blocks (block b owns the nc =
// dynamic shared bytes / (NR * 2k) columns from b * nc, whose W rows it bulk-copies into shared
// memory before its PDL wait) with gemv_defer.cuh's deferred norm: after the wait each block loads its
// threads' pieces of h while its rows land, then sums its columns from shared memory.
template <int EPI, int R>
static __device__ __forceinline__ void gemv_p4_defer_rows(const bf16* __restrict__ res_in,
                                                          const bf16* __restrict__ y_add,
                                                          const bf16* __restrict__ w_norm,
                                                          bf16* __restrict__ res_out, const bf16* __restrict__ w,
                                                          bf16* __restrict__ y, int n, int k, int y_stride,
                                                          float eps) {
    constexpr int SPLIT = 4;
    constexpr int NR = EPI == GEMV_SILU ? 2 : 1;
    extern __shared__ __align__(128) unsigned char defer_rows_smem[];
    __shared__ __align__(8) uint64_t defer_bar;
    __shared__ float sums[2][SPLIT][R * NR];
    __shared__ float ssq[SPLIT][R];
    if (blockDim.x != SPLIT * 32) __trap();  // the k split is `_s4`'s
    kern_pdl_launch_dependents();
    const int64_t row_bytes = (int64_t)k * 2;
    const int64_t nc = (int64_t)dynamic_smem_bytes() / (NR * row_bytes);
    const int64_t c0 = (int64_t)blockIdx.x * nc;
    if (nc < 1 || c0 >= n || k % 8 != 0 || k > DEFER_STEP * DEFER_MAXP) {  // block-uniform
        kern_pdl_wait();  // NOTE: so that the grid completes only after the launch before it
        return;
    }
    const int cols = (int)min(nc, (int64_t)n - c0);
    const uint32_t bar = smem_addr(&defer_bar);
    if (threadIdx.x == 0) {
        mbar_init(bar, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        const uint32_t bytes = (uint32_t)(cols * row_bytes);
        const uint64_t policy = l2_evict_first();
        mbar_expect_tx(bar, NR * bytes);
        // NOTE: weights are read before the wait (no launch of a step writes them); h and y after.
#pragma unroll
        for (int g = 0; g < NR; ++g) {
            const uint32_t dst = smem_addr(defer_rows_smem) + (uint32_t)(g * nc * row_bytes);
            const char* src = reinterpret_cast<const char*>(w + ((int64_t)g * n + c0) * k);
            for (uint32_t off = 0; off < bytes; off += P4_COPY)
                bulk_g2s(dst + off, src + off, min(P4_COPY, bytes - off), bar, policy);
        }
    }
    __syncthreads();
    kern_pdl_wait();
    const int first = (int)threadIdx.x * 8;
    uint4 hw[R][DEFER_MAXP];  // bf16(h * w_norm): x's rounding, without r
    float ss[R];
    defer_load_h<R>(res_in, y_add, w_norm, c0 == 0 ? res_out : nullptr, first, k, hw, ss);
    float rn[R];  // thread 0's: r of each row, from the first column's barrier on
    const int pieces = k / 8;
    mbar_wait(bar, 0);
#pragma unroll 1
    for (int c = 0; c < cols; ++c) {
        const uint4* row[NR];
#pragma unroll
        for (int g = 0; g < NR; ++g)
            row[g] = reinterpret_cast<const uint4*>(defer_rows_smem + (g * nc + c) * row_bytes);
        float acc[R][NR];
        defer_fma<R, NR>(hw, [&](int j, int g) {
            const int q = (int)threadIdx.x + j * (DEFER_STEP / 8);
            return q < pieces ? row[g][q] : make_uint4(0u, 0u, 0u, 0u);
        }, acc);
        // NOTE: two buffers: column c + 2 writes c's buffer only after column c + 1's barrier,
        // which thread 0 passes after its reads of column c's.
        defer_column_end<EPI, R, NR>(acc, ss, c == 0, sums[c & 1], ssq, rn, y, y_stride, (int)c0 + c, k, eps);
    }
}

// The prefetched forms: kern_gemv_bf16_p4's launch (grid [ceil_div(n, nc), 1, 1], block [128, 1, 1],
// dynamic shared memory nc * 2k bytes) with the deferred norm before it.
extern "C" __global__ void __launch_bounds__(128)
    kern_gemv_bf16_p4_d(const bf16* __restrict__ res_in, const bf16* __restrict__ y_add,
        const bf16* __restrict__ w_norm, bf16* __restrict__ res_out, const bf16* __restrict__ w,
        bf16* __restrict__ y, int rows, int n, int k, int y_stride, float eps) {
    defer_with_rows(rows, [&](auto r) {
        gemv_p4_defer_rows<GEMV_STORE, decltype(r)::value>(res_in, y_add, w_norm, res_out, w, y, n, k, y_stride, eps);
    });
}

// The same before kern_gemv_bf16_p4_silu's epilogue (dynamic shared memory nc * 4k bytes).
extern "C" __global__ void __launch_bounds__(128)
    kern_gemv_bf16_p4_silu_d(const bf16* __restrict__ res_in, const bf16* __restrict__ y_add,
        const bf16* __restrict__ w_norm, bf16* __restrict__ res_out, const bf16* __restrict__ w,
        bf16* __restrict__ y, int rows, int n, int k, int y_stride, float eps) {
    defer_with_rows(rows, [&](auto r) {
        gemv_p4_defer_rows<GEMV_SILU, decltype(r)::value>(res_in, y_add, w_norm, res_out, w, y, n, k, y_stride, eps);
    });
}
