"""Program templates against the plain compile: for every example manifest and the runtime's test
manifests, at several var keys (both ends, the middle, both sides of every `when` edge), the
templated steps equal `compile_program`'s byte for byte: kernel function, grid, block, shared
memory, launch config, every staged arg slot and the pointer layout; each GEMM's shape, algo and
pointers; and the same error where the plain compile raises one."""

from __future__ import annotations

import hashlib
import itertools
import json
import random
from pathlib import Path
from typing import Any

import pytest

from kern_manifest import KernelLaunch, Manifest, parse_manifest
from kern_runtime import _program as program
from kern_runtime import nccl
from kern_runtime._program import ProgramTemplate, Resources, Step, compile_program
from kern_runtime.blas import GemmShape

from .helpers import manifests, peer_manifests

SHA = "ab" * 32
_COLLECTIVES: list[tuple[Any, ...]] = []
EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


class FakeBlas:
    """Plans cached by (shape, algo, scales) like the real one; describe and matmul recorded."""

    def __init__(self) -> None:
        self.plans: dict[tuple[GemmShape, tuple[int, ...] | None, tuple[int, int] | None], tuple[Any, ...]] = {}
        self.calls: list[tuple[Any, ...]] = []
        self.described: list[tuple[Any, ...]] = []

    def plan(self, shape: GemmShape, algo: tuple[int, ...] | None,
             scales: tuple[int, int] | None = None) -> tuple[Any, ...]:
        return self.plans.setdefault((shape, algo, scales), ("plan", shape, algo, scales))

    def describe(self, plan: tuple[Any, ...]) -> dict[str, int]:
        self.described.append(plan)
        return {"id": plan[1].m % 7, "tile": plan[1].n % 5}

    def matmul(self, plan: Any, a: int, w: int, c: int, stream: int) -> None:
        self.calls.append((plan, a, w, c, stream))


def _resources(m: Manifest) -> Resources:
    env = m.var_max
    buffers = {n: (0x10000000 * (i + 1), b.nbytes(env)) for i, (n, b) in enumerate(m.buffers.items())}
    states = {n: (0x7000000000 + (i << 32), 1 << 30) for i, n in enumerate(m.states)}
    scratch = {o: {s: 0x9000000000 + (i << 24) + j * 4096 for j, s in enumerate(op.impl.scratch)}
               for i, (o, op) in enumerate(m.ops.items())}  # fmt: skip
    funcs = {(o, i): f"{o}#{i}" for o, op in m.ops.items() for i in range(len(op.impl.launches))}
    groups = m.topology.groups if m.topology else {}
    comms = {g: nccl.Communicator(g, 0, size, None) for g, size in groups.items()}
    return Resources(m, buffers, states, scratch, funcs, FakeBlas(), dict.fromkeys(groups, 0), 0, comms)  # type: ignore[arg-type]


def _dump(step: Step, blas: FakeBlas) -> tuple[Any, ...]:
    head = (step.position, step.label, dict(step.algo) if step.algo is not None else None)
    rec = getattr(step.run, "record", None)
    if rec is None:
        blas.calls.clear()
        _COLLECTIVES.clear()
        step.run()
        return (*head, tuple(blas.calls), tuple(_COLLECTIVES))
    base = rec.args.data.ctypes.data
    layout = [int(p) - base if p else 0 for p in rec.args.ptrs]
    slots = [rec.args.slot(i) for i in range(len(rec.args.ptrs))]
    return (*head, rec.func, rec.grid, rec.block, rec.smem, rec.config, rec.label, rec.args.nbytes,
            rec.args.data.tobytes(), layout, slots)  # fmt: skip


def _outcome(fn: Any, res: Resources) -> tuple[Any, ...]:
    try:
        steps = fn()
    except Exception as exc:
        return ("error", type(exc).__name__, str(exc))
    assert isinstance(res.blas, FakeBlas)
    return ("ok", [_dump(s, res.blas) for s in steps])


