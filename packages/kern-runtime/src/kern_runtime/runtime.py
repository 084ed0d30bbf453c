"""Runtime: a verified manifest loaded onto one GPU, its weights, programs and graphs.

`Runtime` is the facade; its parts are private modules: `_rt_load` (kernels, memory and extern
checks at load, the weights), `_rt_memory` (every allocation), `_rt_pool` (the sequence pool's
methods, `Runtime`'s base), `_rt_io` (input and output copies), `_rt_programs` (compiled steps,
graphs, `issue`), `_rt_peers` (connecting ranks).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from kern_manifest import Manifest
from kern_pool import Capacity

from . import _driver as drv
from . import _rt_load, nccl
from ._loader import CHUNK_BYTES
from ._manifest import load_manifest
from ._rt_core import Spec
from ._rt_io import Fetch, Io
from ._rt_load import Loaded, Progress, WeightLoader
from ._rt_memory import Resident
from ._rt_peers import Peers
from ._rt_pool import SequenceMethods
from ._rt_programs import Programs
from .errors import ApiError
from .graphs import Graph, GraphCacheStats
from .peers import Offer, PeerHandle
from .weights import Tensors

__all__ = ["DEFAULT_CAPACITY", "Fetch", "Progress", "Resident", "Runtime", "connect_local"]

DEFAULT_CAPACITY: Final = Capacity(tokens=4096, seqs=1)
"""What `Runtime.load` holds when no capacity is given: 4096 tokens, one live sequence."""


class Runtime(SequenceMethods):
    """A manifest on one GPU. Build with `Runtime.load`."""

    def __init__(self, loaded: Loaded) -> None:
        spec = self._spec = loaded.spec
        self.manifest = spec.manifest
        self.gpu = spec.gpu
        self.capacity = spec.capacity
        self._device = loaded.device
        self._kernels = loaded.kernels
        self._memory = loaded.memory
        self._programs = Programs(spec, loaded.device, loaded.memory, loaded.kernels.funcs, loaded.blas,
                                  loaded.peering)
        self._io = Io(spec.manifest, loaded.device, loaded.memory, loaded.domains)
        self._peers = Peers(spec, loaded.device, loaded.memory.own_address, loaded.peering)
        self._weight_loader = WeightLoader(spec, loaded.device, loaded.memory, self._programs)

    @property
    def _stream(self) -> Any:
        return self._device.stream

    @classmethod
    def load(
        cls,
        manifest: Manifest | str | os.PathLike[str],
        kernels_dir: str | os.PathLike[str],
        *,
        gpu: int = 0,
        capacity: Capacity | None = None,
        over: Resident | None = None,
        ranks: Mapping[str, int] | None = None,
    ) -> Runtime:
        """Verifies the manifest, loads its modules by sha256, allocates buffers and states.

        Args:
            manifest: a kern_manifest model (`read_manifest`'s; another is verified here once),
                or a manifest file's path (read with `read_manifest`).
            kernels_dir: the directory holding module files (matched by sha256, not by name).
            gpu: the device ordinal.
            capacity: tokens for paged states, live sequences for per-seq states (a
                `kern_pool.Capacity`; `DEFAULT_CAPACITY` when not given). `tokens=None` gives
                the pool the device memory left free after everything else, less 1 GiB.
            over: weights kept from another runtime on the same GPU; identical ones are claimed.
            ranks: this rank's index in each topology group (0 where not given).

        Raises:
            InputFileError, ManifestParseError, ManifestVerifyError, ManifestUnsupportedError,
            KernelArtifactError, ApiError, CudaError, BlasError. A failed load releases everything it
            allocated.
        """
        model = load_manifest(manifest)
        cap = DEFAULT_CAPACITY if capacity is None else capacity
        if over is not None and over.gpu != gpu:
            raise ApiError(f"load_over: resident weights live on gpu {over.gpu}, not {gpu}")
        spec = Spec.of(model, gpu, cap, ranks or {})
        return cls(_rt_load.load(spec, Path(kernels_dir), over))

    @classmethod
    def open(cls, manifest: Manifest | str | os.PathLike[str], kernels_dir: str | os.PathLike[str],
             weights: Sequence[str | os.PathLike[str]], *, gpu: int, capacity: Capacity,
             log: Callable[[str], None] = lambda s: None, progress: Progress | None = None) -> Runtime:
        """`load`, its summary through `log`, then the weights (.safetensors files) on 8 threads,
        `progress` following them; the runtime is closed again when they fail.

        Raises:
            as `load`; the weights' errors (see `load_weights`).
        """
        from .weights import Safetensors

        rt = cls.load(manifest, kernels_dir, gpu=gpu, capacity=capacity)
        try:
            log(rt.summary())
            rt.load_weights(Safetensors.open([str(p) for p in weights]), threads=8, progress=progress)
        except BaseException:
            rt.close()
            raise
        return rt

    # -- peers ------------------------------------------------------------------------------------

    def make_current(self) -> None:
        """Makes this runtime's CUDA context current on the calling thread (a thread that drives
        one rank of several in one process calls it first)."""
        self._device.live()
        drv.set_current(self._device.ctx)

    @property
    def ranks(self) -> dict[str, int]:
        """This rank's index in every topology group."""
        return dict(self._spec.ranks)

    def export_handles(self) -> dict[str, PeerHandle]:
        """The shareable handle of every export buffer and fixed state, by name.

        Raises:
            ApiError: the manifest declares no topology.
        """
        return self._peers.export_handles()

    def import_peers(self, group: str, members: Sequence[Mapping[str, PeerHandle]]) -> None:
        """Fills the peer buffers of `group` from every member's handle table (in rank order; this
        rank's own entry is not read). The mappings live as long as the runtime.

        Raises:
            ApiError: no topology, an unknown group or a wrong member count. OfferError: a member
                exports no buffer a peer buffer mirrors.
        """
        self._peers.import_peers(group, members)

    def offer(self) -> Offer:
        """This rank's offer: manifest digest, ranks, exported handles, and the NCCL id of each
        group with collectives this rank is rank 0 of (made once per runtime).

        Raises:
            ApiError: the manifest declares no topology.
        """
        return self._peers.offer()

    def check_offers(self, offers: Mapping[str, Sequence[Offer]]) -> None:
        """What `connect` checks before it imports or joins anything.

        Raises:
            OfferError: a group missing, a wrong count, a digest, rank or group mismatch, or rank 0
                without the group's NCCL id.
        """
        self._peers.check_offers(offers)

    def connect(self, offers: Mapping[str, Sequence[Offer]]) -> None:
        """Connects this rank: checks every member's offer (`check_offers`), fills every peer buffer
        (`import_peers`), joins each group's NCCL communicator (blocks until every rank has), then
        runs the once programs that needed them.

        Raises:
            OfferError: see `check_offers` (nothing was imported or joined). ApiError, NcclError.
        """
        self._peers.connect(offers)
        self._connected()

    def require_peers(self) -> None:
        """Raises NotConnectedError while a peer buffer is not filled."""
        self._peers.require_peers()

    def require_nccl(self) -> None:
        """Raises NotConnectedError while a group with collectives has no communicator."""
        self._peers.require_nccl()

    def _connected(self) -> None:
        if self._programs.loaded:
            self._programs.run_once(connected=True)
            self.synchronize()

    # -- weights and programs ---------------------------------------------------------------------

    def load_weights(
        self,
        tensors: Tensors,
        *,
        threads: int = 8,
        progress: Progress | None = None,
        chunk_bytes: int = CHUNK_BYTES,
    ) -> int:
        """Fills weight buffers from `tensors`, runs derive programs, then once programs.

        Every bind is planned (and checked) before a byte moves. Returns the bytes copied.

        Raises:
            WeightArtifactError: a tensor is missing or does not match its bind.
            ApiError: weights were already loaded.
        """
        return self._weight_loader.load(tensors, threads, progress, chunk_bytes)

    def run(self, program: str, vars: Mapping[str, int]) -> None:
        """Enqueues every launch of `program` eagerly on the runtime's stream."""
        self._programs.run(program, vars)

    def capture_graph(self, program: str, vars: Mapping[str, int]) -> Graph:
        """The CUDA graph of `program` at these vars (captured on first use, then cached)."""
        return self._programs.capture_graph(program, vars)

    def cache_graphs(self, program: str, limit: int) -> None:
        """From now on `issue(program, vars)` of a program that declares no graph replays a graph
        of it captured at those vars on their second use (the first runs eagerly), keeping the
        `limit` most recently used; a displaced graph is destroyed (one still in flight is freed
        when it completes). `limit` 0 turns the cache off and destroys its graphs. `run` stays
        eager. For programs called again and again at a few lengths whose host enqueue costs
        more than their GPU time (short prefill chunks).

        Raises:
            ApiError: an unknown or derive program, one that declares `graph` (issue captures it
                already), or a limit that is not an int >= 0; nothing changes.
        """
        self._programs.cache_graphs(program, limit)

    def graph_cache(self, program: str) -> GraphCacheStats | None:
        """What `program`'s graph cache did so far (None: no cache; see `cache_graphs`)."""
        return self._programs.graph_cache(program)

    def replay(self, graph: Graph, vars: Mapping[str, int]) -> None:
        """Replays a captured graph; vars must equal the ones it was captured at."""
        self._programs.replay(graph, vars)

    def issue(self, program: str, vars: Mapping[str, int]) -> None:
        """Replays the program's graph (captured once per vars key) if it declares graph, or from
        its graph cache (`cache_graphs`) if it has one, else runs it. While a staged wake is
        pending (`wake_now`) a program without a declared graph runs eagerly, each call waiting
        only for its own slices; a graph waits for them all."""
        self._programs.issue(program, vars)

    def time_calls(self, program: str, vars: Mapping[str, int], *,
                   before: str | None = None) -> tuple[list[tuple[str, float]], bool]:
        """GPU milliseconds of each call of one eager run of `program`, in call order, and whether
        every call was enqueued before the GPU reached it. A timing event sits between calls and
        the stream is held back by device memsets while the host enqueues, so the calls run back
        to back (an event between two launches ends a PDL overlap: the times add up to more than
        a replay). `before` (a plain program, e.g. the step seed) runs before each run. Runs the
        program a few times; synchronizes.

        Raises:
            ApiError: an unknown or derive program, bad vars, or weights not loaded.
        """
        return self._programs.time_calls(program, vars, before)

    def gemm_algos(self, program: str, vars: Mapping[str, int]) -> list[tuple[str, dict[str, int]]]:
        """(call label, algo fields) of every GEMM in `program` at `vars`: what to pin in a manifest."""
        return self._programs.gemm_algos(program, vars)

    # -- inputs, outputs, buffers -----------------------------------------------------------------

    def write_input(self, name: str, array: npt.ArrayLike) -> None:
        """Copies `array` into the start of input `name` (a prefix write), ordered on the stream.

        Raises:
            ApiError: unknown or non-input buffer, wrong dtype, too many elements.
            DomainError: an element outside the buffer's declared domain (nothing is written).
        """
        self._io.write_input(name, array)

    def read_output(self, name: str, count: int | None = None) -> npt.NDArray[Any]:
        """The first `count` elements (default: all) of output `name`; synchronizes the stream."""
        return self._io.read_output(name, count)

    def fetch_output(self, name: str, count: int | None = None) -> Fetch:
        """Enqueues a copy of the first `count` elements (default: all) of output `name`, ordered on
        the stream after the work issued so far, into pinned memory of its own; later work may
        overwrite the output without touching it. `fetched` waits for this copy only, so the next
        step can be issued before the previous one's output is read.

        Raises:
            ApiError: unknown or non-output buffer, or count outside [0, its elements].
        """
        return self._io.fetch_output(name, count)

    def fetched(self, fetch: Fetch) -> npt.NDArray[Any]:
        """The elements `fetch` copied, once its copy has landed (waits for it, not for later work).

        Raises:
            ApiError: the fetch was read already.
        """
        return self._io.fetched(fetch)

    def read_buffer(self, name: str) -> npt.NDArray[np.uint8]:
        """Every byte of any device buffer (for tests and A/B harnesses); synchronizes."""
        return self._memory.read_buffer(name)

    def synchronize(self) -> None:
        """Waits for everything enqueued on the runtime's stream and on its transfer stream."""
        self._memory.synchronize()

    # -- lifetime ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Releases every allocation, module, graph and the stream (idempotent)."""
        if self._device.closed:
            return
        try:
            drv.stream_synchronize(self._device.stream)
        finally:
            self._release()

    def into_resident(self) -> Resident:
        """Closes this runtime but keeps its loaded device weight buffers for `load(over=...)`."""
        self._device.live()
        if not self._programs.loaded:
            raise ApiError("into_resident needs loaded weights")
        self.synchronize()
        resident = Resident(self.gpu, self._device.dev, self._memory.keep_weights())
        self._release()
        return resident

    def _release(self) -> None:
        self._device.closed = True
        self._programs.release()
        self._memory.release_weights()
        self._device.stack.close()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- description ------------------------------------------------------------------------------

    def summary(self) -> str:
        """Startup lines: vars, buffers by kind with bytes, states, modules, programs."""
        return _rt_load.summary(self._spec, self._device, self._kernels, self._memory)

    def buffer_address(self, name: str) -> int:
        """The device (or pinned host) address of a buffer, for tools that bind their own memory."""
        return self._memory.buffer(name).ptr


