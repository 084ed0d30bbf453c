// kern_attn_decode_rows with at least 64 pages a split in a launch of several rows (the product
// takes 16: attention.cuh's ROWS_MIN_PAGES); the same ABI, grid, shared memory and scratch.
#define KERN_ROWS_MIN_PAGES 64
#include "attention.cuh"

extern "C" __global__ void __launch_bounds__(128)
kern_attn_decode_rows_m64(const bf16* __restrict__ qkv, const bf16* __restrict__ kv,
                          const int* __restrict__ block_table, const int* __restrict__ seq_lens,
                          float* part_o, float* part_lse, int* counters, bf16* __restrict__ out, int nq,
                          int nkv, int head_dim, int page_tokens, int64_t page_stride, int table_stride,
                          int max_splits, float scale) {
    kern_pdl_launch_dependents();
    extern __shared__ __align__(16) unsigned char rows_smem[];
    rows_entry<RowsFlat>(qkv, kv, block_table, seq_lens, part_o, part_lse, counters, out, nq, nkv, head_dim,
                         page_tokens, page_stride, table_stride, max_splits, scale, rows_smem);
}
