// Lab forms of kern_attn_decode_rows (attention.cu), for builds that may set KERN_ROWS_WARPS
// (warps per block), KERN_ROWS_STAGES (page slots per warp), KERN_ROWS_CLUSTER_PAGES (the cluster
// path's most pages per split) and KERN_ROWS_TARGET (attn_rows_run's TARGET: blocks with work a
// launch aims at; 0, the product's, none) before including this header. KERN_ROWS_VARIANT: the product's arguments and grid, block
// [32 * KERN_ROWS_WARPS], rows_smem_bytes(head_dim) bytes of dynamic shared memory
// (KERN_ROWS_WARPS * KERN_ROWS_STAGES pages of head_dim x 2 x 16 bf16). KERN_ROWS_FLAT: below.
#pragma once
#pragma nv_diag_suppress 177  // attention.cuh's prefill helpers, unused here
#include "attention.cuh"


#ifndef KERN_ROWS_TARGET
#define KERN_ROWS_TARGET 0
#endif

#define KERN_ROWS_VARIANT(NAME)                                                                      \
    extern "C" __global__ void __cluster_dims__(1, DEC_CLUSTER, 1)                                   \
    NAME(const bf16* __restrict__ qkv, const bf16* __restrict__ kv, const int* __restrict__ block_table, \
         const int* __restrict__ seq_lens, float* part_o, float* part_lse, int* counters,              \
         bf16* __restrict__ out, int nq, int nkv, int head_dim, int page_tokens, int64_t page_stride,  \
         int table_stride, int max_splits, float scale);                                             \
    extern "C" __global__ void __launch_bounds__(32 * KERN_ROWS_WARPS)                               \
    NAME(const bf16* __restrict__ qkv, const bf16* __restrict__ kv, const int* __restrict__ block_table, \
         const int* __restrict__ seq_lens, float* part_o, float* part_lse, int* counters,              \
         bf16* __restrict__ out, int nq, int nkv, int head_dim, int page_tokens, int64_t page_stride,  \
         int table_stride, int max_splits, float scale) {                                            \
        kern_pdl_launch_dependents();                                                                \
        extern __shared__ __align__(16) unsigned char rows_smem[];                                   \
        const int group = nq / nkv;                                                                  \
        if (page_tokens != ROWS_PAGE || group * nkv != nq || group > 8 || head_dim != 128) __trap();  \
        attn_rows_run<128, 1, KERN_ROWS_TARGET>(qkv, kv, block_table, seq_lens, part_o, part_lse, counters, out, nq, nkv, \
                              page_stride, table_stride, max_splits, scale, rows_smem);              \
    }

// A cluster-free form of the rows entry (grid [nkv, max_splits, rows], block 128, no cluster
// dims, so any max_splits): row r's pages = ceil(len / 16) split in whole pages, pps =
// max(MIN_PAGES, ceil(pages / max_splits)) per split; a row of one split (or none) is written by
// its block at y = 0 alone (as attn_rows_run does at TARGET > 0); otherwise each split writes its
// normalized rows and log2-sum-exps to part_o[r, s] / part_lse[r, s], counts itself in
// counters[r, kv head], and the last block reduces the splits in order (decode_reduce_heads) and
// sets the counter back to 0. head_dim 128, up to 8 query heads per kv head.
template <int MIN_PAGES>
__device__ void attn_rows_flat_run(const bf16* qkv, const bf16* kv, const int* block_table, const int* seq_lens,
                                   float* part_o, float* part_lse, int* counters, bf16* out, int nq, int nkv,
                                   int64_t page_stride, int table_stride, int max_splits, float scale,
                                   unsigned char* smem) {
    constexpr int D = 128;
    const int row = blockIdx.z;
    const int split = blockIdx.y;
    const int head = blockIdx.x;
    const int group = nq / nkv;
    const int len = seq_lens[row];
    const int pages = (len + ROWS_PAGE - 1) / ROWS_PAGE;
    const int pps = max(MIN_PAGES, (pages + max_splits - 1) / max_splits);
    const int used = (pages + pps - 1) / pps;
    if (split >= max(used, 1)) {
        kern_pdl_wait();
        return;
    }
    bf16* out_row = out + (int64_t)row * nq * D;
    const bf16* qrow = qkv + (int64_t)row * (nq + 2 * nkv) * D;
    const int* table = block_table + (int64_t)row * table_stride;
    if (used <= 1) {
        const RowsSplit sp{kv, table, page_stride, nkv, head, len, pages, 0, pages};
        rows_write_whole<D, 1>(qrow, sp, group, scale, used, out_row + (int64_t)head * group * D, smem);
        return;
    }
    float* po = part_o + (int64_t)row * max_splits * nq * D;
    float* pl = part_lse + (int64_t)row * max_splits * nq;
    const RowsSplit sp{kv, table, page_stride, nkv, head, len, pages, split * pps, min(pps, pages - split * pps)};
    rows_fold_split<D, 1>(qrow, sp, group, scale * LOG2E, po + ((int64_t)split * nq + head * group) * D,
                          pl + split * nq + head * group, smem);
    __threadfence();
    __syncthreads();
    __shared__ int is_last;
    int* count = counters + (int64_t)row * nkv + head;
    if (threadIdx.x == 0) is_last = atomicAdd(count, 1) == used - 1;
    __syncthreads();
    if (!is_last) return;
    __threadfence();
    decode_reduce_heads(po, pl, out_row, head * group, group, used, nq, D, reinterpret_cast<float*>(smem));
    if (threadIdx.x == 0) *count = 0;
}

#define KERN_ROWS_FLAT(NAME, MIN_PAGES)                                                              \
    extern "C" __global__ void __launch_bounds__(128)                                                \
    NAME(const bf16* __restrict__ qkv, const bf16* __restrict__ kv, const int* __restrict__ block_table, \
         const int* __restrict__ seq_lens, float* part_o, float* part_lse, int* counters,              \
         bf16* __restrict__ out, int nq, int nkv, int head_dim, int page_tokens, int64_t page_stride,  \
         int table_stride, int max_splits, float scale) {                                            \
        kern_pdl_launch_dependents();                                                                \
        extern __shared__ __align__(16) unsigned char rows_smem[];                                   \
        const int group = nq / nkv;                                                                  \
        if (page_tokens != ROWS_PAGE || group * nkv != nq || group > 8 || head_dim != 128) __trap();  \
        attn_rows_flat_run<MIN_PAGES>(qkv, kv, block_table, seq_lens, part_o, part_lse, counters, out, nq, \
                                      nkv, page_stride, table_stride, max_splits, scale, rows_smem); \
    }
