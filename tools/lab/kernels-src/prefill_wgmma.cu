// lab-arch: sm_90a
// Causal prefill attention over paged KV on Hopper's warpgroup MMA (wgmma), with prefill.cu's ABI:
// the arguments, grid, split plan and outputs of kern_prefill_attn, so kern_prefill_combine merges
// its partials unchanged. Only the dynamic shared memory differs.
//
// Design (wgmma facts: wgmma.cuh):
// - A block is one warpgroup (128 threads) over one kv head and 64 packed rows (prefill.cuh's
//   packing: packed row p is query head kvh * group + p % group at chunk row p / group), the
//   product's block. Warp w's accumulator rows 16w..16w+15 are the product's warp rows, so
//   pf_rows gives every thread's rows, heads and positions as it does there.
// - S = Q K^T: 8 (head_dim 128) or 4 (64) wgmma m64n64k16 per 64-key tile, Q and K both read from
//   shared memory through descriptors (K-major: head_dim contiguous). O += P V: 4 wgmma
//   m64n{head_dim}k16 per tile, P from registers (S's f32 accumulator rounded to bf16 and packed
//   in place: the accumulator's layout per 16 keys is the A fragment's), V from shared memory
//   MN-major (the token's head_dim row contiguous, as the page holds it; imm-trans-b 1).
// - Shared memory: Q [64 rows][head_dim], then STAGES stages of K [64 keys][head_dim] and
//   V [64 keys][head_dim]. Each is a stack of 64 x 64 slabs (8 KiB: 64 rows of 128 bytes, 64 bf16
//   each; head_dim 128 takes two, columns 0-63 then 64-127) in the 128-byte swizzle: the 16-byte
//   chunk c (columns 8c..8c+7 of the slab) of row r lies at slab + 128 r + 16 (c ^ (r % 8)). The
//   base is rounded up to 1024 bytes (the swizzle atom), hence 1 KiB more than the tiles need.
//   Descriptors: Q and K: start = slab of step k / 4 + 32 (k % 4) bytes (16 columns per k16
//   step), SBO 1024 (8 rows of 128 bytes), LBO unused; V for keys 16 kk..16 kk + 15: start =
//   V + 2048 kk, SBO 1024 (8 keys), LBO 8192 (the next 64 columns' slab).
// - Gathering: cp.async 16-byte chunks from the pages (a token's k or v head row is head_dim
//   contiguous bf16; PfPages) into the swizzled slots; keys at or past the block's last position
//   are zero-filled (finite; masked). Q rows past the chunk are zeros. STAGES - 1 tiles are in
//   flight while one is computed: at tile j the stage of tile j - 1 is refilled, after the barrier
//   every warp reaches only once its wgmmas of tile j - 1 have completed.
// - Per tile: wait for the tile's cp.async group, fence.proxy.async, barrier; issue the next
//   load; wgmma.fence, the S group, wait; online softmax in f32 and log2 units (the scale folded
//   into one FFMA before ex2; the causal mask only on tiles that cross a warp's first position);
//   wgmma.fence, the P V group, wait. Every warp takes part in every tile of its block (wgmma is
//   warpgroup-wide): a warp whose rows all precede a tile gets P = 0 there.
// - Overlapped (OVERLAP, 3 stages): the P V group of tile t - 1 is issued right behind the S group
//   of tile t; wait_group 1 retires S, the softmax of tile t runs while P V still does, then
//   wait_group 0 and O's rescale. The stage of tile t - 1 is then still read after the barrier,
//   so one tile (not two) is loaded ahead. The first tile is peeled off (ptxas serializes wgmma
//   issued or waited under a branch it cannot follow).
// - Key splits exactly as kern_prefill_attn: splits = prefill_splits(seq_len, rows, nq, nkv)
//   (prefill.cuh), the block's 64-key tiles cut into `splits` equal runs, bf16 rows to `out` with
//   one split, f32 normalized rows and log2-sum-exps to the partials with more.
// - Two blocks per SM (__launch_bounds__(128, 2); shared memory 81 KiB at 2 stages, 113 KiB at 3,
//   head_dim 128): while one block's warpgroup is in its softmax the other's wgmmas run.
//
// Entries: kern_prefill_attn_wgmma (2 stages), kern_prefill_attn_wgmma_s3 (3 stages) and
// kern_prefill_attn_wgmma_ov (3 stages, overlapped).
// Arguments, grid [ceil_div(rows * nq / nkv, 64), nkv, min(16, ceil_div(512, rows))] and block
// [128] as kern_prefill_attn; dynamic shared memory 1024 + (1 + 2 * STAGES) * 64 * head_dim * 2
// bytes. head_dim in {64, 128}; nq a multiple of nkv.
#include <type_traits>

