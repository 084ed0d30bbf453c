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
// ordinary loads after kern_pdl_wait and stays in L1 / L2. Each lane keeps rows * COLS f32 partial
// sums; a warp shuffle reduces them, and with SPLIT > 1 the group's warps add their sums through
// shared memory in warp order.
// Grid [ceil_div(n, WARPS / SPLIT * COLS), 1, 1], block [WARPS * 32, 1, 1].
//
// PDL: every block first lets the next launch start, issues its first round of W loads (weights
// are never written by a decode step), then waits for the previous launch (kern_pdl_wait) before
// it reads x or touches y.
//
// Entries of gemv.cu (the configuration is part of the entry; kern_qwen3's GEMV_ENTRIES mirrors it):
//   kern_gemv_bf16_s4                    4 warps share one column (SPLIT 4): short n, long k
//   kern_gemv_bf16_silu                  the gate/up GEMV with SiLU-and-mul in its epilogue
//   kern_gemv_bf16_b4                    one resident wave of blocks, each summing a balanced band
//                                        of columns in `_s4`'s order ("Balanced bands" below)
//   kern_gemv_bf16_p4                    `_s4`'s sums; each block's W rows copied into shared memory
//                                        before the PDL wait ("Prefetched GEMV" below)
// The lab's modules (tools/lab/kernels-src) build other configurations of these layouts and other
// layouts on this device code.
#pragma once
#include "kern_common.cuh"

#include <type_traits>


// What the group does with its column sums.
enum GemvEpilogue {
    GEMV_STORE = 0,  // y = bf16(sum)
    GEMV_ACC = 1,    // y = bf16(f32(y) + sum)
    GEMV_SILU = 2,   // y[c] = bf16(bf16(silu(bf16(g))) * bf16(u)), g / u from W rows c / n + c
};

// Calls f(std::integral_constant<int, R>{}) for R = rows in 1..4 (each layout keeps its x rows'
// sums in registers, so R is a template argument); other row counts write nothing.
template <typename F>
static __device__ __forceinline__ void with_rows(int rows, F&& f) {
    switch (rows) {
        case 1: f(std::integral_constant<int, 1>{}); break;
        case 2: f(std::integral_constant<int, 2>{}); break;
        case 3: f(std::integral_constant<int, 3>{}); break;
        case 4: f(std::integral_constant<int, 4>{}); break;
        default: break;
    }
}

// Writes one output element from its column sum(s): `sum` is x . W[c] (for GEMV_SILU the gate
// row's), `up` the up row's (read by GEMV_SILU only).
template <int EPI>
static __device__ __forceinline__ void gemv_epilogue(bf16* out, float sum, float up) {
    if constexpr (EPI == GEMV_ACC) {
        *out = to_bf(to_f(*out) + sum);
    } else if constexpr (EPI == GEMV_SILU) {
        const float g = bf(sum);
        const float u = bf(up);
        *out = to_bf(bf(g / (1.0f + expf(-g))) * u);
    } else {
        *out = to_bf(sum);
    }
}

// A 16-byte streaming load of read-only data that is used once: no L1 allocation, and L2
// evict-first, so the weight stream does not push out of L2 what the small launches between the
// GEMVs read (the residual, the KV pages): a miss there waits behind the next GEMV's weight
// copies issued before its PDL wait. (The policy has no inputs: the compiler makes it once.)
static __device__ __forceinline__ uint4 ld_stream(const bf16* p) {
    uint64_t policy;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p), "l"(policy));
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

// Adds one round of W pieces (cur[u][j]: piece base + u * STEP of W row j) times x into acc. XS:
// x is in this block's shared memory (gemv_norm.cuh's folded norm), read with ordinary loads.
template <int UNROLL, int NR, int STEP, int R, bool XS = false>
static __device__ __forceinline__ void gemv_fma_round(float (&acc)[R][NR], const uint4 (&cur)[UNROLL][NR],
                                                      const bf16* __restrict__ x, int base, int k) {
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
                if constexpr (XS) {
                    unpack8(*reinterpret_cast<const uint4*>(x + (size_t)r * k + idx), xf);
                } else {
                    unpack8(ld_after_wait(x + (size_t)r * k + idx), xf);
                }
#pragma unroll
                for (int j = 0; j < NR; ++j)
#pragma unroll
                    for (int e = 0; e < 8; ++e) acc[r][j] = fmaf(xf[e], wf[j][e], acc[r][j]);
            }
        }
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
        gemv_fma_round<UNROLL, NR, STEP, R>(acc, cur, x, base, k);
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
                gemv_epilogue<EPI>(y + (size_t)r * (size_t)y_stride + col0 + j, acc[r][j],
                                   acc[r][EPI == GEMV_SILU ? j + COLS : j]);
            }
    }
}

