// kern_attn_decode: the one-launch decode attention of one row before kern_attn_decode_rows
// (attention.cu), kept as the baseline the lab's attention experiments (attention_wide.cu,
// attention_qkn.cu) and tools/lab/time_attention.py compare with. Its own module, so that it leaves
// attention.cu's cubin as it was. Its body is attention.cuh's attn_decode_run.
#include "attention_lab.cuh"

// kern_attn_decode_partial and kern_attn_decode_reduce in one launch. Clusters of DEC_CLUSTER (8)
// blocks along grid y, so `splits` (grid y) must be a multiple of 8: the driver refuses any other
// grid. Two split plans, chosen per launch from seq_len (uniform over the grid):
// - cluster path, up to DEC_CLUSTER * DEC_CLUSTER_PAGES pages (512 tokens at pages of 16) when a kv
//   head's rows fit (group * head_dim <= 2048): the first cluster along y takes the sequence in 8
//   splits of pps = ceil(pages / 8) pages (kern_attn_decode_partial's plan at splits = 8); each
//   block keeps its split's rows and lse in its shared memory, a cluster barrier, then every block
//   of the cluster (used or not) reduces a slice of the kv head's outputs from them; later clusters
//   exit at once; part_o, part_lse and `counters` are untouched. Bit-identical to partial +
//   reduce at splits = 8.
// - global path, otherwise: the `splits` plan (pps = ceil(pages / splits)); only the splits that
//   hold tokens run (s < used = ceil(pages / pps)). Each writes its partials to part_o / part_lse,
//   then counts itself in counters[kv head]; the block that counts last reduces the kv head's query
//   heads over the used splits into `out` and sets the counter back to 0, so `counters` (i32[nkv],
//   zero before the first launch) is zero again between launches. Bit-identical to partial +
//   reduce at `splits`.
// grid [nkv, splits], block [128].
// NOTE: the cluster shape sits on this declaration only: the definition keeps the
// `extern "C" __global__ void __launch_bounds__(N) kern_...(` form that kern_qwen3 and
// kern_qwen3.mined read the ABI from; the attribute carries over to the definition.
extern "C" __global__ void __cluster_dims__(1, DEC_CLUSTER, 1)
kern_attn_decode(const bf16* __restrict__ qkv, const bf16* __restrict__ kv,
                 const int* __restrict__ block_table, const int* __restrict__ seq_len,
                 float* part_o, float* part_lse, int* counters, bf16* __restrict__ out, int nq,
                 int nkv, int head_dim, int page_tokens, int64_t page_stride, int splits,
                 float scale);

extern "C" __global__ void __launch_bounds__(128)
kern_attn_decode(const bf16* __restrict__ qkv, const bf16* __restrict__ kv,
                 const int* __restrict__ block_table, const int* __restrict__ seq_len,
                 float* part_o, float* part_lse, int* counters, bf16* __restrict__ out, int nq,
                 int nkv, int head_dim, int page_tokens, int64_t page_stride, int splits,
                 float scale) {
    kern_pdl_launch_dependents();
    attn_decode_run(kv, block_table, seq_len, part_o, part_lse, counters, out, nq, nkv, head_dim,
                    page_tokens, page_stride, splits, scale, [&](int, int, int) { return qkv; });
}

