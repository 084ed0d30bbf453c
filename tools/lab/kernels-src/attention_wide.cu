// Decode attention for long contexts: kern_attn_decode with a two-level combine on its global path.
// Its own module, so that adding it leaves attention.cu's cubin as it was.
//
// kern_attn_decode's global path (beyond 32 pages) has each of its `splits` blocks per kv head write
// a partial, and the last block to count folds all of them: one block of 128 threads doing
// splits x group x head_dim dependent L2 loads, a serial tail that grows with the splits (the
// one-launch attention at 8192 tokens: 54.9 us at 32 splits, 68.0 at 128, 101.6 at 256 on the H200,
// docs/perf.md). Here, where a kv head's rows fit a cluster block's shared area (group * head_dim
// <= 2048), the 8 blocks of each cluster first combine their splits through distributed shared
// memory into one partial (cluster_partial, attention.cu), and the last block folds only the
// ceil(used / 8) clusters' partials; so more splits buy parallelism without a longer tail.
// Everything else is kern_attn_decode's (attn_decode_run): the split plan, the L2 prefetch before
// the PDL wait, the cluster path up to 32 pages (bit-identical to kern_attn_decode there), the
// global path for wider groups.
// part_o / part_lse hold `splits` rows, as kern_attn_decode's (the two-level path writes ceil(used / 8)
// of them, the wider groups' global path up to `splits`); counters as kern_attn_decode's
// (i32[nkv], zero before the first launch, zero again after each). grid [nkv, splits] (splits a
// multiple of 8), block [128].
#include "attention_lab.cuh"

// The `_late` entries: kern_attn_decode and kern_attn_decode_wide (the same bits) that let the next
// launch start only once their blocks have folded their splits, not at their start, so the next
// GEMV's weight loads (issued before its own PDL wait) queue behind this launch's KV loads instead
// of ahead of them.
extern "C" __global__ void __cluster_dims__(1, DEC_CLUSTER, 1)
kern_attn_decode_late(const bf16* __restrict__ qkv, const bf16* __restrict__ kv,
                      const int* __restrict__ block_table, const int* __restrict__ seq_len,
                      float* part_o, float* part_lse, int* counters, bf16* __restrict__ out, int nq,
                      int nkv, int head_dim, int page_tokens, int64_t page_stride, int splits,
                      float scale);

extern "C" __global__ void __cluster_dims__(1, DEC_CLUSTER, 1)
kern_attn_decode_wide_late(const bf16* __restrict__ qkv, const bf16* __restrict__ kv,
                           const int* __restrict__ block_table, const int* __restrict__ seq_len,
                           float* part_o, float* part_lse, int* counters, bf16* __restrict__ out,
                           int nq, int nkv, int head_dim, int page_tokens, int64_t page_stride,
                           int splits, float scale);

extern "C" __global__ void __cluster_dims__(1, DEC_CLUSTER, 1)
kern_attn_decode_wide(const bf16* __restrict__ qkv, const bf16* __restrict__ kv,
                      const int* __restrict__ block_table, const int* __restrict__ seq_len,
                      float* part_o, float* part_lse, int* counters, bf16* __restrict__ out, int nq,
                      int nkv, int head_dim, int page_tokens, int64_t page_stride, int splits,
                      float scale);

extern "C" __global__ void __launch_bounds__(128)
kern_attn_decode_wide(const bf16* __restrict__ qkv, const bf16* __restrict__ kv,
                      const int* __restrict__ block_table, const int* __restrict__ seq_len,
                      float* part_o, float* part_lse, int* counters, bf16* __restrict__ out, int nq,
                      int nkv, int head_dim, int page_tokens, int64_t page_stride, int splits,
                      float scale) {
    kern_pdl_launch_dependents();
    attn_decode_run<true>(kv, block_table, seq_len, part_o, part_lse, counters, out, nq, nkv, head_dim,
                          page_tokens, page_stride, splits, scale, [&](int, int, int) { return qkv; });
}

extern "C" __global__ void __launch_bounds__(128)
kern_attn_decode_late(const bf16* __restrict__ qkv, const bf16* __restrict__ kv,
                      const int* __restrict__ block_table, const int* __restrict__ seq_len,
                      float* part_o, float* part_lse, int* counters, bf16* __restrict__ out, int nq,
                      int nkv, int head_dim, int page_tokens, int64_t page_stride, int splits,
                      float scale) {
    attn_decode_run<false, true>(kv, block_table, seq_len, part_o, part_lse, counters, out, nq, nkv, head_dim,
                                 page_tokens, page_stride, splits, scale, [&](int, int, int) { return qkv; });
}

extern "C" __global__ void __launch_bounds__(128)
kern_attn_decode_wide_late(const bf16* __restrict__ qkv, const bf16* __restrict__ kv,
                           const int* __restrict__ block_table, const int* __restrict__ seq_len,
                           float* part_o, float* part_lse, int* counters, bf16* __restrict__ out,
                           int nq, int nkv, int head_dim, int page_tokens, int64_t page_stride,
                           int splits, float scale) {
    attn_decode_run<true, true>(kv, block_table, seq_len, part_o, part_lse, counters, out, nq, nkv, head_dim,
                                page_tokens, page_stride, splits, scale, [&](int, int, int) { return qkv; });
}