template <int WARPS, int COLS, int UNROLL, int SPLIT, int EPI>
static __device__ __forceinline__ void gemv(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                            bf16* __restrict__ y, int rows, int n, int k,
                                            int y_stride) {
    with_rows(rows, [&](auto r) {
        gemv_rows<WARPS, COLS, UNROLL, SPLIT, EPI, decltype(r)::value>(x, w, y, n, k, y_stride);
    });
}


// Balanced bands: block b owns the output columns [b * n / grid, (b + 1) * n / grid) and its
// SPLIT warps sum them one after another (SPLIT-way split of k, as the `_s4` entry), the next
// column's first loads issued before the current column is reduced. The generator sizes the grid
// to the blocks that are resident at once (GEMV_BAND), so the columns spread over one wave with at
// most one column of imbalance between blocks instead of whole waves of short blocks; the
// summation order of a column is `gemv_rows<SPLIT, 1, UNROLL, SPLIT>`'s (so the same bits as the
// matching `_s<SPLIT>` entry). NR = 2 (SiLU) streams a column's gate and up rows together.
// Grid [any, 1, 1], block [SPLIT * 32, 1, 1].
template <int SPLIT, int UNROLL, int EPI, int R, bool XS = false, typename Prologue = decltype(nullptr)>
static __device__ __forceinline__ void gemv_band_rows(const bf16* __restrict__ x,
                                                      const bf16* __restrict__ w,
                                                      bf16* __restrict__ y, int n, int k,
                                                      int y_stride, Prologue prologue = nullptr) {
    constexpr int NR = EPI == GEMV_SILU ? 2 : 1;
    constexpr int STEP = 256 * SPLIT;
    constexpr int ROUND = STEP * UNROLL;
    const int lane = threadIdx.x & 31;
    const int part = threadIdx.x >> 5;
    const int c0 = (int)((int64_t)blockIdx.x * n / gridDim.x);
    const int c1 = (int)((int64_t)(blockIdx.x + 1) * n / gridDim.x);
    kern_pdl_launch_dependents();
    if (c0 >= c1) return;  // block-uniform: more blocks than columns
    const int first = (part * 32 + lane) * 8;
    auto rows_of = [&](int c, const bf16* (&r)[NR]) {
#pragma unroll
        for (int g = 0; g < NR; ++g) r[g] = w + ((size_t)g * n + c) * (size_t)k;
    };
    const bf16* row[NR];
    rows_of(c0, row);
    uint4 wv[UNROLL][NR];
    gemv_load<UNROLL, NR, STEP>(wv, row, first, k);
    // NOTE: weights are read before the wait (no launch of a step writes them); x and y after.
    kern_pdl_wait();
    if constexpr (XS) prologue();  // x, in shared memory, is written here
#pragma unroll 1
    for (int c = c0; c < c1; ++c) {
        const bf16* next[NR];
        rows_of(min(c + 1, c1 - 1), next);
        rows_of(c, row);
        float acc[R][NR];
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int g = 0; g < NR; ++g) acc[r][g] = 0.0f;
        for (int base = first; base < k; base += ROUND) {
            uint4 cur[UNROLL][NR];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u)
#pragma unroll
                for (int g = 0; g < NR; ++g) cur[u][g] = wv[u][g];
            if (base + ROUND < k) {
                gemv_load<UNROLL, NR, STEP>(wv, row, base + ROUND, k);
            } else if (c + 1 < c1) {
                gemv_load<UNROLL, NR, STEP>(wv, next, first, k);
            }
            gemv_fma_round<UNROLL, NR, STEP, R, XS>(acc, cur, x, base, k);
        }
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int g = 0; g < NR; ++g) acc[r][g] = warp_sum(acc[r][g]);
        // NOTE: two buffers: column c + 2 writes c's buffer only after column c + 1's barrier,
        // which the reader of column c passes after its reads.
        __shared__ float sums[2][SPLIT][R * NR];
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
    }
}

