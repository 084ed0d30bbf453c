"""Loading a runtime: the kernels the manifest pins, its memory, the extern checks (all rolled back
together when any step fails), then the weights into their buffers, derive and once programs."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kern_manifest import ExternLaunch, KernelLaunch, Manifest
from kern_manifest.schema import BufArg, Call, ExprArg, I32Arg, I64Arg, ParamArg, ScratchArg, VarArg

from . import _driver as drv
from . import memory, nccl, sass
from ._loader import Job, run_jobs
from ._manifest import bind_segments
from ._peering import Peering
from ._program import Resources, Value, call_value, gemm_shape, gemm_sizes_at
from ._rt_core import Device, Spec
from ._rt_memory import Memory, Resident, size_text
from ._rt_programs import Programs, resources
from .blas import WORKSPACE_BYTES, Blas, GemmShape
from .domains import InputDomain, input_domains
from .errors import ApiError, KernelArtifactError, ManifestUnsupportedError
from .kernels import LoadedModule, hash_dir, read_module
from .peers import choose_handle_kind
from .weights import Tensors, plan_bind

__all__ = ["Kernels", "Loaded", "Progress", "WeightLoader", "load", "summary"]

Progress = Callable[[int, int], None]


@dataclass(slots=True)
class Kernels:
    """The loaded modules and, per (op, launch index), the resolved function."""

    modules: dict[str, LoadedModule]
    funcs: dict[tuple[str, int], Any]


@dataclass(slots=True)
class Loaded:
    """What `load` made: everything a runtime's parts are built over."""

    spec: Spec
    device: Device
    kernels: Kernels
    memory: Memory
    peering: Peering | None
    blas: Blas | None
    domains: dict[str, InputDomain]


def load(spec: Spec, kernels_dir: Path, over: Resident | None) -> Loaded:
    """Loads the pinned kernels, allocates buffers, fixed states, scratch, the cuBLASLt workspace
    and the pool, and claims identical weights from `over` (then closes it). A failure releases
    everything allocated so far."""
    device = Device(spec.gpu)
    mem: Memory | None = None
    try:
        device.open()
        kernels = _load_kernels(spec.manifest, device, kernels_dir)
        peering = _peering(spec, device)
        mem = Memory(spec, device, peering)
        mem.allocate(over)
        blas = _check_externs(spec, device, resources(spec, device, mem, kernels.funcs, None, peering))
        mem.allocate_pool()
        domains = input_domains(spec.manifest, mem.state_units())
        if over is not None:
            mem.weights.update(over.take(sorted(mem.claimed)))
            over.close()
    except BaseException:
        device.closed = True
        if mem is not None:
            mem.release_weights()
        device.stack.close()
        raise
    return Loaded(spec, device, kernels, mem, peering, blas, domains)


def _peering(spec: Spec, device: Device) -> Peering | None:
    if spec.manifest.topology is None:
        return None
    kind = choose_handle_kind(drv.handle_kind_usable(device.dev, "fabric"),
                              drv.handle_kind_usable(device.dev, "posix_fd"))
    return Peering(device.stack, spec.manifest, device.dev, spec.ranks, kind)


# -- kernels ----------------------------------------------------------------------------------------


def _load_kernels(manifest: Manifest, device: Device, kernels_dir: Path) -> Kernels:
    hashes = hash_dir(kernels_dir)
    modules: dict[str, LoadedModule] = {}
    data: dict[str, bytes] = {}
    for name, mod in manifest.modules.items():
        data[name] = read_module(hashes, name, mod.sha256.lower())
        modules[name] = LoadedModule.load(device.stack, name, mod.sha256, data[name], device.arch)
    funcs = _resolve_launches(manifest, modules)
    _scan_peer_kernels(manifest, data)
    return Kernels(modules, funcs)


def _resolve_launches(manifest: Manifest, modules: Mapping[str, LoadedModule]) -> dict[tuple[str, int], Any]:
    bounds = manifest.var_bounds
    funcs: dict[tuple[str, int], Any] = {}
    # NOTE: the dynamic shared-memory limit is the function's, not the launch's: launches of one
    # entry from several ops (different shapes) need the largest of their sizes.
    smem: dict[tuple[str, str], tuple[Any, int]] = {}
    for op_name, op in manifest.ops.items():
        for li, launch in enumerate(op.impl.launches):
            if not isinstance(launch, KernelLaunch):
                continue
            params = launch.params if launch.params is not None else op.params
            func = modules[launch.module].resolve(launch.entry, [str(p) for p in params])
            funcs[(op_name, li)] = func
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
    return funcs


