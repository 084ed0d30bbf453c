// Shared device helpers for kern's own kernels (bf16 rounding, reductions, vector access).
// NOTE: every rounding helper rounds to nearest even, as torch does for bf16 tensors.
#pragma once

#include <cuda_bf16.h>
#include <stdint.h>

typedef __nv_bfloat16 bf16;

#define KERN_NEG_INF (-__int_as_float(0x7f800000))

// Programmatic dependent launch (PDL, sm_90). A launch with `"pdl": true` may start while the
// previous launch of the stream still runs; `kern_pdl_wait` blocks until that launch has completed
// and its writes are visible, so every kernel calls it before it reads anything an earlier launch
// wrote and before it writes anything an earlier launch reads. Without PDL both are no-ops.
// `kern_pdl_launch_dependents` lets the next launch of the stream start its blocks (up to their
// own wait) as soon as every block of this grid has passed it.
static __device__ __forceinline__ void kern_pdl_wait() {
    asm volatile("griddepcontrol.wait;" ::: "memory");
}

static __device__ __forceinline__ void kern_pdl_launch_dependents() {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

static __device__ __forceinline__ float bf(float x) {
    return __bfloat162float(__float2bfloat16_rn(x));
}

static __device__ __forceinline__ float to_f(bf16 x) { return __bfloat162float(x); }

static __device__ __forceinline__ bf16 to_bf(float x) { return __float2bfloat16_rn(x); }

// c += a b on the tensor cores: mma.sync m16n8k16, bf16 inputs, f32 accumulator (a: the 16 x 16
// A fragment, b0 / b1: the 16 x 8 B fragment, as the PTX ISA lays them out per lane).
static __device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                                uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Unpacks 8 bf16 held in a uint4 into floats.
static __device__ __forceinline__ void unpack8(const uint4 v, float* out) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        out[2 * i] = __uint_as_float(w[i] << 16);
        out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

static __device__ __forceinline__ uint32_t pack2(float lo, float hi) {
    const uint32_t a = __bfloat16_as_ushort(to_bf(lo));
    const uint32_t b = __bfloat16_as_ushort(to_bf(hi));
    return a | (b << 16);
}

static __device__ __forceinline__ uint4 pack8(const float* v) {
    return make_uint4(pack2(v[0], v[1]), pack2(v[2], v[3]), pack2(v[4], v[5]), pack2(v[6], v[7]));
}

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
static __device__ __forceinline__ float block_sum(float v) {
    __shared__ float partial[32];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int nwarps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    float t = lane < nwarps ? partial[lane] : 0.0f;
    return warp_sum(t);
}