def connect_local(runtimes: Sequence[Runtime]) -> None:
    """Connects runtimes one process holds, every rank of every group: checks their offers,
    fills their peer buffers, and joins each group's communicators in one NCCL group call.

    Raises:
        ApiError: the runtimes are not one rank each of every group. OfferError: see
            `Runtime.check_offers`. NcclError.
    """
    if not runtimes:
        raise ApiError("connect_local needs at least one runtime")
    groups = dict(runtimes[0].manifest.topology.groups) if runtimes[0].manifest.topology else {}
    for g, size in groups.items():
        got = sorted(rt.ranks.get(g, -1) for rt in runtimes)
        if got != list(range(size)):
            raise ApiError(f"connect_local: group {g!r} has {size} ranks, the runtimes hold ranks {got}: "
                           "pass one runtime per rank")
    offers = [rt.offer() for rt in runtimes]
    table = {g: [offers[i] for i in sorted(range(len(runtimes)), key=lambda i: runtimes[i].ranks[g])]
             for g in groups}
    for rt in runtimes:
        rt.check_offers(table)
    for rt in runtimes:
        rt._peers.attach(table)  # pyright: ignore[reportPrivateUsage]
    for g in sorted(runtimes[0]._spec.nccl_groups):  # pyright: ignore[reportPrivateUsage]
        ordered = sorted(runtimes, key=lambda rt: rt.ranks[g])
        contexts = [functools.partial(drv.set_current, rt._device.ctx) for rt in ordered]  # pyright: ignore[reportPrivateUsage]
        for rt, comm in zip(ordered, nccl.init_local(g, table[g][0].nccl[g], contexts), strict=True):
            rt._peers.peering().adopt(comm)  # pyright: ignore[reportPrivateUsage]
    for rt in runtimes:
        rt._connected()  # pyright: ignore[reportPrivateUsage]
