// Causal prefill attention over paged KV on the tensor cores (mma.sync m16n8k16 bf16 -> f32,
// ldmatrix, cp.async double buffering), for Qwen3-style GQA.
//
// A block owns one kv head and PF_BM "packed rows": packed row p of a kv head is query head
// kvh * group + p % group at chunk row p / group, so the group's query heads share every K/V tile
// the block gathers from the pages. Warp w computes packed rows [16w, 16w + 16) of the block.
// Keys stream in tiles of PF_BN through two shared-memory stages (padded rows: conflict-free
// ldmatrix). Softmax is online, in f32 and log2 units; P rounds to bf16 for the P.V product.
//
// Split over the keys: for a short chunk over a long prefix the grid's z dimension splits each
// block's key tiles into `prefill_splits(...)` parts, decided on the device from seq_len and rows
// (the same function in both entries). With one split a block writes bf16 rows to `out`; with
// more, each split writes its normalized f32 rows and log2-sum-exp to the partials and
// kern_prefill_combine merges them.
#pragma once
#include "kern_common.cuh"

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

constexpr int PF_BM = 64;           // packed rows per block (4 warps x 16)
constexpr int PF_BN = 64;           // keys per tile
constexpr int PF_THREADS = 128;
constexpr int PF_MAX_SPLITS = 16;   // grid z at most
constexpr int PF_SPLIT_ROWS = 512;  // chunks of this many rows or more never split
constexpr int PF_TARGET = 264;      // blocks the split aims for (2 per SM on 132 SMs)
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

template <int D>
struct PfStage {
    static constexpr int LD = D + 8;  // NOTE: 16 bytes of padding per row: ldmatrix conflict-free.
    bf16 k[PF_BN][LD];
    bf16 v[PF_BN][LD];
};

template <int D>
constexpr int prefill_smem_bytes() {
    return 2 * (int)sizeof(PfStage<D>);
}

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

static __device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

static __device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

static __device__ __forceinline__ void pf_mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                              uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Gathers keys [kb, kb + PF_BN) of kv head `head` (k and v) into `st`; keys at or past `end`
// are zeros.
template <int D>
__device__ __forceinline__ void pf_load_tile(PfStage<D>& st, const PfPages& kv, int kb, int end,
                                             int head) {
    constexpr int CH = D / 8;
    const int64_t voff = kv.v_offset(D);
#pragma unroll
    for (int i = 0; i < PF_BN * CH / PF_THREADS; ++i) {
        const int c = threadIdx.x + i * PF_THREADS;
        const int key = c / CH;
        const int ch = c % CH;
        const int tok = kb + key;
        const bool valid = tok < end;
        const bf16* kp = valid ? kv.k_row(tok, head, D) + ch * 8 : kv.kv;
        cp_async16(smem_u32(&st.k[key][ch * 8]), kp, valid);
        cp_async16(smem_u32(&st.v[key][ch * 8]), valid ? kp + voff : kv.kv, valid);
    }
}

// S = Q K^T for the warp's 16 rows and the tile's PF_BN keys.
template <int D>
__device__ __forceinline__ void pf_scores(float (&s)[PF_BN / 8][4], const uint32_t (&qa)[D / 16][4],
                                          const PfStage<D>& st) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int nt = 0; nt < PF_BN / 8; ++nt) {
        s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < D / 16; ks += 2) {
            uint32_t b[4];
            ldsm_x4(b, smem_u32(&st.k[nt * 8 + (lane & 7)][ks * 16 + (lane >> 3) * 8]));
            pf_mma(s[nt], qa[ks], b[0], b[1]);
            pf_mma(s[nt], qa[ks + 1], b[2], b[3]);
        }
    }
}

// Masks (key <= qpos of the row) and scales one score tile, updates the running max and sum,
// rescales o, and leaves P in s. Rows with every key so far masked keep m = -inf, l = 0, o = 0.
template <int NO>
__device__ __forceinline__ void pf_softmax(float (&s)[PF_BN / 8][4], float (&o)[NO][4],
                                           float (&m)[2], float (&l)[2], int kb,
                                           const int (&qpos)[2], float scale_log2) {
    const int tq = threadIdx.x & 3;
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int nt = 0; nt < PF_BN / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int key = kb + nt * 8 + 2 * tq + (e & 1);
            const int r = e >> 1;
            const float v = key <= qpos[r] ? s[nt][e] * scale_log2 : KERN_NEG_INF;
            s[nt][e] = v;
            mx[r] = fmaxf(mx[r], v);
        }
    }
    float ms[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        ms[r] = mx[r] == KERN_NEG_INF ? 0.0f : mx[r];
        const float alpha = exp2f(m[r] - ms[r]);
        m[r] = mx[r];
        l[r] *= alpha;
#pragma unroll
        for (int nt = 0; nt < NO; ++nt) {
            o[nt][2 * r] *= alpha;
            o[nt][2 * r + 1] *= alpha;
        }
    }
#pragma unroll
    for (int nt = 0; nt < PF_BN / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float p = exp2f(s[nt][e] - ms[e >> 1]);
            s[nt][e] = p;
            l[e >> 1] += p;
        }
    }
}

