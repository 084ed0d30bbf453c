// bf16 GEMV for batch-1 decode: y[r, c] = sum_k x[r, k] * W[c, k] for r < rows (1..4).
//
// W is the Hugging Face Linear weight, bf16 row-major [n, k] (the `W` of extern:cublaslt_bf16_tn);
// x is bf16 [rows, k] with row stride k; y is bf16 [rows, *] with row stride `y_stride` elements,
// so a launch can write one column band of a wider output. f32 accumulation, one rounding to bf16.
// k must be a multiple of 8 and x / W 16-byte aligned; rows outside 1..4 write nothing.
//
// Layout of the work: the block's GEMV_WARPS warps form groups of GEMV_SPLIT warps; each group owns
// GEMV_RPW consecutive output columns (rows of W). Lane l of warp s of a group streams the 16-byte
// pieces s * 32 + l, (s + GEMV_SPLIT) * 32 + l, ... of each of its W rows, GEMV_UNROLL pieces per
// W row in flight before any is consumed, with ld.global.nc.L1::no_allocate so the W stream does
// not evict x from L1; x is read through the read-only path (it stays in L1 / L2: it is at most
// 4 * k bf16). Each lane keeps rows * GEMV_RPW f32 partial sums; a warp shuffle reduces them, and
// with GEMV_SPLIT > 1 the group's warps add their sums through shared memory in warp order.
// Grid [ceil_div(n, GEMV_WARPS / GEMV_SPLIT * GEMV_RPW), 1, 1], block [GEMV_WARPS * 32, 1, 1].
//
// NOTE: the GEMV_* macros are fixed for the built cubin (docs/qwen3.md gives the grid with these
// values); tools/tests/helpers/time_gemv.py builds other values only to compare them, and
// tools/tests/test_gemv_gpu.py checks those builds too.
#include "kern_common.cuh"

#ifndef GEMV_WARPS
#define GEMV_WARPS 4
#endif
#ifndef GEMV_RPW
#define GEMV_RPW 1
#endif
#ifndef GEMV_UNROLL
#define GEMV_UNROLL 4
#endif
#ifndef GEMV_SPLIT
#define GEMV_SPLIT 1
#endif

static_assert(GEMV_WARPS % GEMV_SPLIT == 0, "GEMV_SPLIT must divide GEMV_WARPS");

// A 16-byte streaming load of read-only data that is used once: no L1 allocation.
static __device__ __forceinline__ uint4 ld_stream(const bf16* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

template <int R, bool ACC>
static __device__ __forceinline__ void gemv_rows(const bf16* __restrict__ x,
                                                 const bf16* __restrict__ w,
                                                 bf16* __restrict__ y, int n, int k,
                                                 int y_stride) {
    constexpr int GROUPS = GEMV_WARPS / GEMV_SPLIT;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int part = warp % GEMV_SPLIT;
    const int col0 = (blockIdx.x * GROUPS + warp / GEMV_SPLIT) * GEMV_RPW;
#if GEMV_SPLIT == 1
    if (col0 >= n) return;
#endif

    const bf16* wr[GEMV_RPW];
#pragma unroll
    for (int j = 0; j < GEMV_RPW; ++j) {
        // Columns past n (the last group's tail) re-read column n - 1 and are not stored; with
        // GEMV_SPLIT > 1 every warp reaches the barrier below, so no warp leaves early.
        const int c = min(col0 + j, n - 1);
        wr[j] = w + (size_t)c * (size_t)k;
    }

    float acc[R][GEMV_RPW];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int j = 0; j < GEMV_RPW; ++j) acc[r][j] = 0.0f;

    constexpr int STEP = 256 * GEMV_SPLIT;  // elements between a lane's consecutive pieces
    for (int base = (part * 32 + lane) * 8; base < k; base += STEP * GEMV_UNROLL) {
        uint4 wv[GEMV_UNROLL][GEMV_RPW];
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; ++u) {
            const int idx = base + u * STEP;
#pragma unroll
            for (int j = 0; j < GEMV_RPW; ++j)
                wv[u][j] = idx < k ? ld_stream(wr[j] + idx) : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; ++u) {
            const int idx = base + u * STEP;
            if (idx < k) {
                float wf[GEMV_RPW][8];
#pragma unroll
                for (int j = 0; j < GEMV_RPW; ++j) unpack8(wv[u][j], wf[j]);
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    float xf[8];
                    unpack8(__ldg(reinterpret_cast<const uint4*>(x + (size_t)r * k + idx)), xf);
#pragma unroll
                    for (int j = 0; j < GEMV_RPW; ++j)
#pragma unroll
                        for (int e = 0; e < 8; ++e) acc[r][j] = fmaf(xf[e], wf[j][e], acc[r][j]);
                }
            }
        }
    }

#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int j = 0; j < GEMV_RPW; ++j) acc[r][j] = warp_sum(acc[r][j]);

#if GEMV_SPLIT > 1
    __shared__ float sums[GEMV_WARPS][R * GEMV_RPW];
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int j = 0; j < GEMV_RPW; ++j) sums[warp][r * GEMV_RPW + j] = acc[r][j];
    }
    __syncthreads();
    if (part != 0 || col0 >= n) return;
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int j = 0; j < GEMV_RPW; ++j) {
                float t = 0.0f;
#pragma unroll
                for (int s = 0; s < GEMV_SPLIT; ++s) t += sums[warp + s][r * GEMV_RPW + j];
                acc[r][j] = t;
            }
    }
#endif

    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int j = 0; j < GEMV_RPW; ++j) {
                if (col0 + j >= n) continue;
                bf16* out = y + (size_t)r * (size_t)y_stride + col0 + j;
                *out = ACC ? to_bf(to_f(*out) + acc[r][j]) : to_bf(acc[r][j]);
            }
    }
}

template <bool ACC>
static __device__ __forceinline__ void gemv(const bf16* __restrict__ x,
                                            const bf16* __restrict__ w, bf16* __restrict__ y,
                                            int rows, int n, int k, int y_stride) {
    switch (rows) {
        case 1: gemv_rows<1, ACC>(x, w, y, n, k, y_stride); break;
        case 2: gemv_rows<2, ACC>(x, w, y, n, k, y_stride); break;
        case 3: gemv_rows<3, ACC>(x, w, y, n, k, y_stride); break;
        case 4: gemv_rows<4, ACC>(x, w, y, n, k, y_stride); break;
        default: break;
    }
}

// y[r, c] = bf16(sum_k x[r, k] * W[c, k]).
extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)
    kern_gemv_bf16(const bf16* __restrict__ x, const bf16* __restrict__ w, bf16* __restrict__ y,
                   int rows, int n, int k, int y_stride) {
    gemv<false>(x, w, y, rows, n, k, y_stride);
}

// y[r, c] = bf16(f32(y[r, c]) + sum_k x[r, k] * W[c, k]): one rounding (a fused residual add).
extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)
    kern_gemv_bf16_acc(const bf16* __restrict__ x, const bf16* __restrict__ w,
                       bf16* __restrict__ y, int rows, int n, int k, int y_stride) {
    gemv<true>(x, w, y, rows, n, k, y_stride);
}
