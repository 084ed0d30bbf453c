"""The loader's split of planned copies into pieces that fit one pinned chunk."""

from __future__ import annotations

from kern_runtime._loader import Job, _pieces, _span  # pyright: ignore[reportPrivateUsage]
from kern_runtime.weights import Copy, MemoryBlob, TensorInfo

INFO = TensorInfo("t", "u8", (64, 100), MemoryBlob(memoryview(bytes(6400))))


def _covered(pieces: list, chunk: int) -> int:  # type: ignore[type-arg]
    for p in pieces:
        assert _span(p)[1] <= chunk
    return sum(p.nbytes * p.rows for p in pieces)


def test_contiguous_copy_splits_by_bytes() -> None:
    pieces = _pieces([Job(0, Copy(INFO, 0, 100, 0, 6400, 1))], 1000)
    assert [(p.byte0, p.nbytes) for p in pieces][:2] == [(0, 1000), (1000, 1000)] and len(pieces) == 7
    assert _covered(pieces, 1000) == 6400


def test_strided_copy_splits_by_whole_rows() -> None:
    pieces = _pieces([Job(0, Copy(INFO, 10, 100, 0, 30, 64))], 1000)
    assert [p.rows for p in pieces] == [10] * 6 + [4]
    assert _covered(pieces, 1000) == 30 * 64


def test_rows_wider_than_a_chunk_become_contiguous_runs() -> None:
    pieces = _pieces([Job(0, Copy(INFO, 0, 100, 0, 90, 64))], 64)
    assert all(p.copy.height == 1 for p in pieces)
    assert _covered(pieces, 64) == 90 * 64
    assert pieces[2].copy.src_offset == 100 and pieces[2].copy.dst_offset == 90
