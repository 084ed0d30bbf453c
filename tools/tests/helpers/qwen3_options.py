"""Tests' shorthand for a kern_qwen3 manifest from the generator's flags as keywords."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import kern_qwen3 as gen


def plan_of(*, chunk: int = gen.DEFAULT_CHUNK, feed: str = "host", precision: str = "bf16",
            gemv: Sequence[str] = (), fuse: bool = False, pdl: bool = False, fold_norm: bool = False,
            defer_norm: bool = False, gemv_pick: Mapping[str, str] | None = None, rows: int = 0,
            gemm_algos: str | None = None, weights: str = "bf16") -> gen.Plan:
    """The Plan of `kern-qwen3`'s flags (`gemv_pick` overrides GEMV_PICK per GEMM)."""
    picks = {**gen.GEMV_PICK, **(gemv_pick or {})}
    passes = gen.plan_passes(fold_norm=fold_norm, defer_norm=defer_norm, pdl=pdl, gemm_algos=gemm_algos)
    return gen.Plan(chunk=chunk, feed=feed, precision=precision, gemv=tuple(gemv), fuse=fuse,  # type: ignore[arg-type]
                    picks=picks, passes=passes, rows=rows, weights=weights)  # type: ignore[arg-type]


def generate(shape: gen.Qwen3Shape, modules: Mapping[str, str], entries: Mapping[str, str], *, model: str,
             **options: Any) -> dict[str, Any]:
    """kern_qwen3.generate with the plan of `options` (plan_of's keywords)."""
    return gen.generate(shape, modules, entries, model=model, plan=plan_of(**options))


FAKE_ENTRIES = {e: ("qwen3_attn" if "attn" in e else "qwen3_core")
                for e in (*gen.ENTRIES, *gen.DEVICE_FEED_ENTRIES, *gen.GEMV_ENTRIES, *gen.FUSED_ENTRIES,
                          *gen.DEFER_ENTRIES.values(), *gen.ROWS_ENTRIES,
                          *gen.F32_ENTRIES, *gen.FP8_ENTRIES)}
FAKE_HASHES = {"qwen3_core": "a" * 64, "qwen3_attn": "b" * 64}


def manifest(config: Mapping[str, Any], **kw: Any) -> dict[str, Any]:
    """The manifest of `config` over FAKE_ENTRIES / FAKE_HASHES (plan_of's keywords)."""
    return generate(gen.shape_from_config(config), FAKE_HASHES, FAKE_ENTRIES, model="t", **kw)


def verify_manifest(manifest: dict[str, Any]) -> None:
    """kern_manifest's parser and verifier accept `manifest`."""
    from kern_manifest import parse_manifest, verify

    verify(parse_manifest(json.dumps(manifest)))


_SIG = re.compile(r"__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(kern_\w+)\s*\(([^)]*)\)")
_C_TYPES = {"bf16": "bf16", "__nv_bfloat16": "bf16", "int64_t": "i64", "int": "i32", "int32_t": "i32",
            "float": "f32", "uint8_t": "fp8e4m3"}


def c_params(src: Path) -> dict[str, list[tuple[str, bool, bool]]]:
    """entry -> [(dtype, is_pointer, is_const)] parsed from the .cu sources."""
    out: dict[str, list[tuple[str, bool, bool]]] = {}
    for path in src.glob("*.cu"):
        for entry, params in _SIG.findall(path.read_text()):
            parsed = []
            for p in (p.strip() for p in params.split(",") if p.strip()):
                words = p.replace("*", " * ").replace("__restrict__", "").split()
                base = next(w for w in words if w in _C_TYPES)
                parsed.append((_C_TYPES[base], "*" in words, "const" in words))
            out[entry] = parsed
    return out


def assert_abi(ops: dict[str, Any], sigs: dict[str, list[tuple[str, bool, bool]]]) -> None:
    for name, op in ops.items():
        for launch in op["impl"]["launches"]:
            if launch["entry"].startswith("extern:"):
                continue
            declared = launch.get("params", op["params"])
            actual = sigs[launch["entry"]]
            assert len(declared) == len(actual), (name, launch["entry"])
            for text, (ctype, ptr, const) in zip(declared, actual, strict=True):
                where = (name, launch["entry"], text, ctype)
                if " " in text:  # buffer or state
                    direction, kind = text.split(" ", 1)
                    assert ptr and const == (direction == "in"), where
                    if kind.startswith("buffer<"):
                        assert kind == f"buffer<{ctype}>", where
                else:
                    assert not ptr and text == ctype, where
