"""Chunk sizing for pooled states."""

from __future__ import annotations

from kern_runtime.memory import MAX_CHUNK, align_up, chunk_bytes

MIB = 1 << 20


def test_align_up() -> None:
    assert [align_up(n, 256) for n in (0, 1, 256, 257)] == [0, 256, 256, 512]


def test_chunk_is_half_the_smallest_object_in_granules_capped() -> None:
    gran = 2 * MIB
    assert chunk_bytes(49 * MIB, gran) == 24 * MIB
    assert chunk_bytes(1000 * MIB, gran) == MAX_CHUNK
    assert chunk_bytes(int(2.25 * MIB), gran) == MAX_CHUNK  # under two granules: the cap
    assert chunk_bytes(5 * MIB, gran) == 2 * MIB
