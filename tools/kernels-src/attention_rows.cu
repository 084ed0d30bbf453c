// Decode attention over rows of different lengths (the batched decode step): each row its own q,
// sequence length, block-table row, partials and output. The device code is attention.cuh's split
// fold and reduce; the plan is kern_attn_decode_partial's per row (pages = ceil(seq_lens[r] / P),
// pps = ceil(pages / max_splits), used = ceil(pages / pps) splits hold tokens).
#include "attention.cuh"

// Row r = blockIdx.z: q at qkv + r * (nq + 2 * nkv) * head_dim, length seq_lens[r], block-table
// row block_table + r * table_stride, partials part_o [rows, max_splits, nq, head_dim] and
// part_lse [rows, max_splits, nq] (f32), out + r * nq * head_dim. Split s = blockIdx.y < used folds
// its pages, then counts itself in counters[r, kv head]; the block that counts last reduces the kv
// head's query heads over the used splits (kern_attn_decode_reduce's arithmetic) and sets the
// counter back to 0, so `counters` (i32 [rows, nkv], zero before the first launch) is zero again
// between launches. head_dim in {64, 128}; nq / nkv <= 8 or a multiple of 8.
// grid [nkv, max_splits, rows], block [128].
extern "C" __global__ void __launch_bounds__(128)
kern_attn_decode_rows(const bf16* __restrict__ qkv, const bf16* __restrict__ kv,
                      const int* __restrict__ block_table, const int* __restrict__ seq_lens,
                      float* part_o, float* part_lse, int* counters, bf16* __restrict__ out, int nq,
                      int nkv, int head_dim, int page_tokens, int64_t page_stride, int table_stride,
                      int max_splits, float scale) {
    kern_pdl_launch_dependents();
    kern_pdl_wait();
    const int r = blockIdx.z;
    const int len = seq_lens[r];
    const int pages = (len + page_tokens - 1) / page_tokens;
    const int pps = max((pages + max_splits - 1) / max_splits, 1);
    const int used = (pages + pps - 1) / pps;
    const int split = blockIdx.y;
    if (split >= used) return;
    const int group = nq / nkv;
    const PagedKV paged{kv, block_table + (int64_t)r * table_stride, nkv, head_dim, page_tokens, page_stride};
    float* row_o = part_o + (int64_t)r * max_splits * nq * head_dim;
    float* row_lse = part_lse + (int64_t)r * max_splits * nq;
    const int tok0 = min(split * pps * page_tokens, len);
    const int tok1 = min((split + 1) * pps * page_tokens, len);
    const int64_t row0 = (int64_t)split * nq + blockIdx.x * group;
    __shared__ float smem[DEC_SMEM_FLOATS];
    decode_split_rows(qkv + (int64_t)r * (nq + 2 * nkv) * head_dim, paged, tok0, tok1,
                      row_o + row0 * head_dim, row_lse + row0, group, scale * LOG2E, smem);
    __threadfence();
    __syncthreads();
    __shared__ int is_last;
    int* count = counters + (int64_t)r * nkv + blockIdx.x;
    if (threadIdx.x == 0) is_last = atomicAdd(count, 1) == used - 1;
    __syncthreads();
    if (!is_last) return;
    __threadfence();
    decode_reduce_heads(row_o, row_lse, out + (int64_t)r * nq * head_dim, blockIdx.x * group, group,
                        used, nq, head_dim, smem);
    if (threadIdx.x == 0) *count = 0;
}