def _scan_peer_kernels(manifest: Manifest, data: Mapping[str, bytes]) -> None:
    """The trust boundary: every kernel a call hands a peer buffer is scanned (cuobjdump -sass)
    and refused when it issues multicast instructions."""
    dumps: dict[str, dict[str, list[str]]] = {}
    for module, entry in sorted(_peer_kernels(manifest)):
        if module not in dumps:
            dumps[module] = sass.sass_functions(sass.dump_sass(data[module], module))
        sass.scan_kernel(dumps[module], module, entry)


def _peer_kernels(manifest: Manifest) -> set[tuple[str, str]]:
    """(module, entry) of every kernel launch in an op that some call hands a peer buffer."""
    ops = {c.op for p in manifest.programs.values() for c in p.calls
           if any(isinstance(a, BufArg) and manifest.buffers[a.buf].kind == "peer" for a in c.args)}
    return {(la.module, la.entry) for op in sorted(ops) for la in manifest.ops[op].impl.launches
            if isinstance(la, KernelLaunch)}


# -- externs ----------------------------------------------------------------------------------------


def _check_externs(spec: Spec, device: Device, res: Resources) -> Blas | None:
    """Loads NCCL's bindings if a program runs collectives; the cuBLASLt handle and workspace if
    an op calls a GEMM, each GEMM's entry parsed and each pinned algo checked."""
    gemms = [(op_name, launch) for op_name, op in spec.manifest.ops.items()
             for launch in op.impl.launches
             if isinstance(launch, ExternLaunch) and not launch.signature.collective]  # fmt: skip
    if any(n.groups for n in spec.needs.values()):
        nccl.bindings()
    if not gemms:
        return None
    ws = memory.device(device.stack, WORKSPACE_BYTES)
    blas = Blas(device.stack, ws.ptr)
    for op_name, launch in gemms:
        gemm_shape(launch.entry, [1, 1, 1], f"op {op_name!r}")
        if launch.algo is not None:
            _check_algo(spec, blas, res, op_name, launch)
    return blas


def _check_algo(spec: Spec, blas: Blas, res: Resources, op_name: str, launch: ExternLaunch) -> None:
    """AlgoCheck a pinned algo at both var ends of every call site of this op."""
    for pname, prog in spec.manifest.programs.items():
        for call in prog.calls:
            if call.op != op_name:
                continue
            for env in _var_ends(spec.manifest, spec.reads[pname], launch):
                shape = _gemm_shape_at(res, call, launch, env)
                try:
                    blas.plan(shape, _algo(launch))
                except KernelArtifactError as exc:
                    raise KernelArtifactError(f"op {op_name!r} in program {pname!r}: {exc}") from None


def _gemm_shape_at(res: Resources, call: Call, launch: ExternLaunch, env: Mapping[str, int]) -> GemmShape:
    values = [call_value(res, a, env, "algo check") for a in call.args]
    if launch.args is not None:
        values = [values[a.param] if isinstance(a, ParamArg) else Value() if isinstance(a, ScratchArg)
                  else Value(scalar=_lit(a, env)) for a in launch.args]
    return gemm_shape(launch.entry, [int(v.scalar or 0) for v in values[gemm_sizes_at(launch.entry):]])


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


# -- weights ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Copying:
    threads: int
    report: Progress
    chunk: int


