// The attention entries (their device code: attention.cuh).
#include "attention.cuh"

// Split s of `splits` covers whole pages [s * pps, (s + 1) * pps) of the sequence's
// ceil(seq_len / page_tokens) pages, pps = ceil(pages / splits); an empty split writes lse -inf.
// part_o[s, h, :] is the split's normalized output, part_lse[s, h] its log2-sum-exp.
// head_dim in {64, 128}; nq / nkv <= 8 or a multiple of 8. grid [nkv, splits], block [128].
extern "C" __global__ void __launch_bounds__(128)
kern_attn_decode_partial(const bf16* __restrict__ qkv, const bf16* __restrict__ kv,
                         const int* __restrict__ block_table, const int* __restrict__ seq_len,
                         float* __restrict__ part_o, float* __restrict__ part_lse, int nq, int nkv,
                         int head_dim, int page_tokens, int64_t page_stride, int splits,
                         float scale) {
    kern_pdl_launch_dependents();
    kern_pdl_wait();
    const PagedKV paged{kv, block_table, nkv, head_dim, page_tokens, page_stride};
    const int len = *seq_len;
    const int pages = (len + page_tokens - 1) / page_tokens;
    const int pps = (pages + splits - 1) / splits;
    const int tok0 = min(blockIdx.y * pps * page_tokens, len);
    const int tok1 = min((blockIdx.y + 1) * pps * page_tokens, len);
    const int group = nq / nkv;
    const int64_t row0 = (int64_t)blockIdx.y * nq + blockIdx.x * group;
    __shared__ float smem[DEC_SMEM_FLOATS];
    decode_split_rows(qkv, paged, tok0, tok1, part_o + row0 * head_dim, part_lse + row0, group,
                      scale * LOG2E, smem);
}

// out[0, h * D + d] = bf16(sum_s w_s part_o[s, h, d] / sum_s w_s), w_s = 2^(lse_s - max lse).
// grid [nq], block [128].
extern "C" __global__ void kern_attn_decode_reduce(const float* __restrict__ part_o,
                                                   const float* __restrict__ part_lse,
                                                   bf16* __restrict__ out, int nq, int head_dim,
                                                   int splits) {
    kern_pdl_launch_dependents();
    kern_pdl_wait();
    const int h = blockIdx.x;
    float mx = KERN_NEG_INF;
    for (int s = 0; s < splits; ++s) mx = fmaxf(mx, part_lse[s * nq + h]);
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float num = 0.0f, den = 0.0f;
        for (int s = 0; s < splits; ++s) {
            const float lse = part_lse[s * nq + h];
            if (lse == KERN_NEG_INF) continue;
            const float w = exp2f(lse - mx);
            den += w;
            num += w * part_o[((int64_t)s * nq + h) * head_dim + d];
        }
        out[(int64_t)h * head_dim + d] = to_bf(den > 0.0f ? num / den : 0.0f);
    }
}

// out[i, h * D:(h + 1) * D] = softmax(q_i . K^T * scale, keys <= seq_len - rows + i) V, for the
// `rows` rows of this call; their own k/v are already in the pages (kern_kv_write runs first).
// head_dim in {64, 128}. grid [ceil_div(rows, 64), nq], block [128].
extern "C" __global__ void __launch_bounds__(128)
kern_attn_prefill(const bf16* __restrict__ qkv, const bf16* __restrict__ kv,
                  const int* __restrict__ block_table, const int* __restrict__ seq_len,
                  bf16* __restrict__ out, int rows, int nq, int nkv, int head_dim,
                  int page_tokens, int64_t page_stride, float scale) {
    kern_pdl_launch_dependents();
    kern_pdl_wait();
    const PagedKV paged{kv, block_table, nkv, head_dim, page_tokens, page_stride};
    const int len = *seq_len;
    __shared__ uint4 smem[sizeof(PrefillTile<128>) / sizeof(uint4)];
    if (head_dim == 64) {
        prefill_impl<64>(qkv, paged, len, out, rows, nq, scale * LOG2E, smem);
    } else {
        prefill_impl<128>(qkv, paged, len, out, rows, nq, scale * LOG2E, smem);
    }
}

// Decode attention over `rows` sequences of their own lengths (grid z = row r): row r's query
// heads at qkv + r * (nq + 2 nkv) * head_dim (the fused qkv row), its length seq_lens[r], its
// block-table row block_table + r * table_stride, its output out + r * nq * head_dim.
// The split plan is the row's own, from seq_lens[r] (so a row gives the same bits in any launch of
// two rows or more): its pages = ceil(len / 16) split in whole pages, max(m, ceil(pages /
// max_splits)) per split, m = 16, or 4 in a launch of one row (attention.cuh's attn_rows_run):
// - one split (up to 16 m tokens): the block at y = 0 writes the row's outputs itself (a row of 0
//   tokens gets zeros); part_o, part_lse and counters untouched;
// - more: each split writes its normalized rows and log2-sum-exps to part_o[r, s] / part_lse[r, s]
//   and counts itself in counters[r, kv head]; the last to count reduces the splits in order into
//   out and sets the counter back to 0.
// Blocks without a split exit at once (after the PDL wait). Scratch: part_o f32[rows, max_splits,
// nq, head_dim], part_lse f32[rows, max_splits, nq], counters i32[rows, nkv] (zero before the first
// launch, zero again after each). page_tokens 16, head_dim 64 or 128, nq / nkv <= 16 (the
// generator checks; anything else traps). grid [nkv, max_splits, rows] (any max_splits >= 1),
// block [128], rows_smem_bytes(head_dim) bytes of dynamic shared memory (96 KiB at 128, 48 KiB at
// 64).
extern "C" __global__ void __launch_bounds__(128)
kern_attn_decode_rows(const bf16* __restrict__ qkv, const bf16* __restrict__ kv,
                      const int* __restrict__ block_table, const int* __restrict__ seq_lens,
                      float* part_o, float* part_lse, int* counters, bf16* __restrict__ out, int nq,
                      int nkv, int head_dim, int page_tokens, int64_t page_stride, int table_stride,
                      int max_splits, float scale) {
    kern_pdl_launch_dependents();
    extern __shared__ __align__(16) unsigned char rows_smem[];
    rows_entry<RowsFlat>(qkv, kv, block_table, seq_lens, part_o, part_lse, counters, out, nq, nkv, head_dim,
                         page_tokens, page_stride, table_stride, max_splits, scale, rows_smem);
}
