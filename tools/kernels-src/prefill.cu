// kern-arch: sm_90a
// Causal prefill attention over paged KV on the tensor cores, wgmma (device code: prefill.cuh).
#include "prefill.cuh"

// out[i, h * D:(h + 1) * D] = softmax(q_i . K^T * scale, keys <= seq_len - rows + i) V for the
// `rows` rows of this chunk (query head h of row i in qkv[i, h * D ..]); their own k/v are
// already in the pages. Block (x, y, z): kv head y, packed rows [128 x', 128 x' + 128) with
// x' = gridDim.x - 1 - x, key split z of splits = prefill_splits(seq_len, rows, nq, nkv), chosen
// here from seq_len (blocks with z >= splits exit). One split: bf16 rows to `out`; more: f32
// normalized rows to part_o[z, i, h, :] and log2-sum-exps to part_lse[z, i, h] for
// kern_prefill_combine. part_o holds 2 * PF_SPLIT_ROWS * nq * head_dim floats, part_lse
// 2 * PF_SPLIT_ROWS * nq. head_dim in {64, 128}; nq a multiple of nkv.
// grid [ceil_div(rows * nq / nkv, 128), nkv, min(16, ceil_div(512, rows))], block [384],
// dynamic shared memory 1024 + 14 * 64 * head_dim * 2 bytes (PfSmem: Q and 6 K/V stages).
extern "C" __global__ void __launch_bounds__(PF_THREADS, 1)
kern_prefill_attn(const bf16* __restrict__ qkv, const bf16* __restrict__ kv,
                  const int* __restrict__ block_table, const int* __restrict__ seq_len,
                  bf16* __restrict__ out, float* __restrict__ part_o,
                  float* __restrict__ part_lse, int rows, int nq, int nkv, int head_dim,
                  int page_tokens, int64_t page_stride, float scale) {
    kern_pdl_launch_dependents();
    kern_pdl_wait();
    extern __shared__ __align__(1024) uint8_t pf_smem[];
    __shared__ PfBars bars;
    const uint32_t smem = (smem_u32(pf_smem) + 1023u) & ~1023u;
    const PfPages paged{kv, block_table, nkv, page_tokens, page_stride};
    const int len = *seq_len;
    const int splits = min((int)gridDim.z, prefill_splits(len, rows, nq, nkv));
    if ((int)blockIdx.z >= splits) return;
    if (threadIdx.x == 0) {
        for (int s = 0; s < PF_STAGES; ++s) {
            pf_mbar_init(&bars.full[s], PF_WG);
            pf_mbar_init(&bars.empty[s], 2 * PF_WG);
        }
        pf_mbar_init(&bars.q, PF_WG);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (head_dim == 64) {
        prefill_block<64>(qkv, paged, len, rows, nq, splits, out, part_o, part_lse, scale * PF_LOG2E, smem, bars);
    } else {
        prefill_block<128>(qkv, paged, len, rows, nq, splits, out, part_o, part_lse, scale * PF_LOG2E, smem, bars);
    }
}

// out[i, h, d] = bf16(sum_s w_s part_o[s, i, h, d] / sum_s w_s), w_s = 2^(lse_s - max_s lse_s),
// over the splits kern_prefill_attn chose for this chunk; nothing when it chose one (it wrote
// `out` itself). Block (i, h): row i's query head h, a thread per dim; every split's loads are in
// flight together (the sums run in split order). grid [rows, nq], block [128] (head_dim <= 128).
extern "C" __global__ void __launch_bounds__(128)
kern_prefill_combine(const float* __restrict__ part_o, const float* __restrict__ part_lse,
                     const int* __restrict__ seq_len, bf16* __restrict__ out, int rows, int nq,
                     int nkv, int head_dim) {
    kern_pdl_launch_dependents();
    kern_pdl_wait();
    const int len = *seq_len;
    const int splits = min(prefill_zcap(rows), prefill_splits(len, rows, nq, nkv));
    if (splits <= 1) return;
    const int64_t row = (int64_t)blockIdx.x * nq + blockIdx.y;
    const int64_t split_rows = (int64_t)rows * nq;
    const int d = threadIdx.x;
    if (d >= head_dim) return;
    float lse[PF_MAX_SPLITS], o[PF_MAX_SPLITS];
#pragma unroll
    for (int s = 0; s < PF_MAX_SPLITS; ++s) {
        lse[s] = s < splits ? part_lse[s * split_rows + row] : KERN_NEG_INF;
        o[s] = s < splits ? part_o[(s * split_rows + row) * head_dim + d] : 0.0f;
    }
    float mx = KERN_NEG_INF;
#pragma unroll
    for (int s = 0; s < PF_MAX_SPLITS; ++s) mx = fmaxf(mx, lse[s]);
    float num = 0.0f, den = 0.0f;
#pragma unroll
    for (int s = 0; s < PF_MAX_SPLITS; ++s) {
        if (lse[s] == KERN_NEG_INF) continue;
        const float w = exp2f(lse[s] - mx);
        den += w;
        num += w * o[s];
    }
    out[row * head_dim + d] = to_bf(den > 0.0f ? num / den : 0.0f);
}
