// kern_attn_decode_one's device code (attention_one.cu) over attention.cuh's page streaming: the
// thread-block cluster combine (also the lab's kern_attn_decode, tools/lab/kernels-src) and the
// one-row step's split plan.
#pragma once
#include "attention.cuh"

// ------------------------------------------------------------------------------------------------
// Thread-block clusters (sm_90) for kern_attn_decode_one and the lab's kern_attn_decode: the
// DEC_CLUSTER splits of a cluster combine through distributed shared memory instead of global
// partials, a fence and an atomic counter.
// Every thread of the cluster reaches each cluster_sync().

constexpr int DEC_CLUSTER = 8;            // blocks per cluster along grid y (the portable maximum)
constexpr int DEC_CLUSTER_PAGES = 4;      // pages per split at most on kern_attn_decode's cluster path
constexpr int DEC_CLUSTER_FLOATS = 2048;  // a kv head's partial rows: group * head_dim floats
constexpr int DEC_CLUSTER_HEADS = DEC_CLUSTER_FLOATS / 64;

// barrier.cluster with release / acquire: shared-memory writes before it are visible to every
// block of the cluster after it. NOTE: not .aligned: threads may reach it from divergent code.
static __device__ __forceinline__ void cluster_sync() {
    asm volatile(
        "barrier.cluster.arrive.release;\n\t"
        "barrier.cluster.wait.acquire;" ::: "memory");
}

// The f32 at `p` (this block's shared memory) in the shared memory of cluster block `rank`.
static __device__ __forceinline__ float cluster_load(const float* p, int rank) {
    const uint32_t local = (uint32_t)__cvta_generic_to_shared(p);
    uint32_t remote;
    float v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
    return v;
}

// Cluster block `rank` writes out[head0 * head_dim + i] for its slice of i < group * head_dim from
// the partial rows of splits [0, used) in the shared memory of cluster blocks 0 .. used - 1, with
// kern_attn_decode_reduce's arithmetic in its order over DEC_CLUSTER splits (so the same bits as
// kern_attn_decode_partial + kern_attn_decode_reduce at splits = DEC_CLUSTER); all of a thread's
// remote loads are in flight together.
__device__ __forceinline__ void cluster_reduce(const float* cl_o, const float* cl_lse, bf16* out,
                                               int head0, int group, int head_dim, int used,
                                               int rank) {
    const int total = group * head_dim;
    const int slice = (total + DEC_CLUSTER - 1) / DEC_CLUSTER;
    const int end = min(total, (rank + 1) * slice);
    for (int i = rank * slice + threadIdx.x; i < end; i += blockDim.x) {
        const int g = i / head_dim;
        float lse[DEC_CLUSTER], o[DEC_CLUSTER];
#pragma unroll
        for (int s = 0; s < DEC_CLUSTER; ++s) {
            lse[s] = s < used ? cluster_load(cl_lse + g, s) : KERN_NEG_INF;
            o[s] = s < used ? cluster_load(cl_o + i, s) : 0.0f;
        }
        float mx = KERN_NEG_INF;
#pragma unroll
        for (int s = 0; s < DEC_CLUSTER; ++s) mx = fmaxf(mx, lse[s]);
        float num = 0.0f, den = 0.0f;
#pragma unroll
        for (int s = 0; s < DEC_CLUSTER; ++s) {
            if (lse[s] == KERN_NEG_INF) continue;
            const float w = exp2f(lse[s] - mx);
            den += w;
            num += w * o[s];
        }
        out[(int64_t)head0 * head_dim + i] = to_bf(den > 0.0f ? num / den : 0.0f);
    }
}

// The two-level combine of kern_attn_decode_rows' global path (and the lab's kern_attn_decode_wide,
// attention_wide.cu): cluster block `rank` writes,
// for its slice of i < group * head_dim, the cluster's combined row o[i] = sum_s w_s o_s / sum_s w_s
// (w_s = 2^(lse_s - max lse), cluster_reduce's arithmetic in its order, left in f32) to
// part_o[i] and, at each head's element 0, the cluster's log2-sum-exp max + log2(sum_s w_s) to
// part_lse[head]: one partial of kern_attn_decode_partial's form for the cluster's `used` splits.
__device__ __forceinline__ void cluster_partial(const float* cl_o, const float* cl_lse, float* part_o,
                                                float* part_lse, int group, int head_dim, int used,
                                                int rank) {
    const int total = group * head_dim;
    const int slice = (total + DEC_CLUSTER - 1) / DEC_CLUSTER;
    const int end = min(total, (rank + 1) * slice);
    for (int i = rank * slice + threadIdx.x; i < end; i += blockDim.x) {
        const int g = i / head_dim;
        float lse[DEC_CLUSTER], o[DEC_CLUSTER];
#pragma unroll
        for (int s = 0; s < DEC_CLUSTER; ++s) {
            lse[s] = s < used ? cluster_load(cl_lse + g, s) : KERN_NEG_INF;
            o[s] = s < used ? cluster_load(cl_o + i, s) : 0.0f;
        }
        float mx = KERN_NEG_INF;
#pragma unroll
        for (int s = 0; s < DEC_CLUSTER; ++s) mx = fmaxf(mx, lse[s]);
        float num = 0.0f, den = 0.0f;
#pragma unroll
        for (int s = 0; s < DEC_CLUSTER; ++s) {
            if (lse[s] == KERN_NEG_INF) continue;
            const float w = exp2f(lse[s] - mx);
            den += w;
            num += w * o[s];
        }
        part_o[i] = num / den;  // used >= 1 split with tokens: den >= 1
        if (i % head_dim == 0) part_lse[g] = mx + log2f(den);
    }
}

