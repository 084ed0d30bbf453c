// kern_attn_decode_rows' entry over attention.cuh's attn_rows_run, for lab builds that set
// KERN_ROWS_WARPS (warps per block) and KERN_ROWS_STAGES (page slots per warp) before including
// this header: the same arguments, grid and split plan as the product's entry in attention.cu;
// block [32 * KERN_ROWS_WARPS], rows_smem_bytes(head_dim) bytes of dynamic shared memory
// (KERN_ROWS_WARPS * KERN_ROWS_STAGES pages of head_dim x 2 x 16 bf16).
#pragma once
#pragma nv_diag_suppress 177  // attention.cuh's prefill helpers, unused here
#include "attention.cuh"

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
        attn_rows_run<128, 1>(qkv, kv, block_table, seq_lens, part_o, part_lse, counters, out, nq, nkv, \
                              page_stride, table_stride, max_splits, scale, rows_smem);              \
    }
