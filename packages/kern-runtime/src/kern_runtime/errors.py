"""The runtime's error tree, one class per party that must act.

Provider (fix the manifest generator): ManifestParseError, ManifestVerifyError,
ManifestUnsupportedError, ServingRolesError (no serving roles for a sequence), RanksDisagreeError (the
ranks of a tensor-parallel manifest generate different tokens). Kernel extractor
(re-extract kernels): KernelArtifactError. Weight exporter (re-export weights): WeightArtifactError.
Caller (API misuse): ApiError, DomainError (a write outside an input's domain), InputFileError (a
named file is missing), PromptError (a prompt or row size the model cannot take), EngineError (an
engine asked for what it cannot do), OfferError (a peer's offer is malformed or does not match),
NotConnectedError (a program needs peers or a communicator not joined yet), MissingToolError (a
program the runtime runs, such as cuobjdump, is not installed). Device (CUDA / BLAS / NCCL
at execution): CudaError, NoDriverError, BlasError, NcclError. CallError locates a failure inside a program's
call table.
"""

from __future__ import annotations

__all__ = [
    "ApiError",
    "BlasError",
    "CallError",
    "CudaError",
    "DomainError",
    "EngineError",
    "InputFileError",
    "KernRuntimeError",
    "KernelArtifactError",
    "ManifestParseError",
    "ManifestUnsupportedError",
    "ManifestVerifyError",
    "MissingToolError",
    "NcclError",
    "NoDriverError",
    "NotConnectedError",
    "OfferError",
    "PromptError",
    "RanksDisagreeError",
    "ServingRolesError",
    "WeightArtifactError",
]


class KernRuntimeError(Exception):
    """Base of every error kern_runtime raises."""


class ManifestParseError(KernRuntimeError):
    """The manifest file is not valid JSON or does not match the schema (provider)."""


class ManifestVerifyError(KernRuntimeError):
    """The manifest parsed but failed the verifier (provider)."""


class ManifestUnsupportedError(KernRuntimeError):
    """The manifest is well-formed but asks for something this runtime cannot do (provider)."""


class ServingRolesError(KernRuntimeError):
    """The manifest lacks a role a sequence needs: a buffer `fill`, the chunk or the step program
    (provider)."""


class RanksDisagreeError(KernRuntimeError):
    """The ranks of a tensor-parallel manifest generated different tokens (provider: its
    collectives or the ranks' windows are wrong)."""


class KernelArtifactError(KernRuntimeError):
    """A kernel module is missing, has the wrong hash, or its ABI differs (re-extract kernels)."""


class WeightArtifactError(KernRuntimeError):
    """Checkpoint tensors do not match the manifest's bind (re-export weights)."""


class ApiError(KernRuntimeError):
    """The caller used the API wrongly: unknown name, wrong kind, var out of range."""


class DomainError(ApiError):
    """A host write into an input buffer leaves the buffer's declared domain (caller)."""


class InputFileError(ApiError):
    """A file or directory the caller named is missing or holds nothing usable (caller)."""


class PromptError(ApiError):
    """A prompt or a row's size the model cannot take: an empty prompt or ids outside the model's
    tokens, more tokens than the capacity, a capacity past the model's reach, pages that do not fit
    the block table, a bench driver's rewind before any prefill (caller)."""


class EngineError(ApiError):
    """The engine was asked for what it cannot do: a step with no room left, a sequence of another
    engine or already released, a prompt beyond the model's or the pool's reach, or no memory left
    to evict while live sequences hold the pool (caller)."""


class OfferError(ApiError):
    """A peer's offer bytes are malformed, or its manifest digest, rank or group do not match
    (caller: hand every rank the offers of the same deployment, in member order)."""


class NotConnectedError(ApiError):
    """A program reads a peer buffer not filled yet or calls a collective of a group not joined
    (caller: `connect` or `connect_local` first)."""


class MissingToolError(KernRuntimeError):
    """A program the runtime runs (cuobjdump for the SASS scan) is not installed (caller: install
    kern-runtime's gpu extra or a CUDA toolkit)."""


class CudaError(KernRuntimeError):
    """A CUDA driver call failed.

    Attributes:
        call: the driver function's name.
        code: the CUresult's integer value (-1 when no driver answered).
        explanation: the driver's own explanation.
    """

    def __init__(self, call: str, code: int, explanation: str) -> None:
        super().__init__(f"{call} failed: {explanation} (CUresult {code})")
        self.call = call
        self.code = code
        self.explanation = explanation


class NoDriverError(CudaError):
    """No NVIDIA driver library could be loaded on this machine."""

    def __init__(self, detail: str) -> None:
        KernRuntimeError.__init__(
            self, f"no NVIDIA driver: libcuda could not be loaded ({detail}); run on a GPU host"
        )
        self.call = "cuInit"
        self.code = -1
        self.explanation = detail


class BlasError(KernRuntimeError):
    """A cuBLAS / cuBLASLt call failed at execution.

    Attributes:
        call: the library function's name.
        status: the library's status name.
    """

    def __init__(self, call: str, status: str) -> None:
        super().__init__(f"{call} failed: {status}")
        self.call = call
        self.status = status


class NcclError(KernRuntimeError):
    """An NCCL call failed (device or interconnect).

    Attributes:
        call: the NCCL function's name.
    """

    def __init__(self, call: str, detail: str) -> None:
        super().__init__(f"{call} failed: {detail}")
        self.call = call


class CallError(KernRuntimeError):
    """A failure inside a program, located in its call table.

    Attributes:
        program: the program's name.
        position: the call's index in the program.
        label: the call's label (or its op name).
        cause: the underlying error.
    """

    def __init__(self, program: str, position: int, label: str, cause: Exception) -> None:
        super().__init__(f"program {program!r} call {position} ({label}): {cause}")
        self.program = program
        self.position = position
        self.label = label
        self.cause = cause
