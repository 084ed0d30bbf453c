// Variants of prefill.cu's causal prefill attention (the same ABI, parameters and partials layout),
// built from one template over: warps per block (WARPS), 16-row m tiles per warp (MT: 2 shares each
// K/V fragment between two MMAs, Q then comes from shared memory), keys per tile (BN) and cp.async
// stages (STAGES, one barrier per tile). Beside prefill.cu's kernel they also scale inside the
// exponent (one FFMA + ex2 per score), mask only the tiles that cross a warp's diagonal, skip the
// math of warps whose rows all lie past the chunk, and merge
// the key splits with a block per (row, head) (grid [rows, nq], block [head_dim]).
//
// Entry kern_pl_w<W>m<MT>n<BN>s<S>[b<blocks per SM>, when not 8 / W]: grid [ceil_div(rows * group, 16 * W * MT), nkv,
// min(16, ceil_div(512, rows))], block [32 * W], dynamic shared memory
// 2 * (S * 2 * BN * (D + 8) + (MT > 1 ? 16 * W * MT * (D + 8) : 0)) bytes; then
// kern_pl_w<W>m<MT>n<BN>s<S>_combine: grid [rows, nq], block [head_dim].
#include "prefill.cuh"

// mma.sync m16n8k16 bf16 -> f32 and its ldmatrix fragment loads (the product's prefill runs on wgmma).
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

template <int D_, int WARPS_, int MT_, int BN_, int STAGES_, int MINB_>
struct PlCfg {
    static constexpr int D = D_, WARPS = WARPS_, MT = MT_, BN = BN_, STAGES = STAGES_;
    static constexpr int THREADS = 32 * WARPS;
    static constexpr int WROWS = 16 * MT;  // packed rows per warp
    static constexpr int BM = WARPS * WROWS;
    static constexpr int LD = D + 8;  // NOTE: 16 bytes of padding per row: ldmatrix conflict-free.
    static constexpr bool QSMEM = MT > 1;
    static constexpr int STAGE = 2 * BN * LD;  // k tile then v tile, elements
    static constexpr int TARGET = 132 * MINB_;  // resident blocks on 132 SMs
    static constexpr int NO = D / 8, KS = D / 16, NS = BN / 8;
    static constexpr int MIN_TILES = PF_MIN_TILES * 64 / BN;
};

template <class C>
static __device__ __forceinline__ int pl_splits(int len, int rows, int nq, int nkv) {
    const int group = nq / nkv;
    const int work = (rows * group + C::BM - 1) / C::BM * nkv;
    const int tiles = (len + C::BN - 1) / C::BN;
    int n = min(prefill_zcap(rows), max(1, C::TARGET / work));
    return min(n, max(1, tiles / C::MIN_TILES));
}

static __device__ __forceinline__ float pl_ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

template <class C>
__device__ __forceinline__ void pl_load(bf16* st, const PfPages& kv, int kb, int end, int head) {
    constexpr int CH = C::D / 8;
    const int64_t voff = kv.v_offset(C::D);
#pragma unroll
    for (int i = 0; i < C::BN * CH / C::THREADS; ++i) {
        const int c = threadIdx.x + i * C::THREADS;
        const int key = c / CH;
        const int ch = c % CH;
        const int tok = kb + key;
        const bool valid = tok < end;
        const bf16* kp = valid ? kv.k_row(tok, head, C::D) + ch * 8 : kv.kv;
        cp_async16(smem_u32(st + key * C::LD + ch * 8), kp, valid);
        cp_async16(smem_u32(st + (C::BN + key) * C::LD + ch * 8), valid ? kp + voff : kv.kv, valid);
    }
}

template <int MT>
struct PlRows {
    int tok[MT][2];
    int head[MT][2];
    bool live[MT][2];
    int qpos[MT][2];
    int wqmin;   // the warp's smallest position: tiles ending at or before it need no mask
    int wqmax;   // the warp's largest position: later tiles are masked for all its rows
    bool wlive;  // the warp holds a row of the chunk (else it only loads)
    int kv_end;  // keys the block reads: [0, kv_end)
};

