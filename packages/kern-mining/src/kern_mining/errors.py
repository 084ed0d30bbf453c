"""The kern_mining error tree: every error a caller can act on, with one actionable line."""

from __future__ import annotations

__all__ = [
    "AmbiguousDumpError",
    "CaptureBuildError",
    "CaptureError",
    "CorruptDumpError",
    "DumpError",
    "EmptyDumpError",
    "ExtractError",
    "KernelConflictError",
    "ManifestModulesError",
    "MiningError",
    "MissingModuleError",
    "ToolchainNotFoundError",
]


class MiningError(Exception):
    """Base of every error kern_mining raises on purpose."""


class CaptureError(MiningError):
    """The capture could not be set up or run."""


class ToolchainNotFoundError(CaptureError):
    """No C compiler, CUDA header or CUPTI library was found to build the injection library."""


class CaptureBuildError(CaptureError):
    """The injection library failed to compile; the message carries the compiler's last lines."""


class DumpError(MiningError):
    """A capture directory cannot be read as a dump."""


class EmptyDumpError(DumpError):
    """The dump holds no launches."""


class CorruptDumpError(DumpError):
    """A line of launches.jsonl or modules.jsonl is not a valid record."""


class AmbiguousDumpError(DumpError):
    """A capture root holds several process dumps and none was named."""


class ExtractError(MiningError):
    """Kernels cannot be extracted from a dump for a manifest."""


class ManifestModulesError(ExtractError):
    """The manifest has no readable `modules` table of {name: {source, sha256}}."""


class MissingModuleError(ExtractError):
    """The manifest names modules whose sha256 no cubin of the dump has."""


class KernelConflictError(ExtractError):
    """A kernels/ file already exists with other bytes; extraction only adds files."""
