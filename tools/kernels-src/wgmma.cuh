// Hopper warpgroup MMA (wgmma, sm_90a; a module that includes this header declares
// `// kern-arch: sm_90a`): shared-memory matrix descriptors of the 128-byte swizzle, the fences and
// group waits, and the three bf16 -> f32 shapes the prefill attention (prefill.cuh) issues. Facts
// from the PTX ISA ("Asynchronous Warpgroup Level Matrix Multiply-Accumulate Instructions"):
//
// - A warpgroup is 4 consecutive warps (128 threads); every wgmma instruction is issued by all of
//   them with the same descriptors. m64nNk16: D[64][N] (+)= A[64][16] B[16][N], f32 D in N/2
//   registers per thread: warp w of the group holds rows 16w..16w+15 and, exactly as mma.m16n8
//   does per 8 columns, register 4j + e holds row 16w + lane/4 + 8 (e/2), column
//   8j + 2 (lane%4) + e%2. A from registers (4 x b32 per thread) has mma.m16n8k16's A layout per
//   warp: {(g, 2t..2t+1), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..)}, g = lane/4, t = lane%4, low
//   half first.
// - Shared-memory operands are read through 64-bit descriptors: bits 0-13 start address >> 4,
//   16-29 leading dimension byte offset (LBO) >> 4, 32-45 stride dimension byte offset (SBO) >> 4,
//   49-51 base offset (0 when the swizzle pattern starts on a 1024-byte boundary), 62-63 swizzle
//   mode (1 = 128-byte swizzle).
// - 128-byte swizzle: an atom is 8 rows of 128 bytes (64 bf16) at consecutive 128-byte rows, 1024
//   bytes, 1024-byte aligned; the 16-byte chunk c of row r of an atom lies at chunk c ^ (r % 8).
//   K-major (the K index contiguous: imm-trans 0): one k16 step reads 32 bytes of each row, so the
//   start address moves by 32 bytes per step inside an atom; SBO = the distance between groups of
//   8 rows (M or N); LBO is unused (1). MN-major (the M/N index contiguous: imm-trans 1, only for B
//   here): LBO = the distance between atoms along N (64 elements each), SBO = the distance between
//   groups of 8 rows along K.
// - wgmma.fence before the first wgmma and between any other access of an accumulator or an A
//   fragment register and the wgmma that uses it; commit_group closes a group, wait_group N waits
//   until at most N groups are pending. Reading D or reusing A before the wait is undefined.
// - wgmma reads shared memory in the async proxy: writes made by threads (st.shared, cp.async)
//   need fence.proxy.async before a barrier that orders them before the wgmma. A wgmma's completion
//   (its wait) implies the opposite fence, so a stage can be refilled after every warp has waited.
#pragma once
#include <stdint.h>

constexpr uint32_t WG_ATOM_ROW = 128;   // bytes per swizzled row (64 bf16)
constexpr uint32_t WG_SLAB = 64 * 128;  // 64 rows x 64 bf16, the unit the kernels stack

// A 128-byte-swizzle descriptor for a matrix starting at shared address `addr` (its atoms
// 1024-byte aligned: base offset 0).
static __device__ __forceinline__ uint64_t wg_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((addr & 0x3FFFFu) >> 4) | ((uint64_t)((lbo & 0x3FFFFu) >> 4) << 16) |
           ((uint64_t)((sbo & 0x3FFFFu) >> 4) << 32) | (1ull << 62);
}

// The byte offset of 16-byte chunk `chunk` (8 bf16) of row `row` in a stack of swizzled slabs of
// 64 rows: chunk / 8 picks the slab (64 columns each), row the 128-byte line in it.
static __device__ __forceinline__ uint32_t wg_swizzle(int row, int chunk) {
    return (uint32_t)(chunk >> 3) * WG_SLAB + (uint32_t)row * WG_ATOM_ROW +
           ((uint32_t)((chunk & 7) ^ (row & 7)) << 4);
}

static __device__ __forceinline__ void wg_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

static __device__ __forceinline__ void wg_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

template <int N>
static __device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Orders this thread's earlier generic-proxy writes of shared memory (cp.async included) before
// later async-proxy reads (wgmma) once a barrier has followed.
static __device__ __forceinline__ void wg_fence_proxy_smem() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Keeps the compiler from moving reads or writes of accumulator registers across a wgmma issue or
// wait (the registers are written asynchronously between the two).
template <int N>
static __device__ __forceinline__ void wg_pin(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// D[64][64] (+)= A[64][16] B[16][64], A and B K-major in shared memory; `accumulate` 0: D = A B.
static __device__ __forceinline__ void wg_m64n64k16_ss(float (&d)[32], uint64_t a, uint64_t b,
                                                       int accumulate) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, "
        "%8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, "
        "%24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, p, 1, 1, 0, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
          "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]),
          "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(a), "l"(b), "r"(accumulate)
        : "memory");
}

// D[64][64] += A[64][16] B[16][64], A from registers, B MN-major (N contiguous) in shared memory.
static __device__ __forceinline__ void wg_m64n64k16_rs(float (&d)[32], const uint32_t (&a)[4],
                                                       uint64_t b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, "
        "%8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, "
        "%24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
          "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]),
          "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b)
        : "memory");
}

// D[64][128] += A[64][16] B[16][128], A from registers, B MN-major (N contiguous) in shared memory.
static __device__ __forceinline__ void wg_m64n128k16_rs(float (&d)[64], const uint32_t (&a)[4],
                                                        uint64_t b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, "
        "%8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, "
        "%24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, "
        "%40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, "
        "%56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),
          "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]),
          "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]),
          "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
          "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),
          "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]),
          "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b)
        : "memory");
}
