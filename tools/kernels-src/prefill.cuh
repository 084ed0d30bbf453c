// Causal prefill attention over paged KV on Hopper's warpgroup MMA (wgmma, sm_90a; the facts it
// relies on: wgmma.cuh), for Qwen3-style GQA, warp-specialized.
//
// - A block is three warpgroups over one kv head and PF_BM (128) "packed rows": packed row p of a
//   kv head is query head kvh * group + p % group at chunk row p / group, so the group's query
//   heads share every K/V tile the block gathers from the pages. Warpgroup 0 gathers; warpgroups
//   1 and 2 each own 64 packed rows (64 (w - 1) ..) and compute, both over the same K/V tiles. A
//   consumer warp w's accumulator rows are its warpgroup's packed rows 16w..16w+15 (pf_rows gives
//   every thread's rows, heads and positions).
// - S = Q K^T: D / 16 wgmma m64n64k16 per 64-key tile, Q and K both read from shared memory
//   through descriptors (K-major: head_dim contiguous). O += P V: 4 wgmma m64n{D}k16 per tile, P
//   from registers (S's f32 accumulator rounded to bf16 and packed in place: the accumulator's
//   layout per 16 keys is the A fragment's), V from shared memory MN-major (the token's head_dim
//   row contiguous, as the page holds it; imm-trans-b 1).
// - Shared memory: Q [128 rows][D] (the consumers' halves), then a ring of PF_STAGES stages of K
//   [64 keys][D] and V [64 keys][D]. Each is a stack of 64 x 64 slabs (8 KiB: 64 rows of 128 bytes,
//   64 bf16 each; D 128 takes two, columns 0-63 then 64-127) in the 128-byte swizzle: the 16-byte
//   chunk c (columns 8c..8c+7 of the slab) of row r lies at slab + 128 r + 16 (c ^ (r % 8)). The
//   base is rounded up to 1024 bytes (the swizzle atom), hence 1 KiB more than the tiles need.
//   Descriptors: Q and K: start = slab of step k / 4 + 32 (k % 4) bytes (16 columns per k16 step),
//   SBO 1024 (8 rows of 128 bytes), LBO unused; V for keys 16 kk..16 kk + 15: start = V + 2048 kk,
//   SBO 1024 (8 keys), LBO 8192 (the next 64 columns' slab).
// - Gathering: cp.async 16-byte chunks from the pages (a token's k or v head row is D contiguous
//   bf16; PfPages) into the swizzled slots; keys at or past the block's last position are
//   zero-filled (finite; masked), Q rows past the chunk are zeros. Each gathering thread's copies of
//   a stage arrive on the stage's `full` mbarrier when they land (cp.async.mbarrier.arrive.noinc,
//   128 arrivals a phase); before it copies tile j + PF_STAGES into a stage it waits for the
//   stage's `empty` mbarrier, on which every consumer thread arrives (256 a phase) once the P V
//   that last reads the stage has retired.
// - Per tile t, in each consumer warpgroup: wait for the stage's `full` phase, fence.proxy.async;
//   wgmma.fence and the S group of tile t, then the P V group of tile t - 1 (P in registers since
//   the last tile) right behind it; wait_group 1 retires S, the online softmax of tile t (f32, log2
//   units, the scale folded into one FFMA before ex2, the causal mask only on tiles that cross a
//   warp's first position) runs while P V still does, then wait_group 0, tile t - 1's stage
//   released, O's rescale and P's packing. The first tile is peeled off and the last tile's P V
//   issued after the loop (ptxas serializes wgmma issued or waited under a branch it cannot
//   follow). Every warp takes part in every tile of its block (wgmma is warpgroup-wide): a warp
//   whose rows all precede a tile gets P = 0 there.
// - One block per SM (__launch_bounds__(384, 1): 225 KiB of shared memory at D 128); the gatherer
//   gives registers back (setmaxnreg 72) and the consumers take them (216).
//
// Split over the keys: for a short chunk over a long prefix the grid's z dimension splits each
// block's 64-key tiles into `prefill_splits(...)` equal runs, decided on the device from seq_len
// and rows (the same function in both entries), aiming at a block per SM. With one split a block writes bf16 rows to `out`;
// with more, each split writes its normalized f32 rows and log2-sum-exp to the partials and
// kern_prefill_combine merges them.
#pragma once
#include <type_traits>