#include "prefill.cuh"
#include "wgmma.cuh"

constexpr int WG_THREADS = 128;
constexpr int WG_BM = 64;  // packed rows per block: one m64 (prefill.cuh's PF_BM)
constexpr int WG_BN = 64;  // keys per tile (PF_BN: the split plan's tiles)
static_assert(WG_BM == PF_BM && WG_BN == PF_BN && WG_THREADS == PF_THREADS,
              "the split plan and the grid are prefill.cuh's");

template <int D, int STAGES>
struct WgCfg {
    static constexpr int TILE = D / 64 * (int)WG_SLAB;  // one 64-row operand, bytes
    static constexpr int STAGE = 2 * TILE;              // K then V
    static constexpr int BYTES = TILE + STAGES * STAGE; // Q then the stages
    static constexpr int SMEM = BYTES + 1024;           // + rounding the base up to 1024
    static constexpr int NO = D / 2;                    // O accumulator registers per thread
    static_assert(SMEM == 1024 + (1 + 2 * STAGES) * 64 * D * 2, "the launch's shared memory (header)");
    static_assert(2 * (SMEM + 1024) <= 228 * 1024, "two blocks per SM, 1 KiB reserved for each");
};

// Q rows of the block into the swizzled Q slabs; rows past the chunk are zeros.
template <int D>
__device__ __forceinline__ void wg_load_q(uint32_t dst, const bf16* qkv, int p0, int packed, int group,
                                          int kvh, int nq, int nkv) {
    constexpr int CH = D / 8;
    const int64_t qstride = (int64_t)(nq + 2 * nkv) * D;
#pragma unroll
    for (int i = 0; i < WG_BM * CH / WG_THREADS; ++i) {
        const int c = threadIdx.x + i * WG_THREADS;
        const int row = c / CH;
        const int ch = c % CH;
        const int p = p0 + row;
        const int pc = min(p, packed - 1);  // NOTE: a valid address for the zero-fill too (no branch)
        const bf16* src = qkv + (pc / group) * qstride + (int64_t)(kvh * group + pc % group) * D + ch * 8;
        cp_async16(dst + wg_swizzle(row, ch), src, p < packed);
    }
}

// Keys [kb, kb + 64) of kv head `head`, k to `kdst` and v to `vdst`; keys at or past `end` are zeros.
template <int D>
__device__ __forceinline__ void wg_load_kv(uint32_t kdst, uint32_t vdst, const PfPages& kv, int kb, int end,
                                           int head) {
    constexpr int CH = D / 8;
    const int64_t voff = kv.v_offset(D);
#pragma unroll
    for (int i = 0; i < WG_BN * CH / WG_THREADS; ++i) {
        const int c = threadIdx.x + i * WG_THREADS;
        const int key = c / CH;
        const int ch = c % CH;
        const int tok = kb + key;
        const bool valid = tok < end;
        // NOTE: the last key's row stands in for keys past `end` (zero-filled): every address is
        // valid and the block-table read needs no branch.
        const bf16* kp = kv.k_row(min(tok, end - 1), head, D) + ch * 8;
        const uint32_t off = wg_swizzle(key, ch);
        cp_async16(kdst + off, kp, valid);
        cp_async16(vdst + off, kp + voff, valid);
    }
}

// s = Q K^T for the tile in `k` (Q in `q`).
template <int D>
__device__ __forceinline__ void wg_scores(float (&s)[32], uint32_t q, uint32_t k) {
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
        const uint32_t off = (uint32_t)(ks >> 2) * WG_SLAB + (uint32_t)(ks & 3) * 32;
        wg_m64n64k16_ss(s, wg_desc(q + off, 16, 1024), wg_desc(k + off, 16, 1024), ks > 0);
    }
}