// o += P V for the warp's 16 rows over the tile's keys.
template <int D>
__device__ __forceinline__ void pf_pv(float (&o)[D / 8][4], const float (&s)[PF_BN / 8][4],
                                      const PfStage<D>& st) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int kk = 0; kk < PF_BN / 16; ++kk) {
        const uint32_t pa[4] = {pack2(s[2 * kk][0], s[2 * kk][1]), pack2(s[2 * kk][2], s[2 * kk][3]),
                                pack2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                pack2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
        const int key = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
        for (int nt = 0; nt < D / 8; nt += 2) {
            uint32_t b[4];
            ldsm_x4_t(b, smem_u32(&st.v[key][(nt + (lane >> 4)) * 8]));
            pf_mma(o[nt], pa, b[0], b[1]);
            pf_mma(o[nt + 1], pa, b[2], b[3]);
        }
    }
}

// Where a block's packed rows sit: its chunk rows and query heads, and the keys it reads.
struct PfRows {
    int tok[2];   // chunk row of this thread's two rows (clamped to rows - 1 for loads)
    int head[2];  // query head of the two rows
    bool live[2];
    int qpos[2];  // positions of the two rows
    int warp_qmax;  // the warp's largest position: later key tiles are masked for all its rows
    int kv_end;     // keys the block reads: [0, kv_end)
};

__device__ __forceinline__ PfRows pf_rows(int p0, int rows, int group, int kvh, int base) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
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
    const int wlast = min(p0 + warp * 16 + 15, packed - 1);
    r.warp_qmax = base + wlast / group;
    r.kv_end = base + min(p0 + PF_BM - 1, packed - 1) / group + 1;
    return r;
}

// The block (blockIdx.x from the last packed rows first: causal blocks late in the chunk read the
// most keys, so they start first), split blockIdx.z of `splits`.
template <int D>
__device__ void prefill_block(const bf16* qkv, const PfPages& kv, int len, int rows, int nq,
                              int splits, bf16* out, float* part_o, float* part_lse,
                              float scale_log2, uint8_t* smem) {
    constexpr int KS = D / 16;
    constexpr int NO = D / 8;
    PfStage<D>* stage = reinterpret_cast<PfStage<D>*>(smem);
    const int lane = threadIdx.x & 31;
    const int tq = lane & 3;
    const int group = nq / kv.nkv;
    const int kvh = blockIdx.y;
    const int p0 = (gridDim.x - 1 - blockIdx.x) * PF_BM;
    const int base = len - rows;
    const PfRows r = pf_rows(p0, rows, group, kvh, base);
    const int ntiles = (r.kv_end + PF_BN - 1) / PF_BN;
    const int per = (ntiles + splits - 1) / splits;
    const int t0 = min((int)blockIdx.z * per, ntiles);
    const int t1 = min(t0 + per, ntiles);
    if (t0 < t1) pf_load_tile<D>(stage[0], kv, t0 * PF_BN, r.kv_end, kvh);
    cp_async_commit();

    const int64_t qstride = (int64_t)(nq + 2 * kv.nkv) * D;
    uint32_t qa[KS][4];
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int col = ks * 16 + 2 * tq + (i >> 1) * 8;
            qa[ks][i] = *reinterpret_cast<const uint32_t*>(
                qkv + r.tok[i & 1] * qstride + (int64_t)r.head[i & 1] * D + col);
        }
    }
    float o[NO][4];
#pragma unroll
    for (int nt = 0; nt < NO; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
    float m[2] = {KERN_NEG_INF, KERN_NEG_INF}, l[2] = {0.0f, 0.0f};

    for (int t = t0; t < t1; ++t) {
        if (t + 1 < t1) {
            pf_load_tile<D>(stage[(t - t0 + 1) & 1], kv, (t + 1) * PF_BN, r.kv_end, kvh);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const PfStage<D>& st = stage[(t - t0) & 1];
        const int kb = t * PF_BN;
        if (kb <= r.warp_qmax) {
            float s[PF_BN / 8][4];
            pf_scores<D>(s, qa, st);
            pf_softmax<NO>(s, o, m, l, kb, r.qpos, scale_log2);
            pf_pv<D>(o, s, st);
        }
        __syncthreads();
    }

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
            for (int nt = 0; nt < NO; ++nt)
                *reinterpret_cast<uint32_t*>(dst + nt * 8) =
                    pack2(o[nt][2 * i] * inv, o[nt][2 * i + 1] * inv);
        } else {
            const int64_t prow = (int64_t)blockIdx.z * rows * nq + row;
            float* dst = part_o + prow * D + 2 * tq;
#pragma unroll
            for (int nt = 0; nt < NO; ++nt)
                *reinterpret_cast<float2*>(dst + nt * 8) =
                    make_float2(o[nt][2 * i] * inv, o[nt][2 * i + 1] * inv);
            if (tq == 0) part_lse[prow] = l[i] > 0.0f ? m[i] + log2f(l[i]) : KERN_NEG_INF;
        }
    }
}
