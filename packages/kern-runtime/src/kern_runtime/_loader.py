"""The weight loader: performs planned Copies with pread and pinned double buffers on N threads.

Each thread owns one stream and two pinned chunks: while one chunk's DMA runs, the next piece is
read into the other. Files are read with pread (page-cache copies scale with readers; mmap faults
serialize), each contiguous run in as few reads as the chunk allows.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from . import _driver as drv
from .errors import WeightArtifactError
from .weights import Copy, DeviceBlob, FileBlob, MemoryBlob

__all__ = ["CHUNK_BYTES", "Job", "run_jobs"]

CHUNK_BYTES = 4 << 20
Progress = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class Job:
    """One planned copy into a destination base address (device, or pinned host memory)."""

    dst: int
    copy: Copy
    host: bool = False


@dataclass(frozen=True, slots=True)
class _Piece:
    dst: int
    host: bool
    copy: Copy
    row0: int
    rows: int
    byte0: int
    nbytes: int


def _rows(job: Job) -> list[Job]:
    """A strided copy as one contiguous copy per row (for rows wider than a chunk)."""
    c = job.copy
    return [
        Job(job.dst, Copy(c.tensor, c.src_offset + r * c.src_pitch, c.width, c.dst_offset + r * c.width, c.width, 1), job.host)
        for r in range(c.height)
    ]


def _pieces(jobs: Sequence[Job], chunk: int) -> list[_Piece]:
    out: list[_Piece] = []
    for job in jobs:
        c = job.copy
        if c.height > 1 and c.width > chunk:
            out.extend(_pieces(_rows(job), chunk))
            continue
        if c.height == 1:
            for b in range(0, c.width, chunk):
                out.append(_Piece(job.dst, job.host, c, 0, 1, b, min(chunk, c.width - b)))
            continue
        per = max(1, chunk // c.src_pitch) if c.src_pitch <= chunk else 1
        for r in range(0, c.height, per):
            out.append(_Piece(job.dst, job.host, c, r, min(per, c.height - r), 0, c.width))
    return out


def _pread_into(fd: int, view: memoryview, offset: int, path: str) -> None:
    done = 0
    while done < len(view):
        try:
            n = os.preadv(fd, [view[done:]], offset + done)
        except OSError as exc:
            raise WeightArtifactError(f"{path}: read failed at byte {offset + done}: {exc}") from None
        if n == 0:
            raise WeightArtifactError(f"{path}: file ends before byte {offset + len(view)}; re-export it")
        done += n


class _Files:
    def __init__(self) -> None:
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()

    def fd(self, path: str) -> int:
        with self._lock:
            if path not in self._fds:
                try:
                    self._fds[path] = os.open(path, os.O_RDONLY)
                except OSError as exc:
                    raise WeightArtifactError(f"{path}: cannot open ({exc})") from None
            return self._fds[path]

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def _span(p: _Piece) -> tuple[int, int]:
    """(offset inside the blob, bytes) that cover one piece's source."""
    c = p.copy
    if c.height == 1:
        return c.src_offset + p.byte0, p.nbytes
    start = c.src_offset + p.row0 * c.src_pitch
    if p.rows == 1:
        return start, c.width
    return start, (p.rows - 1) * c.src_pitch + c.width


def _fill(files: _Files, p: _Piece, view: memoryview) -> int:
    """Reads a piece's source span into `view`; returns the bytes used."""
    blob = p.copy.tensor.blob
    off, n = _span(p)
    if isinstance(blob, FileBlob):
        _pread_into(files.fd(blob.path), view[:n], blob.offset + off, blob.path)
    elif isinstance(blob, MemoryBlob):
        view[:n] = blob.data[off : off + n]
    else:
        raise AssertionError("device blobs are not staged")
    return n


def _dst_addr(p: _Piece) -> int:
    c = p.copy
    return p.dst + c.dst_offset + p.row0 * c.width + p.byte0


