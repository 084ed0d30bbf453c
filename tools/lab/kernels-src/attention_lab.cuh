// The lab's one-row decode attention device code over the product's attention.cuh: the
// thread-block cluster combine and attn_decode_run, the body of kern_attn_decode
// (attention_cluster.cu) and its variants (attention_wide.cu, attention_qkn.cu).
#pragma once
#pragma nv_diag_suppress 177  // attention.cuh's prefill helpers, unused here
#include "attention_cluster.cuh"


// The body of the lab's one-row decode attention, kern_attn_decode (tools/lab/kernels-src:
// attention_cluster.cu, and its variants in attention_wide.cu and attention_qkn.cu): a fixed
// split count (grid y), 4 warps a block, a warp per token. `q_rows(tok0, tok1, len)` runs after the
// PDL wait in every block that has a split to fold (block-uniform) and returns where query head h's
// row starts at h * head_dim:
// the qkv row for kern_attn_decode, this block's shared copy for the fused q/k-norm entry
// (attention_qkn.cu). LATE: the entry did not call kern_pdl_launch_dependents at its start; every
// block that stays calls it once its split is folded (blocks that return early count as exited),
// so the next launch's blocks start, and issue their loads, behind this launch's KV loads
// (attention_wide.cu's `_late` entries).
template <bool WIDE = false, bool LATE = false, typename QRows>
static __device__ __forceinline__ void attn_decode_run(const bf16* __restrict__ kv,
                                                       const int* __restrict__ block_table,
                                                       const int* __restrict__ seq_len, float* part_o,
                                                       float* part_lse, int* counters,
                                                       bf16* __restrict__ out, int nq, int nkv,
                                                       int head_dim, int page_tokens,
                                                       int64_t page_stride, int splits, float scale,
                                                       QRows&& q_rows) {
    const PagedKV paged{kv, block_table, nkv, head_dim, page_tokens, page_stride};
    // NOTE: seq_len, the block table and the k / v rows before the last token are read before the
    // wait. Code before the wait may overlap every launch back to the stream's last launch without
    // PDL, so none of those may write them: kern_qwen3 launches a decode step's first kernel without
    // PDL, and within the step only q/k-norm writes k / v (the last token's rows) and only the
    // advance, after the argmax, writes the length and reads the table (kern_qwen3's tests check it).
    const int len = *seq_len;
    const int pages = (len + page_tokens - 1) / page_tokens;
    const int group = nq / nkv;
    const int split = blockIdx.y;
    const bool clustered = pages <= DEC_CLUSTER * DEC_CLUSTER_PAGES && group * head_dim <= DEC_CLUSTER_FLOATS;
    const int plan = clustered ? DEC_CLUSTER : splits;
    const int pps = max((pages + plan - 1) / plan, 1);
    const int used = (pages + pps - 1) / pps;
    // WIDE: the global plan's splits combine per cluster first (cluster_partial), then the last
    // block over the clusters' partials, where a kv head's rows fit a cluster block's shared area.
    const bool two_level = WIDE && !clustered && group * head_dim <= DEC_CLUSTER_FLOATS;
    const int clusters = (used + DEC_CLUSTER - 1) / DEC_CLUSTER;  // two_level: those with a used split
    if (split >= (clustered ? DEC_CLUSTER : two_level ? clusters * DEC_CLUSTER : used)) {
        kern_pdl_wait();
        return;
    }
    if (split < used) {
        // Pull the split's k / v rows (but the last token's) into L2 while the previous launches
        // finish, so the fold's page-by-page loads after the wait hit L2 instead of DRAM.
        const int t0 = min(split * pps * page_tokens, len);
        const int t1 = min((split + 1) * pps * page_tokens, len - 1);
        const int lines = head_dim * 2 / 128;  // 128-byte lines per k (or v) row
        for (int i = threadIdx.x; i < (t1 - t0) * 2 * lines; i += blockDim.x) {
            const int tok = t0 + i / (2 * lines);
            const int rest = i % (2 * lines);
            const bf16* row = paged.k_row(tok, blockIdx.x) + (rest >= lines ? paged.v_offset() : 0);
            asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(row + (rest % lines) * 64));
        }
    }
    kern_pdl_wait();
    __shared__ float smem[DEC_SMEM_FLOATS];
    __shared__ float cl_o[DEC_CLUSTER_FLOATS];
    __shared__ float cl_lse[DEC_CLUSTER_HEADS];
    if (split < used) {
        const int tok0 = min(split * pps * page_tokens, len);
        const int tok1 = min((split + 1) * pps * page_tokens, len);
        const int64_t row0 = (int64_t)split * nq + blockIdx.x * group;
        const bf16* qkv = q_rows(tok0, tok1, len);
        const bool in_smem = clustered || two_level;
        decode_split_rows(qkv, paged, tok0, tok1, in_smem ? cl_o : part_o + row0 * head_dim,
                          in_smem ? cl_lse : part_lse + row0, group, scale * LOG2E, smem);
    }
    if constexpr (LATE) kern_pdl_launch_dependents();
    if constexpr (WIDE) {
        if (two_level) {
            const int c = split / DEC_CLUSTER;
            const int64_t crow0 = (int64_t)c * nq + blockIdx.x * group;
            cluster_sync();
            cluster_partial(cl_o, cl_lse, part_o + crow0 * head_dim, part_lse + crow0, group, head_dim,
                            min(DEC_CLUSTER, used - c * DEC_CLUSTER), split % DEC_CLUSTER);
            // NOTE: no block may exit while another can still read its shared memory.
            cluster_sync();
            __threadfence();
            __syncthreads();
            __shared__ int wide_last;
            if (threadIdx.x == 0)
                wide_last = atomicAdd(&counters[blockIdx.x], 1) == clusters * DEC_CLUSTER - 1;
            __syncthreads();
            if (!wide_last) return;
            __threadfence();
            decode_reduce_heads(part_o, part_lse, out, blockIdx.x * group, group, clusters, nq, head_dim,
                                smem);
            if (threadIdx.x == 0) counters[blockIdx.x] = 0;
            return;
        }
    }
    if (clustered) {
        cluster_sync();
        cluster_reduce(cl_o, cl_lse, out, blockIdx.x * group, group, head_dim, used, split);
        // NOTE: no block may exit while another can still read its shared memory.
        cluster_sync();
        return;
    }
    // Publish this block's partials, then count it; the last of the kv head's blocks reduces.
    __threadfence();
    __syncthreads();
    __shared__ int is_last;
    if (threadIdx.x == 0) is_last = atomicAdd(&counters[blockIdx.x], 1) == used - 1;
    __syncthreads();
    if (!is_last) return;
    __threadfence();
    decode_reduce_heads(part_o, part_lse, out, blockIdx.x * group, group, used, nq, head_dim, smem);
    if (threadIdx.x == 0) counters[blockIdx.x] = 0;
}



