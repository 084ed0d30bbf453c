"""The driver shell: every CUDA driver call of kern_runtime goes through this module.

Each call's result passes `check()`, which unpacks cuda-bindings' `(CUresult, *values)` and raises
`CudaError` naming the call and the driver's explanation. Pointers cross this boundary as ints.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable, Sequence
from typing import Any

from cuda.bindings import driver as cu  # pyright: ignore[reportAttributeAccessIssue]

from .errors import CudaError, NoDriverError

__all__ = ["check", "cu"]

_SUCCESS = cu.CUresult.CUDA_SUCCESS
_initialized = False


def explain(code: Any) -> str:
    """The driver's name and text for a CUresult (falls back to the enum name)."""
    try:
        err, name = cu.cuGetErrorName(code)
        err2, text = cu.cuGetErrorString(code)
    except Exception:
        return str(code)
    if err != _SUCCESS or err2 != _SUCCESS:
        return str(code)
    return f"{name.decode()}: {text.decode()}"


def check(call: str, result: Any) -> Any:
    """Unpack a cuda-bindings result tuple; raise CudaError if the CUresult is not success.

    Returns None for a bare status, the single value, or a tuple of values.
    """
    if isinstance(result, tuple):
        err = result[0]
        values: tuple[Any, ...] = result[1:]
    else:
        err, values = result, ()
    if err != _SUCCESS:
        raise CudaError(call, int(err), explain(err))
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def _call(fn: Callable[..., Any], *args: Any) -> Any:
    return check(fn.__name__, fn(*args))


def init() -> None:
    """cuInit once; a machine without libcuda raises NoDriverError."""
    global _initialized
    if _initialized:
        return
    try:
        result = cu.cuInit(0)
    except (RuntimeError, OSError) as exc:  # cuda-pathfinder's DynamicLibNotFoundError
        raise NoDriverError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from exc
    check("cuInit", result)
    _initialized = True


# -- devices, contexts, streams, events ---------------------------------------------------------


def device_count() -> int:
    """NVIDIA devices visible to this process (cuInit, then cuDeviceGetCount).

    Raises:
        NoDriverError: no libcuda on this machine.
        CudaError: cuInit or cuDeviceGetCount fails (no device usable by this driver).
    """
    init()
    return int(_call(cu.cuDeviceGetCount))


def device(ordinal: int) -> Any:
    init()
    return _call(cu.cuDeviceGet, ordinal)


def device_attribute(dev: Any, attr: Any) -> int:
    return int(check("cuDeviceGetAttribute", cu.cuDeviceGetAttribute(attr, dev)))