// o += P V for the tile's V in `v`; `pa` holds P's A fragments per 16 keys.
template <int D>
__device__ __forceinline__ void wg_pv(float (&o)[D / 2], const uint32_t (&pa)[WG_BN / 16][4], uint32_t v) {
#pragma unroll
    for (int kk = 0; kk < WG_BN / 16; ++kk) {
        const uint64_t desc = wg_desc(v + (uint32_t)kk * 16 * WG_ATOM_ROW, WG_SLAB, 8 * WG_ATOM_ROW);
        if constexpr (D == 128) {
            wg_m64n128k16_rs(o, pa[kk], desc);
        } else {
            wg_m64n64k16_rs(o, pa[kk], desc);
        }
    }
}

// Masks (when `mask`: key <= the row's position) the scores of the tile at keys kb.., updates the
// running max m (log2 units, scale folded in) and sum l, leaves P in s and the factor o's rows
// must be scaled by in alpha (o itself is left alone: a P V product may still be adding to it).
// s[4 j + e]: row i = e / 2 of the thread, key kb + 8 j + 2 (lane % 4) + e % 2.
__device__ __forceinline__ void wg_softmax(float (&s)[32], float (&alpha)[2], float (&m)[2], float (&l)[2], int kb,
                                           bool mask, const int (&qpos)[2], float scale_log2) {
    const int tq = threadIdx.x & 3;
    if (mask) {
#pragma unroll
        for (int v = 0; v < 32; ++v) {
            const int key = kb + 8 * (v >> 2) + 2 * tq + (v & 1);
            if (key > qpos[(v >> 1) & 1]) s[v] = KERN_NEG_INF;
        }
    }
    float mx[2] = {KERN_NEG_INF, KERN_NEG_INF};
#pragma unroll
    for (int v = 0; v < 32; ++v) mx[(v >> 1) & 1] = fmaxf(mx[(v >> 1) & 1], s[v]);
    float ms[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
        const float mn = fmaxf(m[i], mx[i] * scale_log2);
        // NOTE: a row with every key so far masked keeps m = -inf, l = 0, o = 0 (exp2(-inf) = 0).
        ms[i] = mn == KERN_NEG_INF ? 0.0f : mn;
        alpha[i] = exp2f(m[i] - ms[i]);
        m[i] = mn;
        l[i] *= alpha[i];
    }
#pragma unroll
    for (int v = 0; v < 32; ++v) {
        const int i = (v >> 1) & 1;
        const float p = exp2f(fmaf(s[v], scale_log2, -ms[i]));
        s[v] = p;
        l[i] += p;
    }
}

// o's rows scaled by the softmax's alpha (o[4 j + e] is row e / 2's).
template <int NO>
__device__ __forceinline__ void wg_rescale(float (&o)[NO], const float (&alpha)[2]) {
#pragma unroll
    for (int j = 0; j < NO / 4; ++j) {
        o[4 * j + 0] *= alpha[0];
        o[4 * j + 1] *= alpha[0];
        o[4 * j + 2] *= alpha[1];
        o[4 * j + 3] *= alpha[1];
    }
}

// P's A fragments: keys 16 kk..16 kk + 15 are accumulator columns j = 2 kk, 2 kk + 1.
__device__ __forceinline__ void wg_pack_p(uint32_t (&pa)[WG_BN / 16][4], const float (&s)[32]) {
#pragma unroll
    for (int kk = 0; kk < WG_BN / 16; ++kk) {
        pa[kk][0] = pack2(s[8 * kk + 0], s[8 * kk + 1]);  // row g, keys 2t, 2t + 1
        pa[kk][1] = pack2(s[8 * kk + 2], s[8 * kk + 3]);  // row g + 8
        pa[kk][2] = pack2(s[8 * kk + 4], s[8 * kk + 5]);  // row g, keys 8 + 2t, 8 + 2t + 1
        pa[kk][3] = pack2(s[8 * kk + 6], s[8 * kk + 7]);  // row g + 8
    }
}

