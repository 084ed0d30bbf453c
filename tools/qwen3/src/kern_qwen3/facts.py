"""Facts read back from a manifest (benchmarks and tests use them)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["decode_gemm_shapes", "decode_weight_bytes"]

_DTYPE_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "i32": 4, "u32": 4, "i64": 8, "u64": 8, "i8": 1, "u8": 1, "fp8e4m3": 1}


def _literal(arg: Mapping[str, Any]) -> int:
    (value,) = arg.values()
    return int(value)


def decode_gemm_shapes(manifest: Mapping[str, Any]) -> list[tuple[str, int, int, int]]:
    """The (weight buffer, m, n, k) of every GEMM call in the decode program, in order (m = 1)."""
    out: list[tuple[str, int, int, int]] = []
    for call in manifest["programs"]["decode"]["calls"]:
        if call["op"] == "gemm":
            _a, w, _c, _m, n, k = call["args"]
            out.append((w["buf"], 1, _literal(n), _literal(k)))
        elif call["op"].startswith("gemv"):
            n, k = manifest["buffers"][call["args"][1]["buf"]]["shape"]
            out.append((call["args"][1]["buf"], 1, int(n), int(k)))
    return out


def decode_weight_bytes(manifest: Mapping[str, Any]) -> int:
    """Bytes of the weight buffers one decode step reads whole: every weight any call but the
    embedding gather reads (a tied embedding counts once, as the lm_head)."""
    buffers = manifest["buffers"]
    read_whole = {
        a["buf"]
        for c in manifest["programs"]["decode"]["calls"]
        if c["op"] != "embed"
        for a in c["args"]
        if "buf" in a and buffers[a["buf"]]["kind"] == "weight"
    }
    return sum(_buffer_bytes(buffers[name]) for name in read_whole)


def _buffer_bytes(buffer: Mapping[str, Any]) -> int:
    n = _DTYPE_BYTES[buffer["dtype"]]
    for dim in buffer["shape"]:
        n *= int(dim)
    return n
