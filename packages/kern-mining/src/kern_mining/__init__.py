"""kern_mining: capture any CUDA process, analyze its launches, extract its kernels.

`capture` builds a CUPTI injection library and runs a command under it; `load_dump` reads what it
wrote; `analyze` finds request windows, forward passes, the token count, call sites, closed-form
grids and scalars, pointer classes and the ABI census; `extract_kernels` copies the cubins a
manifest pins out of a dump. `synth` writes synthetic captures with known ground truth.
"""

from kern_mining.analyze import (
    AbiEntry,
    Analysis,
    AnalyzeConfig,
    ForwardPass,
    Site,
    SkippedWindow,
    TokensReference,
    Window,
    analyze,
    analyze_dir,
)
from kern_mining.capture import (
    CaptureResult,
    Toolchain,
    build_library,
    capture_env,
    find_toolchain,
    run_capture,
)
from kern_mining.dump import (
    Dump,
    ModuleRecord,
    Param,
    Pointer,
    RecordedLaunch,
    load_dump,
    resolve_dump_dir,
)
from kern_mining.errors import (
    AmbiguousDumpError,
    CaptureBuildError,
    CaptureError,
    CorruptDumpError,
    DumpError,
    EmptyDumpError,
    ExtractError,
    KernelConflictError,
    ManifestModulesError,
    MiningError,
    MissingModuleError,
    ToolchainNotFoundError,
)
from kern_mining.extract import ExtractReport, extract_kernels
from kern_mining.fit import Fit, fit_samples

__all__ = [
    "AbiEntry",
    "AmbiguousDumpError",
    "Analysis",
    "AnalyzeConfig",
    "CaptureBuildError",
    "CaptureError",
    "CaptureResult",
    "CorruptDumpError",
    "Dump",
    "DumpError",
    "EmptyDumpError",
    "ExtractError",
    "ExtractReport",
    "Fit",
    "ForwardPass",
    "KernelConflictError",
    "ManifestModulesError",
    "MiningError",
    "MissingModuleError",
    "ModuleRecord",
    "Param",
    "Pointer",
    "RecordedLaunch",
    "Site",
    "SkippedWindow",
    "TokensReference",
    "Toolchain",
    "ToolchainNotFoundError",
    "Window",
    "analyze",
    "analyze_dir",
    "build_library",
    "capture_env",
    "extract_kernels",
    "find_toolchain",
    "fit_samples",
    "load_dump",
    "resolve_dump_dir",
    "run_capture",
]
