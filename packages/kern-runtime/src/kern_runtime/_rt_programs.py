"""A runtime's programs, from a call to the GPU: the checks, the var keys, the compiled steps and
program templates, eager runs (waiting for a staged wake's slices), captured graphs, the graph
caches, and `issue` end to end."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from contextlib import suppress
from typing import Any

from . import _driver as drv
from . import _timing
from ._hosttier import Slice
from ._peering import Peering
from ._program import ProgramTemplate, Resources, Step, compile_program
from ._rt_core import Device, Spec
from ._rt_memory import Memory
from .blas import Blas
from .errors import ApiError, CallError, KernRuntimeError
from .graphs import Graph, GraphCache, GraphCacheStats, VarKey, normalize_vars

__all__ = ["Programs", "resources"]


def resources(spec: Spec, device: Device, memory: Memory, funcs: Mapping[tuple[str, int], Any],
              blas: Blas | None, peering: Peering | None) -> Resources:
    """What compiling reads: addresses, functions, BLAS, ranks, the stream, communicators."""
    return Resources(
        manifest=spec.manifest,
        buffers={n: (a.ptr, a.nbytes) for n, a in memory.buffers.items()},
        states={n: (a.ptr, a.nbytes) for n, a in memory.states.items()},
        scratch=memory.scratch,
        funcs=funcs,
        blas=blas,
        ranks=spec.ranks,
        stream=device.stream,
        comms=peering.comms if peering is not None else {},
    )


class Programs:
    """Compiles, runs, captures and replays one runtime's programs on its stream."""

    def __init__(self, spec: Spec, device: Device, memory: Memory, funcs: Mapping[tuple[str, int], Any],
                 blas: Blas | None, peering: Peering | None) -> None:
        self._spec = spec
        self._manifest = spec.manifest
        self._reads = spec.reads
        self._bounds = spec.bounds
        self._device = device
        self._memory = memory
        self._funcs = funcs
        self._blas = blas
        self._peering = peering
        self.loaded = False
        self._steps: dict[tuple[str, VarKey], list[Step]] = {}
        self._templates: dict[str, ProgramTemplate] = {}
        self._graphs: dict[tuple[str, VarKey], Graph] = {}
        self._cached: dict[str, GraphCache[Graph]] = {}
        self._touches: dict[str, dict[int, tuple[Slice, ...]]] = {}

    def resources(self) -> Resources:
        """What compiling reads now (buffers come and go while derive programs run)."""
        return resources(self._spec, self._device, self._memory, self._funcs, self._blas, self._peering)

    # -- compiling --------------------------------------------------------------------------------

    def check(self, program: str) -> None:
        """ApiError unless `program` may run now; NotConnectedError while what it needs is not."""
        programs = self._manifest.programs
        if program not in programs:
            raise ApiError(f"unknown program {program!r}; programs: {sorted(programs)}")
        if programs[program].derive:
            raise ApiError(f"program {program!r} is a derive program; it runs only inside load_weights")
        if not self.loaded:
            raise ApiError("call load_weights before running programs")
        needs = self._spec.needs[program]
        if needs.peers or needs.groups:
            assert self._peering is not None
            self._peering.require(needs, program)

    def _key(self, program: str, vars: Mapping[str, int]) -> VarKey:
        return normalize_vars(program, self._bounds, self._reads[program], vars)

    def _compile(self, program: str, key: VarKey) -> list[Step]:
        steps = self._steps.get((program, key))
        if steps is None:
            res = self.resources()
            steps = compile_program(res, program, {}) if not key else self._template(program, res).compile(res, dict(key))
            self._steps[(program, key)] = steps
        return steps

    def _template(self, program: str, res: Resources) -> ProgramTemplate:
        template = self._templates.get(program)
        if template is None or not template.fits(res):
            template = ProgramTemplate(res, program)
            self._templates[program] = template
        return template

    def _checked(self, program: str, vars: Mapping[str, int]) -> list[Step]:
        self._device.live()
        self.check(program)
        return self._compile(program, self._key(program, vars))

    # -- running ----------------------------------------------------------------------------------

    def _execute(self, program: str, steps: list[Step]) -> None:
        """Enqueues the steps; while a staged wake is pending each call first waits for the slices
        it touches (`Sequences.staged`), so it runs as soon as its own slices landed."""
        seqs = self._memory.seqs
        run: Iterable[Step] = steps
        if seqs is not None and seqs.pending:
            touch = self._touches.get(program)
            if touch is None:
                touch = self._touches[program] = seqs.call_slices(self._manifest.programs[program].calls)
            run = seqs.staged(steps, touch)
        for step in run:
            try:
                step.run()
            except KernRuntimeError as exc:
                raise CallError(program, step.position, step.label, exc) from exc

    def _pending(self) -> bool:
        seqs = self._memory.seqs
        return seqs is not None and seqs.pending

    def _await_staged(self) -> None:
        """The compute stream waits for every staged copy still pending (before a graph)."""
        seqs = self._memory.seqs
        if seqs is not None and seqs.pending:
            seqs.await_staged()

    def _launch(self, graph: Graph) -> None:
        self._await_staged()
        drv.graph_launch(graph.exec_, self._device.stream)

    def run(self, program: str, vars: Mapping[str, int]) -> None:
        """Enqueues every launch of `program` eagerly."""
        self._execute(program, self._checked(program, vars))

    def derive(self, program: str) -> None:
        """Runs a derive program once, waits for it and forgets its steps."""
        self._execute(program, self._compile(program, ()))
        self._memory.synchronize()
        self._steps = {k: v for k, v in self._steps.items() if k[0] != program}

    def run_once(self, *, connected: bool) -> None:
        """Once programs: those that need no peers or collectives after the weights, the others
        after connect."""
        for name in sorted(self._manifest.programs):
            needs = self._spec.needs[name]
            if self._manifest.programs[name].once and bool(needs.peers or needs.groups) == connected:
                self.run(name, {v: self._bounds[v] for v in self._reads[name]})

    def issue(self, program: str, vars: Mapping[str, int]) -> None:
        """A captured graph's launch, a graph cache's replay or capture, a capture of a program
        that declares graph, else an eager run (see `Runtime.issue`)."""
        graph = self._graphs.get((program, self._key(program, vars) if program in self._reads else ()))
        if graph is not None:
            self._launch(graph)
            return
        cache = self._cached.get(program)
        if cache is not None and not self._pending():
            self._issue_cached(program, cache, vars)
            return
        if program in self._manifest.programs and self._manifest.programs[program].graph:
            self._launch(self.capture_graph(program, vars))
        else:
            self.run(program, vars)

    # -- graphs -----------------------------------------------------------------------------------

    def capture_graph(self, program: str, vars: Mapping[str, int]) -> Graph:
        """The graph of `program` at these vars (captured on first use, then kept)."""
        self._device.live()
        self.check(program)
        key = self._key(program, vars)
        graph = self._graphs.get((program, key))
        if graph is None:
            graph = self._capture(program, key)
            self._device.stack.callback(drv.graph_exec_destroy, graph.exec_)
            self._graphs[(program, key)] = graph
        return graph

    def _capture(self, program: str, key: VarKey) -> Graph:
        """The program captured and instantiated at `key`; the caller owns its exec."""
        steps = self._compile(program, key)
        stream = self._device.stream
        self._await_staged()  # NOTE: a capture may not wait on events recorded outside it
        drv.begin_capture(stream)
        try:
            self._execute(program, steps)
        except BaseException:
            try:
                g = drv.end_capture(stream)
                drv.graph_destroy(g)
            except KernRuntimeError:
                pass
            raise
        g = drv.end_capture(stream)
        try:
            exec_ = drv.graph_instantiate(g)
        finally:
            drv.graph_destroy(g)
        return Graph(program, key, exec_, len(steps))

    def replay(self, graph: Graph, vars: Mapping[str, int]) -> None:
        """Launches `graph` (ApiError: vars other than its own)."""
        key = self._key(graph.program, vars)
        if key != graph.key:
            raise ApiError(f"graph of {graph.program!r} was captured at {dict(graph.key)}, not {dict(key)}")
        self._launch(graph)

    def cache_graphs(self, program: str, limit: int) -> None:
        """See `Runtime.cache_graphs`."""
        self._device.live()
        self.check(program)
        if self._manifest.programs[program].graph:
            raise ApiError(f"program {program!r} declares graph: issue() replays its graphs already")
        if type(limit) is not int or limit < 0:
            raise ApiError(f"graph cache limit must be an int >= 0, got {limit!r}")
        old = self._cached.pop(program, None)
        if old is not None:
            _destroy(old.drain())
        if limit:
            self._cached[program] = GraphCache(limit)

    def graph_cache(self, program: str) -> GraphCacheStats | None:
        """What `program`'s graph cache did so far (None: no cache)."""
        cache = self._cached.get(program)
        return None if cache is None else cache.stats()

    def _issue_cached(self, program: str, cache: GraphCache[Graph], vars: Mapping[str, int]) -> None:
        self._device.live()
        key = self._key(program, vars)
        graph = cache.lookup(key)
        if graph is None and cache.wants(key):
            graph = self._capture(program, key)
            old = cache.insert(key, graph)
            if old is not None:
                _destroy([old])
        if graph is None:
            self._execute(program, self._compile(program, key))
        else:
            self._launch(graph)

    # -- measuring --------------------------------------------------------------------------------

    def time_calls(self, program: str, vars: Mapping[str, int],
                   before: str | None) -> tuple[list[tuple[str, float]], bool]:
        """See `Runtime.time_calls`."""
        self._device.live()
        self.check(program)
        seed: list[Step] = []
        if before is not None:
            self.check(before)
            seed = self._compile(before, self._key(before, {}))
        steps = self._compile(program, self._key(program, vars))
        self._await_staged()
        return _timing.time_steps(steps, self._device.stream, seed)

    def gemm_algos(self, program: str, vars: Mapping[str, int]) -> list[tuple[str, dict[str, int]]]:
        """(call label, algo fields) of every GEMM in `program` at `vars`."""
        steps = self._checked(program, vars)
        return [(s.label, dict(s.algo)) for s in steps if s.algo is not None]

    def release(self) -> None:
        """Forgets every graph and step; destroys the cached graphs (the rest go with the stack)."""
        self._graphs.clear()
        for cache in self._cached.values():
            for g in cache.drain():
                with suppress(KernRuntimeError):  # NOTE: the context goes next; free the rest
                    drv.graph_exec_destroy(g.exec_)
        self._cached.clear()
        self._steps.clear()
        self._templates.clear()


def _destroy(graphs: list[Graph]) -> None:
    for g in graphs:
        drv.graph_exec_destroy(g.exec_)
