// kern-arch: sm_90a
// Causal prefill attention over paged KV, warp-specialized (head_dim 128): kern_prefill_attn's ABI
// and partials layout, with its own split plan and combine (kern_pf_ws_combine).
//
// - A block is three warpgroups over one kv head and 128 packed rows (prefill.cuh's packing):
//   warpgroup 0 gathers, warpgroups 1 and 2 each own 64 packed rows (rows 64 (w - 1) ..) and run
//   prefill.cuh's tile step on them (S = Q K^T, the online softmax, P V behind the next S), both
//   over the same K/V tiles: a tile gathered once feeds 128 rows.
// - The gatherer copies Q (both halves) and then every 64-key tile of K and V with cp.async into a
//   ring of WS_STAGES stages; each thread's copies arrive on the stage's `full` mbarrier when they
//   land (cp.async.mbarrier.arrive.noinc; 128 arrivals a phase). A consumer thread waits for
//   `full`, fences the async proxy and issues its wgmma; after the P V that last reads a stage it
//   arrives on the stage's `empty` mbarrier (256 arrivals a phase), which the gatherer waits for
//   before it copies tile j + WS_STAGES there.
// - Registers: the gatherer gives its own back (setmaxnreg 72: its cp.async addresses need them), the consumers take them (216).
// - One block per SM: 1 KiB + 32 KiB of Q + 6 stages of 32 KiB of dynamic shared memory.
#include "prefill.cuh"

constexpr int WS_BM = 128;      // packed rows per block
constexpr int WS_STAGES = 6;    // K/V tiles in the ring
constexpr int WS_THREADS = 384;
constexpr int WS_TARGET = 132;  // blocks the split aims for (one per SM)
constexpr int WS_TILE = 2 * (int)WG_SLAB;     // one 64-row operand at head_dim 128
constexpr int WS_STAGE = 2 * WS_TILE;         // K then V
constexpr int WS_SMEM = 1024 + 2 * WS_TILE + WS_STAGES * WS_STAGE;
static_assert(WS_SMEM <= 227 * 1024, "the launch's dynamic shared memory");

// The grid's z extent: prefill.cuh's prefill_zcap; the splits, as prefill_splits over WS_BM rows.
static __device__ __forceinline__ int ws_splits(int len, int rows, int nq, int nkv) {
    const int group = nq / nkv;
    const int work = (rows * group + WS_BM - 1) / WS_BM * nkv;
    const int tiles = (len + PF_BN - 1) / PF_BN;
    int n = min(prefill_zcap(rows), max(1, WS_TARGET / work));
    return min(n, max(1, tiles / PF_MIN_TILES));
}

static __device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}

static __device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(smem_u32(bar)) : "memory");
}

// The thread's cp.async copies issued so far arrive on `bar` when they land (counted in its init).
static __device__ __forceinline__ void mbar_cp_async_arrive(uint64_t* bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}

// Waits until the phase of parity `parity` of `bar` has completed.
static __device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "WS_WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WS_WAIT;\n"
        "}\n" ::"r"(smem_u32(bar)),
        "r"(parity)
        : "memory");
}

template <int N>
static __device__ __forceinline__ void set_max_regs_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

template <int N>
static __device__ __forceinline__ void set_max_regs_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

// pf_rows for a consumer warpgroup's thread `tid` (0..127) over packed rows [p0, p0 + 64).
__device__ __forceinline__ PfRows ws_rows(int tid, int p0, int rows, int group, int kvh, int base) {
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
    r.kv_end = base + min(p0 + PF_BM - 1, packed - 1) / group + 1;
    return r;
}