// The rows of one split: bf16 to `out` (one split) or the normalized f32 partials and log2-sum-exps.
template <int D>
__device__ __forceinline__ void wg_store(const PfRows& r, float (&o)[D / 2], const float (&m)[2], float (&l)[2],
                                         int rows, int nq, int splits, bf16* out, float* part_o,
                                         float* part_lse) {
    const int tq = threadIdx.x & 3;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        if (!r.live[i]) continue;
        const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
        const int64_t row = (int64_t)r.tok[i] * nq + r.head[i];
        if (splits == 1) {
            bf16* dst = out + row * D + 2 * tq;
#pragma unroll
            for (int j = 0; j < D / 8; ++j)
                *reinterpret_cast<uint32_t*>(dst + 8 * j) = pack2(o[4 * j + 2 * i] * inv, o[4 * j + 2 * i + 1] * inv);
        } else {
            const int64_t prow = (int64_t)blockIdx.z * rows * nq + row;
            float* dst = part_o + prow * D + 2 * tq;
#pragma unroll
            for (int j = 0; j < D / 8; ++j)
                *reinterpret_cast<float2*>(dst + 8 * j) = make_float2(o[4 * j + 2 * i] * inv, o[4 * j + 2 * i + 1] * inv);
            if (tq == 0) part_lse[prow] = l[i] > 0.0f ? m[i] + log2f(l[i]) : KERN_NEG_INF;
        }
    }
}

// The block (blockIdx.x from the last packed rows first, as kern_prefill_attn), split blockIdx.z
// of `splits`; `smem` is 1024-byte aligned. OVERLAP (STAGES 3): the P V product of tile t - 1 is
// issued right after S of tile t and runs during tile t's softmax.
template <int D, int STAGES, bool OVERLAP>
__device__ void wg_block(const bf16* qkv, const PfPages& kv, int len, int rows, int nq, int splits, bf16* out,
                         float* part_o, float* part_lse, float scale_log2, uint32_t smem) {
    using C = WgCfg<D, STAGES>;
    static_assert(!OVERLAP || STAGES == 3, "the overlapped loop keeps tile t, tile t - 1 and the load of t + 1");
    // NOTE: tiles in flight while tile t is computed: STAGES - 1, or 1 when the stage of tile
    // t - 1 is still read by its P V product.
    constexpr int AHEAD = OVERLAP ? 1 : STAGES - 1;
    const int warp = threadIdx.x >> 5;
    const int group = nq / kv.nkv;
    const int kvh = blockIdx.y;
    const int p0 = (gridDim.x - 1 - blockIdx.x) * WG_BM;
    const int packed = rows * group;
    const int base = len - rows;
    const PfRows r = pf_rows(p0, rows, group, kvh, base);
    const int wqmin = base + min(p0 + warp * 16, packed - 1) / group;  // the warp's first position
    const int ntiles = (r.kv_end + WG_BN - 1) / WG_BN;
    const int per = (ntiles + splits - 1) / splits;
    const int t0 = min((int)blockIdx.z * per, ntiles);
    const int t1 = min(t0 + per, ntiles);
    const uint32_t q_smem = smem;
    const uint32_t kv_smem = smem + C::TILE;

    if (t0 < t1) {
        wg_load_q<D>(q_smem, qkv, p0, packed, group, kvh, nq, kv.nkv);
        wg_load_kv<D>(kv_smem, kv_smem + C::TILE, kv, t0 * WG_BN, r.kv_end, kvh);
    }
    cp_async_commit();
#pragma unroll
    for (int s = 1; s < AHEAD; ++s) {
        if (t0 + s < t1) {
            const uint32_t st = kv_smem + s * C::STAGE;
            wg_load_kv<D>(st, st + C::TILE, kv, (t0 + s) * WG_BN, r.kv_end, kvh);
        }
        cp_async_commit();
    }

    float o[C::NO];
#pragma unroll
    for (int i = 0; i < C::NO; ++i) o[i] = 0.0f;
    float s[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) s[i] = 0.0f;
    uint32_t pa[WG_BN / 16][4];
    float m[2] = {KERN_NEG_INF, KERN_NEG_INF}, l[2] = {0.0f, 0.0f}, alpha[2];

    // One tile; `chained` (a std::integral_constant, so the wgmma issue and waits are not under a
    // branch ptxas cannot follow): P V of tile t - 1 goes behind S of tile t.
    auto tile = [&](int t, auto chained) {
        const int j = t - t0;
        cp_async_wait<AHEAD - 1>();  // tile t's group (the later ones may still be in flight)
        wg_fence_proxy_smem();
        __syncthreads();
        // NOTE: tile t + AHEAD goes to a stage no wgmma reads any more: that of tile t - 1 (every
        // warp waited for its products before the barrier above) or, overlapped, of tile t - 2. A
        // group is committed even when empty so that the wait above counts AHEAD - 1 younger groups.
        if (t + AHEAD < t1) {
            const uint32_t st = kv_smem + (uint32_t)((j + AHEAD) % STAGES) * C::STAGE;
            wg_load_kv<D>(st, st + C::TILE, kv, (t + AHEAD) * WG_BN, r.kv_end, kvh);
        }
        cp_async_commit();
        const uint32_t k_smem = kv_smem + (uint32_t)(j % STAGES) * C::STAGE;
        const int kb = t * WG_BN;

        wg_pin(s);
        wg_pin(o);
        wg_fence();
        wg_scores<D>(s, q_smem, k_smem);
        wg_commit();
        if constexpr (decltype(chained)::value) {
            // P V of tile t - 1 (P in pa since the last tile) behind S of tile t.
            wg_pv<D>(o, pa, kv_smem + (uint32_t)((j + STAGES - 1) % STAGES) * C::STAGE + C::TILE);
            wg_commit();
            wg_wait<1>();  // S done; P V may still run
        } else {
            wg_wait<0>();
        }
        wg_pin(s);

        wg_softmax(s, alpha, m, l, kb, kb + WG_BN - 1 > wqmin, r.qpos, scale_log2);
        if constexpr (decltype(chained)::value) wg_wait<0>();
        wg_pin(o);
        wg_rescale(o, alpha);
        wg_pack_p(pa, s);

        if constexpr (!OVERLAP) {
            wg_fence();
            wg_pv<D>(o, pa, k_smem + C::TILE);
            wg_commit();
            wg_wait<0>();
            wg_pin(o);
        }
    };
    if constexpr (OVERLAP) {
        if (t0 < t1) {
            tile(t0, std::false_type{});
            for (int t = t0 + 1; t < t1; ++t) tile(t, std::true_type{});
            wg_pin(o);
            wg_fence();
            wg_pv<D>(o, pa, kv_smem + (uint32_t)((t1 - 1 - t0) % STAGES) * C::STAGE + C::TILE);
            wg_commit();
            wg_wait<0>();
            wg_pin(o);
        }
    } else {
        for (int t = t0; t < t1; ++t) tile(t, std::false_type{});
    }
    cp_async_wait<0>();
    wg_store<D>(r, o, m, l, rows, nq, splits, out, part_o, part_lse);
}

