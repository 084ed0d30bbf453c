"""kern_runtime: the CUDA executor for verified kern manifests.

`Runtime.load(manifest, kernels_dir, gpu=, capacity=)` verifies a manifest, loads its kernel
modules by sha256, allocates buffers and states; `load_weights(Safetensors.open(paths))` fills the
weights; `run` / `issue` execute programs (eager / CUDA graph); `write_input` / `read_output` move
data. Errors are typed by who must act (see `kern_runtime.errors`).
"""

from .domains import InputDomain, StateUnits, check_domain, input_domains
from .errors import (
    ApiError,
    BlasError,
    CallError,
    CudaError,
    DomainError,
    KernelArtifactError,
    KernRuntimeError,
    ManifestError,
    ManifestParseError,
    ManifestVerifyError,
    NoDriverError,
    WeightArtifactError,
)
from .graphs import Graph, normalize_vars
from .runtime import Capacity, Resident, Runtime
from .weights import (
    Copy,
    DeviceBlob,
    FileBlob,
    MemoryBlob,
    Safetensors,
    Segment,
    TensorInfo,
    Tensors,
    plan_bind,
)

__all__ = [
    "ApiError",
    "BlasError",
    "CallError",
    "Capacity",
    "Copy",
    "CudaError",
    "DeviceBlob",
    "DomainError",
    "FileBlob",
    "Graph",
    "InputDomain",
    "KernRuntimeError",
    "KernelArtifactError",
    "ManifestError",
    "ManifestParseError",
    "ManifestVerifyError",
    "MemoryBlob",
    "NoDriverError",
    "Resident",
    "Runtime",
    "Safetensors",
    "Segment",
    "StateUnits",
    "TensorInfo",
    "Tensors",
    "WeightArtifactError",
    "check_domain",
    "input_domains",
    "normalize_vars",
    "plan_bind",
]
