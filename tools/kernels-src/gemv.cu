// bf16 GEMV for batch-1 decode: y[r, c] = sum_k x[r, k] * W[c, k] for r < rows (1..4).
//
// W is the Hugging Face Linear weight, bf16 row-major [n, k] (the `W` of extern:cublaslt_bf16_tn);
// x is bf16 [rows, k] with row stride k; y is bf16 [rows, *] with row stride `y_stride` elements,
// so a launch can write one column band of a wider output. f32 accumulation, one rounding to bf16.
// k must be a multiple of 8 and x / W 16-byte aligned; rows outside 1..4 write nothing.
//
// Layout of the work (a configuration WARPS, COLS, UNROLL, SPLIT): the block's WARPS warps form
// groups of SPLIT warps; each group owns COLS consecutive output columns (rows of W). Lane l of
// warp s of a group streams the 16-byte pieces s * 32 + l, (s + SPLIT) * 32 + l, ... of each of its
// W rows, UNROLL pieces per W row per round, the next round's loads issued before the current
// round is consumed (two rounds in flight), with ld.global.nc.L1::no_allocate so the W stream does
// not evict x from L1; x (at most 4 * k bf16, written by the previous launch) is read with
// ordinary loads after kern_pdl_wait and stays in L1 / L2. Each lane keeps rows * COLS f32 partial sums; a warp shuffle reduces them, and with
// SPLIT > 1 the group's warps add their sums through shared memory in warp order.
// Grid [ceil_div(n, WARPS / SPLIT * COLS), 1, 1], block [WARPS * 32, 1, 1].
//
// PDL: every block first lets the next launch start, issues its first round of W loads (weights
// are never written by a decode step), then waits for the previous launch (kern_pdl_wait) before
// it reads x or touches y.
//
// Entries (the configuration is part of the entry; tools/gen_qwen3.py's GEMV_ENTRIES mirrors it):
//   kern_gemv_bf16, kern_gemv_bf16_acc   the GEMV_* macros below (4, 1, 4, 1 as built)
//   kern_gemv_bf16_s2                    2 columns per block, 2 warps share each (SPLIT 2)
//   kern_gemv_bf16_s4                    4 warps share one column (SPLIT 4): short n, long k
//   kern_gemv_bf16_s8                    8 warps (256 threads) share one column (SPLIT 8)
//   kern_gemv_bf16_c2                    4 warps, 2 columns each
//   kern_gemv_bf16_q4, _s2q4, _s4q4      each group streams 4 columns one after another (the next
//                                        column's first loads issued before the current one's sums)
//   kern_gemv_bf16_silu                  the gate/up GEMV with SiLU-and-mul in its epilogue
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

// What the group does with its column sums.
enum GemvEpilogue {
    GEMV_STORE = 0,  // y = bf16(sum)
    GEMV_ACC = 1,    // y = bf16(f32(y) + sum)
    GEMV_SILU = 2,   // y[c] = bf16(bf16(silu(bf16(g))) * bf16(u)), g / u from W rows c / n + c
};

// A 16-byte streaming load of read-only data that is used once: no L1 allocation.
static __device__ __forceinline__ uint4 ld_stream(const bf16* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// A 16-byte load of data an earlier launch wrote (x): an ordinary, coherent load issued only
// after kern_pdl_wait (never the non-coherent path, which assumes data fixed for the grid's life).
static __device__ __forceinline__ uint4 ld_after_wait(const bf16* p) {
    uint4 v;
    asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

template <int UNROLL, int NR, int STEP>
static __device__ __forceinline__ void gemv_load(uint4 (&wv)[UNROLL][NR], const bf16* const (&wr)[NR],
                                                 int base, int k) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        const int idx = base + u * STEP;
#pragma unroll
        for (int j = 0; j < NR; ++j)
            wv[u][j] = idx < k ? ld_stream(wr[j] + idx) : make_uint4(0u, 0u, 0u, 0u);
    }
}