def compute_capability(dev: Any) -> tuple[int, int]:
    a = cu.CUdevice_attribute
    major = device_attribute(dev, a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
    minor = device_attribute(dev, a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
    return major, minor


def device_pci_bus_id(dev: Any) -> str:
    """The device's PCI address as sysfs spells it (`0000:3b:00.0`)."""
    raw = _call(cu.cuDeviceGetPCIBusId, 64, dev)
    text = raw if isinstance(raw, str) else bytes(raw).decode(errors="replace")
    text = text.split("\0", 1)[0].strip()
    domain, rest = text.split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"


def primary_context(dev: Any) -> Any:
    ctx = _call(cu.cuDevicePrimaryCtxRetain, dev)
    _call(cu.cuCtxSetCurrent, ctx)
    return ctx


def release_primary_context(dev: Any) -> None:
    _call(cu.cuDevicePrimaryCtxRelease, dev)


def set_current(ctx: Any) -> None:
    _call(cu.cuCtxSetCurrent, ctx)


def stream_create() -> Any:
    return _call(cu.cuStreamCreate, int(cu.CUstream_flags.CU_STREAM_NON_BLOCKING))


def stream_destroy(stream: Any) -> None:
    _call(cu.cuStreamDestroy, stream)


def stream_synchronize(stream: Any) -> None:
    _call(cu.cuStreamSynchronize, stream)


def event_create(timing: bool = True) -> Any:
    flags = cu.CUevent_flags.CU_EVENT_DEFAULT if timing else cu.CUevent_flags.CU_EVENT_DISABLE_TIMING
    return _call(cu.cuEventCreate, int(flags))


def event_destroy(event: Any) -> None:
    _call(cu.cuEventDestroy, event)


def event_record(event: Any, stream: Any) -> None:
    _call(cu.cuEventRecord, event, stream)


def event_synchronize(event: Any) -> None:
    _call(cu.cuEventSynchronize, event)


def event_query(event: Any) -> bool:
    """True once everything before the event's record has run; False while it is pending."""
    result = cu.cuEventQuery(event)
    err = result[0] if isinstance(result, tuple) else result
    if err == cu.CUresult.CUDA_ERROR_NOT_READY:
        return False
    check("cuEventQuery", err)
    return True


def event_elapsed_ms(start: Any, end: Any) -> float:
    return float(_call(cu.cuEventElapsedTime, start, end))


def stream_wait_event(stream: Any, event: Any) -> None:
    _call(cu.cuStreamWaitEvent, stream, event, 0)


def mem_get_info() -> tuple[int, int]:
    free, total = _call(cu.cuMemGetInfo)
    return int(free), int(total)


# -- memory ---------------------------------------------------------------------------------------


def mem_alloc(nbytes: int) -> int:
    return int(_call(cu.cuMemAlloc, max(nbytes, 1)))


def mem_free(ptr: int) -> None:
    _call(cu.cuMemFree, ptr)


def host_alloc(nbytes: int) -> int:
    flags = cu.CU_MEMHOSTALLOC_PORTABLE | cu.CU_MEMHOSTALLOC_DEVICEMAP
    return int(_call(cu.cuMemHostAlloc, max(nbytes, 1), flags))


def host_free(ptr: int) -> None:
    _call(cu.cuMemFreeHost, ptr)


def host_view(ptr: int, nbytes: int) -> memoryview:
    """A writable memoryview over host memory owned elsewhere (pinned allocations)."""
    return memoryview((ctypes.c_uint8 * nbytes).from_address(ptr)).cast("B")


def memset_async(ptr: int, nbytes: int, stream: Any) -> None:
    _call(cu.cuMemsetD8Async, ptr, 0, nbytes, stream)


def copy_htod_async(dst: int, src: int, nbytes: int, stream: Any) -> None:
    _call(cu.cuMemcpyHtoDAsync, dst, src, nbytes, stream)


def copy_dtoh_async(dst: int, src: int, nbytes: int, stream: Any) -> None:
    _call(cu.cuMemcpyDtoHAsync, dst, src, nbytes, stream)


def copy_dtod_async(dst: int, src: int, nbytes: int, stream: Any) -> None:
    _call(cu.cuMemcpyDtoDAsync, dst, src, nbytes, stream)


def copy_htod(dst: int, src: int, nbytes: int) -> None:
    """Host-to-device bytes, returning once they landed.

    NOTE: cuMemcpyHtoD from pageable memory returns once the bytes are staged, before its DMA
    lands, and the legacy stream it runs on orders nothing with the non-blocking streams kern
    copies on: without the context synchronize, a copy queued next on such a stream could land
    first and be overwritten by these bytes.
    """
    _call(cu.cuMemcpyHtoD, dst, src, nbytes)
    _call(cu.cuCtxSynchronize)


def copy_dtoh(dst: int, src: int, nbytes: int) -> None:
    _call(cu.cuMemcpyDtoH, dst, src, nbytes)


# -- virtual memory management ------------------------------------------------------------------


HANDLE_KINDS: dict[str, Any] = {
    "fabric": cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_FABRIC,
    "posix_fd": cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
}
"""Shareable handle kinds of exported VMM chunks, by the name offers carry."""


def _vmm_prop(dev: Any, handle_kind: str | None = None) -> Any:
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = int(dev)
    if handle_kind is not None:
        prop.requestedHandleTypes = HANDLE_KINDS[handle_kind]
    return prop


def handle_kind_supported(dev: Any, kind: str) -> bool:
    """Whether the device exports VMM chunks as `kind` ("fabric" or "posix_fd")."""
    attr = (cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED if kind == "fabric"
            else cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)
    return device_attribute(dev, attr) != 0


def handle_kind_usable(dev: Any, kind: str) -> bool:
    """Whether a VMM chunk exportable as `kind` can be made here: the device attribute says it is
    supported, and a probe chunk of the allocation granularity is created (a device may report
    fabric handles while the system refuses them: CUDA_ERROR_NOT_PERMITTED without an IMEX
    channel)."""
    if not handle_kind_supported(dev, kind):
        return False
    err, handle = cu.cuMemCreate(vmm_granularity(dev), _vmm_prop(dev, kind), 0)
    if err != cu.CUresult.CUDA_SUCCESS:
        return False
    _call(cu.cuMemRelease, handle)
    return True


def vmm_create_shareable(nbytes: int, dev: Any, kind: str) -> Any:
    """A physical chunk that can be exported as `kind`."""
    return _call(cu.cuMemCreate, nbytes, _vmm_prop(dev, kind), 0)


def vmm_export(handle: Any, kind: str) -> bytes | int:
    """The shareable handle of a chunk: 64 fabric bytes, or a POSIX file descriptor."""
    out = _call(cu.cuMemExportToShareableHandle, handle, HANDLE_KINDS[kind], 0)
    return bytes(out.data) if kind == "fabric" else int(out)


def vmm_import(shareable: bytes | int, kind: str) -> Any:
    """A chunk handle from a shareable handle (release it with `vmm_release`)."""
    if isinstance(shareable, bytes):
        fabric = cu.CUmemFabricHandle()
        fabric.data = shareable
        return _call(cu.cuMemImportFromShareableHandle, fabric, HANDLE_KINDS[kind])
    return _call(cu.cuMemImportFromShareableHandle, shareable, HANDLE_KINDS[kind])


def vmm_granularity(dev: Any) -> int:
    flag = cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
    return int(_call(cu.cuMemGetAllocationGranularity, _vmm_prop(dev), flag))


def vmm_reserve(nbytes: int, alignment: int) -> int:
    return int(_call(cu.cuMemAddressReserve, nbytes, alignment, 0, 0))


def vmm_free_address(ptr: int, nbytes: int) -> None:
    _call(cu.cuMemAddressFree, ptr, nbytes)


def vmm_create(nbytes: int, dev: Any) -> Any:
    return _call(cu.cuMemCreate, nbytes, _vmm_prop(dev), 0)


def vmm_release(handle: Any) -> None:
    _call(cu.cuMemRelease, handle)


def vmm_map(ptr: int, nbytes: int, handle: Any) -> None:
    _call(cu.cuMemMap, ptr, nbytes, 0, handle, 0)


def vmm_unmap(ptr: int, nbytes: int) -> None:
    _call(cu.cuMemUnmap, ptr, nbytes)


def vmm_set_access(ptr: int, nbytes: int, dev: Any) -> None:
    desc = cu.CUmemAccessDesc()
    desc.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    desc.location.id = int(dev)
    desc.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    _call(cu.cuMemSetAccess, ptr, nbytes, [desc], 1)


# -- modules and functions ----------------------------------------------------------------------


def module_load(image: bytes) -> Any:
    return _call(cu.cuModuleLoadData, image)


def module_unload(module: Any) -> None:
    _call(cu.cuModuleUnload, module)


def module_functions(module: Any) -> list[tuple[str, Any]]:
    """Every function in a loaded module with its name."""
    count = int(_call(cu.cuModuleGetFunctionCount, module))
    funcs = _call(cu.cuModuleEnumerateFunctions, count, module) if count else []
    return [(_func_name(f), f) for f in funcs]


def _func_name(func: Any) -> str:
    name = _call(cu.cuFuncGetName, func)
    return name.decode() if isinstance(name, bytes) else str(name)


def func_param_layout(func: Any) -> list[tuple[int, int]]:
    """(offset, size) of every kernel parameter, from cuFuncGetParamInfo."""
    layout: list[tuple[int, int]] = []
    while True:
        err, offset, size = cu.cuFuncGetParamInfo(func, len(layout))
        if err == cu.CUresult.CUDA_ERROR_INVALID_VALUE:
            return layout
        check("cuFuncGetParamInfo", (err,))
        layout.append((int(offset), int(size)))


def func_attribute(func: Any, attr: Any) -> int:
    # NOTE: under lazy loading (the driver's default) an enumerated function is loaded at its first
    # launch or set attribute; a query before that is CUDA_ERROR_FUNCTION_NOT_LOADED, so load it.
    _call(cu.cuFuncLoad, func)
    return int(check("cuFuncGetAttribute", cu.cuFuncGetAttribute(attr, func)))


def func_max_dynamic_smem(func: Any) -> int:
    """The dynamic shared memory a launch of `func` may take now (by default 48 KiB less its static part)."""
    return func_attribute(func, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)


def func_set_dynamic_smem(func: Any, nbytes: int) -> None:
    attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    _call(cu.cuFuncSetAttribute, func, attr, nbytes)


def func_set_carveout(func: Any, percent: int) -> None:
    """The function's preferred shared-memory share of the SM's L1 / shared storage (a hint)."""
    attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
    _call(cu.cuFuncSetAttribute, func, attr, percent)


def func_set_non_portable_cluster(func: Any) -> None:
    attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
    _call(cu.cuFuncSetAttribute, func, attr, 1)


# -- launches -------------------------------------------------------------------------------------


def launch(
    func: Any, grid: Sequence[int], block: Sequence[int], smem: int, stream: Any, params: int
) -> None:
    check(
        "cuLaunchKernel",
        cu.cuLaunchKernel(
            func, grid[0], grid[1], grid[2], block[0], block[1], block[2], smem, stream, params, 0
        ),
    )


def launch_config(
    grid: Sequence[int],
    block: Sequence[int],
    smem: int,
    stream: Any,
    cluster: Sequence[int] | None,
    pdl: bool,
) -> Any:
    """A CUlaunchConfig for cuLaunchKernelEx, built once per launch record."""
    cfg = cu.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = block
    cfg.sharedMemBytes = smem
    cfg.hStream = stream
    attrs = _launch_attributes(tuple(cluster) if cluster is not None else None, pdl)
    cfg.attrs = list(attrs)
    cfg.numAttrs = len(attrs)
    return cfg


@functools.cache
def _launch_attributes(cluster: tuple[int, ...] | None, pdl: bool) -> tuple[Any, ...]:
    """The launch attributes of a cluster shape and PDL flag, made once: assigning them to a
    config's `attrs` copies each struct, so configs share none of their memory."""
    attrs: list[Any] = []
    if cluster is not None:
        attr = cu.CUlaunchAttribute()
        attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = cluster
        attrs.append(attr)
    if pdl:
        attr = cu.CUlaunchAttribute()
        attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        attrs.append(attr)
    return tuple(attrs)


def launch_ex(config: Any, func: Any, params: int) -> None:
    check("cuLaunchKernelEx", cu.cuLaunchKernelEx(config, func, params, 0))


# -- graphs ---------------------------------------------------------------------------------------


def begin_capture(stream: Any) -> None:
    mode = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
    _call(cu.cuStreamBeginCapture, stream, mode)


def end_capture(stream: Any) -> Any:
    return _call(cu.cuStreamEndCapture, stream)


def graph_instantiate(graph: Any) -> Any:
    return _call(cu.cuGraphInstantiate, graph, 0)


def graph_destroy(graph: Any) -> None:
    _call(cu.cuGraphDestroy, graph)


def graph_exec_destroy(exec_: Any) -> None:
    _call(cu.cuGraphExecDestroy, exec_)


def graph_launch(exec_: Any, stream: Any) -> None:
    (err,) = cu.cuGraphLaunch(exec_, stream)
    if err != _SUCCESS:
        raise CudaError("cuGraphLaunch", int(err), explain(err))


# -- tensor maps ----------------------------------------------------------------------------------

TENSORMAP_DTYPES: dict[str, str] = {
    "u8": "CU_TENSOR_MAP_DATA_TYPE_UINT8",
    "u16": "CU_TENSOR_MAP_DATA_TYPE_UINT16",
    "u32": "CU_TENSOR_MAP_DATA_TYPE_UINT32",
    "i32": "CU_TENSOR_MAP_DATA_TYPE_INT32",
    "u64": "CU_TENSOR_MAP_DATA_TYPE_UINT64",
    "i64": "CU_TENSOR_MAP_DATA_TYPE_INT64",
    "f16": "CU_TENSOR_MAP_DATA_TYPE_FLOAT16",
    "bf16": "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16",
    "f32": "CU_TENSOR_MAP_DATA_TYPE_FLOAT32",
    "tf32": "CU_TENSOR_MAP_DATA_TYPE_TFLOAT32",
    "u4": "CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN8B",
    "u4packed": "CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN16B",
}


def tensormap_encode_tiled(
    dtype: str,
    address: int,
    dims: Sequence[int],
    strides: Sequence[int],
    box: Sequence[int],
    swizzle: int,
    l2_promotion: int,
    oob_nan: bool,
) -> bytes:
    """cuTensorMapEncodeTiled into the 128-byte CUtensorMap image."""
    swz = {0: "NONE", 32: "32B", 64: "64B", 128: "128B"}[swizzle]
    l2 = {0: "NONE", 64: "L2_64B", 128: "L2_128B", 256: "L2_256B"}[l2_promotion]
    oob = "NAN_REQUEST_ZERO_FMA" if oob_nan else "NONE"
    tmap = _call(
        cu.cuTensorMapEncodeTiled,
        getattr(cu.CUtensorMapDataType, TENSORMAP_DTYPES[dtype]),
        len(dims),
        address,
        [cu.cuuint64_t(d) for d in dims],
        [cu.cuuint64_t(s) for s in strides],
        [cu.cuuint32_t(b) for b in box],
        [cu.cuuint32_t(1) for _ in dims],
        cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        getattr(cu.CUtensorMapSwizzle, f"CU_TENSOR_MAP_SWIZZLE_{swz}"),
        getattr(cu.CUtensorMapL2promotion, f"CU_TENSOR_MAP_L2_PROMOTION_{l2}"),
        getattr(cu.CUtensorMapFloatOOBfill, f"CU_TENSOR_MAP_FLOAT_OOB_FILL_{oob}"),
    )
    return ctypes.string_at(tmap.getPtr(), 128)


# -- 2-D copies -----------------------------------------------------------------------------------


def copy_2d_async(
    dst: int,
    dst_pitch: int,
    dst_device: bool,
    src: int,
    src_pitch: int,
    src_device: bool,
    width: int,
    height: int,
    stream: Any,
) -> None:
    """cuMemcpy2DAsync between host (pinned) and device memory, rows of `width` bytes."""
    p = cu.CUDA_MEMCPY2D()
    host, dev = cu.CUmemorytype.CU_MEMORYTYPE_HOST, cu.CUmemorytype.CU_MEMORYTYPE_DEVICE
    p.srcMemoryType = dev if src_device else host
    if src_device:
        p.srcDevice = src
    else:
        p.srcHost = src
    p.srcPitch = src_pitch
    p.dstMemoryType = dev if dst_device else host
    if dst_device:
        p.dstDevice = dst
    else:
        p.dstHost = dst
    p.dstPitch = dst_pitch
    p.WidthInBytes = width
    p.Height = height
    _call(cu.cuMemcpy2DAsync, p, stream)