template <int SPLIT, int UNROLL, int EPI>
static __device__ __forceinline__ void gemv_band(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                                 bf16* __restrict__ y, int rows, int n, int k,
                                                 int y_stride) {
    with_rows(rows, [&](auto r) {
        gemv_band_rows<SPLIT, UNROLL, EPI, decltype(r)::value>(x, w, y, n, k, y_stride);
    });
}

// ------------------------------------------------------------------------------------------------
// Bulk copies into shared memory (cp.async.bulk, the TMA's 1-D form) completed on an mbarrier: the
// prefetched GEMV below and the lab's streaming forms fill shared memory with them.

// NOTE: GEMV_TMA_HINT is fixed for the built cubin; tools/lab/time_gemv.py --tma builds other
// values only to compare them.
#ifndef GEMV_TMA_HINT
#define GEMV_TMA_HINT 1
#endif

static __device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

static __device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

static __device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
                 : "memory");
}

static __device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "KERN_MBAR_WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra KERN_MBAR_WAIT;\n"
        "}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}

// An L2 policy for data read once (the weights): evicted first, so x and the KV pages stay.
static __device__ __forceinline__ uint64_t l2_evict_first() {
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    return policy;
}

// Bulk copy of `bytes` (a multiple of 16; both addresses 16-byte aligned) from global to this
// block's shared memory; completes `bytes` transactions on the mbarrier.
static __device__ __forceinline__ void bulk_g2s(uint32_t dst, const void* src, uint32_t bytes,
                                                uint32_t bar, uint64_t policy) {
#if GEMV_TMA_HINT
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
        " [%0], [%1], %2, [%3], %4;" ::"r"(dst),
        "l"(src), "r"(bytes), "r"(bar), "l"(policy)
        : "memory");
#else
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1], %2, [%3];" ::"r"(dst),
        "l"(src), "r"(bytes), "r"(bar)
        : "memory");
#endif
}

static __device__ __forceinline__ uint32_t dynamic_smem_bytes() {
    uint32_t v;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(v));
    return v;
}

// ------------------------------------------------------------------------------------------------
// Prefetched GEMV (`_p4`): block b owns the nc consecutive columns [b * nc, b * nc + nc), nc =
// dynamic shared bytes / (NR * 2k), and before kern_pdl_wait it copies all of their W rows (NR
// contiguous ranges: the columns' rows, and for the SiLU entry their up rows n further) into its
// shared memory with bulk copies, completed on one mbarrier. Under PDL the blocks that are resident
// while the previous launch still runs have their weights land during it; a multi-wave grid streams
// with up to (shared memory per SM / block bytes) blocks' copies in flight per SM. The 4 warps split
// k of each column as kern_gemv_bf16_s4 does (lane l of warp s takes pieces s * 32 + l + 128 j in
// order, 8 FMAs each), with the same warp shuffle and the same sum over the warps in warp order:
// the same bits as `_s4` (`_p4_silu`: as `_b4_silu`). A launch whose dynamic shared memory holds no
// column writes nothing. Measured (docs/perf.md): lm_head 168.1 us in the step against `_c2`'s
// 185.9 (picked); o 8.14 -> 4.44 us behind the attention, but its neighbours slower (not picked).
// Grid [ceil_div(n, nc), 1, 1], block [128, 1, 1], dynamic shared memory nc * NR * 2k bytes.
constexpr uint32_t P4_COPY = 16384;  // bytes per bulk copy