template <class C>
__device__ __forceinline__ PlRows<C::MT> pl_rows(int p0, int rows, int group, int kvh, int base) {
    const int lane = threadIdx.x & 31;
    const int w0 = p0 + (threadIdx.x >> 5) * C::WROWS;
    const int packed = rows * group;
    PlRows<C::MT> r;
#pragma unroll
    for (int mt = 0; mt < C::MT; ++mt) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int p = w0 + mt * 16 + (lane >> 2) + 8 * i;
            r.live[mt][i] = p < packed;
            const int pc = min(p, packed - 1);
            r.tok[mt][i] = pc / group;
            r.head[mt][i] = kvh * group + pc % group;
            r.qpos[mt][i] = base + r.tok[mt][i];
        }
    }
    r.wlive = w0 < packed;
    r.wqmin = base + min(w0, packed - 1) / group;
    r.wqmax = base + min(w0 + C::WROWS - 1, packed - 1) / group;
    r.kv_end = base + min(p0 + C::BM - 1, packed - 1) / group + 1;
    return r;
}

// Q rows of the block into shared memory (QSMEM): packed row p is query head kvh * group + p % group
// of chunk row p / group; rows past the chunk repeat its last packed row.
template <class C>
__device__ __forceinline__ void pl_load_q(bf16* qs, const bf16* qkv, int p0, int rows, int group,
                                          int kvh, int64_t qstride) {
    constexpr int CH = C::D / 8;
    const int packed = rows * group;
#pragma unroll
    for (int i = 0; i < C::BM * CH / C::THREADS; ++i) {
        const int c = threadIdx.x + i * C::THREADS;
        const int row = c / CH;
        const int ch = c % CH;
        const int pc = min(p0 + row, packed - 1);
        const bf16* src = qkv + (pc / group) * qstride + (int64_t)(kvh * group + pc % group) * C::D + ch * 8;
        cp_async16(smem_u32(qs + row * C::LD + ch * 8), src, true);
    }
}

template <class C>
__device__ __forceinline__ void pl_scores(float (&s)[C::MT][C::NS][4], const uint32_t (&qa)[C::KS][4],
                                          const bf16* qs, const bf16* ks) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < C::NS; ++nt) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.0f;
    const int qrow = (threadIdx.x >> 5) * C::WROWS + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int kk = 0; kk < C::KS; kk += 2) {
        uint32_t qf[C::MT][2][4];
        if constexpr (C::QSMEM) {
#pragma unroll
            for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    ldsm_x4(qf[mt][h], smem_u32(qs + (qrow + mt * 16) * C::LD + (kk + h) * 16 + (lane >> 4) * 8));
        } else {
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int i = 0; i < 4; ++i) qf[0][h][i] = qa[kk + h][i];
        }
#pragma unroll
        for (int nt = 0; nt < C::NS; ++nt) {
            uint32_t b[4];
            ldsm_x4(b, smem_u32(ks + (nt * 8 + (lane & 7)) * C::LD + kk * 16 + (lane >> 3) * 8));
#pragma unroll
            for (int mt = 0; mt < C::MT; ++mt) {
                mma_bf16(s[mt][nt], qf[mt][0], b[0], b[1]);
                mma_bf16(s[mt][nt], qf[mt][1], b[2], b[3]);
            }
        }
    }
}

// One m tile's online softmax over the tile: m in raw score units (scale > 0 keeps the max), P =
// 2^(s * sl2 - m * sl2) in s; rows with every key so far masked keep m = -inf, l = 0, o = 0.
template <bool MASK, class C>
__device__ __forceinline__ void pl_softmax(float (&s)[C::NS][4], float (&o)[C::NO][4], float (&m)[2],
                                           float (&l)[2], int kb, const int (&qpos)[2], float sl2) {
    const int tq = threadIdx.x & 3;
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int nt = 0; nt < C::NS; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int r = e >> 1;
            if (MASK) {
                const int key = kb + nt * 8 + 2 * tq + (e & 1);
                if (key > qpos[r]) s[nt][e] = KERN_NEG_INF;
            }
            mx[r] = fmaxf(mx[r], s[nt][e]);
        }
    }
    float nb[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        const float ms = mx[r] == KERN_NEG_INF ? 0.0f : mx[r];
        nb[r] = -ms * sl2;
        const float alpha = pl_ex2(fmaf(m[r], sl2, nb[r]));
        m[r] = mx[r];
        l[r] *= alpha;
#pragma unroll
        for (int nt = 0; nt < C::NO; ++nt) {
            o[nt][2 * r] *= alpha;
            o[nt][2 * r + 1] *= alpha;
        }
    }