extern "C" __global__ void __launch_bounds__(WS_THREADS, 1)
kern_pf_ws(const bf16* __restrict__ qkv, const bf16* __restrict__ kv, const int* __restrict__ block_table,
           const int* __restrict__ seq_len, bf16* __restrict__ out, float* __restrict__ part_o,
           float* __restrict__ part_lse, int rows, int nq, int nkv, int head_dim, int page_tokens,
           int64_t page_stride, float scale) {
    constexpr int D = 128;
    kern_pdl_launch_dependents();
    kern_pdl_wait();
    if (head_dim != D) __trap();
    extern __shared__ __align__(1024) uint8_t ws_smem[];
    __shared__ __align__(8) uint64_t full[WS_STAGES], empty[WS_STAGES], qfull;
    const uint32_t smem = (smem_u32(ws_smem) + 1023u) & ~1023u;
    const PfPages paged{kv, block_table, nkv, page_tokens, page_stride};
    const int len = *seq_len;
    const int splits = min((int)gridDim.z, ws_splits(len, rows, nq, nkv));
    if ((int)blockIdx.z >= splits) return;
    const int group = nq / nkv;
    const int kvh = blockIdx.y;
    const int p0 = (gridDim.x - 1 - blockIdx.x) * WS_BM;
    const int packed = rows * group;
    const int base = len - rows;
    const int kv_end = base + min(p0 + WS_BM - 1, packed - 1) / group + 1;
    const int ntiles = (kv_end + PF_BN - 1) / PF_BN;
    const int per = (ntiles + splits - 1) / splits;
    const int t0 = min((int)blockIdx.z * per, ntiles);
    const int t1 = min(t0 + per, ntiles);
    const int n = t1 - t0;
    const uint32_t q_smem = smem;
    const uint32_t ring = smem + 2 * WS_TILE;
    if (threadIdx.x == 0) {
        for (int s = 0; s < WS_STAGES; ++s) {
            mbar_init(&full[s], 128);
            mbar_init(&empty[s], 256);
        }
        mbar_init(&qfull, 128);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    const int wg = threadIdx.x >> 7;

    if (wg == 0) {
        set_max_regs_dec<72>();
        if (n > 0) {
            pf_load_q<D>(q_smem, qkv, p0, packed, group, kvh, nq, nkv);
            pf_load_q<D>(q_smem + WS_TILE, qkv, p0 + 64, packed, group, kvh, nq, nkv);
            mbar_cp_async_arrive(&qfull);
        }
        for (int j = 0; j < n; ++j) {
            const int s = j % WS_STAGES;
            if (j >= WS_STAGES) mbar_wait(&empty[s], (uint32_t)((j / WS_STAGES - 1) & 1));
            const uint32_t st = ring + (uint32_t)s * WS_STAGE;
            pf_load_kv<D>(st, st + WS_TILE, paged, (t0 + j) * PF_BN, kv_end, kvh);
            mbar_cp_async_arrive(&full[s]);
        }
        cp_async_wait<0>();
        return;
    }

    set_max_regs_inc<216>();
    const int c = wg - 1;
    const int tid = threadIdx.x & 127;
    const PfRows r = ws_rows(tid, p0 + 64 * c, rows, group, kvh, base);
    const uint32_t q_mine = q_smem + (uint32_t)c * WS_TILE;
    const float scale_log2 = scale * PF_LOG2E;
    float o[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
    float s[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) s[i] = 0.0f;
    uint32_t pa[PF_BN / 16][4];
    float m[2] = {KERN_NEG_INF, KERN_NEG_INF}, l[2] = {0.0f, 0.0f}, alpha[2];
    auto k_of = [&](int j) { return ring + (uint32_t)(j % WS_STAGES) * WS_STAGE; };

    auto tile = [&](int j, auto chained) {
        mbar_wait(&full[j % WS_STAGES], (uint32_t)((j / WS_STAGES) & 1));
        wg_fence_proxy_smem();
        const int kb = (t0 + j) * PF_BN;
        wg_pin(s);
        wg_pin(o);
        wg_fence();
        pf_scores<D>(s, q_mine, k_of(j));
        wg_commit();
        if constexpr (decltype(chained)::value) {
            pf_pv<D>(o, pa, k_of(j - 1) + WS_TILE);
            wg_commit();
            wg_wait<1>();
        } else {
            wg_wait<0>();
        }
        wg_pin(s);
        pf_softmax(s, alpha, m, l, kb, kb + PF_BN - 1 > r.warp_qmin, r.qpos, scale_log2);
        if constexpr (decltype(chained)::value) {
            wg_wait<0>();
            mbar_arrive(&empty[(j - 1) % WS_STAGES]);  // tile j - 1's K and V are read
        }
        wg_pin(o);
        pf_rescale(o, alpha);
        pf_pack_p(pa, s);
    };
    if (n > 0) {
        mbar_wait(&qfull, 0);
        tile(0, std::false_type{});
        for (int j = 1; j < n; ++j) tile(j, std::true_type{});
        wg_pin(o);
        wg_fence();
        pf_pv<D>(o, pa, k_of(n - 1) + WS_TILE);
        wg_commit();
        wg_wait<0>();
        wg_pin(o);
    }
    pf_store<D>(r, o, m, l, rows, nq, splits, out, part_o, part_lse);
}

// kern_prefill_combine over kern_pf_ws' splits. grid [rows], block [128].
extern "C" __global__ void __launch_bounds__(128)
kern_pf_ws_combine(const float* __restrict__ part_o, const float* __restrict__ part_lse,
                   const int* __restrict__ seq_len, bf16* __restrict__ out, int rows, int nq, int nkv,
                   int head_dim) {
    kern_pdl_launch_dependents();
    kern_pdl_wait();
    const int len = *seq_len;
    const int splits = min(prefill_zcap(rows), ws_splits(len, rows, nq, nkv));
    if (splits <= 1) return;
    const int64_t row0 = (int64_t)blockIdx.x * nq;
    const int64_t split_rows = (int64_t)rows * nq;
    for (int i = threadIdx.x; i < nq * head_dim; i += blockDim.x) {
        const int64_t row = row0 + i / head_dim;
        const int d = i % head_dim;
        float mx = KERN_NEG_INF;
        for (int z = 0; z < splits; ++z) mx = fmaxf(mx, part_lse[z * split_rows + row]);
        float num = 0.0f, den = 0.0f;
        for (int z = 0; z < splits; ++z) {
            const float lse = part_lse[z * split_rows + row];
            if (lse == KERN_NEG_INF) continue;
            const float w = exp2f(lse - mx);
            den += w;
            num += w * part_o[(z * split_rows + row) * head_dim + d];
        }
        out[row * head_dim + d] = to_bf(den > 0.0f ? num / den : 0.0f);
    }
}
