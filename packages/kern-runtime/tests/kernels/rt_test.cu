// Test kernels for kern-runtime's GPU tests (built by the test setup with nvcc for sm_90).
#include <cooperative_groups.h>

extern "C" __global__ void rt_axpb(const float* x, float* y, float a, float b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + b;
}

extern "C" __global__ void rt_mix(const float* x, float* y, float s, float t, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = fmaf(y[i], s, x[i] * t);
}

extern "C" __global__ void rt_fill_i64(long long* out, long long base, unsigned char step, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = base + (long long)step * i;
}

// Reverses n floats through dynamic shared memory (n * 4 bytes, more than 48 KiB in the test).
extern "C" __global__ void rt_smem_reverse(const float* x, float* y, int n) {
  extern __shared__ float buf[];
  for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = x[i];
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = buf[n - 1 - i];
}

// Each block writes its rank inside the cluster and the cluster's size.
extern "C" __global__ void rt_cluster_rank(int* out) {
  cooperative_groups::cluster_group c = cooperative_groups::this_cluster();
  if (threadIdx.x == 0) out[blockIdx.x] = (int)c.block_rank() * 100 + (int)c.num_blocks();
}

// A by-value pack: a 128-byte TMA descriptor, then an i32 to add (192 bytes, 64-byte aligned).
struct alignas(64) TmaPack {
  unsigned long long map[16];
  int add;
  int pad[15];
};

// Each block TMA-loads an 8 x 32 f32 box (rows blockIdx.x*8...) and writes 2*v + add.
extern "C" __global__ void rt_tma_tile(const __grid_constant__ TmaPack p, float* out) {
  __shared__ alignas(128) float tile[8 * 32];
  __shared__ alignas(8) unsigned long long bar;
  unsigned b = (unsigned)__cvta_generic_to_shared(&bar);
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(b));
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(8 * 32 * 4) : "memory");
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
        ::"r"((unsigned)__cvta_generic_to_shared(tile)), "l"(&p.map), "r"(0), "r"((int)blockIdx.x * 8), "r"(b)
        : "memory");
  }
  __syncthreads();
  asm volatile(
      "{\n .reg .pred done;\n WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n @!done bra WAIT_%=;\n}"
      ::"r"(b), "r"(0) : "memory");
  for (int i = threadIdx.x; i < 8 * 32; i += blockDim.x) out[blockIdx.x * 256 + i] = 2.0f * tile[i] + (float)p.add;
}

// Copies `count` floats from each of `ranks` peer addresses into out[r * count ..] (plain loads).
extern "C" __global__ void rt_peer_gather(const unsigned long long* peers, float* out, int ranks, int count) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= count) return;
  for (int r = 0; r < ranks; ++r) out[r * count + i] = reinterpret_cast<const float*>(peers[r])[i];
}
