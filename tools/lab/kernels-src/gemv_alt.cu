// GEMV configurations and layouts the decode step does not launch: kern_qwen3's picks were measured
// against them (tools/lab/notes/kernel-experiments.md). Built against the product's gemv.cuh (its
// layout, loads, epilogues and bulk copies are described there); kern_lab's ALT_ENTRIES mirrors the
// entries' launch shapes.
//
// Entries (the configuration is part of the entry):
//   kern_gemv_bf16, kern_gemv_bf16_acc   the GEMV_* macros below (4, 1, 4, 1 as built)
//   kern_gemv_bf16_s2                    2 columns per block, 2 warps share each (SPLIT 2)
//   kern_gemv_bf16_s8                    8 warps (256 threads) share one column (SPLIT 8)
//   kern_gemv_bf16_c2                    4 warps, 2 columns each
//   kern_gemv_bf16_q4, _s2q4, _s4q4      each group streams 4 columns one after another (the next
//                                        column's first loads issued before the current one's sums)
//   kern_gemv_bf16_b4_silu               gemv.cu's balanced bands with kern_gemv_bf16_silu's epilogue
//   kern_gemv_bf16_tma, _tma_silu        W through a shared-memory ring filled by bulk copies
//                                        ("Streaming GEMV" below; measured slower, docs/kernels.md)
//   kern_gemv_bf16_d4, _d8, _d4_silu     the balanced bands with 4 or 8 units of W loads in flight per
//                                        lane ("Deep bands" below)
//   kern_gemv_bf16_p4_silu               gemv.cu's prefetched GEMV with the SiLU epilogue
//
// NOTE: the GEMV_* macros are fixed for the built cubin; tools/lab/time_gemv.py builds other values
// only to compare them, and tools/lab/tests/test_gemv_alt_gpu.py checks those builds too.
#include "gemv.cuh"

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
        float acc[R][1];
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r][0] = 0.0f;
        for (int base = first; base < k; base += ROUND) {
            uint4 cur[UNROLL][1];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) cur[u][0] = wv[u][0];
            if (base + ROUND < k) {
                gemv_load<UNROLL, 1, STEP>(wv, row, base + ROUND, k);
            } else if (c + 1 < SEQ) {
                gemv_load<UNROLL, 1, STEP>(wv, next, first, k);
            }
            gemv_fma_round<UNROLL, 1, STEP, R>(acc, cur, x, base, k);
        }
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r][0] = warp_sum(acc[r][0]);
        if constexpr (SPLIT > 1) {
            // NOTE: two buffers: column c + 2 writes c's buffer only after column c + 1's barrier,
            // which the reader of column c passes after its reads.
            __shared__ float sums[2][WARPS][R];
            if (lane == 0) {
#pragma unroll
                for (int r = 0; r < R; ++r) sums[c & 1][warp][r] = acc[r][0];
            }
            __syncthreads();
            if (part == 0 && lane == 0) {
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    float t = 0.0f;
#pragma unroll
                    for (int s = 0; s < SPLIT; ++s) t += sums[c & 1][warp + s][r];
                    acc[r][0] = t;
                }
            }
        }
        if (part == 0 && lane == 0 && colg + c < n) {
#pragma unroll
            for (int r = 0; r < R; ++r) y[(size_t)r * (size_t)y_stride + colg + c] = to_bf(acc[r][0]);
        }
    }
}

template <int WARPS, int SEQ, int UNROLL, int SPLIT>
static __device__ __forceinline__ void gemv_seq(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                                bf16* __restrict__ y, int rows, int n, int k,
                                                int y_stride) {
    with_rows(rows, [&](auto r) {
        gemv_seq_rows<WARPS, SEQ, UNROLL, SPLIT, decltype(r)::value>(x, w, y, n, k, y_stride);
    });
}


