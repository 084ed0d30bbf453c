"""One runtime's side of peering: its exports, its peer buffers, its communicators, and the
checks `connect` runs on a deployment's offers before anything is imported or joined."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kern_manifest import ExternLaunch, Manifest
from kern_manifest.schema import BufArg, RankArg

from . import _driver as drv
from . import memory, nccl
from .errors import ApiError, ManifestUnsupportedError, NotConnectedError, OfferError
from .memory import Allocation, Shared
from .peers import Chunk, Offer, PeerHandle, take_fd

__all__ = ["Needs", "Peering", "check_offers", "check_ranks", "collective_groups", "program_needs"]


def check_ranks(manifest: Manifest, ranks: Mapping[str, int]) -> dict[str, int]:
    """This rank's index in every topology group (0 where not given).

    Raises:
        ApiError: a group the manifest does not declare, or a rank outside [0, size).
    """
    groups = dict(manifest.topology.groups) if manifest.topology else {}
    unknown = sorted(set(ranks) - set(groups))
    if unknown:
        raise ApiError(f"ranks name group(s) {unknown} the manifest does not declare (groups: {sorted(groups)})")
    for g, r in ranks.items():
        if type(r) is not int or not 0 <= r < groups[g]:
            raise ApiError(f"rank {r!r} in group {g!r} is outside [0, {groups[g]})")
    return {g: ranks.get(g, 0) for g in groups}


def collective_groups(manifest: Manifest, op: str) -> set[str]:
    """The topology groups the collectives of `op` run over."""
    out: set[str] = set()
    for launch in manifest.ops[op].impl.launches:
        if isinstance(launch, ExternLaunch) and launch.signature.collective and launch.args:
            last = launch.args[-1]
            if isinstance(last, RankArg):
                out.add(last.rank)
    return out


@dataclass(frozen=True, slots=True)
class Needs:
    """What a program needs connected: the peer buffers it reads, the groups it runs collectives
    over."""

    peers: frozenset[str]
    groups: frozenset[str]


def program_needs(manifest: Manifest, program: str) -> Needs:
    """The peer buffers and collective groups of one program."""
    peers: set[str] = set()
    groups: set[str] = set()
    for call in manifest.programs[program].calls:
        groups |= collective_groups(manifest, call.op)
        peers |= {a.buf for a in call.args if isinstance(a, BufArg) and manifest.buffers[a.buf].kind == "peer"}
    return Needs(frozenset(peers), frozenset(groups))


def _members_line(group: str, got: int, size: int) -> str:
    return f"group {group!r} has {size} ranks, connect got {got} offers: pass one per rank, in rank order"


def check_offers(manifest: Manifest, digest: str, ranks: Mapping[str, int], own: Offer,
                 offers: Mapping[str, Sequence[Offer]], nccl_groups: set[str]) -> None:
    """Every check `connect` makes before it imports or joins anything.

    Raises:
        OfferError: a group missing or unknown, a wrong count, a digest, rank or group mismatch,
            this rank's slot holding another offer, or rank 0 without the group's NCCL id.
    """
    groups = dict(manifest.topology.groups) if manifest.topology else {}
    if set(offers) != set(groups):
        raise OfferError(f"connect needs offers for groups {sorted(groups)}, got {sorted(offers)}")
    for g, members in offers.items():
        if len(members) != groups[g]:
            raise OfferError(_members_line(g, len(members), groups[g]))
        for r, offer in enumerate(members):
            if offer.digest != digest:
                raise OfferError(f"rank {r} of group {g!r} runs manifest {offer.digest[:12]}, this rank "
                                 f"{digest[:12]}: every rank must load the same manifest")
            if set(offer.ranks) != set(groups):
                raise OfferError(f"rank {r} of group {g!r} offers groups {sorted(offer.ranks)}, the manifest "
                                 f"declares {sorted(groups)}")
            if offer.ranks[g] != r:
                raise OfferError(f"offer {r} of group {g!r} is rank {offer.ranks[g]}'s: order offers by rank")
        if members[ranks[g]] != own:
            raise OfferError(f"offer {ranks[g]} of group {g!r} is not this rank's own offer")
        if g in nccl_groups and g not in members[0].nccl:
            raise OfferError(f"rank 0 of group {g!r} offers no NCCL id: take its offer after load (offer())")


@dataclass(slots=True)
class Peering:
    """Exports, peer buffers and communicators of one runtime (owned by it, released on its stack)."""

    stack: ExitStack
    manifest: Manifest
    dev: Any
    ranks: dict[str, int]
    kind: str | None
    exported: dict[str, Shared] = field(default_factory=dict[str, Shared])
    peer_buffers: dict[str, Allocation] = field(default_factory=dict[str, Allocation])
    unfilled: set[str] = field(default_factory=set[str])
    comms: dict[str, nccl.Communicator] = field(default_factory=dict[str, nccl.Communicator])
    uids: dict[str, bytes] = field(default_factory=dict[str, bytes])
    _handles: dict[str, PeerHandle] = field(default_factory=dict[str, PeerHandle])
    _imported: dict[tuple[int, str], int] = field(default_factory=dict[tuple[int, str], int])

    def share(self, name: str, nbytes: int, chunk: int) -> Allocation:
        """An exportable VMM allocation for buffer or state `name`."""
        if self.kind is None:
            raise ManifestUnsupportedError(f"{name!r} is exported but this device exports no VMM handle kind "
                                           "(neither fabric nor POSIX file descriptors)")
        shared = memory.shareable(self.stack, self.dev, nbytes, chunk, self.kind)
        self.exported[name] = shared
        return shared.alloc

    def add_peer_buffer(self, name: str, alloc: Allocation) -> None:
        self.peer_buffers[name] = alloc
        self.unfilled.add(name)

    def export_handles(self) -> dict[str, PeerHandle]:
        """The shareable handle of every export buffer and fixed state (exported once)."""
        for name, shared in self.exported.items():
            if name not in self._handles:
                self._handles[name] = self._export(name, shared)
        return dict(self._handles)

    def _export(self, name: str, shared: Shared) -> PeerHandle:
        chunks: list[Chunk] = []
        for off, size, handle in shared.chunks:
            raw = drv.vmm_export(handle, shared.kind)
            if isinstance(raw, int):
                self.stack.callback(os.close, raw)
            chunks.append(Chunk(off, size, raw))
        return PeerHandle(name, shared.kind, shared.alloc.nbytes, tuple(chunks), os.getpid())

    def nccl_ids(self, groups: set[str]) -> dict[str, bytes]:
        """The NCCL id of each of `groups` this rank is rank 0 of (made once)."""
        for g in sorted(groups):
            if self.ranks[g] == 0 and g not in self.uids:
                self.uids[g] = nccl.unique_id()
        return dict(self.uids)

    def import_peers(self, group: str, members: Sequence[Mapping[str, PeerHandle]],
                     own: Callable[[str], int]) -> None:
        """Fills every peer buffer of `group` with each member's address of its `of` (this rank's
        own address at its own index; one mapping per exported target)."""
        size = self.manifest.topology.groups[group] if self.manifest.topology else 0
        if len(members) != size:
            raise ApiError(_members_line(group, len(members), size))
        for name, alloc in self.peer_buffers.items():
            buf = self.manifest.buffers[name]
            if buf.group != group or buf.of is None:
                continue
            addrs = [own(buf.of) if r == self.ranks[group] else self._address(members[r], buf.of, r)
                     for r in range(size)]
            table = np.asarray(addrs, dtype=np.uint64)
            drv.copy_htod(alloc.ptr, table.ctypes.data, table.nbytes)
            self.unfilled.discard(name)

    def _address(self, handles: Mapping[str, PeerHandle], target: str, rank: int) -> int:
        h = handles.get(target)
        if h is None:
            raise OfferError(f"rank {rank} exports no {target!r} (exports: {sorted(handles)})")
        key = (h.pid, f"{target}@{rank}")
        if key not in self._imported:
            self._imported[key] = self._map(h)
        return self._imported[key]

    def _map(self, h: PeerHandle) -> int:
        imported: list[tuple[int, int, Any]] = []
        for c in h.chunks:
            if isinstance(c.handle, bytes):
                imported.append((c.offset, c.nbytes, drv.vmm_import(c.handle, h.kind)))
                continue
            fd = take_fd(h.pid, c.handle)
            try:
                imported.append((c.offset, c.nbytes, drv.vmm_import(fd, h.kind)))
            finally:
                os.close(fd)
        return memory.map_imported(self.stack, self.dev, imported, h.nbytes)

    def join(self, group: str, uid: bytes) -> None:
        """Joins the group's communicator (blocks until every rank has)."""
        comm = nccl.init_rank(group, self.manifest.topology.groups[group] if self.manifest.topology else 1,
                              uid, self.ranks[group])
        self.adopt(comm)

    def adopt(self, comm: nccl.Communicator) -> None:
        self.comms[comm.group] = comm
        self.stack.callback(comm.destroy)

    def require(self, needs: Needs, program: str) -> None:
        """Raises NotConnectedError when `program` reads an unfilled peer buffer or runs a
        collective of a group not joined."""
        missing = sorted(needs.peers & self.unfilled)
        if missing:
            raise NotConnectedError(f"program {program!r} reads peer buffer(s) {missing} not filled yet: "
                                    "connect the ranks first (connect / connect_local)")
        unjoined = sorted(needs.groups - set(self.comms))
        if unjoined:
            raise NotConnectedError(f"program {program!r} runs collectives of group(s) {unjoined} not joined: "
                                    "connect the ranks first (connect / connect_local)")