#include "kern_common.cuh"
#include "wgmma.cuh"

#define PF_LOG2E 1.4426950408889634f

// The pages of one layer (docs/qwen3.md "KV state layout"): `kv` points at the layer's k block of
// page 0; a page holds [k|v][page_tokens][nkv][head_dim], pages `page_stride` elements apart;
// logical page j of the sequence is physical page block_table[j].
struct PfPages {
    const bf16* kv;
    const int* block_table;
    int nkv;
    int page_tokens;
    int64_t page_stride;

    // Token `tok`'s k row for kv head `head` (D elements); its v row is at + v_offset(D).
    __device__ __forceinline__ const bf16* k_row(int tok, int head, int D) const {
        const int64_t page = block_table[tok / page_tokens];
        return kv + page * page_stride + ((int64_t)(tok % page_tokens) * nkv + head) * D;
    }
    __device__ __forceinline__ int64_t v_offset(int D) const {
        return (int64_t)page_tokens * nkv * D;
    }
};

constexpr int PF_BM = 128;          // packed rows per block: two consumer warpgroups of one m64
constexpr int PF_WG_ROWS = 64;      // packed rows per consumer warpgroup
constexpr int PF_BN = 64;           // keys per tile
constexpr int PF_THREADS = 384;     // the gathering warpgroup and two consumers
constexpr int PF_WG = 128;          // threads per warpgroup
constexpr int PF_STAGES = 6;        // K/V tiles in shared memory
constexpr int PF_MAX_SPLITS = 16;   // grid z at most
constexpr int PF_SPLIT_ROWS = 512;  // chunks of this many rows or more never split
constexpr int PF_TARGET = 132;      // blocks the split aims for (one per SM on 132 SMs)
constexpr int PF_MIN_TILES = 4;     // key tiles per split at least, on average

// The grid's z extent for `rows` chunk rows: min(PF_MAX_SPLITS, ceil(PF_SPLIT_ROWS / rows)). With
// z > 1 only when rows < PF_SPLIT_ROWS, splits * rows < 2 * PF_SPLIT_ROWS: the partials hold
// 2 * PF_SPLIT_ROWS rows of nq heads.
static __host__ __device__ __forceinline__ int prefill_zcap(int rows) {
    return min(PF_MAX_SPLITS, (PF_SPLIT_ROWS + rows - 1) / rows);
}

// Splits of the keys for a chunk of `rows` rows ending at `len` (uniform over the launch).
static __device__ __forceinline__ int prefill_splits(int len, int rows, int nq, int nkv) {
    const int group = nq / nkv;
    const int work = (rows * group + PF_BM - 1) / PF_BM * nkv;
    const int tiles = (len + PF_BN - 1) / PF_BN;
    int n = min(prefill_zcap(rows), max(1, PF_TARGET / work));
    n = min(n, max(1, tiles / PF_MIN_TILES));
    return n;
}

// The shared-memory layout of kern_prefill_attn at head_dim D (bytes).
template <int D>
struct PfSmem {
    static constexpr int TILE = D / 64 * (int)WG_SLAB;  // one 64-row operand
    static constexpr int STAGE = 2 * TILE;              // K then V
    static constexpr int Q = 2 * TILE;                  // the two consumers' Q rows
    static constexpr int BYTES = Q + PF_STAGES * STAGE;  // Q then the stages
    static constexpr int SMEM = BYTES + 1024;           // + rounding the base up to 1024
    static constexpr int NO = D / 2;                    // O accumulator registers per thread
    static_assert(SMEM == 1024 + (2 + 2 * PF_STAGES) * 64 * D * 2, "the launch's shared memory (prefill.cu)");
    static_assert(SMEM <= 227 * 1024, "one block per SM");
};