// Deep bands: the balanced bands above with more W in flight. A column's k is cut into segments
// of PPL pieces per lane (SEG = PPL * STEP elements); the block walks the units (column, segment)
// of its band in order and keeps D units' loads in flight in a ring of registers, so a block has
// D * PPL pieces per lane outstanding (the band entry has at most two columns' worth, ~2.5 pieces
// each at k = 2560: too few to cover DRAM latency at one resident wave). The summation order of a
// column is `_s4`'s (each lane adds its pieces in increasing order across segments, then the warp
// shuffle, then the SPLIT warps in warp order): the same bits as `gemv_band_rows` and `_s<SPLIT>`.
// Grid [any, 1, 1], block [SPLIT * 32, 1, 1].
template <int SPLIT, int D, int PPL, int EPI, int R>
static __device__ __forceinline__ void gemv_deep_rows(const bf16* __restrict__ x,
                                                      const bf16* __restrict__ w,
                                                      bf16* __restrict__ y, int n, int k,
                                                      int y_stride) {
    constexpr int NR = EPI == GEMV_SILU ? 2 : 1;
    constexpr int STEP = 256 * SPLIT;
    constexpr int SEG = STEP * PPL;
    const int lane = threadIdx.x & 31;
    const int part = threadIdx.x >> 5;
    const int c0 = (int)((int64_t)blockIdx.x * n / gridDim.x);
    const int c1 = (int)((int64_t)(blockIdx.x + 1) * n / gridDim.x);
    kern_pdl_launch_dependents();
    if (c0 >= c1) return;  // block-uniform: more blocks than columns
    const int segs = (k + SEG - 1) / SEG;
    const int units = (c1 - c0) * segs;
    const int first = (part * 32 + lane) * 8;
    // Unit u: column c0 + u / segs, pieces first + (u % segs) * SEG + p * STEP for p < PPL.
    auto load_unit = [&](uint4 (&buf)[PPL][NR], int u) {
        if (u >= units) return;  // block-uniform
        const int c = c0 + u / segs;
        const int base = first + (u % segs) * SEG;
#pragma unroll
        for (int p = 0; p < PPL; ++p) {
            const int idx = base + p * STEP;
#pragma unroll
            for (int g = 0; g < NR; ++g)
                buf[p][g] = idx < k ? ld_stream(w + ((size_t)g * n + c) * (size_t)k + idx)
                                    : make_uint4(0u, 0u, 0u, 0u);
        }
    };
    uint4 ring[D][PPL][NR];
#pragma unroll
    for (int i = 0; i < D; ++i) load_unit(ring[i], i);
    // NOTE: weights are read before the wait (no launch of a step writes them); x and y after.
    kern_pdl_wait();
    __shared__ float sums[2][SPLIT][R * NR];
    float acc[R][NR];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int g = 0; g < NR; ++g) acc[r][g] = 0.0f;
#pragma unroll 1
    for (int u0 = 0; u0 < units; u0 += D) {
#pragma unroll
        for (int i = 0; i < D; ++i) {
            const int u = u0 + i;
            if (u >= units) break;  // block-uniform
            const int seg = u % segs;
            const int base = first + seg * SEG;
            gemv_fma_round<PPL, NR, STEP, R>(acc, ring[i], x, base, k);
            // The slot is consumed: refill it D units ahead (D - 1 units stay in flight meanwhile).
            load_unit(ring[i], u + D);
            if (seg == segs - 1) {
                const int c = c0 + u / segs;
#pragma unroll
                for (int r = 0; r < R; ++r)
#pragma unroll
                    for (int g = 0; g < NR; ++g) acc[r][g] = warp_sum(acc[r][g]);
                // NOTE: two buffers: column c + 2 writes c's buffer only after column c + 1's
                // barrier, which the reader of column c passes after its reads.
                if (lane == 0) {
#pragma unroll
                    for (int r = 0; r < R; ++r)
#pragma unroll
                        for (int g = 0; g < NR; ++g) sums[c & 1][part][r * NR + g] = acc[r][g];
                }
                __syncthreads();
                if (part == 0 && lane == 0) {
#pragma unroll
                    for (int r = 0; r < R; ++r) {
                        float t[NR];
#pragma unroll
                        for (int g = 0; g < NR; ++g) {
                            t[g] = 0.0f;
#pragma unroll
                            for (int s = 0; s < SPLIT; ++s) t[g] += sums[c & 1][s][r * NR + g];
                        }
                        gemv_epilogue<EPI>(y + (size_t)r * (size_t)y_stride + c, t[0], t[NR - 1]);
                    }
                }
#pragma unroll
                for (int r = 0; r < R; ++r)
#pragma unroll
                    for (int g = 0; g < NR; ++g) acc[r][g] = 0.0f;
            }
        }
    }
}

template <int SPLIT, int D, int PPL, int EPI>
static __device__ __forceinline__ void gemv_deep(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                                 bf16* __restrict__ y, int rows, int n, int k,
                                                 int y_stride) {
    with_rows(rows, [&](auto r) {
        gemv_deep_rows<SPLIT, D, PPL, EPI, decltype(r)::value>(x, w, y, n, k, y_stride);
    });
}

