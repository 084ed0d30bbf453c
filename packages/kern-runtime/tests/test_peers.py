"""kern_runtime.peers and the connect checks (_peering): offer wire format, handle kinds, ranks,
and every refusal connect makes before it imports anything."""

from __future__ import annotations

import json
import os
import struct
import zlib
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import kern_manifest as km
from kern_runtime import ApiError, NotConnectedError, OfferError
from kern_runtime._peering import Needs, Peering, check_offers, check_ranks, program_needs
from kern_runtime.peers import OFFER_MAGIC, Chunk, Offer, PeerHandle, choose_handle_kind, take_fd

DIGEST = "ab" * 32


def _offer(rank: int, *, digest: str = DIGEST, kind: str = "posix_fd", nccl: bool = True) -> Offer:
    raw: bytes | int = bytes(range(rank, rank + 64)) if kind == "fabric" else 10 + rank
    handle = PeerHandle("flags", kind, 2 << 20, (Chunk(0, 2 << 20, raw),), 1000 + rank)
    ids = {"tp": bytes([rank + 1]) * 128} if nccl and rank == 0 else {}
    return Offer(digest, {"tp": rank}, {"flags": handle}, ids)


@pytest.mark.parametrize("kind", ["fabric", "posix_fd"])
def test_offer_round_trips(kind: str) -> None:
    offer = _offer(0, kind=kind)
    assert Offer.from_bytes(offer.to_bytes()) == offer
    assert offer.to_bytes().startswith(OFFER_MAGIC)


@given(st.integers(min_value=0, max_value=200))
def test_every_truncation_is_refused(cut: int) -> None:
    data = _offer(0).to_bytes()
    if cut >= len(data):
        return
    with pytest.raises(OfferError):
        Offer.from_bytes(data[:cut])


@given(st.data())
def test_any_flipped_body_byte_fails_the_checksum(data: st.DataObject) -> None:
    raw = bytearray(_offer(1, kind="fabric").to_bytes())
    at = data.draw(st.integers(min_value=18, max_value=len(raw) - 1))
    raw[at] ^= data.draw(st.integers(min_value=1, max_value=255))
    with pytest.raises(OfferError, match="checksum"):
        Offer.from_bytes(bytes(raw))


def _framed(body: bytes, version: int = 1, magic: bytes = OFFER_MAGIC) -> bytes:
    return struct.pack("<8sHII", magic, version, len(body), zlib.crc32(body)) + body


def _body(offer: Offer) -> dict[str, Any]:
    data = offer.to_bytes()
    return json.loads(data[18:])


def test_wrong_magic_version_and_padding_are_refused() -> None:
    good = _offer(0).to_bytes()
    with pytest.raises(OfferError, match="magic"):
        Offer.from_bytes(b"X" * 8 + good[8:])
    with pytest.raises(OfferError, match="version 2"):
        Offer.from_bytes(_framed(good[18:], version=2))
    with pytest.raises(OfferError, match="truncated or padded"):
        Offer.from_bytes(good + b"\0")


@pytest.mark.parametrize(("edit", "match"), [
    (lambda d: d.update(digest="zz"), "sha256"),
    (lambda d: d["ranks"].update(tp=-1), "ranks.tp"),
    (lambda d: d["handles"][0].update(kind="ipc"), "handle kind"),
    (lambda d: d["handles"][0]["chunks"][0].__setitem__(2, "00ff"), "fd"),
    (lambda d: d["nccl"].update(tp="00"), "128 bytes"),
    (lambda d: d.pop("handles"), "does not parse"),
])
def test_garbled_fields_are_refused(edit: Any, match: str) -> None:
    body = _body(_offer(0))
    edit(body)
    with pytest.raises(OfferError, match=match):
        Offer.from_bytes(_framed(json.dumps(body).encode()))
    with pytest.raises(OfferError):
        Offer.from_bytes(_framed(b"{not json"))


