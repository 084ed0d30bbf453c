"""Builds fatbin containers from ELF images (tests use it to put same-named kernels in one module)."""

from __future__ import annotations

import struct

FATBIN_MAGIC = 0xBA55ED50
_ENTRY_HEADER = 64


def pack_fatbin(images: list[tuple[int, bytes]]) -> bytes:
    """A fatbin holding each (sm, ELF image) as an uncompressed entry."""
    body = b""
    for arch, image in images:
        pad = (-len(image)) % 8
        payload = image + bytes(pad)
        header = struct.pack("<HHIQIIHHIIIQ", 2, 0x0101, _ENTRY_HEADER, len(payload), 0, 0, 8, 1, arch, 0, 0, 0x11)
        header += bytes(_ENTRY_HEADER - len(header))
        body += header + payload
    return struct.pack("<IHHQ", FATBIN_MAGIC, 1, 16, len(body)) + body
