"""Peers: exported VMM memory, the offer one rank hands the others, and its wire format.

A rank exports every `export: true` buffer and every fixed state as VMM chunks with a shareable
handle: a fabric handle where the device supports it (CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED)
and KERN_NO_FABRIC is unset, otherwise a POSIX file descriptor. Its `Offer` carries the manifest
digest, its rank in each topology group, those handles (with the exporting process id), and the NCCL unique id of
each group it is rank 0 of. `Offer.to_bytes` / `Offer.from_bytes` are the wire format (the caller
moves the bytes: TCP, a launcher, a file). A file descriptor is meaningful in its own process only:
another process takes a duplicate with pidfd_getfd (Linux 5.6+, and the permission to trace the
exporter), which `take_fd` does.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from .errors import ApiError, OfferError

__all__ = [
    "OFFER_MAGIC",
    "OFFER_VERSION",
    "Chunk",
    "Offer",
    "PeerHandle",
    "choose_handle_kind",
    "take_fd",
]

OFFER_MAGIC: Final = b"KERNOFR\x00"
OFFER_VERSION: Final = 1
_HEADER = struct.Struct("<8sHII")  # magic, version, body length, crc32 of the body
_KINDS: Final = ("fabric", "posix_fd")
_PIDFD_GETFD = {"x86_64": 438, "aarch64": 438}


def choose_handle_kind(fabric: bool, posix_fd: bool, env: Mapping[str, str] = os.environ) -> str | None:
    """The handle kind exported chunks carry: fabric where supported and KERN_NO_FABRIC is unset
    (or "0"), else posix_fd where supported, else None."""
    no_fabric = env.get("KERN_NO_FABRIC", "") not in ("", "0")
    if fabric and not no_fabric:
        return "fabric"
    return "posix_fd" if posix_fd else None


@dataclass(frozen=True, slots=True)
class Chunk:
    """One exported physical chunk: its byte offset in the allocation, its size, and its
    shareable handle (64 fabric bytes, or a file descriptor of the exporting process)."""

    offset: int
    nbytes: int
    handle: bytes | int


@dataclass(frozen=True, slots=True)
class PeerHandle:
    """An exported buffer or state: name, bytes mapped, handle kind, chunks, and the exporting
    process (whose file descriptors the chunks name)."""

    name: str
    kind: str
    nbytes: int
    chunks: tuple[Chunk, ...]
    pid: int


@dataclass(frozen=True, slots=True)
class Offer:
    """What one rank hands the others before they connect.

    Attributes:
        digest: the manifest's canonical digest (kern_manifest.digest).
        ranks: this rank's index in every topology group.
        handles: the exported buffers and states, by name.
        nccl: the NCCL unique id (128 bytes) of each group this rank is rank 0 of.
    """

    digest: str
    ranks: Mapping[str, int]
    handles: Mapping[str, PeerHandle] = field(default_factory=dict[str, PeerHandle])
    nccl: Mapping[str, bytes] = field(default_factory=dict[str, bytes])

    def to_bytes(self) -> bytes:
        """The wire format: a header (magic, version, length, crc32) and a JSON body."""
        body = json.dumps(_to_json(self), sort_keys=True, separators=(",", ":")).encode()
        return _HEADER.pack(OFFER_MAGIC, OFFER_VERSION, len(body), zlib.crc32(body)) + body

    @classmethod
    def from_bytes(cls, data: bytes) -> Offer:
        """Parses `to_bytes` output.

        Raises:
            OfferError: truncated, garbled, another version, or fields of the wrong form.
        """
        body = _body(bytes(data))
        try:
            doc = json.loads(body)
            return _from_json(doc)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise OfferError(f"offer body does not parse: {exc}") from None


def _body(data: bytes) -> bytes:
    if len(data) < _HEADER.size:
        raise OfferError(f"offer of {len(data)} bytes is shorter than its {_HEADER.size}-byte header (truncated)")
    magic, version, length, crc = _HEADER.unpack_from(data)
    if magic != OFFER_MAGIC:
        raise OfferError("these bytes are not a kern offer (wrong magic)")
    if version != OFFER_VERSION:
        raise OfferError(f"offer version {version}, this runtime reads {OFFER_VERSION}: run one kern version")
    body = data[_HEADER.size:]
    if len(body) != length:
        raise OfferError(f"offer body is {len(body)} bytes, its header says {length} (truncated or padded)")
    if zlib.crc32(body) != crc:
        raise OfferError("offer body does not match its checksum (garbled in transit)")
    return body


def _to_json(offer: Offer) -> dict[str, Any]:
    return {
        "digest": offer.digest,
        "ranks": dict(offer.ranks),
        "handles": [
            {"name": h.name, "kind": h.kind, "nbytes": h.nbytes, "pid": h.pid,
             "chunks": [[c.offset, c.nbytes, c.handle.hex() if isinstance(c.handle, bytes) else c.handle]
                        for c in h.chunks]}
            for h in offer.handles.values()
        ],
        "nccl": {g: uid.hex() for g, uid in offer.nccl.items()},
    }


def _int(value: object, what: str) -> int:
    if type(value) is not int or value < 0:
        raise OfferError(f"offer field {what} must be an integer >= 0, got {value!r}")
    return value


def _handle(doc: Mapping[str, Any]) -> PeerHandle:
    kind = doc["kind"]
    if kind not in _KINDS:
        raise OfferError(f"offer handle kind {kind!r} is not one of {', '.join(_KINDS)}")
    chunks: list[Chunk] = []
    for off, size, raw in doc["chunks"]:
        handle: bytes | int = _int(raw, "fd") if kind == "posix_fd" else bytes.fromhex(raw)
        if isinstance(handle, bytes) and len(handle) != 64:
            raise OfferError(f"fabric handle of {len(handle)} bytes (64 expected)")
        chunks.append(Chunk(_int(off, "chunk offset"), _int(size, "chunk size"), handle))
    return PeerHandle(str(doc["name"]), kind, _int(doc["nbytes"], "nbytes"), tuple(chunks), _int(doc["pid"], "pid"))


def _from_json(doc: Mapping[str, Any]) -> Offer:
    digest = doc["digest"]
    if not isinstance(digest, str) or len(digest) != 64:
        raise OfferError(f"offer digest {digest!r} is not a sha256 hex digest")
    ranks = {str(g): _int(r, f"ranks.{g}") for g, r in doc["ranks"].items()}
    handles = {h.name: h for h in (_handle(d) for d in doc["handles"])}
    nccl = {str(g): bytes.fromhex(u) for g, u in doc["nccl"].items()}
    if any(len(u) != 128 for u in nccl.values()):
        raise OfferError("an NCCL unique id in the offer is not 128 bytes")
    return Offer(digest, ranks, handles, nccl)


def take_fd(pid: int, fd: int) -> int:
    """A file descriptor of this process for `fd` of process `pid` (a duplicate; close it).

    Raises:
        ApiError: the system refuses (no pidfd_getfd, the process is gone, or no permission).
    """
    if pid == os.getpid():
        return os.dup(fd)
    number = _PIDFD_GETFD.get(platform.machine())
    if number is None or not hasattr(os, "pidfd_open"):
        raise ApiError("taking a file descriptor from another process needs Linux pidfd_getfd; run all ranks "
                       "in one process (connect_local)")
    try:
        pidfd = os.pidfd_open(pid)
    except OSError as exc:
        raise ApiError(f"process {pid} of the offer is not reachable ({exc.strerror}); is it still running?") from None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        got = int(libc.syscall(ctypes.c_long(number), ctypes.c_int(pidfd), ctypes.c_int(fd), ctypes.c_uint(0)))
        if got < 0:
            err = ctypes.get_errno()
            raise ApiError(f"pidfd_getfd of fd {fd} in process {pid} failed ({os.strerror(err)}): the importer needs "
                           "permission to trace the exporter (same user, ptrace scope), or one process for all ranks")
        return got
    finally:
        os.close(pidfd)