def test_fabric_handle_must_be_64_bytes() -> None:
    body = _body(_offer(0, kind="fabric"))
    body["handles"][0]["chunks"][0][2] = "ab" * 10
    with pytest.raises(OfferError, match="64 expected"):
        Offer.from_bytes(_framed(json.dumps(body).encode()))


def test_handle_kind_prefers_fabric_unless_forced_off() -> None:
    assert choose_handle_kind(True, True, {}) == "fabric"
    assert choose_handle_kind(True, True, {"KERN_NO_FABRIC": "1"}) == "posix_fd"
    assert choose_handle_kind(True, True, {"KERN_NO_FABRIC": "0"}) == "fabric"
    assert choose_handle_kind(False, True, {}) == "posix_fd"
    assert choose_handle_kind(True, False, {"KERN_NO_FABRIC": "1"}) is None
    assert choose_handle_kind(False, False, {}) is None


def test_take_fd_in_this_process_duplicates() -> None:
    r, w = os.pipe()
    try:
        dup = take_fd(os.getpid(), w)
        os.write(dup, b"k")
        os.close(dup)
        assert os.read(r, 1) == b"k"
    finally:
        os.close(r)
        os.close(w)


def test_take_fd_of_a_missing_process_is_one_line() -> None:
    with pytest.raises(ApiError, match=r"not reachable|pidfd"):
        take_fd(2**22 + 12345, 3)


# -- manifests with a topology ---------------------------------------------------------------------


def _tp_manifest(size: int = 2) -> dict[str, Any]:
    return {
        "schema_version": 5, "model": "peers",
        "topology": {"groups": {"tp": size}},
        "buffers": {
            "x": {"dtype": "bf16", "shape": [8], "kind": "input"},
            "y": {"dtype": "bf16", "shape": [8], "kind": "output"},
            "flags": {"dtype": "u32", "shape": [4], "kind": "carry", "export": True},
            "peers": {"dtype": "u64", "shape": [size], "kind": "peer", "of": "flags", "group": "tp"},
        },
        "modules": {"m": {"source": "m.cubin", "sha256": "c" * 64}},
        "ops": {
            "sum": {"params": ["in buffer<bf16>", "out buffer<bf16>", "i64"], "impl": {"launches": [
                {"entry": "extern:nccl_allreduce_bf16", "args": [{"param": 0}, {"param": 1}, {"param": 2},
                                                                 {"rank": "tp"}]}]}},
            "poke": {"params": ["in buffer<u64>", "inout buffer<u32>", "i32"], "impl": {"launches": [
                {"module": "m", "entry": "poke", "block": [32, 1, 1], "grid": [1, 1, 1]}]}},
        },
        "programs": {
            "step": {"calls": [{"op": "sum", "args": [{"buf": "x"}, {"buf": "y"}, {"i64": 8}]}]},
            "touch": {"calls": [{"op": "poke", "args": [{"buf": "peers"}, {"buf": "flags"}, {"rank": "tp"}]}]},
        },
    }


def _model(doc: dict[str, Any]) -> km.Manifest:
    return km.load_manifest(json.dumps(doc))


def test_the_test_manifest_verifies_and_a_bad_topology_does_not() -> None:
    _model(_tp_manifest())
    bad = _tp_manifest()
    bad["topology"]["groups"]["tp"] = 0
    with pytest.raises(km.ManifestError, match="group size"):
        _model(bad)
    bad = _tp_manifest()
    bad["buffers"]["peers"]["shape"] = [3]
    with pytest.raises(km.ManifestError, match="peer shape"):
        _model(bad)


def test_ranks_are_checked_against_the_topology() -> None:
    m = _model(_tp_manifest(4))
    assert check_ranks(m, {}) == {"tp": 0}
    assert check_ranks(m, {"tp": 3}) == {"tp": 3}
    with pytest.raises(ApiError, match=r"outside \[0, 4\)"):
        check_ranks(m, {"tp": 4})
    with pytest.raises(ApiError, match="outside"):
        check_ranks(m, {"tp": True})  # type: ignore[dict-item]
    with pytest.raises(ApiError, match="does not declare"):
        check_ranks(m, {"dp": 0})


