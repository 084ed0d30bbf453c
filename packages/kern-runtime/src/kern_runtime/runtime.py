"""Runtime: a verified manifest loaded onto one GPU, its weights, programs and graphs."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import ExitStack, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, overload

import numpy as np
import numpy.typing as npt

import kern_pool
from kern_manifest import Buffer, ExternLaunch, KernelLaunch, Manifest, digest
from kern_manifest.schema import BufArg, Call, ExprArg, I32Arg, I64Arg, ParamArg, VarArg
from kern_pool import Capacity

from . import _driver as drv
from . import _timing, memory, nccl, sass
from ._hosttier import Slice, Waking
from ._loader import CHUNK_BYTES, Job, run_jobs
from ._manifest import bind_segments, load_manifest
from ._peering import Needs, Peering, check_offers, check_ranks, program_needs
from ._program import (
    ProgramTemplate,
    Resources,
    Step,
    Value,
    call_value,
    compile_program,
    gemm_shape,
)
from .blas import WORKSPACE_BYTES, Blas, GemmShape
from .domains import InputDomain, StateUnits, check_domain, input_domains
from .errors import (
    ApiError,
    CallError,
    KernelArtifactError,
    KernRuntimeError,
    ManifestUnsupportedError,
    NotConnectedError,
)
from .graphs import Graph, GraphCache, GraphCacheStats, VarKey, normalize_vars
from .kernels import LoadedModule, hash_dir, read_module
from .memory import Allocation
from .peers import Offer, PeerHandle, choose_handle_kind
from .sequences import Sequences, pool_config_for, pool_layout
from .weights import Tensors, plan_bind

__all__ = ["DEFAULT_CAPACITY", "Fetch", "Resident", "Runtime", "connect_local"]

_NP_DTYPES: Mapping[str, Any] = {
    "bf16": np.uint16, "f16": np.float16, "f32": np.float32, "fp8e4m3": np.uint8, "fp8e8m0": np.uint8,
    "i8": np.int8, "i32": np.int32, "u32": np.uint32, "i64": np.int64, "u64": np.uint64, "u8": np.uint8,
}  # fmt: skip
Progress = Callable[[int, int], None]


DEFAULT_CAPACITY: Final = Capacity(tokens=4096, seqs=1)
"""What `Runtime.load` holds when no capacity is given: 4096 tokens, one live sequence."""


def _capacity_tokens(cap: Capacity) -> int | None:
    """The tokens a runtime sizes its states for (None: all free memory); the one-line caller
    error where the capacity cannot be met."""
    if not isinstance(cap, Capacity):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise ApiError(f"capacity must be a kern_runtime.Capacity, got {type(cap).__name__}")
    tokens_ok = cap.tokens is None or (type(cap.tokens) is int and cap.tokens >= 1)
    if not tokens_ok or type(cap.seqs) is not int or cap.seqs < 1:
        raise ApiError(f"capacity needs tokens >= 1 (or None: all free memory) and seqs >= 1, got {cap}")
    return cap.tokens


@dataclass(slots=True)
class _Staging:
    alloc: Allocation
    event: Any
    pending: bool = False


@dataclass(eq=False, slots=True)
class Fetch:
    """An output copy in flight (`Runtime.fetch_output`): read it with `Runtime.fetched`."""

    name: str
    count: int
    dtype: np.dtype[Any]
    _slot: _Staging
    _read: bool = False


@dataclass(slots=True)
class _Weight:
    spec: Buffer
    alloc: Allocation
    stack: ExitStack


class Resident:
    """Device weight buffers kept from a closed Runtime, claimable by `Runtime.load(over=...)`."""

    def __init__(self, gpu: int, dev: Any, weights: dict[str, _Weight]) -> None:
        self.gpu = gpu
        self._dev = dev
        self._weights = weights
        self._open = True
        drv.primary_context(dev)

    @property
    def names(self) -> list[str]:
        """Names of the weight buffers still held."""
        return sorted(self._weights)

    def claim(self, name: str, spec: Buffer) -> _Weight | None:
        """The held buffer `name` if its declaration equals `spec` (else None)."""
        w = self._weights.get(name)
        return w if w is not None and w.spec == spec else None

    def take(self, names: list[str]) -> dict[str, _Weight]:
        """Hands the named buffers over (they are no longer released by this Resident)."""
        return {n: self._weights.pop(n) for n in names}

    def close(self) -> None:
        """Releases every buffer not claimed."""
        if not self._open:
            return
        self._open = False
        for w in self._weights.values():
            w.stack.close()
        self._weights.clear()
        drv.release_primary_context(self._dev)


class Runtime:
    """A manifest on one GPU. Build with `Runtime.load`."""

    def __init__(self, manifest: Manifest, gpu: int, capacity: Capacity) -> None:
        self.manifest = manifest
        self.gpu = gpu
        self.capacity = capacity
        self._tokens = _capacity_tokens(capacity)
        self._stack = ExitStack()
        self._weights: dict[str, _Weight] = {}
        self._buffers: dict[str, Allocation] = {}
        self._states: dict[str, Allocation] = {}
        self._state_notes: dict[str, str] = {}
        self._scratch: dict[str, dict[str, int]] = {}
        self._funcs: dict[tuple[str, int], Any] = {}
        self._modules: dict[str, LoadedModule] = {}
        self._staging: dict[str, _Staging] = {}
        self._fetch_free: dict[str, list[_Staging]] = {}
        self._steps: dict[tuple[str, VarKey], list[Step]] = {}
        self._templates: dict[str, ProgramTemplate] = {}
        self._graphs: dict[tuple[str, VarKey], Graph] = {}
        self._cached: dict[str, GraphCache[Graph]] = {}
        self._touches: dict[str, dict[int, tuple[Slice, ...]]] = {}
        self._reads = {name: manifest.program_vars(name) for name in manifest.programs}
        self._bounds = manifest.var_max
        self._claimed: set[str] = set()
        self._loaded = False
        self._closed = False
        self._blas: Blas | None = None
        self._dev: Any = None
        self._ctx: Any = None
        self._stream: Any = None
        self._arch = 0
        self._chunk = CHUNK_BYTES
        self._ranks: dict[str, int] = {}
        self._seqs: Sequences | None = None
        self._domains: dict[str, InputDomain] = {}
        self._module_data: dict[str, bytes] = {}
        self._peering: Peering | None = None
        self._needs: dict[str, Needs] = {}
        self._digest_hex: str | None = None

    # -- loading ----------------------------------------------------------------------------------

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
            manifest: a path to a manifest file, or a parsed kern_manifest model (verified here).
            kernels_dir: the directory holding module files (matched by sha256, not by name).
            gpu: the device ordinal.
            capacity: tokens for paged states, live sequences for per-seq states (a
                `kern_pool.Capacity`; `DEFAULT_CAPACITY` when not given). `tokens=None` gives
                the pool the device memory left free after everything else, less 1 GiB.
            over: weights kept from another runtime on the same GPU; identical ones are claimed.
            ranks: this rank's index in each topology group (0 where not given).

        Raises:
            ManifestParseError, ManifestVerifyError, ManifestUnsupportedError, KernelArtifactError,
            ApiError, CudaError, BlasError. A failed load releases everything it allocated.
        """
        model = load_manifest(manifest)
        cap = DEFAULT_CAPACITY if capacity is None else capacity
        if over is not None and over.gpu != gpu:
            raise ApiError(f"load_over: resident weights live on gpu {over.gpu}, not {gpu}")
        rt = cls(model, gpu, cap)
        rt._ranks = check_ranks(model, dict(ranks or {}))
        rt._needs = {name: program_needs(model, name) for name in model.programs}
        try:
            rt._setup(Path(kernels_dir), over)
        except BaseException:
            rt._release()
            raise
        return rt

    def _setup(self, kernels_dir: Path, over: Resident | None) -> None:
        drv.init()
        if not 0 <= self.gpu < drv.device_count():
            raise ApiError(f"gpu {self.gpu} does not exist ({drv.device_count()} devices)")
        self._dev = drv.device(self.gpu)
        self._ctx = drv.primary_context(self._dev)
        self._stack.callback(drv.release_primary_context, self._dev)
        self._stream = drv.stream_create()
        self._stack.callback(drv.stream_destroy, self._stream)
        major, minor = drv.compute_capability(self._dev)
        self._arch = major * 10 + minor
        self._load_modules(kernels_dir)
        self._resolve_launches()
        self._scan_peer_kernels()
        if self.manifest.topology is not None:
            kind = choose_handle_kind(drv.handle_kind_usable(self._dev, "fabric"),
                                      drv.handle_kind_usable(self._dev, "posix_fd"))
            self._peering = Peering(self._stack, self.manifest, self._dev, self._ranks, kind)
        self._allocate_buffers(over)
        self._allocate_fixed_states()
        self._allocate_scratch()
        self._check_externs()
        self._allocate_pool()
        self._domains = input_domains(self.manifest, self._state_units())
        if over is not None:
            self._weights.update(over.take(sorted(self._claimed)))
            over.close()

    def _load_modules(self, kernels_dir: Path) -> None:
        hashes = hash_dir(kernels_dir)
        for name, mod in self.manifest.modules.items():
            data = read_module(hashes, name, mod.sha256.lower())
            self._modules[name] = LoadedModule.load(self._stack, name, mod.sha256, data, self._arch)
            self._module_data[name] = data

    def _scan_peer_kernels(self) -> None:
        """The trust boundary: every kernel a call hands a peer buffer is scanned (cuobjdump -sass)
        and refused when it issues multicast instructions."""
        dumps: dict[str, dict[str, list[str]]] = {}
        for module, entry in sorted(_peer_kernels(self.manifest)):
            if module not in dumps:
                dumps[module] = sass.sass_functions(sass.dump_sass(self._module_data[module], module))
            sass.scan_kernel(dumps[module], module, entry)
        self._module_data.clear()

    def _resolve_launches(self) -> None:
        bounds = self.manifest.var_bounds
        # NOTE: the dynamic shared-memory limit is the function's, not the launch's: launches of one
        # entry from several ops (different shapes) need the largest of their sizes.
        smem: dict[tuple[str, str], tuple[Any, int]] = {}
        for op_name, op in self.manifest.ops.items():
            for li, launch in enumerate(op.impl.launches):
                if not isinstance(launch, KernelLaunch):
                    continue
                params = launch.params if launch.params is not None else op.params
                func = self._modules[launch.module].resolve(launch.entry, [str(p) for p in params])
                self._funcs[(op_name, li)] = func
                key = (launch.module, launch.entry)
                smem[key] = (func, max(smem.get(key, (func, 0))[1], launch.shared_mem.range(bounds)[1]))
                if launch.cluster is not None and launch.cluster[0] * launch.cluster[1] * launch.cluster[2] > 8:
                    drv.func_set_non_portable_cluster(func)
                if launch.carveout is not None:
                    drv.func_set_carveout(func, launch.carveout)
        # NOTE: the opt-in is needed once static + dynamic passes 48 KiB, so compare with the
        # function's own limit (48 KiB less its static shared memory), not with 48 KiB; a function
        # no launch gives dynamic shared memory is not queried (nor loaded) at all.
        for func, hi in smem.values():
            if hi > 0 and hi > drv.func_max_dynamic_smem(func):
                drv.func_set_dynamic_smem(func, hi)

    def _allocate_buffers(self, over: Resident | None) -> None:
        for name, buf in self.manifest.buffers.items():
            if buf.kind == "peer":
                self._add_peer_buffer(name, buf)
                continue
            if buf.kind == "source":
                continue
            nbytes = self.manifest.buffer_max_bytes(name)
            if buf.kind == "weight" and buf.placement == "device" and over is not None:
                claimed = over.claim(name, buf)
                if claimed is not None:
                    self._buffers[name] = claimed.alloc
                    self._claimed.add(name)
                    continue
            self._buffers[name] = self._allocate(name, buf, nbytes)
            if buf.kind in ("input", "output"):
                self._add_staging(name, nbytes)

    def _add_peer_buffer(self, name: str, buf: Buffer) -> None:
        of = self.manifest.states.get(buf.of or "")
        if of is not None and of.bytes is None:
            raise ManifestUnsupportedError(
                f"peer buffer {name!r} mirrors pooled state {buf.of!r}: this runtime exports fixed states and "
                "export buffers only")
        alloc = memory.device(self._stack, self.manifest.buffer_max_bytes(name))
        self._buffers[name] = alloc
        assert self._peering is not None  # NOTE: the verifier requires a topology group on a peer
        self._peering.add_peer_buffer(name, alloc)

    def _allocate(self, name: str, buf: Buffer, nbytes: int) -> Allocation:
        stack = ExitStack() if buf.kind == "weight" else self._stack
        if buf.placement == "host":
            alloc = memory.host(stack, nbytes)
        elif buf.export and self._peering is not None and buf.kind != "weight":
            alloc = self._peering.share(name, nbytes, drv.vmm_granularity(self._dev))
        elif buf.export:
            alloc = memory.vmm(stack, self._dev, nbytes, drv.vmm_granularity(self._dev))
        else:
            alloc = memory.device(stack, nbytes)
        if buf.kind == "weight":
            self._weights[name] = _Weight(buf, alloc, stack)
        return alloc

    def _add_staging(self, name: str, nbytes: int) -> None:
        alloc = memory.host(self._stack, nbytes)
        event = drv.event_create()
        self._stack.callback(drv.event_destroy, event)
        self._staging[name] = _Staging(alloc, event)

    def _allocate_fixed_states(self) -> None:
        gran = drv.vmm_granularity(self._dev)
        for name, st in self.manifest.states.items():
            if st.bytes is None:
                continue
            nbytes, chunk, note = memory.state_size(st, self._tokens or 0, self.capacity.seqs, 1, gran)
            if self._peering is not None and self._peering.kind is not None:
                alloc = self._peering.share(name, nbytes, chunk)
            else:
                alloc = memory.vmm(self._stack, self._dev, nbytes, chunk)
            drv.memset_async(alloc.ptr, alloc.nbytes, self._stream)
            self._states[name] = alloc
            self._state_notes[name] = note

    def _allocate_pool(self) -> None:
        """The pool of paged and per-seq states, last: `Capacity(tokens=None)` gives it the device
        memory still free once buffers, scratch and fixed states have theirs, less 1 GiB."""
        paged, per_seq, unit, _ = pool_layout(self.manifest)
        free = drv.mem_get_info()[0] if self._tokens is None and (paged or per_seq) else None
        config = pool_config_for(self.manifest, self.capacity, free)
        if config is not None:
            slices = {n: s.slices for n, s in self.manifest.states.items() if s.slices is not None}
            self._seqs = Sequences(self._stack, self._dev, self._stream, config, self._ctx, slices)
            for name, (base, reserved) in self._seqs.spans.items():
                self._states[name] = Allocation(base, reserved, "vmm")
            for p in paged:
                self._state_notes[p.name] = f"paged, {config.pages_max} pages of {unit} tokens, pool chunk {_size(config.chunk)}"
            for q in per_seq:
                self._state_notes[q.name] = f"per-seq, {config.first_slots} slots (up to {config.slots_max}), pool chunk {_size(config.chunk)}"
        drv.stream_synchronize(self._stream)

    def _state_units(self) -> dict[str, StateUnits]:
        """What each allocated state holds, in the units an `index_into` domain counts."""
        out: dict[str, StateUnits] = {}
        config = self._seqs.config if self._seqs is not None else None
        for name, st in self.manifest.states.items():
            if st.bytes is not None:
                out[name] = StateUnits(st.bytes, f"{st.bytes} bytes")
            elif config is not None and st.bytes_per_token is not None:
                out[name] = StateUnits(config.pages_max * config.unit,
                                       f"{config.pages_max} pages of {config.unit} tokens")
            elif config is not None and st.bytes_per_seq is not None:
                out[name] = StateUnits(config.slots_max * st.bytes_per_seq,
                                       f"{config.slots_max} slots of {st.bytes_per_seq} bytes")
        return out

    def _allocate_scratch(self) -> None:
        env = self.manifest.var_max
        for op_name, op in self.manifest.ops.items():
            table: dict[str, int] = {}
            for sname, sc in op.impl.scratch.items():
                table[sname] = memory.device(self._stack, sc.nbytes(env)).ptr
            self._scratch[op_name] = table

    def _check_externs(self) -> None:
        gemms = [(op_name, launch) for op_name, op in self.manifest.ops.items()
                 for launch in op.impl.launches
                 if isinstance(launch, ExternLaunch) and not launch.signature.collective]  # fmt: skip
        if any(n.groups for n in self._needs.values()):
            nccl.bindings()
        if not gemms:
            return
        ws = memory.device(self._stack, WORKSPACE_BYTES)
        self._blas = Blas(self._stack, ws.ptr)
        for op_name, launch in gemms:
            gemm_shape(launch.entry, [1, 1, 1], f"op {op_name!r}")
            if launch.algo is not None:
                self._check_algo(op_name, launch)

    def _check_algo(self, op_name: str, launch: ExternLaunch) -> None:
        """AlgoCheck a pinned algo at both var ends of every call site of this op."""
        assert self._blas is not None
        for pname, prog in self.manifest.programs.items():
            for call in prog.calls:
                if call.op != op_name:
                    continue
                for env in _var_ends(self.manifest, self._reads[pname], launch):
                    shape = self._gemm_shape_at(call, launch, env)
                    try:
                        self._blas.plan(shape, _algo(launch))
                    except KernelArtifactError as exc:
                        raise KernelArtifactError(f"op {op_name!r} in program {pname!r}: {exc}") from None

    def _gemm_shape_at(self, call: Call, launch: ExternLaunch, env: Mapping[str, int]) -> GemmShape:
        res = self._resources()
        values = [call_value(res, a, env, "algo check") for a in call.args]
        if launch.args is not None:
            values = [values[a.param] if isinstance(a, ParamArg) else Value(scalar=_lit(a, env)) for a in launch.args]
        return gemm_shape(launch.entry, [int(v.scalar or 0) for v in values[3:]])

    def _resources(self) -> Resources:
        return Resources(
            manifest=self.manifest,
            buffers={n: (a.ptr, a.nbytes) for n, a in self._buffers.items()},
            states={n: (a.ptr, a.nbytes) for n, a in self._states.items()},
            scratch=self._scratch,
            funcs=self._funcs,
            blas=self._blas,
            ranks=self._ranks,
            stream=self._stream,
            comms=self._peering.comms if self._peering is not None else {},
        )

    # -- peers ------------------------------------------------------------------------------------

    def _peers(self) -> Peering:
        self._live()
        if self._peering is None:
            raise ApiError("this manifest declares no topology: there are no peers to connect")
        return self._peering

    def make_current(self) -> None:
        """Makes this runtime's CUDA context current on the calling thread (a thread that drives
        one rank of several in one process calls it first)."""
        self._live()
        drv.set_current(self._ctx)

    @property
    def ranks(self) -> dict[str, int]:
        """This rank's index in every topology group."""
        return dict(self._ranks)

    def export_handles(self) -> dict[str, PeerHandle]:
        """The shareable handle of every export buffer and fixed state, by name.

        Raises:
            ApiError: the manifest declares no topology.
        """
        return self._peers().export_handles()

    def import_peers(self, group: str, members: Sequence[Mapping[str, PeerHandle]]) -> None:
        """Fills the peer buffers of `group` from every member's handle table (in rank order; this
        rank's own entry is not read). The mappings live as long as the runtime.

        Raises:
            ApiError: no topology, an unknown group or a wrong member count. OfferError: a member
                exports no buffer a peer buffer mirrors.
        """
        peering = self._peers()
        if group not in self._ranks:
            raise ApiError(f"unknown group {group!r}; groups: {sorted(self._ranks)}")
        drv.set_current(self._ctx)
        peering.import_peers(group, members, self._own_address)

    def _own_address(self, name: str) -> int:
        alloc = self._buffers.get(name) or self._states.get(name)
        if alloc is None:
            raise ApiError(f"{name!r} has no memory in this runtime")
        return alloc.ptr

    def offer(self) -> Offer:
        """This rank's offer: manifest digest, ranks, exported handles, and the NCCL id of each
        group with collectives this rank is rank 0 of (made once per runtime).

        Raises:
            ApiError: the manifest declares no topology.
        """
        peering = self._peers()
        drv.set_current(self._ctx)
        ids = peering.nccl_ids(self._nccl_groups())
        return Offer(self._digest(), dict(self._ranks), peering.export_handles(), ids)

    def _digest(self) -> str:
        if self._digest_hex is None:
            self._digest_hex = digest(self.manifest)
        return self._digest_hex

    def _nccl_groups(self) -> set[str]:
        return {g for n in self._needs.values() for g in n.groups}

    def check_offers(self, offers: Mapping[str, Sequence[Offer]]) -> None:
        """What `connect` checks before it imports or joins anything.

        Raises:
            OfferError: a group missing, a wrong count, a digest, rank or group mismatch, or rank 0
                without the group's NCCL id.
        """
        self._peers()
        check_offers(self.manifest, self._digest(), self._ranks, self.offer(), offers, self._nccl_groups())

    def connect(self, offers: Mapping[str, Sequence[Offer]]) -> None:
        """Connects this rank: checks every member's offer (`check_offers`), fills every peer buffer
        (`import_peers`), joins each group's NCCL communicator (blocks until every rank has), then
        runs the once programs that needed them.

        Raises:
            OfferError: see `check_offers` (nothing was imported or joined). ApiError, NcclError.
        """
        self.check_offers(offers)
        self._attach(offers)
        peering = self._peers()
        for g in sorted(self._nccl_groups()):
            if g not in peering.comms:
                drv.set_current(self._ctx)
                peering.join(g, offers[g][0].nccl[g])
        self._connected()

    def _attach(self, offers: Mapping[str, Sequence[Offer]]) -> None:
        for g in sorted(offers):
            self.import_peers(g, [o.handles for o in offers[g]])
        self.require_peers()

    def _connected(self) -> None:
        if self._loaded:
            self._run_once(connected=True)
            self.synchronize()

    def require_peers(self) -> None:
        """Raises NotConnectedError while a peer buffer is not filled."""
        peering = self._peers()
        if peering.unfilled:
            raise NotConnectedError(f"peer buffer(s) {sorted(peering.unfilled)} are not filled: connect first")

    def require_nccl(self) -> None:
        """Raises NotConnectedError while a group with collectives has no communicator."""
        peering = self._peers()
        missing = sorted(self._nccl_groups() - set(peering.comms))
        if missing:
            raise NotConnectedError(f"group(s) {missing} have collectives and no communicator: connect first")

    # -- weights ----------------------------------------------------------------------------------

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
        self._live()
        if self._loaded:
            raise ApiError("load_weights was already called on this runtime")
        drv.set_current(self._ctx)
        jobs = self._plan_weights(tensors)
        sources = self._plan_sources(tensors)
        total = sum(j.copy.nbytes for j in jobs) + sum(j.copy.nbytes for js in sources.values() for j in js)
        done = 0

        def report(d: int, _t: int) -> None:
            if progress is not None:
                progress(done + d, total)

        if chunk_bytes < 1 << 16:
            raise ApiError(f"chunk_bytes {chunk_bytes} is below 64 KiB")
        self._chunk = chunk_bytes
        done += run_jobs(jobs, self._ctx, threads=threads, progress=report, chunk=chunk_bytes)
        done += self._run_derive(sources, threads, report)
        self._loaded = True
        self._run_once(connected=False)
        self.synchronize()
        return done

    def _run_once(self, *, connected: bool) -> None:
        """Once programs: those that need no peers or collectives after the weights, the others
        after connect."""
        for name in sorted(self.manifest.programs):
            needs = self._needs[name]
            if self.manifest.programs[name].once and bool(needs.peers or needs.groups) == connected:
                self.run(name, {v: self._bounds[v] for v in self._reads[name]})

    def _plan_weights(self, tensors: Tensors) -> list[Job]:
        jobs: list[Job] = []
        for name, buf in self.manifest.buffers.items():
            if buf.kind != "weight" or buf.bind is None or name in self._claimed:
                continue
            alloc = self._buffers[name]
            segs = bind_segments(name, buf, self._ranks)
            for c in plan_bind(name, buf.dtype, self.manifest.buffer_max_bytes(name), segs, tensors):
                jobs.append(Job(alloc.ptr, c, host=buf.placement == "host"))
        return jobs

    def _plan_sources(self, tensors: Tensors) -> dict[str, list[Job]]:
        out: dict[str, list[Job]] = {}
        for name, buf in self.manifest.buffers.items():
            if buf.kind == "source":
                segs = bind_segments(name, buf, self._ranks)
                out[name] = [Job(0, c) for c in plan_bind(name, buf.dtype, self.manifest.buffer_max_bytes(name), segs, tensors)]
        return out

    def _run_derive(self, sources: dict[str, list[Job]], threads: int, report: Progress) -> int:
        moved = 0
        derive = sorted(n for n, p in self.manifest.programs.items() if p.derive)
        last_reader = {s: max((i for i, p in enumerate(derive) if s in _program_buffers(self.manifest, p)), default=-1)
                       for s in sources}  # fmt: skip
        live: dict[str, ExitStack] = {}
        try:
            for i, pname in enumerate(derive):
                for s in sorted(_program_buffers(self.manifest, pname) & sources.keys()):
                    if s not in live:
                        moved += self._stage_source(s, sources[s], live, threads, report)
                self._execute(pname, self._compile(pname, ()))
                self.synchronize()
                self._steps = {k: v for k, v in self._steps.items() if k[0] != pname}
                for s in [s for s in live if last_reader[s] <= i]:
                    live.pop(s).close()
                    del self._buffers[s]
        finally:
            for s, st in live.items():
                st.close()
                self._buffers.pop(s, None)
        return moved

    def _stage_source(self, name: str, jobs: list[Job], live: dict[str, ExitStack], threads: int, report: Progress) -> int:
        stack = ExitStack()
        live[name] = stack
        alloc = memory.device(stack, self.manifest.buffer_max_bytes(name))
        self._buffers[name] = alloc
        return run_jobs(
            [Job(alloc.ptr, j.copy) for j in jobs], self._ctx, threads=threads, progress=report, chunk=self._chunk
        )

    # -- running ----------------------------------------------------------------------------------

    def _program(self, program: str) -> None:
        if program not in self.manifest.programs:
            raise ApiError(f"unknown program {program!r}; programs: {sorted(self.manifest.programs)}")
        if self.manifest.programs[program].derive:
            raise ApiError(f"program {program!r} is a derive program; it runs only inside load_weights")
        if not self._loaded:
            raise ApiError("call load_weights before running programs")
        needs = self._needs[program]
        if needs.peers or needs.groups:
            assert self._peering is not None
            self._peering.require(needs, program)

    def _key(self, program: str, vars: Mapping[str, int]) -> VarKey:
        return normalize_vars(program, self._bounds, self._reads[program], vars)

    def _compile(self, program: str, key: VarKey) -> list[Step]:
        steps = self._steps.get((program, key))
        if steps is None:
            res = self._resources()
            steps = compile_program(res, program, {}) if not key else self._template(program, res).compile(res, dict(key))
            self._steps[(program, key)] = steps
        return steps

    def _template(self, program: str, res: Resources) -> ProgramTemplate:
        template = self._templates.get(program)
        if template is None or not template.fits(res):
            template = ProgramTemplate(res, program)
            self._templates[program] = template
        return template

    def _execute(self, program: str, steps: list[Step]) -> None:
        """Enqueues the steps; while a staged wake is pending each call first waits for the slices
        it touches (`Sequences.staged`), so it runs as soon as its own slices landed."""
        seqs = self._seqs
        run: Iterable[Step] = steps
        if seqs is not None and seqs.pending:
            run = seqs.staged(steps, self._touch(program, seqs))
        for step in run:
            try:
                step.run()
            except KernRuntimeError as exc:
                raise CallError(program, step.position, step.label, exc) from exc

    def _touch(self, program: str, seqs: Sequences) -> dict[int, tuple[Slice, ...]]:
        """Call position -> the pooled states' slices the call touches (its state args)."""
        touch = self._touches.get(program)
        if touch is None:
            touch = self._touches[program] = seqs.call_slices(self.manifest.programs[program].calls)
        return touch

    def _await_staged(self) -> None:
        """The compute stream waits for every staged copy still pending (before a graph)."""
        if self._seqs is not None and self._seqs.pending:
            self._seqs.await_staged()

    def _launch(self, graph: Graph) -> None:
        self._await_staged()
        drv.graph_launch(graph.exec_, self._stream)

    def run(self, program: str, vars: Mapping[str, int]) -> None:
        """Enqueues every launch of `program` eagerly on the runtime's stream."""
        self._live()
        self._program(program)
        key = self._key(program, vars)
        self._execute(program, self._compile(program, key))

    def capture_graph(self, program: str, vars: Mapping[str, int]) -> Graph:
        """The CUDA graph of `program` at these vars (captured on first use, then cached)."""
        self._live()
        self._program(program)
        key = self._key(program, vars)
        graph = self._graphs.get((program, key))
        if graph is None:
            graph = self._capture_graph(program, key)
        return graph

    def _capture_graph(self, program: str, key: VarKey) -> Graph:
        graph = self._capture(program, key)
        self._stack.callback(drv.graph_exec_destroy, graph.exec_)
        self._graphs[(program, key)] = graph
        return graph

    def _capture(self, program: str, key: VarKey) -> Graph:
        """The program captured and instantiated at `key`; the caller owns its exec."""
        steps = self._compile(program, key)
        self._await_staged()  # NOTE: a capture may not wait on events recorded outside it
        drv.begin_capture(self._stream)
        try:
            self._execute(program, steps)
        except BaseException:
            try:
                g = drv.end_capture(self._stream)
                drv.graph_destroy(g)
            except KernRuntimeError:
                pass
            raise
        g = drv.end_capture(self._stream)
        try:
            exec_ = drv.graph_instantiate(g)
        finally:
            drv.graph_destroy(g)
        return Graph(program, key, exec_, len(steps))

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
        self._live()
        self._program(program)
        if self.manifest.programs[program].graph:
            raise ApiError(f"program {program!r} declares graph: issue() replays its graphs already")
        if type(limit) is not int or limit < 0:
            raise ApiError(f"graph cache limit must be an int >= 0, got {limit!r}")
        old = self._cached.pop(program, None)
        if old is not None:
            self._destroy(old.drain())
        if limit:
            self._cached[program] = GraphCache(limit)

    def graph_cache(self, program: str) -> GraphCacheStats | None:
        """What `program`'s graph cache did so far (None: no cache; see `cache_graphs`)."""
        cache = self._cached.get(program)
        return None if cache is None else cache.stats()

    def _destroy(self, graphs: list[Graph]) -> None:
        for g in graphs:
            drv.graph_exec_destroy(g.exec_)

    def _issue_cached(self, program: str, cache: GraphCache[Graph], vars: Mapping[str, int]) -> None:
        self._live()
        key = self._key(program, vars)
        graph = cache.lookup(key)
        if graph is None and cache.wants(key):
            graph = self._capture(program, key)
            old = cache.insert(key, graph)
            if old is not None:
                self._destroy([old])
        if graph is None:
            self._execute(program, self._compile(program, key))
        else:
            self._launch(graph)

    def replay(self, graph: Graph, vars: Mapping[str, int]) -> None:
        """Replays a captured graph; vars must equal the ones it was captured at."""
        key = self._key(graph.program, vars)
        if key != graph.key:
            raise ApiError(f"graph of {graph.program!r} was captured at {dict(graph.key)}, not {dict(key)}")
        self._launch(graph)

    def issue(self, program: str, vars: Mapping[str, int]) -> None:
        """Replays the program's graph (captured once per vars key) if it declares graph, or from
        its graph cache (`cache_graphs`) if it has one, else runs it. While a staged wake is
        pending (`wake_now`) a program without a declared graph runs eagerly, each call waiting
        only for its own slices; a graph waits for them all."""
        graph = self._graphs.get((program, self._key(program, vars) if program in self._reads else ()))
        if graph is not None:
            self._launch(graph)
            return
        cache = self._cached.get(program)
        if cache is not None and not (self._seqs is not None and self._seqs.pending):
            self._issue_cached(program, cache, vars)
            return
        if program in self.manifest.programs and self.manifest.programs[program].graph:
            self._launch(self.capture_graph(program, vars))
        else:
            self.run(program, vars)

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
        self._live()
        self._program(program)
        seed: list[Step] = []
        if before is not None:
            self._program(before)
            seed = self._compile(before, self._key(before, {}))
        steps = self._compile(program, self._key(program, vars))
        self._await_staged()
        return _timing.time_steps(steps, self._stream, seed)

    def gemm_algos(self, program: str, vars: Mapping[str, int]) -> list[tuple[str, dict[str, int]]]:
        """(call label, algo fields) of every GEMM in `program` at `vars`: what to pin in a manifest."""
        self._live()
        self._program(program)
        steps = self._compile(program, self._key(program, vars))
        return [(s.label, dict(s.algo)) for s in steps if s.algo is not None]

    # -- sequences (kern_pool decisions on VMM arenas) ---------------------------------------------

    def _pool(self) -> Sequences:
        self._live()
        if self._seqs is None:
            raise ApiError("this manifest declares no paged or per-seq state: there is no sequence pool")
        return self._seqs

    @property
    def pool(self) -> kern_pool.Pool:
        """The kern_pool Pool deciding pages and slots (for schedulers that read its counts)."""
        return self._pool().pool

    def lease(self, tokens: int, *, wait: bool = True) -> kern_pool.Lease:
        """Fresh pages for `tokens` tokens plus a slot per per-seq state, zeroed on the stream.

        A remap the request needs runs on a background thread; `wait` (the default) blocks until
        it landed, `wait=False` raises `kern_pool.Remapping` instead (ask again later).

        Raises:
            ApiError: no pool, or bad tokens. kern_pool.Denied (ExceedsRow, ExceedsPool, Busy,
                Remapping without wait): nothing fits now.
        """
        return self._pool().lease(tokens, wait)

    def lease_slot(self, *, wait: bool = True) -> kern_pool.Lease:
        """A slot-only lease (a peer rank's share of a row): a slot per per-seq state, no pages,
        zeroed on the stream.

        Raises:
            ApiError: no pool, or a pool without per-seq states. kern_pool.Denied: no slot now.
        """
        return self._pool().lease_slot(wait)

    def retire(self, lease: kern_pool.Lease, length: int) -> kern_pool.Checkpoint:
        """Ends `lease` and keeps its first `length` tokens where they are (no copy): the cheap
        checkpoint of a sequence that will not go on.

        Raises:
            ApiError: no pool, a released / foreign lease, or length not in [1, lease.tokens].
        """
        return self._pool().retire(lease, length)

    def checkpoint(self, lease: kern_pool.Lease, length: int, *, wait: bool = True) -> kern_pool.Checkpoint:
        """Keeps `lease`'s first `length` tokens; the partial page and slot are copied on the stream."""
        return self._pool().checkpoint(lease, length, wait)

    def restore(
        self, checkpoint: kern_pool.Checkpoint, length: int, tokens: int, *, wait: bool = True
    ) -> kern_pool.Lease:
        """A new lease starting from `checkpoint`'s first `length` tokens, with room for `tokens`."""
        return self._pool().restore(checkpoint, length, tokens, wait)

    lease_from = restore

    def fork(self, parent: kern_pool.Lease, length: int, tokens: int, *, wait: bool = True) -> kern_pool.Lease:
        """A new lease sharing `parent`'s first `length` tokens (partial page and slot copied)."""
        return self._pool().fork(parent, length, tokens, wait)

    @property
    def remapping(self) -> bool:
        """True while a remap plan is in flight (made, not yet collected)."""
        return self._pool().remapping

    def settle(self) -> None:
        """Blocks until the remap plan in flight, if any, has landed and its new pages and slots
        are zeroed and leasable."""
        self._pool().settle()

    def reserve_host(self, pages: int, slots: int) -> kern_pool.Host:
        """The host tier: one pinned block (`cuMemHostAlloc`, on the GPU's NUMA node) for `pages`
        parked pages and `slots` parked slots; once per runtime.

        Raises:
            ApiError: no pool, already reserved, or counts holding nothing.
        """
        return self._pool().reserve_host(pages, slots)

    def enable_host_tier(self, nbytes: int) -> kern_pool.Host:
        """The host tier in at most `nbytes` of pinned memory (whole units); once.

        Raises:
            ApiError: no pool, already enabled, or too few bytes for one page or slot.
        """
        return self._pool().enable_host(nbytes)

    @property
    def host(self) -> kern_pool.Host:
        """The host tier's kern_pool planner (counts, free runs).

        Raises:
            ApiError: no pool, or the host tier is not enabled.
        """
        return self._pool().host

    def room(self, checkpoint: kern_pool.Checkpoint) -> kern_pool.Room | kern_pool.Checkpoint:
        """Host units for parking `checkpoint` (the Room holds it until `park(room)`), or the
        checkpoint itself back when the host block cannot hold it (evict a parked entry, retry).

        Raises:
            ApiError: no host tier, or a released / foreign checkpoint.
        """
        return self._pool().room(checkpoint)

    def park(self, checkpoint: kern_pool.Checkpoint | kern_pool.Room) -> kern_pool.Parked:
        """Parks on the host tier (`checkpoint` is a Checkpoint, or a Room from `room`).

        A Room: copies on the transfer stream, which starts after everything queued
        on the compute stream and never holds it up; the room's checkpoint is kept until the copies
        landed, then released. A Checkpoint: copies on the compute stream, and the checkpoint stays
        valid (release it when the device copy is no longer wanted). Pages an earlier park of the
        chain left on the host are not copied again.

        Raises:
            ApiError: no host tier, or a released / foreign handle. kern_pool.HostFull: a
                Checkpoint the block cannot hold; nothing was kept.
        """
        seqs = self._pool()
        if isinstance(checkpoint, kern_pool.Room):
            return seqs.park_room(checkpoint)
        return seqs.park(checkpoint)

    def park_now(self, checkpoint: kern_pool.Checkpoint) -> kern_pool.Parked:
        """Parks on the compute stream and lets the checkpoint go at once (what reuses its pages
        is ordered after the copies).

        Raises:
            ApiError: no host tier, or a released / foreign checkpoint. kern_pool.HostFull: the
                block cannot hold it; nothing was kept, the checkpoint is still the caller's.
        """
        return self._pool().park_now(checkpoint)

    @overload
    def wake(self, parked: kern_pool.Parked, length: int) -> kern_pool.Checkpoint: ...

    @overload
    def wake(self, parked: kern_pool.Parked, length: int, tokens: int, *, wait: bool = True) -> Waking: ...

    def wake(
        self, parked: kern_pool.Parked, length: int, tokens: int | None = None, *, wait: bool = True
    ) -> kern_pool.Checkpoint | Waking:
        """Wakes a parked copy's first `length` tokens; `parked` stays valid.

        With `tokens`: a `Waking` whose lease (room for `tokens`) is filled on the transfer
        stream; `awake` hands the lease over once the copies landed. Without: a device
        Checkpoint filled on the compute stream (`restore` it to continue).

        Raises:
            ApiError: no host tier, a released / foreign Parked, or a bad length or tokens.
                kern_pool.Denied: the pool cannot give the pages or slot now.
        """
        seqs = self._pool()
        if tokens is None:
            return seqs.wake(parked, length)
        return seqs.wake_async(parked, length, tokens, wait)

    def wake_now(self, parked: kern_pool.Parked, length: int, tokens: int, *, wait: bool = True) -> kern_pool.Lease:
        """A lease of `tokens` from a parked copy's first `length` tokens, usable at once; `parked`
        stays valid. The copies are staged on the transfer stream slice by slice (the manifest's
        `slices` of a paged state, else whole pages): until they landed, each eager call waits
        only for the slices its state args touch, so a prefill's first layers run while the last
        layers' pages are still copied; a graph, a capture and pool work on the compute stream
        wait for every slice.

        Raises:
            ApiError: as `wake`. kern_pool.Denied: the pool cannot give the pages or slot now.
        """
        return self._pool().wake_now(parked, length, tokens, wait)

    def awake(self, waking: Waking) -> kern_pool.Lease | Waking:
        """The woken lease once its copies landed, else `waking` itself; never blocks.

        Raises:
            ApiError: a Waking of another runtime, or one already awake or released.
        """
        return self._pool().awake(waking)

    def landed(self, waking: Waking) -> bool:
        """Whether a Waking's copies landed (it stays a Waking); never blocks."""
        return self._pool().landed(waking)

    def copy_out(self, copies: kern_pool.ParkCopies) -> None:
        """Performs a park decision made for the same ids elsewhere (a tray's head) on the
        compute stream: device pages and slot to host units.

        Raises:
            ApiError: no host tier, or an id outside this pool or host block.
        """
        self._pool().copy_out(copies)

    def copy_in(self, copies: kern_pool.WakeCopies) -> None:
        """Performs a wake decision made for the same ids elsewhere on the compute stream.

        Raises:
            ApiError: no host tier, or an id outside this pool or host block.
        """
        self._pool().copy_in(copies)

    def read_state(self, name: str, start: int, nbytes: int) -> npt.NDArray[np.uint8]:
        """`nbytes` of state `name` from byte `start` (mapped memory only); synchronizes."""
        alloc = self._state(name, start, nbytes)
        out = np.empty(nbytes, dtype=np.uint8)
        self.synchronize()
        drv.copy_dtoh(out.ctypes.data, alloc.ptr + start, nbytes)
        return out

    def write_state(self, name: str, start: int, data: npt.ArrayLike) -> None:
        """Writes bytes into state `name` at byte `start` (mapped memory only); synchronizes."""
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        alloc = self._state(name, start, raw.nbytes)
        self.synchronize()
        drv.copy_htod(alloc.ptr + start, raw.ctypes.data, raw.nbytes)

    def _state(self, name: str, start: int, nbytes: int) -> Allocation:
        self._live()
        alloc = self._states.get(name)
        if alloc is None:
            raise ApiError(f"unknown state {name!r}; states: {sorted(self._states)}")
        if start < 0 or nbytes < 0 or start + nbytes > alloc.nbytes:
            raise ApiError(f"state {name!r} range [{start}, {start + nbytes}) is outside its {alloc.nbytes} bytes")
        return alloc

    # -- inputs and outputs -----------------------------------------------------------------------

    def _io(self, name: str, kind: str) -> tuple[Buffer, Allocation, _Staging]:
        self._live()
        buf = self.manifest.buffers.get(name)
        if buf is None:
            raise ApiError(f"unknown buffer {name!r}; {kind} buffers: {self._names(kind)}")
        if buf.kind != kind:
            raise ApiError(f"buffer {name!r} is a {buf.kind} buffer, not an {kind}; {kind}s: {self._names(kind)}")
        return buf, self._buffers[name], self._staging[name]

    def _names(self, kind: str) -> list[str]:
        return sorted(n for n, b in self.manifest.buffers.items() if b.kind == kind)

    def write_input(self, name: str, array: npt.ArrayLike) -> None:
        """Copies `array` into the start of input `name` (a prefix write), ordered on the stream.

        Raises:
            ApiError: unknown or non-input buffer, wrong dtype, too many elements.
            DomainError: an element outside the buffer's declared domain (nothing is written).
        """
        buf, alloc, stage = self._io(name, "input")
        arr = np.ascontiguousarray(array)
        want = np.dtype(_NP_DTYPES[buf.dtype])
        if arr.dtype != want:
            raise ApiError(f"input {name!r} is {buf.dtype}: pass a numpy {want} array, not {arr.dtype}")
        if arr.nbytes > alloc.nbytes:
            raise ApiError(f"input {name!r} holds {alloc.nbytes // want.itemsize} elements, got {arr.size}")
        dom = self._domains.get(name)
        if dom is not None:
            check_domain(name, dom, arr)
        if stage.pending:
            drv.event_synchronize(stage.event)
        drv.host_view(stage.alloc.ptr, arr.nbytes)[:] = arr.reshape(-1).view(np.uint8).data
        drv.copy_htod_async(alloc.ptr, stage.alloc.ptr, arr.nbytes, self._stream)
        drv.event_record(stage.event, self._stream)
        stage.pending = True

    def read_output(self, name: str, count: int | None = None) -> npt.NDArray[Any]:
        """The first `count` elements (default: all) of output `name`; synchronizes the stream."""
        buf, alloc, stage = self._io(name, "output")
        dt = np.dtype(_NP_DTYPES[buf.dtype])
        cap = alloc.nbytes // dt.itemsize
        n = cap if count is None else count
        if not 0 <= n <= cap:
            raise ApiError(f"output {name!r} holds {cap} elements, asked for {count}")
        nbytes = n * dt.itemsize
        drv.copy_dtoh_async(stage.alloc.ptr, alloc.ptr, nbytes, self._stream)
        drv.stream_synchronize(self._stream)
        return np.frombuffer(drv.host_view(stage.alloc.ptr, nbytes), dtype=dt).copy()

    def fetch_output(self, name: str, count: int | None = None) -> Fetch:
        """Enqueues a copy of the first `count` elements (default: all) of output `name`, ordered on
        the stream after the work issued so far, into pinned memory of its own; later work may
        overwrite the output without touching it. `fetched` waits for this copy only, so the next
        step can be issued before the previous one's output is read.

        Raises:
            ApiError: unknown or non-output buffer, or count outside [0, its elements].
        """
        buf, alloc, _stage = self._io(name, "output")
        dt = np.dtype(_NP_DTYPES[buf.dtype])
        cap = alloc.nbytes // dt.itemsize
        n = cap if count is None else count
        if not 0 <= n <= cap:
            raise ApiError(f"output {name!r} holds {cap} elements, asked for {count}")
        free = self._fetch_free.setdefault(name, [])
        if free:
            slot = free.pop()
        else:
            event = drv.event_create(timing=False)
            self._stack.callback(drv.event_destroy, event)
            slot = _Staging(memory.host(self._stack, alloc.nbytes), event)
        drv.copy_dtoh_async(slot.alloc.ptr, alloc.ptr, n * dt.itemsize, self._stream)
        drv.event_record(slot.event, self._stream)
        return Fetch(name, n, dt, slot)

    def fetched(self, fetch: Fetch) -> npt.NDArray[Any]:
        """The elements `fetch` copied, once its copy has landed (waits for it, not for later work).

        Raises:
            ApiError: the fetch was read already.
        """
        self._live()
        if fetch._read:  # pyright: ignore[reportPrivateUsage]
            raise ApiError(f"this fetch of {fetch.name!r} was read already")
        slot = fetch._slot  # pyright: ignore[reportPrivateUsage]
        drv.event_synchronize(slot.event)
        nbytes = fetch.count * fetch.dtype.itemsize
        out = np.frombuffer(drv.host_view(slot.alloc.ptr, nbytes), dtype=fetch.dtype).copy()
        fetch._read = True  # pyright: ignore[reportPrivateUsage]
        self._fetch_free[fetch.name].append(slot)
        return out

    def read_buffer(self, name: str) -> npt.NDArray[np.uint8]:
        """Every byte of any device buffer (for tests and A/B harnesses); synchronizes."""
        self._live()
        if name not in self._buffers:
            raise ApiError(f"buffer {name!r} has no memory now; buffers: {sorted(self._buffers)}")
        alloc = self._buffers[name]
        out = np.empty(alloc.nbytes, dtype=np.uint8)
        self.synchronize()
        if alloc.where == "host":
            out[:] = np.frombuffer(drv.host_view(alloc.ptr, alloc.nbytes), dtype=np.uint8)
        else:
            drv.copy_dtoh(out.ctypes.data, alloc.ptr, alloc.nbytes)
        return out

    def synchronize(self) -> None:
        """Waits for everything enqueued on the runtime's stream and on its transfer stream."""
        self._live()
        drv.stream_synchronize(self._stream)
        if self._seqs is not None:
            self._seqs.synchronize_transfers()

    # -- lifetime ---------------------------------------------------------------------------------

    def _live(self) -> None:
        if self._closed:
            raise ApiError("this runtime is closed")

    def _release(self) -> None:
        self._closed = True
        self._graphs.clear()
        for cache in self._cached.values():
            for g in cache.drain():
                with suppress(KernRuntimeError):  # NOTE: the context goes next; free the rest
                    drv.graph_exec_destroy(g.exec_)
        self._cached.clear()
        self._steps.clear()
        self._templates.clear()
        for w in self._weights.values():
            w.stack.close()
        self._weights.clear()
        self._stack.close()

    def close(self) -> None:
        """Releases every allocation, module, graph and the stream (idempotent)."""
        if self._closed:
            return
        try:
            drv.stream_synchronize(self._stream)
        finally:
            self._release()

    def into_resident(self) -> Resident:
        """Closes this runtime but keeps its loaded device weight buffers for `load(over=...)`."""
        self._live()
        if not self._loaded:
            raise ApiError("into_resident needs loaded weights")
        self.synchronize()
        kept = {n: w for n, w in self._weights.items() if w.spec.placement == "device"}
        for n in kept:
            del self._weights[n]
        resident = Resident(self.gpu, self._dev, kept)
        self._release()
        return resident

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- description ------------------------------------------------------------------------------

    def summary(self) -> str:
        """Startup lines: vars, buffers by kind with bytes, states, modules, programs."""
        m = self.manifest
        lines = [f"manifest {m.model}: gpu {self.gpu} (sm_{self._arch})"]
        lines.append("vars: " + (", ".join(f"{n}<={v.max}" for n, v in m.vars.items()) or "none"))
        kinds: dict[str, list[int]] = {}
        for name, buf in m.buffers.items():
            kinds.setdefault(buf.kind, []).append(m.buffer_max_bytes(name))
        lines.append("buffers: " + ", ".join(f"{k} {len(v)} ({_size(sum(v))})" for k, v in sorted(kinds.items())))
        if self._claimed:
            lines.append(f"weights claimed from resident: {len(self._claimed)}")
        for name, a in self._states.items():
            lines.append(f"state {name}: {self._state_notes[name]} ({_size(a.nbytes)}, VMM)")
        for name, mod in self._modules.items():
            lines.append(f"module {name}: {mod.sha256[:12]}")
        for name, p in sorted(m.programs.items()):
            flags = [f for f, on in (("graph", p.graph), ("once", p.once), ("derive", p.derive)) if on]
            lines.append(f"program {name}: {len(p.calls)} calls" + (f" ({', '.join(flags)})" if flags else ""))
        return "\n".join(lines)

    def buffer_address(self, name: str) -> int:
        """The device (or pinned host) address of a buffer, for tools that bind their own memory."""
        self._live()
        if name not in self._buffers:
            raise ApiError(f"buffer {name!r} has no memory now; buffers: {sorted(self._buffers)}")
        return self._buffers[name].ptr


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} B"


