"""A CUDA child process for the capture's end-to-end test: loads a cubin and launches its kernel
`add_one(float* x, int n)` three ways (cuLaunchKernel with kernelParams, cuLaunchKernelEx with a
cluster of 2, cuLaunchKernel with a packed `extra` buffer), or with `host` once on pinned host
memory filled with 0xab and n=0. A failing driver call exits 1 naming the call.
Usage: python launch_child.py CUBIN SYMBOL [host]
"""

from __future__ import annotations

import ctypes
import struct
import sys
from typing import Any

from cuda.bindings import driver as cu  # pyright: ignore[reportAttributeAccessIssue]

# NOTE: the parameter buffer of add_one(float*, int): the pointer at 0 (8 bytes), the int at 8
# (4 bytes), 12 bytes in all. The driver takes CU_LAUNCH_PARAM_BUFFER_SIZE as the exact size of
# the kernel's parameters: a padded 16-byte struct is refused (CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES).
PACKED_SIZE = 12


def check(what: str, result: Any) -> Any:
    values = result if isinstance(result, tuple) else (result,)
    err = values[0]
    if err != cu.CUresult.CUDA_SUCCESS:
        raise SystemExit(f"driver call failed: {what}: {err}")
    return values[1] if len(values) == 2 else values[1:]


def host_launch(func: Any) -> None:
    host = check("cuMemAllocHost", cu.cuMemAllocHost(4096))
    ctypes.memset(int(host), 0xAB, 4096)
    ptr = ctypes.c_uint64(int(host))
    n = ctypes.c_int32(0)
    params = (ctypes.c_void_p * 2)(ctypes.addressof(ptr), ctypes.addressof(n))
    check(
        "cuLaunchKernel (kernelParams, host pointer)",
        cu.cuLaunchKernel(func, 1, 1, 1, 32, 1, 1, 0, cu.CUstream(0), ctypes.addressof(params), 0),
    )
    check("cuCtxSynchronize", cu.cuCtxSynchronize())
    check("cuMemFreeHost", cu.cuMemFreeHost(host))


def main(cubin: str, symbol: str, mode: str) -> None:
    check("cuInit", cu.cuInit(0))
    dev = check("cuDeviceGet", cu.cuDeviceGet(0))
    ctx = check("cuDevicePrimaryCtxRetain", cu.cuDevicePrimaryCtxRetain(dev))
    check("cuCtxSetCurrent", cu.cuCtxSetCurrent(ctx))
    with open(cubin, "rb") as f:
        image = f.read()
    module = check("cuModuleLoadData", cu.cuModuleLoadData(image))
    func = check("cuModuleGetFunction", cu.cuModuleGetFunction(module, symbol.encode()))
    if mode == "host":
        host_launch(func)
        return
    buf = check("cuMemAlloc", cu.cuMemAlloc(1 << 16))
    ptr = ctypes.c_uint64(int(buf))
    n = ctypes.c_int32(1000)
    params = (ctypes.c_void_p * 2)(ctypes.addressof(ptr), ctypes.addressof(n))
    check(
        "cuLaunchKernel (kernelParams)",
        cu.cuLaunchKernel(func, 4, 1, 1, 256, 1, 1, 0, cu.CUstream(0), ctypes.addressof(params), 0),
    )
    check("cuCtxSynchronize after the kernelParams launch", cu.cuCtxSynchronize())

    config = cu.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = 4, 1, 1
    config.blockDimX, config.blockDimY, config.blockDimZ = 128, 1, 1
    attr = cu.CUlaunchAttribute()
    attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = 2, 1, 1
    config.attrs = [attr]
    config.numAttrs = 1
    check(
        "cuLaunchKernelEx (cluster 2x1x1)",
        cu.cuLaunchKernelEx(config, func, ctypes.addressof(params), 0),
    )
    check("cuCtxSynchronize after the cluster launch", cu.cuCtxSynchronize())

    # 8-byte aligned storage holding exactly the 12 bytes of the parameters
    storage = (ctypes.c_uint64 * 2)()
    ctypes.memmove(storage, struct.pack("<Qi", int(buf), 1000), PACKED_SIZE)
    size = ctypes.c_size_t(PACKED_SIZE)
    extra = (ctypes.c_void_p * 5)(1, ctypes.addressof(storage), 2, ctypes.addressof(size), 0)
    check(
        "cuLaunchKernel (packed extra buffer)",
        cu.cuLaunchKernel(func, 2, 1, 1, 64, 1, 1, 0, cu.CUstream(0), 0, ctypes.addressof(extra)),
    )
    check("cuCtxSynchronize after the packed launch", cu.cuCtxSynchronize())
    check("cuMemFree", cu.cuMemFree(buf))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "device")