def _keys(m: Manifest, name: str) -> list[dict[str, int]]:
    reads = sorted(m.program_vars(name))
    cands: dict[str, set[int]] = {v: {1, m.vars[v].max, max(1, m.vars[v].max // 2), min(3, m.vars[v].max)} for v in reads}
    for op in {c.op for c in m.programs[name].calls}:
        for la in m.ops[op].impl.launches:
            w = la.when
            if w is not None and w.var in cands:
                for edge in (w.min, w.max):
                    if edge is not None:
                        cands[w.var] |= {e for e in (edge - 1, edge, edge + 1) if 1 <= e <= m.vars[w.var].max}
    rng = random.Random(name)
    combos = [dict(zip(reads, vals, strict=True)) for vals in itertools.product(*(sorted(cands[v]) for v in reads))]
    return combos if len(combos) <= 24 else rng.sample(combos, 24)


def _fake_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    def collective(entry: str, comm: nccl.Communicator, send: int, recv: int, n: int, stream: Any) -> Any:
        return lambda: _COLLECTIVES.append((entry, comm.group, comm.size, send, recv, n, stream))

    monkeypatch.setattr(program.nccl, "collective", collective)
    def encode(*args: Any) -> bytes:
        return hashlib.sha512(repr(args).encode()).digest() * 2

    monkeypatch.setattr(program.drv, "tensormap_encode_tiled", encode)
    monkeypatch.setattr(program.drv, "launch_config", lambda *a: ("config", *a))


def _check(doc: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[int, int]:
    """Compares every program at every key; returns (keys compared, keys the template staged)."""
    _fake_driver(monkeypatch)
    m = parse_manifest(doc if isinstance(doc, bytes) else json.dumps(doc))
    compared = staged = 0
    plain_compile = program.compile_program
    for name, prog in m.programs.items():
        if prog.derive:
            continue
        res = _resources(m)
        template = ProgramTemplate(res, name)
        assert template.fits(res)
        for key in _keys(m, name):
            plain = _outcome(lambda: compile_program(res, name, key), res)  # noqa: B023
            fast = _outcome(lambda: template.compile(res, key), res)  # noqa: B023
            assert fast == plain, (name, key)
            compared += 1
            if plain[0] == "ok":
                with monkeypatch.context() as mp:
                    mp.setattr(program, "compile_program", _no_plain)
                    again = _outcome(lambda: template.compile(res, key), res)  # noqa: B023
                assert again == plain, (name, key)
                staged += 1
        assert program.compile_program is plain_compile
    return compared, staged


def _no_plain(*_args: Any) -> Any:
    raise AssertionError("the template fell back to the plain compile")


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.json")), ids=lambda p: p.stem)
def test_examples_compile_identically_at_every_key(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    compared, staged = _check(path.read_bytes(), monkeypatch)
    assert compared > 0 and staged == compared


def moving_features() -> Any:
    """`features` with geometry, shared memory, a buffer offset, pack fields, a tensormap and
    scalar args that read a var."""
    doc = manifests.features(SHA)
    doc["vars"] = {"n": {"max": 4096}}
    ops = doc["ops"]
    rev = ops["reverse"]["impl"]["launches"][0]
    rev["grid"], rev["shared_mem"] = [{"ceil_div": ["n", 256]}, 1, 1], {"mul": ["n", 16]}
    ops["reverse"]["params"] = ["in buffer<f32>", "out buffer<f32>", "i32", "f32"]
    ops["cluster"]["impl"]["launches"][0]["grid"] = [{"mul": [{"ceil_div": ["n", 1024]}, 4]}, 1, 1]
    tma = ops["tma"]["impl"]["launches"][0]
    fields = tma["args"][0]["pack"]["fields"]
    fields[0]["tensormap"]["dims"] = [32, {"ceil_div": ["n", 64]}]
    fields += [{"at": 132, "var": "n"}, {"at": 136, "expr": {"add": ["n", 3]}, "width": 8}, {"at": 144, "param": 1}]
    calls = doc["programs"]["main"]["calls"]
    calls[0]["args"] = [{"buf": "sx"}, {"buf": "sy", "offset": {"mul": [{"ceil_div": ["n", 8]}, 4]}}, {"var": "n"}, {"expr": {"add": ["n", 1]}}]
    return doc


TEST_MANIFESTS: dict[str, Any] = {
    "moving_features": moving_features(),
    "basic": manifests.basic(SHA), "basic_i64": manifests.basic(SHA, "i64"), "features": manifests.features(SHA),
    "chain": manifests.chain(SHA, 40), "gemm": manifests.gemm(), "fp8_gemm": manifests.fp8_gemm(256, 512), "same_name": manifests.same_name(SHA, 2),
    "pooled": manifests.pooled(SHA), "serving": manifests.serving(), "remapping": manifests.remapping(SHA),
    "two_paged": manifests.two_paged(SHA), "collectives": peer_manifests.collectives(2),
    "peer_gather": peer_manifests.peer_gather(SHA, 2),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(TEST_MANIFESTS))
def test_runtime_manifests_compile_identically(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    compared, staged = _check(TEST_MANIFESTS[name], monkeypatch)
    assert staged == compared > 0


def test_when_packs_and_tensormaps_are_staged_per_key(monkeypatch: pytest.MonkeyPatch) -> None:
    compared, staged = _check(moving_features(), monkeypatch)
    assert staged == compared > 3
    m = parse_manifest(json.dumps(manifests.basic(SHA)))
    res = _resources(m)
    picks = [ProgramTemplate(res, "pick").compile(res, {"n": n})[0].run.record.func for n in (16, 17)]  # type: ignore[attr-defined]
    assert picks == ["pick#0", "pick#1"]


def test_a_template_fits_only_the_resources_it_was_built_from() -> None:
    m = parse_manifest(json.dumps(manifests.basic(SHA)))
    res = _resources(m)
    template = ProgramTemplate(res, "main")
    moved = Resources(m, {**res.buffers, "x": (0x5550000, res.buffers["x"][1])}, res.states, res.scratch, res.funcs,
                      res.blas, res.ranks, res.stream)  # fmt: skip
    assert not template.fits(moved)
    steps = ProgramTemplate(moved, "main").compile(moved, {"n": 64})
    assert steps[0].run.record.args.slot(0) == (0x5550000).to_bytes(8, "little")  # type: ignore[attr-defined]


def test_fast_prefill_templates_every_kernel_and_describes_each_plan_once() -> None:
    m = parse_manifest((EXAMPLES / "qwen3-4b-fast.json").read_bytes())
    res = _resources(m)
    kernels = sum(isinstance(la, KernelLaunch) for c in m.programs["prefill"].calls for la in m.ops[c.op].impl.launches)
    template = ProgramTemplate(res, "prefill")
    assert isinstance(res.blas, FakeBlas)
    for tokens in (200, 201):
        res.blas.described.clear()
        steps = template.compile(res, {"tokens": tokens})
        assert sum(hasattr(s.run, "record") for s in steps) == kernels > 0
        gemms = [s for s in steps if s.algo is not None]
        shapes = {shape for shape, _algo, _scales in res.blas.plans if shape.m == tokens}
        assert len(gemms) > len(shapes) == len(res.blas.described) > 0


def _config_fields(cfg: Any) -> tuple[Any, ...]:
    attrs = [(int(a.id), a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z,
              a.value.programmaticStreamSerializationAllowed) for a in cfg.attrs]  # fmt: skip
    return (cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ, cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ,
            cfg.sharedMemBytes, int(cfg.numAttrs), attrs)  # fmt: skip


def test_launch_configs_share_cached_attributes_but_no_memory() -> None:
    cu = program.drv.cu
    stream = cu.CUstream(0)
    a = program.drv.launch_config((8, 1, 1), (32, 1, 1), 0, stream, (4, 1, 1), True)
    before = _config_fields(a)
    b = program.drv.launch_config((16, 2, 1), (64, 1, 1), 4096, stream, [4, 1, 1], True)
    c = program.drv.launch_config((2, 1, 1), (32, 1, 1), 0, stream, (2, 1, 1), False)
    d = program.drv.launch_config((2, 1, 1), (32, 1, 1), 0, stream, None, True)
    cluster, pdl = int(cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION), int(
        cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
    assert _config_fields(a) == before
    assert before[:8] == (8, 1, 1, 32, 1, 1, 0, 2) and [x[0] for x in before[8]] == [cluster, pdl]
    assert before[8][0][1:4] == (4, 1, 1) and before[8][1][4] == 1
    assert _config_fields(b)[:8] == (16, 2, 1, 64, 1, 1, 4096, 2) and _config_fields(b)[8] == before[8]
    assert _config_fields(c)[7] == 1 and _config_fields(c)[8][0][:4] == (cluster, 2, 1, 1)
    assert _config_fields(d)[7] == 1 and _config_fields(d)[8][0][0] == pdl


@pytest.mark.parametrize("what", ["no buffer", "no blas"])
def test_errors_are_the_plain_compile_errors(what: str, monkeypatch: pytest.MonkeyPatch) -> None:
    m = parse_manifest(json.dumps(manifests.gemm() if what == "no blas" else manifests.basic(SHA)))
    full = _resources(m)
    if what == "no blas":
        res = Resources(m, full.buffers, full.states, full.scratch, full.funcs, None, {}, 0)
        name, key = "plain", {"m": 4}
    else:
        res = Resources(m, {k: v for k, v in full.buffers.items() if k != "y"}, {}, full.scratch, full.funcs, None, {}, 0)
        name, key = "main", {"n": 100}
    plain = _outcome(lambda: compile_program(res, name, key), full)
    assert plain[0] == "error" and plain[1] == "ManifestUnsupportedError"
    assert _outcome(lambda: ProgramTemplate(res, name).compile(res, key), full) == plain
