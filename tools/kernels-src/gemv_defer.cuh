// GEMVs with the add + RMSNorm before them deferred to their epilogue (`_d`; the band forms of
// gemv_defer.cu, the lab's prefetched forms in gemv_defer_p4.cu): RMSNorm's scale r
// is one number per row, so W (h * r * w_norm) = r * (W (h * w_norm)). Where gemv_norm.cuh's
// prologue must finish the norm (sum of squares, block reduction, x into shared memory) before a
// block's first FMA, here a block, after its PDL wait, loads its threads' pieces of h =
// bf16(res_in + y_add) (kern_add_rmsnorm's rounding of the residual) and keeps bf16(h * w_norm) in
// registers, then streams its band of columns against them at once; the sum of squares of h
// reduces across the block at the first column's barrier, and the epilogue multiplies each column
// sum by r = rsqrt(mean(h^2) + eps). Not the bits of kern_add_rmsnorm + the GEMV (x = bf16(bf16(h r)
// w) there, bf16(h w) r here: one rounding fewer; and another summation order for the sum of
// squares): the GPU test bounds it against a float64 reference. The block that owns column 0 writes h to res_out (another
// buffer than res_in).
//
// Layout: block b owns the columns [b * n / grid, (b + 1) * n / grid) (gemv_band_rows' bands); its 4
// warps split k as kern_gemv_bf16_s4 does (lane l of warp s takes pieces s * 32 + l + 128 j, j <
// DEFER_MAXP), so a thread's pieces of h are the same for every column; the next column's W pieces
// are loaded before the current column is summed (two columns in flight per thread).
// rows 1..2 (a thread keeps its pieces of every row in registers: the decode step has one row);
// k % 8 == 0 and k <= 1024 * DEFER_MAXP (4096); otherwise the launch writes nothing.
// Grid [any, 1, 1] (kern_qwen3 sizes it to one resident wave: at least 4 blocks per SM fit), block
// [128, 1, 1], no dynamic shared memory.
#pragma once
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