def _issue(p: _Piece, src: int, src_device: bool, stream: Any) -> None:
    c = p.copy
    dst = _dst_addr(p)
    if p.rows == 1 and c.height == 1 and not src_device:
        drv.copy_htod_async(dst, src, p.nbytes, stream)
        return
    pitch = c.src_pitch if c.height > 1 else p.nbytes
    drv.copy_2d_async(dst, c.width if c.height > 1 else p.nbytes, not p.host, src, pitch,
                      src_device, c.width if c.height > 1 else p.nbytes, p.rows, stream)


class _Worker:
    """One loader thread: its own stream and two pinned chunks (pinned inside the thread, so the
    threads pin their staging in parallel)."""

    def __init__(self, ctx: Any, chunk: int) -> None:
        self.ctx = ctx
        self.chunk = chunk
        self.bufs: list[int] = []
        self.views: list[memoryview] = []
        self.done = 0
        self.error: BaseException | None = None

    def run(self, pieces: list[_Piece], order: itertools.count[int], files: _Files, stop: threading.Event) -> None:
        try:
            drv.set_current(self.ctx)
            with ExitStack() as stack:
                for _ in range(2):
                    buf = drv.host_alloc(self.chunk)
                    stack.callback(drv.host_free, buf)
                    self.bufs.append(buf)
                    self.views.append(drv.host_view(buf, self.chunk))
                self._loop(pieces, order, files, stop)
        except BaseException as exc:  # handed to the main thread, which re-raises it
            self.error = exc
            stop.set()

    def _loop(self, pieces: list[_Piece], order: itertools.count[int], files: _Files, stop: threading.Event) -> None:
        stream = drv.stream_create()
        events = [drv.event_create(), drv.event_create()]
        used = [False, False]
        slot = 0
        try:
            while not stop.is_set():
                i = next(order)
                if i >= len(pieces):
                    break
                p = pieces[i]
                if isinstance(p.copy.tensor.blob, DeviceBlob):
                    _issue(p, p.copy.tensor.blob.ptr + _span(p)[0], True, stream)
                elif p.host:
                    self._host_piece(files, p)
                else:
                    if used[slot]:
                        drv.event_synchronize(events[slot])
                    _fill(files, p, self.views[slot])
                    _issue(p, self.bufs[slot], False, stream)
                    drv.event_record(events[slot], stream)
                    used[slot] = True
                    slot ^= 1
                self.done += p.nbytes * p.rows
            drv.stream_synchronize(stream)
        finally:
            for e in events:
                drv.event_destroy(e)
            drv.stream_destroy(stream)

    def _host_piece(self, files: _Files, p: _Piece) -> None:
        c = p.copy
        n = _fill(files, p, self.views[0])
        dst = drv.host_view(_dst_addr(p), p.nbytes * p.rows)
        if c.height == 1:
            dst[:] = self.views[0][:n]
            return
        for r in range(p.rows):
            dst[r * c.width : (r + 1) * c.width] = self.views[0][r * c.src_pitch : r * c.src_pitch + c.width]


def run_jobs(
    jobs: Sequence[Job],
    ctx: Any,
    *,
    threads: int = 8,
    chunk: int = CHUNK_BYTES,
    progress: Progress | None = None,
) -> int:
    """Performs every job; returns the bytes moved. Raises the first worker's error."""
    pieces = _pieces(jobs, chunk)
    total = sum(p.nbytes * p.rows for p in pieces)
    if not pieces:
        return 0
    files = _Files()
    with ExitStack() as stack:
        stack.callback(files.close)
        workers = [_Worker(ctx, chunk) for _ in range(max(1, min(threads, len(pieces))))]
        stop = threading.Event()
        order = itertools.count()
        pool = [threading.Thread(target=w.run, args=(pieces, order, files, stop), daemon=True) for w in workers]
        for t in pool:
            t.start()
        for t in pool:
            while t.is_alive():
                t.join(0.05)
                if progress is not None:
                    progress(sum(w.done for w in workers), total)
        for w in workers:
            if w.error is not None:
                raise w.error
    if progress is not None:
        progress(total, total)
    return total
