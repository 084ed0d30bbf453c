"""kern_runtime: the CUDA executor for verified kern manifests.

`Runtime.load(manifest, kernels_dir, gpu=, capacity=)` verifies a manifest, loads its kernel
modules by sha256, allocates buffers and states (`capacity` is a `kern_pool.Capacity`, re-exported
here); `load_weights(Safetensors.open(paths))` fills the weights; `run` / `issue` execute programs
(eager / CUDA graph); `write_input` / `read_output` move data. `Session` runs one sequence on it
(chunked prefill, greedy decode steps) through the serving roles a manifest declares
(`serving_roles`); `device_count` counts the GPUs through the driver shell; `copy_rate` measures
the device's copy bandwidth (a floor's yardstick). `Engine` runs many sequences on it, their KV
pages leased from the pool and their prefixes reused through a `kern_pool.KVCache` (the prefix
index, eviction, the host tier). Errors are typed by who must act (see `kern_runtime.errors`).
Model families come from their providers' `kern.providers` entry points
(`kern_runtime.providers.find`: a `Provider` or one `ProviderError` line).
"""

from kern_pool import Capacity
from kern_pool.cache import Reuse, Source, lease_tokens, pick_reuse, shared_prefix

from .batch import Sampled, Sampling
from .domains import InputDomain, StateUnits, check_domain, input_domains
from .engine import (
    Backend,
    Bound,
    Caching,
    Counters,
    Engine,
    EngineConfig,
    Fetching,
    Pipeline,
    Prefilled,
    Sequence,
    Turn,
)
from .errors import (
    ApiError,
    BlasError,
    CallError,
    CudaError,
    DomainError,
    EngineError,
    InputFileError,
    KernelArtifactError,
    KernRuntimeError,
    ManifestParseError,
    ManifestUnsupportedError,
    ManifestVerifyError,
    MissingToolError,
    NcclError,
    NoDriverError,
    NotConnectedError,
    OfferError,
    ServingRolesError,
    SessionError,
    WeightArtifactError,
)
from .graphs import Graph, GraphCache, GraphCacheStats, normalize_vars
from .peers import Chunk, Offer, PeerHandle
from .probes import copy_rate, device_count
from .providers import Provider, ProviderError
from .roles import RowRoles, ServingRoles, prefill_chunks, read_manifest, serving_roles
from .runtime import DEFAULT_CAPACITY, Fetch, Resident, Runtime, connect_local
from .sequences import Waking
from .session import Session, check_capacity, check_prompt, weight_files
from .weights import (
    Copy,
    DeviceBlob,
    FileBlob,
    MemoryBlob,
    RowInterleave,
    Safetensors,
    TensorInfo,
    Tensors,
    TensorWindow,
    plan_bind,
)

__all__ = [
    "DEFAULT_CAPACITY",
    "ApiError",
    "Backend",
    "BlasError",
    "Bound",
    "Caching",
    "CallError",
    "Capacity",
    "Chunk",
    "Copy",
    "Counters",
    "CudaError",
    "DeviceBlob",
    "DomainError",
    "Engine",
    "EngineConfig",
    "EngineError",
    "Fetch",
    "Fetching",
    "FileBlob",
    "Graph",
    "GraphCache",
    "GraphCacheStats",
    "InputDomain",
    "InputFileError",
    "KernRuntimeError",
    "KernelArtifactError",
    "ManifestParseError",
    "ManifestUnsupportedError",
    "ManifestVerifyError",
    "MemoryBlob",
    "MissingToolError",
    "NcclError",
    "NoDriverError",
    "NotConnectedError",
    "Offer",
    "OfferError",
    "PeerHandle",
    "Pipeline",
    "Prefilled",
    "Provider",
    "ProviderError",
    "Resident",
    "Reuse",
    "RowInterleave",
    "RowRoles",
    "Runtime",
    "Safetensors",
    "Sampled",
    "Sampling",
    "Sequence",
    "ServingRoles",
    "ServingRolesError",
    "Session",
    "SessionError",
    "Source",
    "StateUnits",
    "TensorInfo",
    "TensorWindow",
    "Tensors",
    "Turn",
    "Waking",
    "WeightArtifactError",
    "check_capacity",
    "check_domain",
    "check_prompt",
    "connect_local",
    "copy_rate",
    "device_count",
    "input_domains",
    "lease_tokens",
    "normalize_vars",
    "pick_reuse",
    "plan_bind",
    "prefill_chunks",
    "read_manifest",
    "serving_roles",
    "shared_prefix",
    "weight_files",
]
