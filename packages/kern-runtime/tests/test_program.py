"""Program compilation on the host: every launch's staged argument bytes, `when` selection,
packs (with a stand-in tensormap encoder) and GEMM shapes, without a GPU."""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest

from kern_manifest import parse_manifest
from kern_runtime import ManifestUnsupportedError
from kern_runtime import _program as program
from kern_runtime._program import Resources, compile_program, gemm_shape

from .helpers import manifests

SHA = "ab" * 32


def _resources(doc: dict[str, Any], **extra: Any) -> Resources:
    m = parse_manifest(json.dumps(doc))
    env = m.var_max
    buffers = {n: (0x10000 * (i + 1), b.nbytes(env)) for i, (n, b) in enumerate(m.buffers.items())}
    funcs = {(op, i): f"{op}#{i}" for op, o in m.ops.items() for i in range(len(o.impl.launches))}
    return Resources(m, buffers, extra.get("states", {}), {op: {} for op in m.ops}, funcs, None, {}, "stream")


def _slots(step: program.Step) -> list[bytes]:
    rec = step.run.record  # type: ignore[attr-defined]
    return [rec.args.slot(i) for i in range(len(rec.args.ptrs))]


def _ptr(v: int) -> bytes:
    return v.to_bytes(8, "little")


def test_main_program_stages_pointers_scalars_and_grid() -> None:
    res = _resources(manifests.basic(SHA))
    steps = compile_program(res, "main", {"n": 1000})
    assert [s.label for s in steps] == ["axpb", "fill"]
    x, y, o64 = res.buffers["x"][0], res.buffers["y"][0], res.buffers["o64"][0]
    assert _slots(steps[0]) == [_ptr(x), _ptr(y), struct.pack("<f", 3.0) + bytes(4), struct.pack("<f", 0.5) + bytes(4),
                                struct.pack("<i", 1000) + bytes(4)]  # fmt: skip
    assert _slots(steps[1]) == [_ptr(o64), struct.pack("<q", -(1 << 40)), b"\x07" + bytes(7), struct.pack("<i", 1000) + bytes(4)]
    rec = steps[0].run.record  # type: ignore[attr-defined]
    assert (rec.grid, rec.block, rec.smem, rec.func, rec.config) == ((8, 1, 1), (128, 1, 1), 0, "axpb#0", None)


@pytest.mark.parametrize(("n", "launch", "scale"), [(16, 0, 10.0), (17, 1, 3.0)])
def test_when_ranges_pick_one_launch(n: int, launch: int, scale: float) -> None:
    steps = compile_program(_resources(manifests.basic(SHA)), "pick", {"n": n})
    assert len(steps) == 1 and steps[0].run.record.func == f"pick#{launch}"  # type: ignore[attr-defined]
    assert _slots(steps[0])[2][:4] == struct.pack("<f", scale)


def test_state_offsets_and_launch_arg_remapping() -> None:
    res = _resources(manifests.pooled(SHA), states={"kv": (0x7000000, 1 << 26), "ssm": (0x9000000, 1 << 26)})
    kv, ssm = compile_program(res, "stamp", {})
    assert _slots(kv) == [_ptr(0x7000000 + 32768), struct.pack("<q", 7), b"\x01" + bytes(7), struct.pack("<i", 128) + bytes(4)]
    assert _slots(ssm)[0] == _ptr(0x9000000 + (1 << 19))


def test_pack_with_tensormap_and_cluster_config(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[Any, ...]] = []

    def encode(*args: Any) -> bytes:
        seen.append(args)
        return bytes(range(128))

    monkeypatch.setattr(program.drv, "tensormap_encode_tiled", encode)
    monkeypatch.setattr(program.drv, "launch_config", lambda *a: ("config", *a))
    res = _resources(manifests.features(SHA))
    _reverse, cluster, tma = compile_program(res, "main", {})
    assert _reverse.run.record.smem == 65536  # type: ignore[attr-defined]
    assert cluster.run.record.config == ("config", (8, 1, 1), (32, 1, 1), 0, "stream", (4, 1, 1), True)  # type: ignore[attr-defined]
    tin = res.buffers["tin"][0]
    assert seen == [("f32", tin, [32, 64], [128], [32, 8], 0, 0, False)]
    pack = _slots(tma)[0]
    assert pack == bytes(range(128)) + struct.pack("<i", 5) + bytes(60)


