// GEMVs with the add + RMSNorm before them deferred to their epilogue (`_d`; band and prefetched
// forms, the latter below `gemv_p4_defer_rows`): RMSNorm's scale r
// is one number per row, so W (h * r * w_norm) = r * (W (h * w_norm)). Where gemv_norm.cuh's
// prologue must finish the norm (sum of squares, block reduction, x into shared memory) before a
// block's first FMA, here a block, after its PDL wait, loads its threads' pieces of h =
// bf16(res_in + y_add) (kern_add_rmsnorm's rounding of the residual) and keeps bf16(h * w_norm) in
// registers, then streams its band of columns against them at once; the sum of squares of h
// reduces across the block at the first column's barrier, and the epilogue multiplies each column
// sum by r = rsqrt(mean(h^2) + eps). Not the bits of kern_add_rmsnorm + the GEMV (x = bf16(bf16(h r)
// w) there, bf16(h w) r here: one rounding fewer; and another summation order for the sum of
// squares): the GPU test bounds it against a float64 reference. The block that owns column 0 writes h to res_out (another
// buffer than res_in). Its own module, so that adding it leaves the other cubins as they were.
//
// Layout: block b owns the columns [b * n / grid, (b + 1) * n / grid) (gemv_band_rows' bands); its 4
// warps split k as kern_gemv_bf16_s4 does (lane l of warp s takes pieces s * 32 + l + 128 j, j <
// DEFER_MAXP), so a thread's pieces of h are the same for every column; the next column's W pieces
// are loaded before the current column is summed (two columns in flight per thread).
// rows 1..2 (a thread keeps its pieces of every row in registers: the decode step has one row);
// k % 8 == 0 and k <= 1024 * DEFER_MAXP (4096); otherwise the launch writes nothing.
// Grid [any, 1, 1] (kern_qwen3 sizes it to one resident wave: at least 4 blocks per SM fit), block
// [128, 1, 1], no dynamic shared memory.
#include "gemv_norm.cuh"

constexpr int DEFER_MAXP = 4;  // 16-byte pieces of a k row per thread: k <= 4 * 128 * 8
constexpr int DEFER_STEP = 1024;  // elements between a thread's pieces (4 warps of 32 lanes x 8)

// After the PDL wait: this thread's pieces first + j * DEFER_STEP of h = bf16(res_in + y_add)
// (kern_add_rmsnorm's rounding), written to res_out unless it is null, and of bf16(h * w_norm)
// into hw; ss[r] = the thread's sum of h^2 over them.
template <int R>
static __device__ __forceinline__ void defer_load_h(const bf16* __restrict__ res_in, const bf16* __restrict__ y_add,
                                                    const bf16* __restrict__ w_norm, bf16* __restrict__ res_out,
                                                    int first, int k, uint4 (&hw)[R][DEFER_MAXP], float (&ss)[R]) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
        ss[r] = 0.0f;
#pragma unroll
        for (int j = 0; j < DEFER_MAXP; ++j) {
            const int idx = first + j * DEFER_STEP;
            if (idx < k) {
                const uint4 h = add8(ld_after_wait(res_in + (size_t)r * k + idx),
                                     ld_after_wait(y_add + (size_t)r * k + idx));
                if (res_out != nullptr) *reinterpret_cast<uint4*>(res_out + (size_t)r * k + idx) = h;
                float hf[8], wf[8];
                unpack8(h, hf);
                unpack8(ld_after_wait(w_norm + idx), wf);
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    ss[r] = fmaf(hf[e], hf[e], ss[r]);
                    wf[e] *= hf[e];
                }
                hw[r][j] = pack8(wf);
            } else {
                hw[r][j] = make_uint4(0u, 0u, 0u, 0u);
            }
        }
    }
}

// One column's FMAs: acc[r][g] += hw[r][j] . wv(j, g) over the thread's pieces, W's from `piece`.
template <int R, int NR, typename Piece>
static __device__ __forceinline__ void defer_fma(const uint4 (&hw)[R][DEFER_MAXP], Piece piece, float (&acc)[R][NR]) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int g = 0; g < NR; ++g) acc[r][g] = 0.0f;
#pragma unroll
    for (int j = 0; j < DEFER_MAXP; ++j) {
        float wf[NR][8];
#pragma unroll
        for (int g = 0; g < NR; ++g) unpack8(piece(j, g), wf[g]);  // zero beyond k
#pragma unroll
        for (int r = 0; r < R; ++r) {
            float xf[8];
            unpack8(hw[r][j], xf);
#pragma unroll
            for (int g = 0; g < NR; ++g)
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[r][g] = fmaf(xf[e], wf[g][e], acc[r][g]);
        }
    }
}

// The column's end: warp sums, the block's sum through `sums` (one barrier; at the block's first
// column also the sum of squares, into rn, thread 0's), then thread 0's epilogue of r * sum into
// y[r * y_stride + col].
template <int EPI, int R, int NR>
static __device__ __forceinline__ void defer_column_end(float (&acc)[R][NR], float (&ss)[R], bool first_col,
                                                        float (*sums)[R * NR], float (*ssq)[R], float (&rn)[R],
                                                        bf16* __restrict__ y, int y_stride, int col, int k,
                                                        float eps) {
    const int lane = threadIdx.x & 31;
    const int part = threadIdx.x >> 5;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int g = 0; g < NR; ++g) acc[r][g] = warp_sum(acc[r][g]);
    if (first_col) {
#pragma unroll
        for (int r = 0; r < R; ++r) ss[r] = warp_sum(ss[r]);
    }
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
#pragma unroll
            for (int g = 0; g < NR; ++g) sums[part][r * NR + g] = acc[r][g];
            if (first_col) ssq[part][r] = ss[r];
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
            if (first_col) rn[r] = rsqrtf((ssq[0][r] + ssq[1][r] + ssq[2][r] + ssq[3][r]) / (float)k + eps);
            float t[NR];
#pragma unroll
            for (int g = 0; g < NR; ++g) {
                t[g] = 0.0f;
#pragma unroll
                for (int s = 0; s < 4; ++s) t[g] += sums[s][r * NR + g];
                t[g] *= rn[r];
            }
            gemv_epilogue<EPI>(y + (size_t)r * (size_t)y_stride + col, t[0], t[NR - 1]);
        }
    }
}

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

// The prefetched form (`_p4_d`, `_p4_silu_d`): gemv.cu's `_p4` blocks (block b owns the nc =
// dynamic shared bytes / (NR * 2k) columns from b * nc, whose W rows it bulk-copies into shared
// memory before its PDL wait) with the deferred norm above: after the wait each block loads its
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

// Calls f(std::integral_constant<int, R>{}) for R = rows in 1..2 (a thread keeps its pieces of every
// row in registers); other row counts write nothing, after the PDL wait.
template <typename F>
static __device__ __forceinline__ void defer_with_rows(int rows, F&& f) {
    if (rows == 1) {
        f(std::integral_constant<int, 1>{});
    } else if (rows == 2) {
        f(std::integral_constant<int, 2>{});
    } else {
        kern_pdl_launch_dependents();
        kern_pdl_wait();  // NOTE: so that the grid completes only after the launch before it
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
