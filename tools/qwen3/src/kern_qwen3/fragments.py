"""Small JSON builders of manifest fragments (args, calls, launches), for the generator and for
rewrite passes written outside it (the lab's)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["BF16_IN", "BF16_IO", "BF16_OUT", "STEP_CARRIES", "TOKENS", "Json", "buf", "call", "f32", "gemm_of", "i32",
           "i64", "kernel"]

Json = dict[str, Any]

BF16_IN, BF16_OUT, BF16_IO = "in buffer<bf16>", "out buffer<bf16>", "inout buffer<bf16>"

# NOTE: device-fed decode reads these carries instead of the host inputs.
STEP_CARRIES: dict[str, tuple[str, str]] = {
    "ids": ("step_ids", "i64"),
    "positions": ("step_pos", "i64"),
    "slots": ("step_slot", "i64"),
    "seq_len": ("step_len", "i32"),
}


def buf(name: str, offset: int = 0) -> Json:
    return {"buf": name, "offset": offset} if offset else {"buf": name}


def i32(v: int) -> Json:
    return {"i32": v}


def i64(v: int) -> Json:
    return {"i64": v}


def f32(v: float) -> Json:
    return {"f32": v}


TOKENS: Json = {"var": "tokens"}


def gemm_of(label: str) -> str:
    """The GEMM a call label names (`l3.gate_up` -> `gate_up`)."""
    return label.rsplit(".", 1)[-1]


def call(label: str, op: str, *args: Json) -> Json:
    return {"label": label, "op": op, "args": list(args)}


def kernel(
    mods: Mapping[str, str], entry: str, grid: Sequence[Any], block: int, **extra: Any
) -> Json:
    return {"module": mods[entry], "entry": entry, "block": [block, 1, 1], "grid": list(grid), **extra}