// Pages per split at most on kern_attn_decode_one's cluster path (8 splits of up to 8 pages: rows of
// up to 1,024 tokens combine in one cluster's shared memory).
constexpr int ONE_CLUSTER_PAGES = 2 * ROWS_WARPS;
static_assert(rows_whole_offset<128>() + DEC_CLUSTER_FLOATS + DEC_CLUSTER_HEADS <= rows_smem_bytes(128) / 4 &&
                  rows_whole_offset<64>() + DEC_CLUSTER_FLOATS + DEC_CLUSTER_HEADS <= rows_smem_bytes(64) / 4,
              "a cluster block's rows and lse fit the launch's shared memory");

// kern_attn_decode_one's body for one (kv head, split, row) block, head_dim D, HT head tiles: the
// row's pages = ceil(len / 16),
// - up to DEC_CLUSTER * ONE_CLUSTER_PAGES pages: ceil(pages / 8) pages per split over the first
//   cluster along y, combined through distributed shared memory (cluster_reduce);
// - beyond: max(ROWS_WARPS, ceil(pages / max_splits)) pages per split; each cluster's splits
//   combine into one partial (cluster_partial), the last block to count reduces those in order.
template <int D, int HT>
__device__ void attn_rows_cluster_run(const bf16* qkv, const bf16* kv, const int* block_table,
                                      const int* seq_lens, float* part_o, float* part_lse, int* counters,
                                      bf16* out, int nq, int nkv, int64_t page_stride, int table_stride,
                                      int max_splits, float scale, unsigned char* smem) {
    const int row = blockIdx.z;
    const int split = blockIdx.y;
    const int head = blockIdx.x;
    const int group = nq / nkv;
    // NOTE: seq_lens, the block table and the k / v rows before each row's last token are read
    // before the PDL wait (see rows_fold_split): no launch of the step before this one may write
    // them.
    const int len = seq_lens[row];
    const int pages = (len + ROWS_PAGE - 1) / ROWS_PAGE;
    const bool clustered = pages <= DEC_CLUSTER * ONE_CLUSTER_PAGES;
    const int pps = clustered ? max((pages + DEC_CLUSTER - 1) / DEC_CLUSTER, 1)
                              : max(ROWS_WARPS, (pages + max_splits - 1) / max_splits);
    const int used = (pages + pps - 1) / pps;
    // Beyond the cluster path the splits combine in two levels: the (up to) 8 of each cluster through
    // distributed shared memory into one partial per cluster (cluster_partial), then the last block
    // to count over the `clusters` partials, so the serial tail reads a few rows, not every split's.
    const int clusters = (used + DEC_CLUSTER - 1) / DEC_CLUSTER;
    if (split >= (clustered ? DEC_CLUSTER : clusters * DEC_CLUSTER)) {
        kern_pdl_wait();
        return;
    }
    bf16* out_row = out + (int64_t)row * nq * D;
    float* cl_o = reinterpret_cast<float*>(smem) + rows_whole_offset<D>();
    float* cl_lse = cl_o + DEC_CLUSTER_FLOATS;
    if (split < used) {
        const RowsSplit sp{kv, block_table + (int64_t)row * table_stride, page_stride, nkv, head, len, pages,
                           split * pps, min(pps, pages - split * pps)};
        rows_fold_split<D, HT>(qkv + (int64_t)row * (nq + 2 * nkv) * D, sp, group, scale * LOG2E, cl_o, cl_lse,
                               smem);
    } else {
        kern_pdl_wait();
    }
    const int rank = split % DEC_CLUSTER;
    cluster_sync();
    if (clustered) {
        // NOTE: a row of 0 tokens (used = 0) gets zeros from cluster_reduce.
        cluster_reduce(cl_o, cl_lse, out_row, head * group, group, D, used, rank);
        cluster_sync();  // no block may exit while another can still read its shared memory
        return;
    }
    float* po = part_o + (int64_t)row * max_splits * nq * D;
    float* pl = part_lse + (int64_t)row * max_splits * nq;
    const int c = split / DEC_CLUSTER;
    const int64_t crow0 = (int64_t)c * nq + head * group;
    cluster_partial(cl_o, cl_lse, po + crow0 * D, pl + crow0, group, D, min(DEC_CLUSTER, used - c * DEC_CLUSTER),
                    rank);
    cluster_sync();  // no block may exit while another can still read its shared memory
    __threadfence();
    __syncthreads();
    __shared__ int is_last;
    int* count = counters + (int64_t)row * nkv + head;
    if (threadIdx.x == 0) is_last = atomicAdd(count, 1) == clusters * DEC_CLUSTER - 1;
    __syncthreads();
    if (!is_last) return;
    __threadfence();
    decode_reduce_heads(po, pl, out_row, head * group, group, clusters, nq, D, reinterpret_cast<float*>(smem));
    if (threadIdx.x == 0) *count = 0;
}

// kern_attn_decode_one's plan for rows_entry.
struct RowsCluster {
    template <int D, int HT>
    static __device__ __forceinline__ void go(const bf16* qkv, const bf16* kv, const int* block_table,
                                              const int* seq_lens, float* part_o, float* part_lse, int* counters,
                                              bf16* out, int nq, int nkv, int64_t page_stride, int table_stride,
                                              int max_splits, float scale, unsigned char* smem) {
        attn_rows_cluster_run<D, HT>(qkv, kv, block_table, seq_lens, part_o, part_lse, counters, out, nq, nkv,
                                     page_stride, table_stride, max_splits, scale, smem);
    }
};