static __device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

static __device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
    // NOTE: src-size 0 fills the 16 bytes with zeros (keys past the range must be finite: P is 0
    // there and 0 * garbage could be NaN).
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
}

static __device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N>
static __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Where a block's packed rows sit: its chunk rows and query heads, and the keys it reads.
struct PfRows {
    int tok[2];   // chunk row of this thread's two rows (clamped to rows - 1 for loads)
    int head[2];  // query head of the two rows
    bool live[2];
    int qpos[2];  // positions of the two rows
    int warp_qmin;  // the warp's first position: key tiles ending at or before it need no mask
    int kv_end;     // keys the block reads: [0, kv_end)
};

// Thread `tid` (0..127) of a consumer warpgroup over packed rows [p0, p0 + 64).
__device__ __forceinline__ PfRows pf_rows(int tid, int p0, int rows, int group, int kvh, int base) {
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int packed = rows * group;
    PfRows r;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int p = p0 + warp * 16 + (lane >> 2) + 8 * i;
        r.live[i] = p < packed;
        const int pc = min(p, packed - 1);
        r.tok[i] = pc / group;
        r.head[i] = kvh * group + pc % group;
        r.qpos[i] = base + r.tok[i];
    }
    r.warp_qmin = base + min(p0 + warp * 16, packed - 1) / group;
    r.kv_end = base + min(p0 + PF_WG_ROWS - 1, packed - 1) / group + 1;
    return r;
}

// Q rows [p0, p0 + 64) into the swizzled Q slabs at `dst` (a gathering thread's share); rows past
// the chunk are zeros.
template <int D>
__device__ __forceinline__ void pf_load_q(uint32_t dst, const bf16* qkv, int p0, int packed, int group,
                                          int kvh, int nq, int nkv) {
    constexpr int CH = D / 8;
    const int64_t qstride = (int64_t)(nq + 2 * nkv) * D;
#pragma unroll
    for (int i = 0; i < PF_WG_ROWS * CH / PF_WG; ++i) {
        const int c = threadIdx.x + i * PF_WG;
        const int row = c / CH;
        const int ch = c % CH;
        const int p = p0 + row;
        const int pc = min(p, packed - 1);  // NOTE: a valid address for the zero-fill too (no branch)
        const bf16* src = qkv + (pc / group) * qstride + (int64_t)(kvh * group + pc % group) * D + ch * 8;
        cp_async16(dst + wg_swizzle(row, ch), src, p < packed);
    }
}

