"""Argument staging: u64 slots, scalar encodings and byte packs."""

from __future__ import annotations

import ctypes
import struct

import numpy as np
import pytest

from kern_runtime import ManifestUnsupportedError
from kern_runtime.launch import ArgBlock, encode_value, pack_bytes


def test_scalars_encode_little_endian() -> None:
    assert encode_value("i32", -2) == struct.pack("<i", -2)
    assert encode_value("i64", 1 << 40) == (1 << 40).to_bytes(8, "little")
    assert encode_value("f32", 1.5) == struct.pack("<f", 1.5)
    assert encode_value("u8", 255) == b"\xff"
    assert encode_value("ptr", 0xDEADBEEF00) == (0xDEADBEEF00).to_bytes(8, "little")


@pytest.mark.parametrize(("kind", "value"), [("i32", 1 << 31), ("u8", 256), ("u8", -1), ("ptr", -1), ("i32", 1.5)])
def test_out_of_range_scalars_are_manifest_errors(kind: str, value: float) -> None:
    with pytest.raises(ManifestUnsupportedError):
        encode_value(kind, value, "op x")


def test_slots_are_u64_aligned_and_pointed_at() -> None:
    values = [encode_value("ptr", 0x1000), encode_value("i32", 7), encode_value("u8", 3), bytes(range(20))]
    block = ArgBlock(values)
    assert block.nbytes == 8 + 8 + 8 + 24
    ptrs = np.ctypeslib.as_array((ctypes.c_uint64 * 4).from_address(block.address))
    base = block.data.ctypes.data
    assert [int(p) - base for p in ptrs] == [0, 8, 16, 24]
    assert block.slot(0) == (0x1000).to_bytes(8, "little")
    assert block.slot(1) == struct.pack("<i", 7) + bytes(4)
    assert block.slot(2) == b"\x03" + bytes(7)
    assert block.slot(3) == bytes(range(20)) + bytes(4)


def test_pack_places_fields_and_zero_fills() -> None:
    raw = pack_bytes(16, [(0, b"\x01\x02"), (8, struct.pack("<i", -1))])
    assert raw == b"\x01\x02" + bytes(6) + b"\xff\xff\xff\xff" + bytes(4)
    with pytest.raises(ManifestUnsupportedError, match="overruns"):
        pack_bytes(8, [(4, bytes(8))])