#pragma unroll
    for (int nt = 0; nt < C::NS; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float p = pl_ex2(fmaf(s[nt][e], sl2, nb[e >> 1]));
            s[nt][e] = p;
            l[e >> 1] += p;
        }
    }
}

template <class C>
__device__ __forceinline__ void pl_pv(float (&o)[C::MT][C::NO][4], const float (&s)[C::MT][C::NS][4],
                                      const bf16* vs) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int kk = 0; kk < C::BN / 16; ++kk) {
        uint32_t pa[C::MT][4];
#pragma unroll
        for (int mt = 0; mt < C::MT; ++mt) {
            pa[mt][0] = pack2(s[mt][2 * kk][0], s[mt][2 * kk][1]);
            pa[mt][1] = pack2(s[mt][2 * kk][2], s[mt][2 * kk][3]);
            pa[mt][2] = pack2(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
            pa[mt][3] = pack2(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
        }
        const int key = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
        for (int nt = 0; nt < C::NO; nt += 2) {
            uint32_t b[4];
            ldsm_x4_t(b, smem_u32(vs + key * C::LD + (nt + (lane >> 4)) * 8));
#pragma unroll
            for (int mt = 0; mt < C::MT; ++mt) {
                mma_bf16(o[mt][nt], pa[mt], b[0], b[1]);
                mma_bf16(o[mt][nt + 1], pa[mt], b[2], b[3]);
            }
        }
    }
}

template <class C>
__device__ __forceinline__ void pl_store(const PlRows<C::MT>& r, float (&o)[C::MT][C::NO][4],
                                         float (&m)[C::MT][2], float (&l)[C::MT][2], int rows, int nq,
                                         int splits, float sl2, bf16* out, float* part_o,
                                         float* part_lse) {
    const int tq = threadIdx.x & 3;
#pragma unroll
    for (int mt = 0; mt < C::MT; ++mt) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            float li = l[mt][i];
            li += __shfl_xor_sync(0xffffffffu, li, 1);
            li += __shfl_xor_sync(0xffffffffu, li, 2);
            if (!r.live[mt][i]) continue;
            const float inv = li > 0.0f ? 1.0f / li : 0.0f;
            const int64_t row = (int64_t)r.tok[mt][i] * nq + r.head[mt][i];
            if (splits == 1) {
                bf16* dst = out + row * C::D + 2 * tq;
#pragma unroll
                for (int nt = 0; nt < C::NO; ++nt)
                    *reinterpret_cast<uint32_t*>(dst + nt * 8) =
                        pack2(o[mt][nt][2 * i] * inv, o[mt][nt][2 * i + 1] * inv);
            } else {
                const int64_t prow = (int64_t)blockIdx.z * rows * nq + row;
                float* dst = part_o + prow * C::D + 2 * tq;
#pragma unroll
                for (int nt = 0; nt < C::NO; ++nt)
                    *reinterpret_cast<float2*>(dst + nt * 8) =
                        make_float2(o[mt][nt][2 * i] * inv, o[mt][nt][2 * i + 1] * inv);
                if (tq == 0) part_lse[prow] = li > 0.0f ? m[mt][i] * sl2 + log2f(li) : KERN_NEG_INF;
            }
        }
    }
}