// Keys [kb, kb + 64) of kv head `head`, k to `kdst` and v to `vdst` (a gathering thread's share);
// keys at or past `end` are zeros.
template <int D>
__device__ __forceinline__ void pf_load_kv(uint32_t kdst, uint32_t vdst, const PfPages& kv, int kb, int end,
                                           int head) {
    constexpr int CH = D / 8;
    const int64_t voff = kv.v_offset(D);
#pragma unroll
    for (int i = 0; i < PF_BN * CH / PF_WG; ++i) {
        const int c = threadIdx.x + i * PF_WG;
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
__device__ __forceinline__ void pf_scores(float (&s)[32], uint32_t q, uint32_t k) {
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
        const uint32_t off = (uint32_t)(ks >> 2) * WG_SLAB + (uint32_t)(ks & 3) * 32;
        wg_m64n64k16_ss(s, wg_desc(q + off, 16, 1024), wg_desc(k + off, 16, 1024), ks > 0);
    }
}

// o += P V for the tile's V in `v`; `pa` holds P's A fragments per 16 keys.
template <int D>
__device__ __forceinline__ void pf_pv(float (&o)[D / 2], const uint32_t (&pa)[PF_BN / 16][4], uint32_t v) {
#pragma unroll
    for (int kk = 0; kk < PF_BN / 16; ++kk) {
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
__device__ __forceinline__ void pf_softmax(float (&s)[32], float (&alpha)[2], float (&m)[2], float (&l)[2], int kb,
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
__device__ __forceinline__ void pf_rescale(float (&o)[NO], const float (&alpha)[2]) {
#pragma unroll
    for (int j = 0; j < NO / 4; ++j) {
        o[4 * j + 0] *= alpha[0];
        o[4 * j + 1] *= alpha[0];
        o[4 * j + 2] *= alpha[1];
        o[4 * j + 3] *= alpha[1];
    }
}

// P's A fragments: keys 16 kk..16 kk + 15 are accumulator columns j = 2 kk, 2 kk + 1.
__device__ __forceinline__ void pf_pack_p(uint32_t (&pa)[PF_BN / 16][4], const float (&s)[32]) {
#pragma unroll
    for (int kk = 0; kk < PF_BN / 16; ++kk) {
        pa[kk][0] = pack2(s[8 * kk + 0], s[8 * kk + 1]);  // row g, keys 2t, 2t + 1
        pa[kk][1] = pack2(s[8 * kk + 2], s[8 * kk + 3]);  // row g + 8
        pa[kk][2] = pack2(s[8 * kk + 4], s[8 * kk + 5]);  // row g, keys 8 + 2t, 8 + 2t + 1
        pa[kk][3] = pack2(s[8 * kk + 6], s[8 * kk + 7]);  // row g + 8
    }
}

// The rows of one split: bf16 to `out` (one split) or the normalized f32 partials and log2-sum-exps.
template <int D>
__device__ __forceinline__ void pf_store(const PfRows& r, float (&o)[D / 2], const float (&m)[2], float (&l)[2],
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

static __device__ __forceinline__ void pf_mbar_init(uint64_t* bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}

static __device__ __forceinline__ void pf_mbar_arrive(uint64_t* bar) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(smem_u32(bar)) : "memory");
}

// The thread's cp.async copies issued so far arrive on `bar` when they land (counted in its init).
static __device__ __forceinline__ void pf_mbar_copies_arrive(uint64_t* bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}

// Waits until the phase of parity `parity` of `bar` has completed.
static __device__ __forceinline__ void pf_mbar_wait(uint64_t* bar, uint32_t parity) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "PF_WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra PF_WAIT;\n"
        "}\n" ::"r"(smem_u32(bar)),
        "r"(parity)
        : "memory");
}

// The block's mbarriers: a `full` and an `empty` per stage, and Q's.
struct PfBars {
    uint64_t full[PF_STAGES];
    uint64_t empty[PF_STAGES];
    uint64_t q;
};

// The block (blockIdx.x from the last packed rows first: causal blocks late in the chunk read the
// most keys, so they start first), split blockIdx.z of `splits`; `smem` is 1024-byte aligned, `bars`
// initialized (full: PF_WG arrivals, empty: 2 PF_WG, q: PF_WG). Warpgroup 0 gathers, 1 and 2
// compute.
template <int D>
__device__ void prefill_block(const bf16* qkv, const PfPages& kv, int len, int rows, int nq, int splits,
                              bf16* out, float* part_o, float* part_lse, float scale_log2, uint32_t smem,
                              PfBars& bars) {
    using C = PfSmem<D>;
    const int group = nq / kv.nkv;
    const int kvh = blockIdx.y;
    const int p0 = (gridDim.x - 1 - blockIdx.x) * PF_BM;
    const int packed = rows * group;
    const int base = len - rows;
    const int kv_end = base + min(p0 + PF_BM - 1, packed - 1) / group + 1;
    const int ntiles = (kv_end + PF_BN - 1) / PF_BN;
    const int per = (ntiles + splits - 1) / splits;
    const int t0 = min((int)blockIdx.z * per, ntiles);
    const int n = min(t0 + per, ntiles) - t0;
    const uint32_t ring = smem + C::Q;
    auto stage = [&](int j) { return ring + (uint32_t)(j % PF_STAGES) * C::STAGE; };
    const int wg = threadIdx.x / PF_WG;

    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 72;\n");
        if (n > 0) {
            pf_load_q<D>(smem, qkv, p0, packed, group, kvh, nq, kv.nkv);
            pf_load_q<D>(smem + C::TILE, qkv, p0 + PF_WG_ROWS, packed, group, kvh, nq, kv.nkv);
            pf_mbar_copies_arrive(&bars.q);
        }
        for (int j = 0; j < n; ++j) {
            // NOTE: the stage's previous tile, j - PF_STAGES, released it in its release phase
            // j / PF_STAGES - 1
            if (j >= PF_STAGES) pf_mbar_wait(&bars.empty[j % PF_STAGES], (uint32_t)((j / PF_STAGES - 1) & 1));
            pf_load_kv<D>(stage(j), stage(j) + C::TILE, kv, (t0 + j) * PF_BN, kv_end, kvh);
            pf_mbar_copies_arrive(&bars.full[j % PF_STAGES]);
        }
        cp_async_wait<0>();
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 216;\n");
    const int c = wg - 1;
    const PfRows r = pf_rows(threadIdx.x % PF_WG, p0 + PF_WG_ROWS * c, rows, group, kvh, base);
    const uint32_t q_smem = smem + (uint32_t)c * C::TILE;
    float o[C::NO];
#pragma unroll
    for (int i = 0; i < C::NO; ++i) o[i] = 0.0f;
    float s[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) s[i] = 0.0f;
    uint32_t pa[PF_BN / 16][4];
    float m[2] = {KERN_NEG_INF, KERN_NEG_INF}, l[2] = {0.0f, 0.0f}, alpha[2];

    // One tile; `chained` (a std::integral_constant, so the wgmma issue and waits are not under a
    // branch ptxas cannot follow): P V of tile j - 1 goes behind S of tile j.
    auto tile = [&](int j, auto chained) {
        pf_mbar_wait(&bars.full[j % PF_STAGES], (uint32_t)((j / PF_STAGES) & 1));
        wg_fence_proxy_smem();
        const int kb = (t0 + j) * PF_BN;
        wg_pin(s);
        wg_pin(o);
        wg_fence();
        pf_scores<D>(s, q_smem, stage(j));
        wg_commit();
        if constexpr (decltype(chained)::value) {
            pf_pv<D>(o, pa, stage(j - 1) + C::TILE);
            wg_commit();
            wg_wait<1>();  // S done; P V may still run
        } else {
            wg_wait<0>();
        }
        wg_pin(s);
        pf_softmax(s, alpha, m, l, kb, kb + PF_BN - 1 > r.warp_qmin, r.qpos, scale_log2);
        if constexpr (decltype(chained)::value) {
            wg_wait<0>();
            pf_mbar_arrive(&bars.empty[(j - 1) % PF_STAGES]);  // tile j - 1's K and V are read
        }
        wg_pin(o);
        pf_rescale(o, alpha);
        pf_pack_p(pa, s);
    };
    if (n > 0) {
        pf_mbar_wait(&bars.q, 0);
        tile(0, std::false_type{});
        for (int j = 1; j < n; ++j) tile(j, std::true_type{});
        wg_pin(o);
        wg_fence();
        pf_pv<D>(o, pa, stage(n - 1) + C::TILE);
        wg_commit();
        wg_wait<0>();
        wg_pin(o);
    }
    pf_store<D>(r, o, m, l, rows, nq, splits, out, part_o, part_lse);
}
