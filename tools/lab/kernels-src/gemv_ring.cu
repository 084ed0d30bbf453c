// Ring GEMVs (`_r4`): balanced column bands whose W rows stream through a ring of shared-memory
// stages filled by bulk copies, so a block keeps a whole ring of weights in flight and issues it
// before its PDL wait. Its own module, so that adding it leaves gemv.cu's and gemv_norm.cu's cubins
// as they were.
//
// Block b owns the columns [b * n / grid, (b + 1) * n / grid) (gemv_band_rows' bands; the generator
// sizes the grid to a resident wave). A stage holds one column's W rows (NR of them: the column's
// row, or for the SiLU form its gate row and its up row n rows further), so the ring has
// stages = min(RING_MAX_STAGES, (dynamic shared bytes - the norm area) / (NR * 2k)) stages, each
// with an mbarrier whose transaction count the stage's copies complete. Before kern_pdl_wait,
// thread 0 fills every stage (weights are never written by a decode step); after the wait the
// block sums its columns in order: column j waits for stage j % stages in phase (j / stages) & 1,
// the 4 warps split k as kern_gemv_bf16_s4 does (lane l of warp s takes pieces s * 32 + l + 128 i
// in order, 8 FMAs each), a warp shuffle, then the 4 warp sums in warp order: the same bits as
// `_s4` and `_p4` (the SiLU form: as `_b4_silu`). After the barrier that ends column j's reads,
// thread 0 writes the column and refills its stage with column j + stages.
//
// The `_n` entries fold the add + RMSNorm before the GEMV into the prologue exactly as gemv_norm.cu
// does (the same bits as kern_add_rmsnorm then the GEMV; the block that owns column 0 writes the
// new residual to res_out), while the ring's first copies are in flight: h and x take the first
// 2 * rows * k * 2 bytes of dynamic shared memory, the ring the rest.
//
// rows 1..4 (others write nothing); k % 8 == 0, x / W / y 16-byte aligned as gemv.cu. A launch
// whose dynamic shared memory holds no stage (after the norm area) writes nothing.
// Grid [any, 1, 1] (one wave of bands), block [128, 1, 1].
#include "gemv_norm.cuh"

constexpr int RING_MAX_STAGES = 32;

// Issues the copies of column c's NR W rows into the stage at `dst` (one mbarrier phase).
template <int NR>
static __device__ __forceinline__ void ring_fill(uint32_t dst, uint32_t bar, const bf16* __restrict__ w, int c,
                                                 int n, int k, uint64_t policy) {
    const uint32_t row_bytes = (uint32_t)k * 2;
    mbar_expect_tx(bar, NR * row_bytes);
#pragma unroll
    for (int g = 0; g < NR; ++g) {
        const char* src = reinterpret_cast<const char*>(w + ((int64_t)g * n + c) * k);
        for (uint32_t off = 0; off < row_bytes; off += P4_COPY)
            bulk_g2s(dst + g * row_bytes + off, src + off, min(P4_COPY, row_bytes - off), bar, policy);
    }
}

template <int EPI, int R, bool NORM>
static __device__ __forceinline__ void gemv_ring_rows(const bf16* __restrict__ x, const bf16* __restrict__ res_in,
                                                      const bf16* __restrict__ y_add,
                                                      const bf16* __restrict__ w_norm, bf16* __restrict__ res_out,
                                                      const bf16* __restrict__ w, bf16* __restrict__ y, int n,
                                                      int k, int y_stride, float eps) {
    constexpr int SPLIT = 4;
    constexpr int NR = EPI == GEMV_SILU ? 2 : 1;
    extern __shared__ __align__(128) unsigned char ring_smem[];
    __shared__ __align__(8) uint64_t ring_bar[RING_MAX_STAGES];
    __shared__ float sums[2][SPLIT][R * NR];
    if (blockDim.x != SPLIT * 32) __trap();  // the sum order is `_s4`'s (and the norm's, 4 warps)
    kern_pdl_launch_dependents();
    const uint32_t norm_bytes = NORM ? (uint32_t)(2 * R * k * 2) : 0u;
    const uint32_t stage_bytes = (uint32_t)(NR * k * 2);
    const uint32_t dyn = dynamic_smem_bytes();
    const int stages = dyn > norm_bytes ? (int)min((uint32_t)RING_MAX_STAGES, (dyn - norm_bytes) / stage_bytes) : 0;
    const int c0 = (int)((int64_t)blockIdx.x * n / gridDim.x);
    const int c1 = (int)((int64_t)(blockIdx.x + 1) * n / gridDim.x);
    if (stages < 1 || c0 >= c1) {  // block-uniform
        kern_pdl_wait();  // NOTE: so that the grid completes only after the launch before it
        return;
    }
    const int cols = c1 - c0;
    // NOTE: the stages start 16-byte aligned after the norm area, as the bulk copies need (norm_bytes
    // is a multiple of 32: k % 8 == 0).
    const uint32_t ring = smem_addr(ring_smem) + norm_bytes;
    const uint64_t policy = l2_evict_first();
    if (threadIdx.x == 0) {
        for (int s = 0; s < stages; ++s) mbar_init(smem_addr(&ring_bar[s]), 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        // NOTE: weights are read before the wait (no launch of a step writes them); x and y after.
        for (int s = 0; s < min(stages, cols); ++s)
            ring_fill<NR>(ring + s * stage_bytes, smem_addr(&ring_bar[s]), w, c0 + s, n, k, policy);
    }
    __syncthreads();
    kern_pdl_wait();
    const bf16* xr = x;
    if constexpr (NORM) {
        bf16* h_s = reinterpret_cast<bf16*>(ring_smem);
        bf16* x_s = h_s + (size_t)R * k;
        const bool writer = c0 == 0;
        add_norm_prologue<R>(res_in, y_add, w_norm, res_out, h_s, x_s, k, eps, writer);  // ends in a barrier
        xr = x_s;
    }
    const int lane = threadIdx.x & 31;
    const int part = threadIdx.x >> 5;
    const int pieces = k / 8;
#pragma unroll 1
    for (int j = 0; j < cols; ++j) {
        const int s = j % stages;
        mbar_wait(smem_addr(&ring_bar[s]), (uint32_t)(j / stages) & 1u);
        const uint4* row[NR];
#pragma unroll
        for (int g = 0; g < NR; ++g)
            row[g] = reinterpret_cast<const uint4*>(ring_smem + norm_bytes + s * stage_bytes + g * (size_t)k * 2);
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
                if constexpr (NORM) {
                    unpack8(reinterpret_cast<const uint4*>(xr + (size_t)r * k)[q], xf);
                } else {
                    unpack8(ld_after_wait(xr + (size_t)r * k + (size_t)q * 8), xf);
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
        // NOTE: two buffers: column j + 2 writes j's buffer only after column j + 1's barrier,
        // which thread 0 passes after its reads of column j's.
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int g = 0; g < NR; ++g) sums[j & 1][part][r * NR + g] = acc[r][g];
        }
        __syncthreads();  // every warp is done with stage s
        if (threadIdx.x == 0) {
            if (j + stages < cols) {
                // NOTE: the generic-proxy reads of the stage (ordered by the barrier) before the
                // async-proxy writes that refill it.
                asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
                ring_fill<NR>(ring + s * stage_bytes, smem_addr(&ring_bar[s]), w, c0 + j + stages, n, k, policy);
            }
#pragma unroll
            for (int r = 0; r < R; ++r) {
                float t[NR];
#pragma unroll
                for (int g = 0; g < NR; ++g) {
                    t[g] = 0.0f;
#pragma unroll
                    for (int p = 0; p < SPLIT; ++p) t[g] += sums[j & 1][p][r * NR + g];
                }
                gemv_epilogue<EPI>(y + (size_t)r * (size_t)y_stride + c0 + j, t[0], t[NR - 1]);
            }
        }
    }
}

