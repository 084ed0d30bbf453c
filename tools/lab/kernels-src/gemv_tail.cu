// GEMVs that end with the add + RMSNorm after them (`_an`): where the decode step had a GEMV of y
// and then kern_add_rmsnorm(res, y, w_norm -> x), one launch does both, and the norm runs in the
// GEMV's last block instead of in the prologue of every block of the next GEMV (gemv_norm.cu). So
// the next GEMV reads a finished x and may stream its weights from its first instruction (`_p4`'s
// bulk copies before its PDL wait) with no norm of its own to wait for. Its own module, so that
// adding it leaves gemv.cu's and gemv_norm.cu's cubins as they were.
//
// Every block runs its entry's GEMV body (the same bits as that entry: `_s4`, `_p4`), then fences
// its y writes and counts itself, in two levels so that no counter takes more than TAIL_GROUP
// same-address atomics (on the H200 one counter for 2560 blocks measured the same: the tail's cost
// is the last block's norm behind the next GEMV's weight stream, tools/lab/notes/decode-passes.md; the two
// levels keep the count off a single L2 slice for larger grids): block b counts in counter[1 + (b / TAIL_GROUP) *
// TAIL_STRIDE]; the block that completes a group sets that counter back to 0 and counts the group
// in counter[0]; the block that completes the last group (all of y is written)
// computes h = bf16(res_in + y) and x = bf16(bf16(h * r) * w_norm) in kern_add_rmsnorm's order
// (add_norm_prologue's 128-thread emulation: the same bits), writes h to res_out (another buffer
// than res_in, as gemv_norm.cu's entries) and x to x_out, and sets *counter back to 0, so the
// counter (i32, zero before the first launch) is zero again between launches. The norm is over
// the GEMV's n outputs: y has row stride n (y_stride == n), x_out and res_out [rows, n]. `counter`
// holds 1 + TAIL_STRIDE * ceil(grid / TAIL_GROUP) i32.
// rows 1..4; blocks of 128 threads; the dynamic shared memory holds at least h and x
// (4 * rows * n bytes; `_p4` reuses its rows' area for them), else the launch writes nothing.
#include "gemv_norm.cuh"

constexpr int TAIL_GROUP = 64;   // blocks per first-level counter
constexpr int TAIL_STRIDE = 32;  // i32 between first-level counters: one 128-byte line each

// The last block's add + RMSNorm after the GEMV (above); every block of the grid calls it once.
template <int R>
static __device__ __forceinline__ void add_norm_tail(const bf16* res_in, const bf16* y, const bf16* w_norm,
                                                     bf16* res_out, bf16* x_out, int* counter, int n, float eps) {
    extern __shared__ __align__(16) unsigned char tail_smem[];
    __shared__ int tail_last;
    kern_pdl_wait();  // NOTE: a block whose body had no column may not have waited; the norm reads res_in
    __threadfence();  // this block's y writes, before its count
    __syncthreads();
    if (threadIdx.x == 0) {
        const int group = (int)blockIdx.x / TAIL_GROUP;
        const int groups = ((int)gridDim.x + TAIL_GROUP - 1) / TAIL_GROUP;
        int* count = counter + 1 + group * TAIL_STRIDE;
        bool last = false;
        if (atomicAdd(count, 1) == min(TAIL_GROUP, (int)gridDim.x - group * TAIL_GROUP) - 1) {
            *count = 0;       // no block of this launch counts here again
            __threadfence();  // the group's y writes (seen through its atomics), before the group's count
            last = atomicAdd(counter, 1) == groups - 1;
        }
        tail_last = last;
    }
    __syncthreads();
    if (!tail_last) return;
    __threadfence();  // every other block's y writes, before this block's reads
    bf16* h_s = reinterpret_cast<bf16*>(tail_smem);
    bf16* x_s = h_s + (size_t)R * n;
    add_norm_prologue<R>(res_in, y, w_norm, res_out, h_s, x_s, n, eps, true);  // ends in a barrier
    for (int c = threadIdx.x; c < R * n / 8; c += blockDim.x)
        reinterpret_cast<uint4*>(x_out)[c] = reinterpret_cast<const uint4*>(x_s)[c];
    if (threadIdx.x == 0) *counter = 0;
}

// Runs body(R) then the tail for rows 1..4, if the launch fits the contract above (block-uniform);
// otherwise lets the grid complete after the launch before it and writes nothing.
template <typename Body>
static __device__ __forceinline__ void with_tail(int rows, int n, int y_stride, const bf16* res_in, const bf16* y,
                                                 const bf16* w_norm, bf16* res_out, bf16* x_out, int* counter,
                                                 float eps, Body body) {
    if (blockDim.x != 128) __trap();  // the norm's order emulates kern_add_rmsnorm with 4 warps
    with_rows(rows, [&](auto rr) {
        constexpr int R = decltype(rr)::value;
        if (y_stride != n || n % 8 != 0 || dynamic_smem_bytes() < (uint32_t)(4 * R * n)) {
            kern_pdl_launch_dependents();
            kern_pdl_wait();
            return;
        }
        body(rr);
        add_norm_tail<R>(res_in, y, w_norm, res_out, x_out, counter, n, eps);
    });
}

// kern_gemv_bf16_s4, then kern_add_rmsnorm(res_in + y -> res_out, w_norm -> x_out) in its last
// block: the same bits as that pair. Grid [n, 1, 1], block [128, 1, 1], dynamic shared memory
// 4 * rows * n bytes.
extern "C" __global__ void __launch_bounds__(128)
    kern_gemv_bf16_s4_an(const bf16* __restrict__ x, const bf16* __restrict__ w, bf16* y, int rows, int n,
        int k, int y_stride, const bf16* __restrict__ res_in, const bf16* __restrict__ w_norm,
        bf16* __restrict__ res_out, bf16* __restrict__ x_out, int* counter, float eps) {
    with_tail(rows, n, y_stride, res_in, y, w_norm, res_out, x_out, counter, eps, [&](auto r) {
        gemv_rows<4, 1, 4, 4, GEMV_STORE, decltype(r)::value>(x, w, y, n, k, y_stride);
    });
}

// kern_gemv_bf16_p4, then the add + RMSNorm in its last block (as kern_gemv_bf16_s4_an). Grid
// [ceil_div(n, nc), 1, 1], block [128, 1, 1], dynamic shared memory max(nc * 2k, 4 * rows * n)
// bytes (nc = that / 2k columns per block, at least 1).
extern "C" __global__ void __launch_bounds__(128)
    kern_gemv_bf16_p4_an(const bf16* __restrict__ x, const bf16* __restrict__ w, bf16* y, int rows, int n,
        int k, int y_stride, const bf16* __restrict__ res_in, const bf16* __restrict__ w_norm,
        bf16* __restrict__ res_out, bf16* __restrict__ x_out, int* counter, float eps) {
    with_tail(rows, n, y_stride, res_in, y, w_norm, res_out, x_out, counter, eps, [&](auto r) {
        gemv_p4_rows<GEMV_STORE, decltype(r)::value>(x, w, y, n, k, y_stride);
    });
}