def test_program_needs_name_peers_and_groups() -> None:
    m = _model(_tp_manifest())
    assert program_needs(m, "step") == Needs(frozenset(), frozenset({"tp"}))
    assert program_needs(m, "touch") == Needs(frozenset({"peers"}), frozenset())


def _check(offers: dict[str, list[Offer]], own_rank: int = 0) -> None:
    m = _model(_tp_manifest())
    own = offers["tp"][own_rank] if "tp" in offers and len(offers["tp"]) > own_rank else _offer(own_rank)
    check_offers(m, DIGEST, {"tp": own_rank}, own, offers, {"tp"})


def test_matching_offers_pass() -> None:
    _check({"tp": [_offer(0), _offer(1)]})
    _check({"tp": [_offer(0), _offer(1)]}, own_rank=1)


@pytest.mark.parametrize(("offers", "match"), [
    ({}, "groups"),
    ({"tp": [_offer(0), _offer(1)], "dp": [_offer(0)]}, "groups"),
    ({"tp": [_offer(0)]}, "2 ranks, connect got 1"),
    ({"tp": [_offer(0), _offer(1, digest="cd" * 32)]}, "runs manifest cdcdcdcdcdcd"),
    ({"tp": [_offer(1), _offer(0)]}, "order offers by rank"),
    ({"tp": [_offer(0, nccl=False), _offer(1)]}, "no NCCL id"),
])
def test_mismatched_offers_are_refused(offers: dict[str, list[Offer]], match: str) -> None:
    with pytest.raises(OfferError, match=match):
        _check(offers)


def test_another_ranks_offer_in_this_ranks_slot_is_refused() -> None:
    m = _model(_tp_manifest())
    with pytest.raises(OfferError, match="not this rank's own offer"):
        check_offers(m, DIGEST, {"tp": 1}, _offer(1), {"tp": [_offer(0), _offer(1, kind="fabric")]}, {"tp"})


def test_offer_with_other_groups_is_refused() -> None:
    other = Offer(DIGEST, {"tp": 1, "dp": 0}, _offer(1).handles, {})
    with pytest.raises(OfferError, match="offers groups"):
        _check({"tp": [_offer(0), other]})


def test_require_names_what_is_not_connected() -> None:
    m = _model(_tp_manifest())
    peering = Peering(stack=None, manifest=m, dev=None, ranks={"tp": 0}, kind="posix_fd")  # type: ignore[arg-type]
    peering.unfilled.add("peers")
    with pytest.raises(NotConnectedError, match=r"peer buffer\(s\) \['peers'\]"):
        peering.require(program_needs(m, "touch"), "touch")
    with pytest.raises(NotConnectedError, match=r"group\(s\) \['tp'\] not joined"):
        peering.require(program_needs(m, "step"), "step")
    peering.require(Needs(frozenset(), frozenset()), "none")


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_gpu_test_manifests_verify(ranks: int) -> None:
    from .helpers import peer_manifests as pm

    km.load_manifest(json.dumps(pm.collectives(ranks)))
    km.load_manifest(json.dumps(pm.peer_gather("a" * 64, ranks)))
    km.load_manifest(json.dumps(pm.multicast_gather("a" * 64, "b" * 64)))


def test_collective_definitions_on_numbers() -> None:
    from .helpers import peer_manifests as pm

    sends = pm.inputs(2, 0)
    c = pm.COUNT
    assert np.array_equal(pm.expected("allreduce", sends, 1), sends[0][:c] + sends[1][:c])
    assert np.array_equal(pm.expected("allgather", sends, 0), np.concatenate([sends[0][:c], sends[1][:c]]))
    assert np.array_equal(pm.expected("reducescatter", sends, 1), sends[0][c:] + sends[1][c:])
    assert np.array_equal(pm.expected("alltoall", sends, 1), np.concatenate([sends[0][c:], sends[1][c:]]))
    assert np.array_equal(pm.from_bf16(pm.to_bf16(sends[0])), sends[0])