// ------------------------------------------------------------------------------------------------
// Streaming GEMV: W flows through a ring of shared-memory stages filled by bulk asynchronous copies
// (cp.async.bulk, the TMA's 1-D form), so each SM keeps up to the whole ring in flight instead of
// a few 16-byte loads per thread, and a block issues its first NST stages before kern_pdl_wait:
// with PDL most of a short-n GEMV's weights arrive while the previous launches still run.
//
// A stage holds `cps` output columns (cps = max(1, TMA_STAGE_CAP / (NR * 2k))): for each of the
// NR row groups (1; the SiLU form's gate and up rows) the cps consecutive W rows, one contiguous
// bulk copy each. The n columns form ceil(n / cps) units; block b takes the contiguous units
// [b * units / grid, (b + 1) * units / grid), so each SM streams one contiguous band of W. The ring
// has NST = min(TMA_MAX_STAGES, ring bytes / stage bytes) stages, each with an mbarrier whose
// transaction count the copies complete; a stage is refilled after all warps passed the barrier
// that ends its use. A stage is consumed in two passes with no shuffles on the long side: thread t
// takes the 16-byte pieces t, t + 512, ... of the stage (any row), multiplies each with the
// matching 8 elements of x and stores that piece's partial (one f32 per x row) in shared memory;
// then one warp per column sums the pieces of its W row(s) in a fixed order (lane l takes pieces
// l, l + 32, ...; a warp shuffle adds the lanes) and applies the epilogue. So every column's sum
// has the same order whatever the grid: deterministic. x (rows x k bf16, written by the previous
// launch) is read with ordinary loads after the wait and stays in L1. A launch whose dynamic
// shared memory holds no stage writes nothing (kern_qwen3 sizes both). Grid [any, 1, 1]
// (one block per SM is the intent), block [512], dynamic shared memory TMA_SMEM bytes (kern_qwen3's
// GEMV_TMA_SMEM), split into the ring and the partials (stage bytes / 16 * rows f32).

// NOTE: GEMV_TMA_CAP / GEMV_TMA_COPY / GEMV_TMA_HINT are fixed for the built cubin; time_gemv.py
// --tma builds other values only to compare them.
#ifndef GEMV_TMA_CAP
#define GEMV_TMA_CAP 32768
#endif
#ifndef GEMV_TMA_COPY
#define GEMV_TMA_COPY 0
#endif
constexpr int TMA_WARPS = 16;
constexpr int TMA_MAX_STAGES = 16;
constexpr int TMA_STAGE_CAP = GEMV_TMA_CAP;
constexpr int TMA_COPY = GEMV_TMA_COPY;  // bytes per bulk copy (0: one copy per row group)