template <int WARPS, int COLS, int UNROLL, int SPLIT, int EPI, int R>
static __device__ __forceinline__ void gemv_rows(const bf16* __restrict__ x,
                                                 const bf16* __restrict__ w,
                                                 bf16* __restrict__ y, int n, int k,
                                                 int y_stride) {
    static_assert(WARPS % SPLIT == 0, "SPLIT must divide WARPS");
    constexpr int NR = EPI == GEMV_SILU ? 2 * COLS : COLS;  // W rows a group streams
    constexpr int GROUPS = WARPS / SPLIT;
    constexpr int STEP = 256 * SPLIT;  // elements between a lane's consecutive pieces
    constexpr int ROUND = STEP * UNROLL;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int part = warp % SPLIT;
    const int col0 = (blockIdx.x * GROUPS + warp / SPLIT) * COLS;
    kern_pdl_launch_dependents();
    if (SPLIT == 1 && col0 >= n) return;

    const bf16* wr[NR];
#pragma unroll
    for (int j = 0; j < NR; ++j) {
        // Columns past n (the last group's tail) re-read column n - 1 and are not stored; with
        // SPLIT > 1 every warp reaches the barrier below, so no warp leaves early.
        const int c = min(col0 + j % COLS, n - 1) + (j / COLS) * n;
        wr[j] = w + (size_t)c * (size_t)k;
    }

    float acc[R][NR];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int j = 0; j < NR; ++j) acc[r][j] = 0.0f;

    const int first = (part * 32 + lane) * 8;
    uint4 wv[UNROLL][NR];
    gemv_load<UNROLL, NR, STEP>(wv, wr, first, k);
    // NOTE: weights are read before the wait (no launch of a step writes them); x and y after.
    kern_pdl_wait();
    for (int base = first; base < k; base += ROUND) {
        uint4 cur[UNROLL][NR];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
#pragma unroll
            for (int j = 0; j < NR; ++j) cur[u][j] = wv[u][j];
        if (base + ROUND < k) gemv_load<UNROLL, NR, STEP>(wv, wr, base + ROUND, k);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int idx = base + u * STEP;
            if (idx < k) {
                float wf[NR][8];
#pragma unroll
                for (int j = 0; j < NR; ++j) unpack8(cur[u][j], wf[j]);
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    float xf[8];
                    unpack8(ld_after_wait(x + (size_t)r * k + idx), xf);
#pragma unroll
                    for (int j = 0; j < NR; ++j)
#pragma unroll
                        for (int e = 0; e < 8; ++e) acc[r][j] = fmaf(xf[e], wf[j][e], acc[r][j]);
                }
            }
        }
    }

#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int j = 0; j < NR; ++j) acc[r][j] = warp_sum(acc[r][j]);

    if constexpr (SPLIT > 1) {
        __shared__ float sums[WARPS][R * NR];
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int j = 0; j < NR; ++j) sums[warp][r * NR + j] = acc[r][j];
        }
        __syncthreads();
        if (part != 0 || col0 >= n) return;
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int j = 0; j < NR; ++j) {
                    float t = 0.0f;
#pragma unroll
                    for (int s = 0; s < SPLIT; ++s) t += sums[warp + s][r * NR + j];
                    acc[r][j] = t;
                }
        }
    }

    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int j = 0; j < COLS; ++j) {
                if (col0 + j >= n) continue;
                bf16* out = y + (size_t)r * (size_t)y_stride + col0 + j;
                if constexpr (EPI == GEMV_ACC) {
                    *out = to_bf(to_f(*out) + acc[r][j]);
                } else if constexpr (EPI == GEMV_SILU) {
                    const float g = bf(acc[r][j]);
                    const float u = bf(acc[r][j + COLS]);
                    *out = to_bf(bf(g / (1.0f + expf(-g))) * u);
                } else {
                    *out = to_bf(acc[r][j]);
                }
            }
    }
}

template <int WARPS, int COLS, int UNROLL, int SPLIT, int EPI>
static __device__ __forceinline__ void gemv(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                            bf16* __restrict__ y, int rows, int n, int k,
                                            int y_stride) {
    switch (rows) {
        case 1: gemv_rows<WARPS, COLS, UNROLL, SPLIT, EPI, 1>(x, w, y, n, k, y_stride); break;
        case 2: gemv_rows<WARPS, COLS, UNROLL, SPLIT, EPI, 2>(x, w, y, n, k, y_stride); break;
        case 3: gemv_rows<WARPS, COLS, UNROLL, SPLIT, EPI, 3>(x, w, y, n, k, y_stride); break;
        case 4: gemv_rows<WARPS, COLS, UNROLL, SPLIT, EPI, 4>(x, w, y, n, k, y_stride); break;
        default: break;
    }
}

