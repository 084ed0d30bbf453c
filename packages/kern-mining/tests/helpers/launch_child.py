"""A CUDA child process for the capture's end-to-end test: loads a cubin and launches its kernel
three ways (cuLaunchKernel with kernelParams, cuLaunchKernelEx with a cluster, cuLaunchKernel with
a packed `extra` buffer), or with `host` once on pinned host memory filled with 0xab and n=0.
Usage: python launch_child.py CUBIN SYMBOL [host]
"""

from __future__ import annotations

import ctypes
import sys

from cuda.bindings import driver as cu


def check(result: object) -> object:
    values = result if isinstance(result, tuple) else (result,)
    err = values[0]
    if err != cu.CUresult.CUDA_SUCCESS:
        raise SystemExit(f"driver call failed: {err}")
    return values[1] if len(values) == 2 else values[1:]


def host_launch(func: object) -> None:
    host = check(cu.cuMemAllocHost(4096))
    ctypes.memset(int(host), 0xAB, 4096)
    ptr = ctypes.c_uint64(int(host))
    n = ctypes.c_int32(0)
    params = (ctypes.c_void_p * 2)(ctypes.addressof(ptr), ctypes.addressof(n))
    check(
        cu.cuLaunchKernel(func, 1, 1, 1, 32, 1, 1, 0, cu.CUstream(0), ctypes.addressof(params), 0)
    )
    check(cu.cuCtxSynchronize())
    check(cu.cuMemFreeHost(host))


def main(cubin: str, symbol: str, mode: str) -> None:
    check(cu.cuInit(0))
    dev = check(cu.cuDeviceGet(0))
    ctx = check(cu.cuDevicePrimaryCtxRetain(dev))
    check(cu.cuCtxSetCurrent(ctx))
    with open(cubin, "rb") as f:
        image = f.read()
    module = check(cu.cuModuleLoadData(image))
    func = check(cu.cuModuleGetFunction(module, symbol.encode()))
    if mode == "host":
        host_launch(func)
        return
    buf = check(cu.cuMemAlloc(1 << 16))
    ptr = ctypes.c_uint64(int(buf))
    n = ctypes.c_int32(1000)
    params = (ctypes.c_void_p * 2)(ctypes.addressof(ptr), ctypes.addressof(n))
    check(
        cu.cuLaunchKernel(func, 4, 1, 1, 256, 1, 1, 0, cu.CUstream(0), ctypes.addressof(params), 0)
    )

    config = cu.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = 4, 1, 1
    config.blockDimX, config.blockDimY, config.blockDimZ = 128, 1, 1
    attr = cu.CUlaunchAttribute()
    attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = 2, 1, 1
    config.attrs = [attr]
    config.numAttrs = 1
    check(cu.cuLaunchKernelEx(config, func, ctypes.addressof(params), 0))

    class Packed(ctypes.Structure):
        _fields_ = [("x", ctypes.c_uint64), ("n", ctypes.c_int32), ("pad", ctypes.c_int32)]

    packed = Packed(int(buf), 1000, 0)
    size = ctypes.c_size_t(ctypes.sizeof(packed))
    extra = (ctypes.c_void_p * 5)(1, ctypes.addressof(packed), 2, ctypes.addressof(size), 0)
    check(cu.cuLaunchKernel(func, 2, 1, 1, 64, 1, 1, 0, cu.CUstream(0), 0, ctypes.addressof(extra)))
    check(cu.cuCtxSynchronize())
    check(cu.cuMemFree(buf))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "device")