template <class C>
__device__ void pl_block(const bf16* qkv, const PfPages& kv, int len, int rows, int nq, int splits,
                         bf16* out, float* part_o, float* part_lse, float sl2, uint8_t* smem) {
    bf16* stages = reinterpret_cast<bf16*>(smem);
    bf16* qs = stages + C::STAGES * C::STAGE;
    const int tq = threadIdx.x & 3;
    const int group = nq / kv.nkv;
    const int kvh = blockIdx.y;
    const int p0 = (gridDim.x - 1 - blockIdx.x) * C::BM;
    const int base = len - rows;
    const PlRows<C::MT> r = pl_rows<C>(p0, rows, group, kvh, base);
    const int ntiles = (r.kv_end + C::BN - 1) / C::BN;
    const int per = (ntiles + splits - 1) / splits;
    const int t0 = min((int)blockIdx.z * per, ntiles);
    const int n = min(t0 + per, ntiles) - t0;
    const int64_t qstride = (int64_t)(nq + 2 * kv.nkv) * C::D;

    if constexpr (C::QSMEM) pl_load_q<C>(qs, qkv, p0, rows, group, kvh, qstride);
#pragma unroll
    for (int s = 0; s < C::STAGES - 1; ++s) {
        if (s < n) pl_load<C>(stages + s * C::STAGE, kv, (t0 + s) * C::BN, r.kv_end, kvh);
        cp_async_commit();
    }
    uint32_t qa[C::KS][4];
    if constexpr (!C::QSMEM) {
#pragma unroll
        for (int ks = 0; ks < C::KS; ++ks) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int col = ks * 16 + 2 * tq + (i >> 1) * 8;
                qa[ks][i] = *reinterpret_cast<const uint32_t*>(
                    qkv + r.tok[0][i & 1] * qstride + (int64_t)r.head[0][i & 1] * C::D + col);
            }
        }
    }
    float o[C::MT][C::NO][4];
    float m[C::MT][2], l[C::MT][2];
#pragma unroll
    for (int mt = 0; mt < C::MT; ++mt) {
#pragma unroll
        for (int nt = 0; nt < C::NO; ++nt) o[mt][nt][0] = o[mt][nt][1] = o[mt][nt][2] = o[mt][nt][3] = 0.0f;
        m[mt][0] = m[mt][1] = KERN_NEG_INF;
        l[mt][0] = l[mt][1] = 0.0f;
    }

    for (int j = 0; j < n; ++j) {
        cp_async_wait<C::STAGES - 2>();
        __syncthreads();
        if (j + C::STAGES - 1 < n)
            pl_load<C>(stages + ((j + C::STAGES - 1) % C::STAGES) * C::STAGE, kv,
                       (t0 + j + C::STAGES - 1) * C::BN, r.kv_end, kvh);
        cp_async_commit();
        const bf16* ks = stages + (j % C::STAGES) * C::STAGE;
        const int kb = (t0 + j) * C::BN;
        if (r.wlive && kb <= r.wqmax) {
            float s[C::MT][C::NS][4];
            pl_scores<C>(s, qa, qs, ks);
            const bool diag = kb + C::BN - 1 > r.wqmin;
#pragma unroll
            for (int mt = 0; mt < C::MT; ++mt) {
                if (diag) {
                    pl_softmax<true, C>(s[mt], o[mt], m[mt], l[mt], kb, r.qpos[mt], sl2);
                } else {
                    pl_softmax<false, C>(s[mt], o[mt], m[mt], l[mt], kb, r.qpos[mt], sl2);
                }
            }
            pl_pv<C>(o, s, ks + C::BN * C::LD);
        }
    }
    cp_async_wait<0>();
    pl_store<C>(r, o, m, l, rows, nq, splits, sl2, out, part_o, part_lse);
}

template <class C>
__device__ void pl_combine(const float* part_o, const float* part_lse, const int* seq_len, bf16* out,
                           int rows, int nq, int nkv) {
    const int len = *seq_len;
    const int splits = min(prefill_zcap(rows), pl_splits<C>(len, rows, nq, nkv));
    if (splits <= 1 || (int)threadIdx.x >= C::D) return;
    const int64_t row = (int64_t)blockIdx.x * nq + blockIdx.y;
    const int64_t split_rows = (int64_t)rows * nq;
    float lse[PF_MAX_SPLITS];
    float mx = KERN_NEG_INF;
#pragma unroll
    for (int s = 0; s < PF_MAX_SPLITS; ++s) {
        lse[s] = s < splits ? part_lse[s * split_rows + row] : KERN_NEG_INF;
        mx = fmaxf(mx, lse[s]);
    }
    float num = 0.0f, den = 0.0f;
#pragma unroll
    for (int s = 0; s < PF_MAX_SPLITS; ++s) {
        if (lse[s] == KERN_NEG_INF) continue;
        const float w = exp2f(lse[s] - mx);
        den += w;
        num += w * part_o[(s * split_rows + row) * C::D + threadIdx.x];
    }
    out[row * C::D + threadIdx.x] = to_bf(den > 0.0f ? num / den : 0.0f);
}