#define WG_ENTRY(NAME, STAGES, OVERLAP)                                                              \
    extern "C" __global__ void __launch_bounds__(WG_THREADS, 2)                                    \
    NAME(const bf16* __restrict__ qkv, const bf16* __restrict__ kv,                                \
         const int* __restrict__ block_table, const int* __restrict__ seq_len,                     \
         bf16* __restrict__ out, float* __restrict__ part_o, float* __restrict__ part_lse,         \
         int rows, int nq, int nkv, int head_dim, int page_tokens, int64_t page_stride,            \
         float scale) {                                                                            \
        kern_pdl_launch_dependents();                                                              \
        kern_pdl_wait();                                                                           \
        extern __shared__ __align__(1024) uint8_t wg_smem[];                                       \
        const uint32_t smem = (smem_u32(wg_smem) + 1023u) & ~1023u;                                \
        const PfPages paged{kv, block_table, nkv, page_tokens, page_stride};                       \
        const int len = *seq_len;                                                                  \
        const int splits = min((int)gridDim.z, prefill_splits(len, rows, nq, nkv));                \
        if ((int)blockIdx.z >= splits) return;                                                     \
        if (head_dim == 64) {                                                                      \
            wg_block<64, STAGES, OVERLAP>(qkv, paged, len, rows, nq, splits, out, part_o,          \
                                          part_lse, scale * PF_LOG2E, smem);                       \
        } else {                                                                                   \
            wg_block<128, STAGES, OVERLAP>(qkv, paged, len, rows, nq, splits, out, part_o,         \
                                           part_lse, scale * PF_LOG2E, smem);                      \
        }                                                                                          \
    }

// name, shared-memory stages of K/V, P V of the previous tile during the softmax (1) or not (0)
WG_ENTRY(kern_prefill_attn_wgmma, 2, 0)
WG_ENTRY(kern_prefill_attn_wgmma_s3, 3, 0)
WG_ENTRY(kern_prefill_attn_wgmma_ov, 3, 1)