class WeightLoader:
    """Fills a loaded runtime's weight buffers, then runs its derive and once programs."""

    def __init__(self, spec: Spec, device: Device, memory: Memory, programs: Programs) -> None:
        self._spec = spec
        self._manifest = spec.manifest
        self._device = device
        self._memory = memory
        self._programs = programs

    def load(self, tensors: Tensors, threads: int, progress: Progress | None, chunk_bytes: int) -> int:
        """See `Runtime.load_weights`."""
        self._device.live()
        if self._programs.loaded:
            raise ApiError("load_weights was already called on this runtime")
        ctx = self._device.ctx
        drv.set_current(ctx)
        jobs = self._plan_weights(tensors)
        sources = self._plan_sources(tensors)
        total = sum(j.copy.nbytes for j in jobs) + sum(j.copy.nbytes for js in sources.values() for j in js)
        done = 0

        def report(d: int, _t: int) -> None:
            if progress is not None:
                progress(done + d, total)

        if chunk_bytes < 1 << 16:
            raise ApiError(f"chunk_bytes {chunk_bytes} is below 64 KiB")
        done += run_jobs(jobs, ctx, threads=threads, progress=report, chunk=chunk_bytes)
        done += self._run_derive(sources, _Copying(threads, report, chunk_bytes))
        self._programs.loaded = True
        self._programs.run_once(connected=False)
        self._memory.synchronize()
        return done

    def _plan_weights(self, tensors: Tensors) -> list[Job]:
        jobs: list[Job] = []
        for name, buf in self._manifest.buffers.items():
            if buf.kind != "weight" or buf.bind is None or name in self._memory.claimed:
                continue
            alloc = self._memory.buffers[name]
            segs = bind_segments(name, buf, self._spec.ranks)
            for c in plan_bind(name, buf.dtype, self._manifest.buffer_max_bytes(name), segs, tensors):
                jobs.append(Job(alloc.ptr, c, host=buf.placement == "host"))
        return jobs

    def _plan_sources(self, tensors: Tensors) -> dict[str, list[Job]]:
        out: dict[str, list[Job]] = {}
        for name, buf in self._manifest.buffers.items():
            if buf.kind == "source":
                segs = bind_segments(name, buf, self._spec.ranks)
                nbytes = self._manifest.buffer_max_bytes(name)
                out[name] = [Job(0, c) for c in plan_bind(name, buf.dtype, nbytes, segs, tensors)]
        return out

    def _run_derive(self, sources: dict[str, list[Job]], copying: _Copying) -> int:
        """Derive programs in name order, each source staged just before its first reader and
        released after its last."""
        m = self._manifest
        moved = 0
        derive = sorted(n for n, p in m.programs.items() if p.derive)
        last_reader = {s: max((i for i, p in enumerate(derive) if s in _program_buffers(m, p)), default=-1)
                       for s in sources}  # fmt: skip
        live: dict[str, ExitStack] = {}
        try:
            for i, pname in enumerate(derive):
                for s in sorted(_program_buffers(m, pname) & sources.keys()):
                    if s not in live:
                        moved += self._stage_source(s, sources[s], live, copying)
                self._programs.derive(pname)
                for s in [s for s in live if last_reader[s] <= i]:
                    live.pop(s).close()
                    del self._memory.buffers[s]
        finally:
            for s, st in live.items():
                st.close()
                self._memory.buffers.pop(s, None)
        return moved

    def _stage_source(self, name: str, jobs: list[Job], live: dict[str, ExitStack], copying: _Copying) -> int:
        stack, alloc = self._memory.stage_source(name)
        live[name] = stack
        return run_jobs([Job(alloc.ptr, j.copy) for j in jobs], self._device.ctx, threads=copying.threads,
                        progress=copying.report, chunk=copying.chunk)


def _program_buffers(manifest: Manifest, program: str) -> set[str]:
    return {a.buf for c in manifest.programs[program].calls for a in c.args if isinstance(a, BufArg)}


def summary(spec: Spec, device: Device, kernels: Kernels, mem: Memory) -> str:
    """Startup lines: vars, buffers by kind with bytes, states, modules, programs."""
    m = spec.manifest
    lines = [f"manifest {m.model}: gpu {spec.gpu} (sm_{device.arch})"]
    lines.append("vars: " + (", ".join(f"{n}<={v.max}" for n, v in m.vars.items()) or "none"))
    kinds: dict[str, list[int]] = {}
    for name, buf in m.buffers.items():
        kinds.setdefault(buf.kind, []).append(m.buffer_max_bytes(name))
    lines.append("buffers: " + ", ".join(f"{k} {len(v)} ({size_text(sum(v))})" for k, v in sorted(kinds.items())))
    if mem.claimed:
        lines.append(f"weights claimed from resident: {len(mem.claimed)}")
    for name, a in mem.states.items():
        lines.append(f"state {name}: {mem.notes[name]} ({size_text(a.nbytes)}, VMM)")
    for name, mod in kernels.modules.items():
        lines.append(f"module {name}: {mod.sha256[:12]}")
    for name, p in sorted(m.programs.items()):
        flags = [f for f, on in (("graph", p.graph), ("once", p.once), ("derive", p.derive)) if on]
        lines.append(f"program {name}: {len(p.calls)} calls" + (f" ({', '.join(flags)})" if flags else ""))
    return "\n".join(lines)