#define PL_VARIANT(NAME, W, MT, BN, ST, MINB)                                                       \
    extern "C" __global__ void __launch_bounds__(32 * W, MINB)                                     \
    NAME(const bf16* __restrict__ qkv, const bf16* __restrict__ kv,                                \
         const int* __restrict__ block_table, const int* __restrict__ seq_len,                     \
         bf16* __restrict__ out, float* __restrict__ part_o, float* __restrict__ part_lse,         \
         int rows, int nq, int nkv, int head_dim, int page_tokens, int64_t page_stride,            \
         float scale) {                                                                            \
        kern_pdl_launch_dependents();                                                              \
        kern_pdl_wait();                                                                           \
        extern __shared__ __align__(16) uint8_t pl_smem[];                                         \
        const PfPages paged{kv, block_table, nkv, page_tokens, page_stride};                       \
        const int len = *seq_len;                                                                  \
        if (head_dim == 64) {                                                                      \
            using C = PlCfg<64, W, MT, BN, ST, MINB>;                                              \
            const int splits = min((int)gridDim.z, pl_splits<C>(len, rows, nq, nkv));              \
            if ((int)blockIdx.z >= splits) return;                                                 \
            pl_block<C>(qkv, paged, len, rows, nq, splits, out, part_o, part_lse,                  \
                        scale * PF_LOG2E, pl_smem);                                                \
        } else {                                                                                   \
            using C = PlCfg<128, W, MT, BN, ST, MINB>;                                             \
            const int splits = min((int)gridDim.z, pl_splits<C>(len, rows, nq, nkv));              \
            if ((int)blockIdx.z >= splits) return;                                                 \
            pl_block<C>(qkv, paged, len, rows, nq, splits, out, part_o, part_lse,                  \
                        scale * PF_LOG2E, pl_smem);                                                \
        }                                                                                          \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(128)                                              \
    NAME##_combine(const float* __restrict__ part_o, const float* __restrict__ part_lse,           \
                   const int* __restrict__ seq_len, bf16* __restrict__ out, int rows, int nq,      \
                   int nkv, int head_dim) {                                                        \
        kern_pdl_launch_dependents();                                                              \
        kern_pdl_wait();                                                                           \
        if (head_dim == 64) {                                                                      \
            pl_combine<PlCfg<64, W, MT, BN, ST, MINB>>(part_o, part_lse, seq_len, out, rows, nq,   \
                                                      nkv);                                        \
        } else {                                                                                   \
            pl_combine<PlCfg<128, W, MT, BN, ST, MINB>>(part_o, part_lse, seq_len, out, rows, nq,  \
                                                       nkv);                                       \
        }                                                                                          \
    }

// name, warps, m tiles per warp, keys per tile, stages, blocks per SM (__launch_bounds__)
PL_VARIANT(kern_pl_w4m1n64s2, 4, 1, 64, 2, 2)
PL_VARIANT(kern_pl_w4m1n64s3, 4, 1, 64, 3, 2)
PL_VARIANT(kern_pl_w8m1n64s2, 8, 1, 64, 2, 1)
PL_VARIANT(kern_pl_w8m1n64s3, 8, 1, 64, 3, 1)
PL_VARIANT(kern_pl_w4m2n32s2, 4, 2, 32, 2, 2)
PL_VARIANT(kern_pl_w4m2n32s3, 4, 2, 32, 3, 2)
PL_VARIANT(kern_pl_w8m2n32s2, 8, 2, 32, 2, 1)
PL_VARIANT(kern_pl_w4m1n32s2b3, 4, 1, 32, 2, 3)
PL_VARIANT(kern_pl_w4m1n32s3b3, 4, 1, 32, 3, 3)