template <int EPI, int R>
static __device__ __forceinline__ void gemv_tma_rows(const bf16* __restrict__ x,
                                                     const bf16* __restrict__ w,
                                                     bf16* __restrict__ y, int n, int k,
                                                     int y_stride) {
    constexpr int NR = EPI == GEMV_SILU ? 2 : 1;
    constexpr int THREADS = TMA_WARPS * 32;
    extern __shared__ __align__(128) unsigned char tma_ring[];
    __shared__ __align__(8) uint64_t bars[TMA_MAX_STAGES];
    kern_pdl_launch_dependents();

    const int64_t row_bytes = (int64_t)k * 2;
    const int cps = (int)max((int64_t)1, TMA_STAGE_CAP / (NR * row_bytes));
    const int64_t stage_bytes = cps * NR * row_bytes;
    const int64_t stage_pieces = stage_bytes / 16;
    const int64_t part_bytes = stage_pieces * R * 4;
    const int64_t ring_bytes = (int64_t)dynamic_smem_bytes() - part_bytes;
    const int nst = ring_bytes < stage_bytes ? 0 : (int)min((int64_t)TMA_MAX_STAGES, ring_bytes / stage_bytes);
    const int64_t units = (n + cps - 1) / cps;
    const int u0 = (int)(blockIdx.x * units / gridDim.x);
    const int count = (int)((blockIdx.x + 1) * units / gridDim.x) - u0;
    if (nst < 1 || count < 1) return;

    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int pieces = k / 8;  // per W row
    float* part = reinterpret_cast<float*>(tma_ring + nst * stage_bytes);  // part[r * stage_pieces + i]
    const uint32_t ring = smem_addr(tma_ring);
    const uint32_t bar0 = smem_addr(bars);
    const uint64_t policy = l2_evict_first();

    // Fills stage (i % nst) with unit u0 + i: NR bulk copies, one per row group.
    auto issue = [&](int i) {
        const int s = i % nst;
        const int c0 = (u0 + i) * cps;
        const int cols = min(cps, n - c0);
        const uint32_t bytes = (uint32_t)(cols * row_bytes);
        const uint32_t bar = bar0 + 8 * s;
        mbar_expect_tx(bar, NR * bytes);
#pragma unroll
        for (int g = 0; g < NR; ++g) {
            const uint32_t dst = ring + (uint32_t)(s * stage_bytes + g * cps * row_bytes);
            const char* src = reinterpret_cast<const char*>(w + ((int64_t)g * n + c0) * k);
            if constexpr (TMA_COPY > 0) {
                for (uint32_t off = 0; off < bytes; off += TMA_COPY)
                    bulk_g2s(dst + off, src + off, min((uint32_t)TMA_COPY, bytes - off), bar, policy);
            } else {
                bulk_g2s(dst, src, bytes, bar, policy);
            }
        }
    };

    if (threadIdx.x == 0) {
        for (int s = 0; s < nst; ++s) mbar_init(bar0 + 8 * s, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    // NOTE: weights are read before the wait (no launch of a step writes them); x and y after.
    if (threadIdx.x == 0)
        for (int i = 0; i < min(nst, count); ++i) issue(i);
    kern_pdl_wait();

    for (int i = 0; i < count; ++i) {
        const int s = i % nst;
        const int c0 = (u0 + i) * cps;
        const int cols = min(cps, n - c0);
        const uint4* stage = reinterpret_cast<const uint4*>(tma_ring + s * stage_bytes);
        mbar_wait(bar0 + 8 * s, (uint32_t)((i / nst) & 1));
        // Pass 1: one partial per (x row, piece) of the `cols` live rows of each row group.
        const int live = cols * pieces;
#pragma unroll
        for (int g = 0; g < NR; ++g) {
            const int base = g * cps * pieces;
#pragma unroll 4
            for (int q = threadIdx.x; q < live; q += THREADS) {
                float wf[8];
                unpack8(stage[base + q], wf);
                const int kp = (q % pieces) * 8;
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    float xf[8];
                    unpack8(*reinterpret_cast<const uint4*>(x + (int64_t)r * k + kp), xf);
                    float d = 0.0f;
#pragma unroll
                    for (int e = 0; e < 8; ++e) d = fmaf(xf[e], wf[e], d);
                    part[r * stage_pieces + base + q] = d;
                }
            }
        }
        __syncthreads();
        // Pass 2: warp j sums column j's W row(s), lanes in a fixed order, then the epilogue.
        for (int j = warp; j < cols; j += TMA_WARPS) {
            float acc[R][NR];
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int g = 0; g < NR; ++g) {
                    const float* row = part + r * stage_pieces + ((int64_t)g * cps + j) * pieces;
                    float a = 0.0f;
                    for (int p = lane; p < pieces; p += 32) a += row[p];
                    acc[r][g] = warp_sum(a);
                }
            if (lane == 0) {
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    gemv_epilogue<EPI>(y + (int64_t)r * y_stride + c0 + j, acc[r][0], acc[r][NR - 1]);
                }
            }
        }
        // Every warp is done with stage s and with `part`: refill the stage.
        __syncthreads();
        if (threadIdx.x == 0 && i + nst < count) issue(i + nst);
    }
}

template <int EPI>
static __device__ __forceinline__ void gemv_tma(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                                bf16* __restrict__ y, int rows, int n, int k,
                                                int y_stride) {
    with_rows(rows, [&](auto r) {
        gemv_tma_rows<EPI, decltype(r)::value>(x, w, y, n, k, y_stride);
    });
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

// kern_gemv_bf16_b4_silu's arithmetic (the same bits) with each block's gate and up rows copied
// into shared memory before the PDL wait (W [2n, k]: gate rows, then up rows). Grid
// [ceil_div(n, nc), 1, 1], block [128, 1, 1], dynamic shared memory nc * 2 * 2k bytes.
extern "C" __global__ void __launch_bounds__(128)
    kern_gemv_bf16_p4_silu(const bf16* __restrict__ x, const bf16* __restrict__ w,
        bf16* __restrict__ y, int rows, int n, int k, int y_stride) {
    with_rows(rows, [&](auto r) { gemv_p4_rows<GEMV_SILU, decltype(r)::value>(x, w, y, n, k, y_stride); });
}
