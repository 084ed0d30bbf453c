"""A runtime's side of connecting ranks: its offer, the checks, imports and NCCL joins `connect`
makes, and what must be connected before programs run."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from kern_manifest import digest

from . import _driver as drv
from ._peering import Peering, check_offers
from ._rt_core import Device, Spec
from .errors import ApiError, NotConnectedError
from .peers import Offer, PeerHandle

__all__ = ["Peers"]


class Peers:
    """Connects one rank over its `Peering` (None: the manifest declares no topology)."""

    def __init__(self, spec: Spec, device: Device, own_address: Callable[[str], int],
                 peering: Peering | None) -> None:
        self._spec = spec
        self._device = device
        self._own_address = own_address
        self._peering = peering
        self._digest_hex: str | None = None

    def peering(self) -> Peering:
        """The Peering (ApiError: closed, or no topology)."""
        self._device.live()
        if self._peering is None:
            raise ApiError("this manifest declares no topology: there are no peers to connect")
        return self._peering

    def digest(self) -> str:
        """The manifest's digest (computed once)."""
        if self._digest_hex is None:
            self._digest_hex = digest(self._spec.manifest)
        return self._digest_hex

    def export_handles(self) -> dict[str, PeerHandle]:
        """See `Runtime.export_handles`."""
        return self.peering().export_handles()

    def import_peers(self, group: str, members: Sequence[Mapping[str, PeerHandle]]) -> None:
        """See `Runtime.import_peers`."""
        peering = self.peering()
        if group not in self._spec.ranks:
            raise ApiError(f"unknown group {group!r}; groups: {sorted(self._spec.ranks)}")
        drv.set_current(self._device.ctx)
        peering.import_peers(group, members, self._own_address)

    def offer(self) -> Offer:
        """See `Runtime.offer`."""
        peering = self.peering()
        drv.set_current(self._device.ctx)
        ids = peering.nccl_ids(self._spec.nccl_groups)
        return Offer(self.digest(), dict(self._spec.ranks), peering.export_handles(), ids)

    def check_offers(self, offers: Mapping[str, Sequence[Offer]]) -> None:
        """See `Runtime.check_offers`."""
        self.peering()
        s = self._spec
        check_offers(s.manifest, self.digest(), s.ranks, self.offer(), offers, s.nccl_groups)

    def connect(self, offers: Mapping[str, Sequence[Offer]]) -> None:
        """Checks the offers, fills every peer buffer, joins the communicators not joined yet."""
        self.check_offers(offers)
        self.attach(offers)
        peering = self.peering()
        for g in sorted(self._spec.nccl_groups):
            if g not in peering.comms:
                drv.set_current(self._device.ctx)
                peering.join(g, offers[g][0].nccl[g])

    def attach(self, offers: Mapping[str, Sequence[Offer]]) -> None:
        """Fills every group's peer buffers from the offers' handles."""
        for g in sorted(offers):
            self.import_peers(g, [o.handles for o in offers[g]])
        self.require_peers()

    def require_peers(self) -> None:
        """See `Runtime.require_peers`."""
        peering = self.peering()
        if peering.unfilled:
            raise NotConnectedError(f"peer buffer(s) {sorted(peering.unfilled)} are not filled: connect first")

    def require_nccl(self) -> None:
        """See `Runtime.require_nccl`."""
        peering = self.peering()
        missing = sorted(self._spec.nccl_groups - set(peering.comms))
        if missing:
            raise NotConnectedError(f"group(s) {missing} have collectives and no communicator: connect first")
