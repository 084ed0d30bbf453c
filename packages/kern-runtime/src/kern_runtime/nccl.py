"""extern:nccl_* through NCCL's own Python bindings (nccl4py's `nccl.bindings.nccl`) over the
NVIDIA NCCL wheel: one communicator per topology group, joined at connect.

Before the first communicator is made, `set_environment` sets NCCL_RUNTIME_CONNECT=0 (connections
are made at init, never lazily inside a graph capture), NCCL_PROTO=LL,LL128 and NCCL_NVLS_ENABLE=0
(no NVLink SHARP / multicast), each only where the caller has not set it. kern never asks for
multicast objects.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from .errors import ManifestUnsupportedError, NcclError

__all__ = [
    "NCCL_DEFAULTS",
    "UNIQUE_ID_BYTES",
    "Communicator",
    "bindings",
    "collective",
    "collective_bytes",
    "init_local",
    "init_rank",
    "set_environment",
    "unique_id",
]

UNIQUE_ID_BYTES: Final = 128
"""The size of an ncclUniqueId (the bytes rank 0's offer carries)."""

NCCL_DEFAULTS: Final = {"NCCL_RUNTIME_CONNECT": "0", "NCCL_PROTO": "LL,LL128", "NCCL_NVLS_ENABLE": "0"}
"""What `set_environment` sets where the caller has not."""

_VERBS: Final = ("allreduce", "allgather", "reducescatter", "alltoall")


def bindings() -> Any:
    """nccl4py's low-level module.

    Raises:
        ManifestUnsupportedError: nccl4py or the NCCL library is not installed.
    """
    set_environment()
    try:
        return importlib.import_module("nccl.bindings.nccl")
    except ImportError as exc:
        raise ManifestUnsupportedError(
            f"the manifest calls NCCL collectives and nccl4py is not installed ({exc}); install kern-runtime[gpu]"
        ) from None


def set_environment(env: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """Sets each of NCCL_DEFAULTS the caller has not set; returns the values now in force."""
    for key, value in NCCL_DEFAULTS.items():
        env.setdefault(key, value)
    return {key: env[key] for key in NCCL_DEFAULTS}


def _check(call: str, fn: Callable[..., Any], *args: Any) -> Any:
    nccl = bindings()
    try:
        return fn(*args)
    except nccl.NCCLError as exc:
        raise NcclError(call, str(exc)) from None


def unique_id() -> bytes:
    """A fresh communicator id (rank 0 of a group makes it and hands it out in its offer)."""
    nccl = bindings()
    return bytes(_check("ncclGetUniqueId", nccl.get_unique_id))


@dataclass(slots=True)
class Communicator:
    """One rank's NCCL communicator of a topology group."""

    group: str
    rank: int
    size: int
    comm: Any
    open: bool = True

    def destroy(self) -> None:
        """Frees the communicator (idempotent)."""
        if self.open:
            self.open = False
            nccl = bindings()
            _check("ncclCommDestroy", nccl.comm_destroy, self.comm)


def _uid(raw: bytes) -> Any:
    if len(raw) != UNIQUE_ID_BYTES:
        raise NcclError("ncclCommInitRank", f"a unique id is {UNIQUE_ID_BYTES} bytes, got {len(raw)}")
    return bindings().UniqueId.from_buffer(bytearray(raw))


def init_rank(group: str, size: int, uid: bytes, rank: int) -> Communicator:
    """Joins `group` as `rank` of `size` on the calling thread's current CUDA context; blocks
    until every rank has joined."""
    set_environment()
    nccl = bindings()
    comm = _check("ncclCommInitRank", nccl.comm_init_rank, size, _uid(uid), rank)
    return Communicator(group, rank, size, comm)


def init_local(group: str, uid: bytes, contexts: Sequence[Callable[[], None]]) -> list[Communicator]:
    """Every rank of `group` in one process: one ncclCommInitRank per rank inside one NCCL group
    call; `contexts[r]()` makes rank r's CUDA context current."""
    set_environment()
    nccl = bindings()
    size = len(contexts)
    out: list[Communicator] = []
    _check("ncclGroupStart", nccl.group_start)
    try:
        for rank, make_current in enumerate(contexts):
            make_current()
            comm = _check("ncclCommInitRank", nccl.comm_init_rank, size, _uid(uid), rank)
            out.append(Communicator(group, rank, size, comm))
    finally:
        _check("ncclGroupEnd", nccl.group_end)
    return out


def collective_bytes(entry: str, count: int, size: int) -> tuple[int, int]:
    """(send, recv) elements of an extern:nccl_* call of `count` per rank in a group of `size`."""
    verb = entry.removeprefix("extern:nccl_").rsplit("_", 1)[0]
    if verb == "allgather":
        return count, count * size
    if verb == "reducescatter":
        return count * size, count
    if verb == "alltoall":
        return count * size, count * size
    return count, count


def collective(entry: str, comm: Communicator, send: int, recv: int, count: int, stream: Any) -> Callable[[], None]:
    """The action of one extern:nccl_{verb}_{dtype} call (capturable in a CUDA graph)."""
    nccl = bindings()
    verb, dt = entry.removeprefix("extern:nccl_").rsplit("_", 1)
    if verb not in _VERBS or dt not in ("f32", "bf16"):
        raise ManifestUnsupportedError(f"{entry} is not an NCCL collective of this runtime")
    dtype = int(nccl.DataType.Float32 if dt == "f32" else nccl.DataType.Bfloat16)
    op_sum = int(nccl.RedOp.Sum)
    c, s = comm.comm, int(stream)
    fns: dict[str, Callable[[], Any]] = {
        "allreduce": lambda: nccl.all_reduce(send, recv, count, dtype, op_sum, c, s),
        "allgather": lambda: nccl.all_gather(send, recv, count, dtype, c, s),
        "reducescatter": lambda: nccl.reduce_scatter(send, recv, count, dtype, op_sum, c, s),
        "alltoall": lambda: nccl.allto_all(send, recv, count, dtype, c, s),
    }
    fn = fns[verb]
    call = f"nccl {verb}"

    def run() -> None:
        _check(call, fn)

    return run
