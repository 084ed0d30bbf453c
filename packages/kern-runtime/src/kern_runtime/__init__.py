"""kern_runtime: the CUDA executor for verified kern manifests.

`Runtime.load(manifest, kernels_dir, gpu=, capacity=)` verifies a manifest, loads its kernel
modules by sha256, allocates buffers and states; `load_weights(Safetensors.open(paths))` fills the
weights; `run` / `issue` execute programs (eager / CUDA graph); `write_input` / `read_output` move
data. `Session` runs one sequence on it (chunked prefill, greedy decode steps) through the serving
roles a manifest declares (`serving_roles`). Errors are typed by who must act (see
`kern_runtime.errors`).
"""

from .domains import InputDomain, StateUnits, check_domain, input_domains
from .errors import (
    ApiError,
    BlasError,
    CallError,
    CudaError,
    DomainError,
    InputFileError,
    KernelArtifactError,
    KernRuntimeError,
    ManifestError,
    ManifestParseError,
    ManifestVerifyError,
    NoDriverError,
    ServingRolesError,
    SessionError,
    WeightArtifactError,
)
from .graphs import Graph, normalize_vars
from .roles import ServingRoles, prefill_chunks, read_manifest, serving_roles
from .runtime import Capacity, Resident, Runtime
from .session import Session, check_capacity, check_prompt, weight_files
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
    "InputFileError",
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
    "ServingRoles",
    "ServingRolesError",
    "Session",
    "SessionError",
    "StateUnits",
    "TensorInfo",
    "Tensors",
    "WeightArtifactError",
    "check_capacity",
    "check_domain",
    "check_prompt",
    "input_domains",
    "normalize_vars",
    "plan_bind",
    "prefill_chunks",
    "read_manifest",
    "serving_roles",
    "weight_files",
]
