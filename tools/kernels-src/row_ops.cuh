// Row arithmetic of the RMSNorm kernels (qwen3_core.cu), shared with the GEMVs that fold an
// add + RMSNorm into their prologue (gemv_norm.cuh): the same roundings, so the same bits.
#pragma once
#include "kern_common.cuh"

// n = bf16(bf16(x * r) * w) for 8 elements.
static __device__ __forceinline__ uint4 norm8(const uint4 xv, const uint4 wv, float r) {
    float x[8], w[8], o[8];
    unpack8(xv, x);
    unpack8(wv, w);
#pragma unroll
    for (int i = 0; i < 8; ++i) o[i] = bf(x[i] * r) * w[i];
    return pack8(o);
}

// bf16(a + b) for 8 elements (the residual add, rounded as torch rounds a bf16 sum).
static __device__ __forceinline__ uint4 add8(const uint4 av, const uint4 bv) {
    float a[8], b[8];
    unpack8(av, a);
    unpack8(bv, b);
#pragma unroll
    for (int i = 0; i < 8; ++i) a[i] = bf(a[i] + b[i]);
    return pack8(a);
}

static __device__ __forceinline__ float sumsq8(const uint4 v) {
    float x[8];
    unpack8(v, x);
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) s += x[i] * x[i];
    return s;
}