def test_gemm_operands_take_an_fp8_gemms_scales_and_sizes_after_them() -> None:
    buf = [program.Value(ptr=p, room=4096) for p in (0x1000, 0x2000, 0x3000)]
    scales = [program.Value(ptr=0x4000, room=4), program.Value(ptr=0x5000, room=4)]
    sizes = [program.Value(scalar=v) for v in (7, 256, 512)]
    ptrs, shape, got = program.gemm_operands("extern:cublaslt_fp8_tn", [*buf, *scales, *sizes], "here")
    assert (ptrs, got) == ((0x1000, 0x2000, 0x3000), (0x4000, 0x5000))
    assert (shape.m, shape.n, shape.k, shape.fp8) == (7, 256, 512, True)
    ptrs, shape, got = program.gemm_operands("extern:cublaslt_bf16_tn", [*buf, *sizes], "here")
    assert got is None and (shape.m, shape.n, shape.k, shape.fp8) == (7, 256, 512, False)
    short = [scales[0], program.Value(ptr=0x5000, room=2)]
    with pytest.raises(ManifestUnsupportedError, match=r"^here: extern:cublaslt_fp8_tn takes its A and W scales as one-element f32 buffers$"):
        program.gemm_operands("extern:cublaslt_fp8_tn", [*buf, *short, *sizes], "here")
    with pytest.raises(ManifestUnsupportedError, match="one-element f32 buffers"):
        program.gemm_operands("extern:cublaslt_fp8_tn", [*buf, program.Value(scalar=1), scales[1], *sizes], "here")


def test_gemm_shapes_map_strides_and_kinds() -> None:
    assert gemm_shape("extern:cublaslt_bf16_tn", [7, 256, 512]) == program.GemmShape(7, 256, 512, 256, 512, False, False)
    assert gemm_shape("extern:cublaslt_bf16_tn_acc", [7, 256, 512, 384, 640]).accumulate
    assert gemm_shape("extern:cublas_bf16_tn_f32", [1, 2, 3]).out_f32
    fp8 = gemm_shape("extern:cublaslt_fp8_tn", [7, 256, 512, 384, 640])
    assert fp8 == program.GemmShape(7, 256, 512, 384, 512, False, False, True)  # no lda: A is packed
    assert gemm_shape("extern:cublaslt_fp8_tn_f32", [1, 2, 16]).out_f32
    with pytest.raises(ManifestUnsupportedError, match="extern:nope is not supported by this runtime"):
        gemm_shape("extern:nope", [1, 2, 3])
    with pytest.raises(ManifestUnsupportedError, match="not available"):
        compile_program(_resources(manifests.gemm()), "plain", {"m": 4})


class _PlanBlas:
    """Records the shapes planned; describe and matmul as a stand-in BLAS."""

    def __init__(self) -> None:
        self.shapes: list[Any] = []

    def plan(self, shape: Any, algo: Any, scales: Any = None) -> Any:
        self.shapes.append(shape)
        return ("plan", shape)

    def describe(self, plan: Any) -> dict[str, int]:
        return {}

    def matmul(self, *args: Any) -> None:
        raise AssertionError("not run on the host")


def test_an_extern_gemm_reads_its_ops_scratch() -> None:
    """The FP8 prefill op's form: a kernel writes the bf16 weight into the op's scratch, then the
    GEMM reads it as W (plain compile and template alike)."""
    doc = manifests.gemm()
    write = {"module": "m", "entry": "fill_w", "grid": [1, 1, 1], "block": [32, 1, 1],
             "params": ["in buffer<bf16>", "out buffer<bf16>"], "args": [{"param": 1}, {"scratch": "w"}]}
    gemm = {"entry": "extern:cublaslt_bf16_tn",
            "args": [{"param": 0}, {"scratch": "w"}, {"param": 2}, {"param": 3}, {"i32": 256}, {"i32": 512}]}
    doc["modules"] = {"m": {"sha256": SHA, "source": "m.cubin"}}
    doc["ops"]["scratch_gemm"] = {"params": ["in buffer<bf16>", "in buffer<bf16>", "out buffer<bf16>", "i32"],
                                  "impl": {"scratch": {"w": {"dtype": "bf16", "shape": [256, 512]}},
                                           "launches": [write, gemm]}}
    doc["programs"]["scratch"] = {"calls": [{"op": "scratch_gemm", "args": [
        {"buf": "a"}, {"buf": "w"}, {"buf": "c"}, {"var": "m"}]}]}
    base = _resources(doc)
    blas = _PlanBlas()
    res = Resources(base.manifest, base.buffers, {}, {**base.scratch, "scratch_gemm": {"w": 0x5550000}}, base.funcs,
                    blas, {}, 7)  # type: ignore[arg-type]
    for compiled in (compile_program(res, "scratch", {"m": 9}),
                     program.ProgramTemplate(res, "scratch").compile(res, {"m": 9})):
        fill, mm = compiled
        assert _slots(fill)[1] == _ptr(0x5550000)
        run = mm.run.__self__  # type: ignore[attr-defined]
        assert (run.a, run.w, run.c) == (res.buffers["a"][0], 0x5550000, res.buffers["c"][0])
        assert (run.shape.m, run.shape.n, run.shape.k) == (9, 256, 512)