def _algo(launch: ExternLaunch) -> tuple[int, ...] | None:
    a = launch.algo
    if a is None:
        return None
    return (a.id, a.tile, a.split_k, a.reduction, a.swizzle, a.custom, a.stages, a.inner_shape, a.cluster_shape)


def _lit(arg: object, env: Mapping[str, int]) -> int:
    if isinstance(arg, I32Arg):
        return arg.i32
    if isinstance(arg, I64Arg):
        return arg.i64
    if isinstance(arg, VarArg):
        return env[arg.var]
    if isinstance(arg, ExprArg):
        return arg.expr.eval(env)
    raise ManifestUnsupportedError(f"extern arg {arg!r} is not an integer")


def _var_ends(manifest: Manifest, reads: frozenset[str], launch: ExternLaunch) -> list[dict[str, int]]:
    """The two var corners a pinned algo must pass: all at 1 and all at max (`when` clamps its var)."""
    lo = {v: 1 for v in reads}
    hi = {v: manifest.vars[v].max for v in reads}
    if launch.when is not None:
        w = launch.when
        lo[w.var] = max(lo[w.var], w.min or 1)
        hi[w.var] = min(hi[w.var], w.max if w.max is not None else hi[w.var])
    return [lo, hi]


def _program_buffers(manifest: Manifest, program: str) -> set[str]:
    return {a.buf for c in manifest.programs[program].calls for a in c.args if isinstance(a, BufArg)}


def _peer_kernels(manifest: Manifest) -> set[tuple[str, str]]:
    """(module, entry) of every kernel launch in an op that some call hands a peer buffer."""
    ops = {c.op for p in manifest.programs.values() for c in p.calls
           if any(isinstance(a, BufArg) and manifest.buffers[a.buf].kind == "peer" for a in c.args)}
    return {(la.module, la.entry) for op in sorted(ops) for la in manifest.ops[op].impl.launches
            if isinstance(la, KernelLaunch)}


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
        rt._attach(table)  # pyright: ignore[reportPrivateUsage]
    for g in sorted(runtimes[0]._nccl_groups()):  # pyright: ignore[reportPrivateUsage]
        ordered = sorted(runtimes, key=lambda rt: rt.ranks[g])
        contexts = [functools.partial(drv.set_current, rt._ctx) for rt in ordered]  # pyright: ignore[reportPrivateUsage]
        for rt, comm in zip(ordered, nccl.init_local(g, table[g][0].nccl[g], contexts), strict=True):
            rt._peers().adopt(comm)  # pyright: ignore[reportPrivateUsage]
    for rt in runtimes:
        rt._connected()  # pyright: ignore[reportPrivateUsage]
