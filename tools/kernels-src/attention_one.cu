// The one-row step's decode attention (its device code: attention_cluster.cuh over attention.cuh).
// kern_attn_decode_rows' arguments, grid, block and shared memory, with a split plan for one row:
// short rows spread over a cluster of 8 blocks, whose combine runs in distributed shared memory.
#include "attention_cluster.cuh"

// Decode attention over `rows` sequences of their own lengths (grid z = row r): row r's query
// heads at qkv + r * (nq + 2 nkv) * head_dim (the fused qkv row), its length seq_lens[r], its
// block-table row block_table + r * table_stride, its output out + r * nq * head_dim.
// The split plan is the row's own, from seq_lens[r] (so a row gives the same bits alone and in any
// batch): its pages = ceil(len / 16) split in whole pages,
// - up to DEC_CLUSTER * ONE_CLUSTER_PAGES pages (1024 tokens): ceil(pages / 8) pages per split
//   over the first cluster of 8 blocks along y, combined through distributed shared memory
//   (cluster_reduce; part_o, part_lse and counters untouched; a row of 0 tokens gets zeros);
// - beyond: max(ROWS_WARPS, ceil(pages / max_splits)) pages per split; the splits of each cluster
//   combine through distributed shared memory into one partial per cluster, part_o[r, c] /
//   part_lse[r, c] (cluster_partial); every block of those clusters counts itself in
//   counters[r, kv head]; the last reduces the clusters' partials in order into out and sets the
//   counter back to 0.
// Blocks without a split exit at once (after the PDL wait). Scratch: part_o f32[rows, max_splits,
// nq, head_dim], part_lse f32[rows, max_splits, nq], counters i32[rows, nkv] (zero before the first
// launch, zero again after each). page_tokens 16, head_dim 64 or 128, nq / nkv <= 16 (the
// generator checks; anything else traps). grid [nkv, max_splits, rows] (max_splits a multiple of
// 8: clusters of 1 x 8 x 1), block [128], rows_smem_bytes(head_dim) bytes of dynamic shared
// memory (96 KiB at 128, 48 KiB at 64).
extern "C" __global__ void __cluster_dims__(1, DEC_CLUSTER, 1)
kern_attn_decode_one(const bf16* __restrict__ qkv, const bf16* __restrict__ kv,
                      const int* __restrict__ block_table, const int* __restrict__ seq_lens,
                      float* part_o, float* part_lse, int* counters, bf16* __restrict__ out, int nq,
                      int nkv, int head_dim, int page_tokens, int64_t page_stride, int table_stride,
                      int max_splits, float scale);

extern "C" __global__ void __launch_bounds__(128)
kern_attn_decode_one(const bf16* __restrict__ qkv, const bf16* __restrict__ kv,
                      const int* __restrict__ block_table, const int* __restrict__ seq_lens,
                      float* part_o, float* part_lse, int* counters, bf16* __restrict__ out, int nq,
                      int nkv, int head_dim, int page_tokens, int64_t page_stride, int table_stride,
                      int max_splits, float scale) {
    kern_pdl_launch_dependents();
    extern __shared__ __align__(16) unsigned char rows_smem[];
    rows_entry<RowsCluster>(qkv, kv, block_table, seq_lens, part_o, part_lse, counters, out, nq, nkv, head_dim,
                            page_tokens, page_stride, table_stride, max_splits, scale, rows_smem);
}