// As kern_gemv_bf16_s4 (the same bits), W streamed through the block's ring. Grid [any, 1, 1],
// block [128, 1, 1], dynamic shared memory: stages of 2k bytes.
extern "C" __global__ void __launch_bounds__(128)
    kern_gemv_bf16_r4(const bf16* __restrict__ x, const bf16* __restrict__ w,
        bf16* __restrict__ y, int rows, int n, int k, int y_stride) {
    with_rows(rows, [&](auto r) {
        gemv_ring_rows<GEMV_STORE, decltype(r)::value, false>(x, nullptr, nullptr, nullptr, nullptr, w, y, n, k,
                                                              y_stride, 0.0f);
    });
}

// kern_gemv_bf16_b4_silu's arithmetic (the same bits; W [2n, k]: gate rows, then up rows) on the
// ring. Grid [any, 1, 1], block [128, 1, 1], dynamic shared memory: stages of 4k bytes.
extern "C" __global__ void __launch_bounds__(128)
    kern_gemv_bf16_r4_silu(const bf16* __restrict__ x, const bf16* __restrict__ w,
        bf16* __restrict__ y, int rows, int n, int k, int y_stride) {
    with_rows(rows, [&](auto r) {
        gemv_ring_rows<GEMV_SILU, decltype(r)::value, false>(x, nullptr, nullptr, nullptr, nullptr, w, y, n, k,
                                                             y_stride, 0.0f);
    });
}

// kern_gemv_bf16_b4_n's arithmetic (kern_add_rmsnorm then the GEMV of its output: the same bits)
// on the ring. Grid [any, 1, 1], block [128, 1, 1], dynamic shared memory 4 * rows * k bytes (h and
// x), then stages of 2k bytes.
extern "C" __global__ void __launch_bounds__(128)
    kern_gemv_bf16_r4_n(const bf16* __restrict__ res_in, const bf16* __restrict__ y_add,
        const bf16* __restrict__ w_norm, bf16* __restrict__ res_out, const bf16* __restrict__ w,
        bf16* __restrict__ y, int rows, int n, int k, int y_stride, float eps) {
    with_rows(rows, [&](auto r) {
        gemv_ring_rows<GEMV_STORE, decltype(r)::value, true>(nullptr, res_in, y_add, w_norm, res_out, w, y, n, k,
                                                             y_stride, eps);
    });
}

// kern_gemv_bf16_b4_silu_n's arithmetic (the same bits) on the ring. Grid [any, 1, 1], block
// [128, 1, 1], dynamic shared memory 4 * rows * k bytes (h and x), then stages of 4k bytes.
extern "C" __global__ void __launch_bounds__(128)
    kern_gemv_bf16_r4_silu_n(const bf16* __restrict__ res_in, const bf16* __restrict__ y_add,
        const bf16* __restrict__ w_norm, bf16* __restrict__ res_out, const bf16* __restrict__ w,
        bf16* __restrict__ y, int rows, int n, int k, int y_stride, float eps) {
    with_rows(rows, [&](auto r) {
        gemv_ring_rows<GEMV_SILU, decltype(r)::value, true>(nullptr, res_in, y_add, w_norm, res_out, w, y, n, k,
                                                            y_stride, eps);
    });
}