// XS (gemv_pnorm.cu): the last `reserve` bytes of dynamic shared memory are not for rows; after its
// wait each block with columns runs prologue(), which writes x there, and reads x from it.
template <int EPI, int R, bool XS = false, typename Prologue = decltype(nullptr)>
static __device__ __forceinline__ void gemv_p4_rows(const bf16* __restrict__ x,
                                                    const bf16* __restrict__ w,
                                                    bf16* __restrict__ y, int n, int k,
                                                    int y_stride, uint32_t reserve = 0,
                                                    Prologue prologue = nullptr) {
    constexpr int SPLIT = 4;
    constexpr int NR = EPI == GEMV_SILU ? 2 : 1;
    extern __shared__ __align__(128) unsigned char p4_rows[];
    __shared__ __align__(8) uint64_t p4_bar;
    __shared__ float sums[2][SPLIT][R * NR];
    kern_pdl_launch_dependents();
    const int64_t row_bytes = (int64_t)k * 2;
    const int64_t nc = (int64_t)(dynamic_smem_bytes() - reserve) / (NR * row_bytes);
    const int64_t c0 = (int64_t)blockIdx.x * nc;
    if (nc < 1 || c0 >= n) return;  // block-uniform
    const int cols = (int)min(nc, (int64_t)n - c0);
    const uint32_t bar = smem_addr(&p4_bar);
    if (threadIdx.x == 0) {
        mbar_init(bar, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        const uint32_t bytes = (uint32_t)(cols * row_bytes);
        const uint64_t policy = l2_evict_first();
        mbar_expect_tx(bar, NR * bytes);
        // NOTE: weights are read before the wait (no launch of a step writes them); x and y after.
#pragma unroll
        for (int g = 0; g < NR; ++g) {
            const uint32_t dst = smem_addr(p4_rows) + (uint32_t)(g * nc * row_bytes);
            const char* src = reinterpret_cast<const char*>(w + ((int64_t)g * n + c0) * k);
            for (uint32_t off = 0; off < bytes; off += P4_COPY)
                bulk_g2s(dst + off, src + off, min(P4_COPY, bytes - off), bar, policy);
        }
    }
    __syncthreads();
    kern_pdl_wait();
    if constexpr (XS) prologue();  // x, in shared memory, is written here
    const int lane = threadIdx.x & 31;
    const int part = threadIdx.x >> 5;
    const int pieces = k / 8;
    mbar_wait(bar, 0);
#pragma unroll 1
    for (int c = 0; c < cols; ++c) {
        const uint4* row[NR];
#pragma unroll
        for (int g = 0; g < NR; ++g) row[g] = reinterpret_cast<const uint4*>(p4_rows + (g * nc + c) * row_bytes);
        float acc[R][NR];
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int g = 0; g < NR; ++g) acc[r][g] = 0.0f;
#pragma unroll 4
        for (int q = part * 32 + lane; q < pieces; q += SPLIT * 32) {
            float wf[NR][8];
#pragma unroll
            for (int g = 0; g < NR; ++g) unpack8(row[g][q], wf[g]);
#pragma unroll
            for (int r = 0; r < R; ++r) {
                float xf[8];
                if constexpr (XS) {
                    unpack8(reinterpret_cast<const uint4*>(x + (size_t)r * k)[q], xf);
                } else {
                    unpack8(ld_after_wait(x + (size_t)r * k + (size_t)q * 8), xf);
                }
#pragma unroll
                for (int g = 0; g < NR; ++g)
#pragma unroll
                    for (int e = 0; e < 8; ++e) acc[r][g] = fmaf(xf[e], wf[g][e], acc[r][g]);
            }
        }
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int g = 0; g < NR; ++g) acc[r][g] = warp_sum(acc[r][g]);
        // NOTE: two buffers: column c + 2 writes c's buffer only after column c + 1's barrier,
        // which the reader of column c passes after its reads.
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int g = 0; g < NR; ++g) sums[c & 1][part][r * NR + g] = acc[r][g];
        }
        __syncthreads();
        if (threadIdx.x == 0) {
#pragma unroll
            for (int r = 0; r < R; ++r) {
                float t[NR];
#pragma unroll
                for (int g = 0; g < NR; ++g) {
                    t[g] = 0.0f;
#pragma unroll
                    for (int s = 0; s < SPLIT; ++s) t[g] += sums[c & 1][s][r * NR + g];
                }
                gemv_epilogue<EPI>(y + (size_t)r * (size_t)y_stride + c0 + c, t[0], t[NR - 1]);
            }
        }
    }
}