// Sequential columns: each group of SPLIT warps streams SEQ consecutive columns one after another
// (plain store epilogue). The loads of the next column's first round are issued before the current
// column is consumed, so a group keeps two rounds in flight across its columns, and a block lives
// SEQ times as long as a one-column block (fewer, longer blocks for short-n shapes).
// Grid [ceil_div(n, WARPS / SPLIT * SEQ), 1, 1], block [WARPS * 32, 1, 1].
template <int WARPS, int SEQ, int UNROLL, int SPLIT, int R>
static __device__ __forceinline__ void gemv_seq_rows(const bf16* __restrict__ x,
                                                     const bf16* __restrict__ w,
                                                     bf16* __restrict__ y, int n, int k,
                                                     int y_stride) {
    static_assert(WARPS % SPLIT == 0, "SPLIT must divide WARPS");
    constexpr int GROUPS = WARPS / SPLIT;
    constexpr int STEP = 256 * SPLIT;
    constexpr int ROUND = STEP * UNROLL;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int part = warp % SPLIT;
    const int colg = (blockIdx.x * GROUPS + warp / SPLIT) * SEQ;
    kern_pdl_launch_dependents();
    if (SPLIT == 1 && colg >= n) return;
    const int first = (part * 32 + lane) * 8;
    // NOTE: columns past n re-read column n - 1 and are not stored (every warp reaches the barriers).
    const bf16* row0[1] = {w + (size_t)min(colg, n - 1) * (size_t)k};
    uint4 wv[UNROLL][1];
    gemv_load<UNROLL, 1, STEP>(wv, row0, first, k);
    kern_pdl_wait();
#pragma unroll 1
    for (int c = 0; c < SEQ; ++c) {
        const bf16* row[1] = {w + (size_t)min(colg + c, n - 1) * (size_t)k};
        const bf16* next[1] = {w + (size_t)min(colg + min(c + 1, SEQ - 1), n - 1) * (size_t)k};
        float acc[R];
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] = 0.0f;
        for (int base = first; base < k; base += ROUND) {
            uint4 cur[UNROLL][1];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) cur[u][0] = wv[u][0];
            if (base + ROUND < k) {
                gemv_load<UNROLL, 1, STEP>(wv, row, base + ROUND, k);
            } else if (c + 1 < SEQ) {
                gemv_load<UNROLL, 1, STEP>(wv, next, first, k);
            }
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                const int idx = base + u * STEP;
                if (idx < k) {
                    float wf[8];
                    unpack8(cur[u][0], wf);
#pragma unroll
                    for (int r = 0; r < R; ++r) {
                        float xf[8];
                        unpack8(ld_after_wait(x + (size_t)r * k + idx), xf);
#pragma unroll
                        for (int e = 0; e < 8; ++e) acc[r] = fmaf(xf[e], wf[e], acc[r]);
                    }
                }
            }
        }
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] = warp_sum(acc[r]);
        if constexpr (SPLIT > 1) {
            // NOTE: two buffers: column c + 2 writes c's buffer only after column c + 1's barrier,
            // which the reader of column c passes after its reads.
            __shared__ float sums[2][WARPS][R];
            if (lane == 0) {
#pragma unroll
                for (int r = 0; r < R; ++r) sums[c & 1][warp][r] = acc[r];
            }
            __syncthreads();
            if (part == 0 && lane == 0) {
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    float t = 0.0f;
#pragma unroll
                    for (int s = 0; s < SPLIT; ++s) t += sums[c & 1][warp + s][r];
                    acc[r] = t;
                }
            }
        }
        if (part == 0 && lane == 0 && colg + c < n) {
#pragma unroll
            for (int r = 0; r < R; ++r) y[(size_t)r * (size_t)y_stride + colg + c] = to_bf(acc[r]);
        }
    }
}

template <int WARPS, int SEQ, int UNROLL, int SPLIT>
static __device__ __forceinline__ void gemv_seq(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                                bf16* __restrict__ y, int rows, int n, int k,
                                                int y_stride) {
    switch (rows) {
        case 1: gemv_seq_rows<WARPS, SEQ, UNROLL, SPLIT, 1>(x, w, y, n, k, y_stride); break;
        case 2: gemv_seq_rows<WARPS, SEQ, UNROLL, SPLIT, 2>(x, w, y, n, k, y_stride); break;
        case 3: gemv_seq_rows<WARPS, SEQ, UNROLL, SPLIT, 3>(x, w, y, n, k, y_stride); break;
        case 4: gemv_seq_rows<WARPS, SEQ, UNROLL, SPLIT, 4>(x, w, y, n, k, y_stride); break;
        default: break;
    }
}

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
