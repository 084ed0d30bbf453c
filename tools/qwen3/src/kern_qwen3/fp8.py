"""FP8 weights: the rewrite that makes a bf16 manifest bind a Qwen FP8 checkpoint as it is
downloaded (`weights="qwen-fp8"`).

Every linear weight of the layers (qkv, o, gate_up, down) becomes a float8 e4m3 buffer with a
float32 scale buffer beside it (`<weight>.scale`, [n / 128, ceil(k / 128)]) bound to the
checkpoint's `weight_scale_inv` tensors, concatenated as the weights are. Activations stay bf16
(weights-only FP8); the embedding, the norms and lm_head stay as the checkpoint has them (bf16).

- Decode (one row): each of those GEMMs is `kern_gemv_e4m3_b128` (fp8.cu), which reads the e4m3
  bytes and their block scales: half the bytes of the bf16 step's weights.
- Prefill and the head program's rows: each is one op of two launches: `kern_dequant_e4m3_b128`
  writes the bf16 weight into the op's scratch, then cuBLASLt's bf16 GEMM runs over it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal

from kern_qwen3.errors import GenError
from kern_qwen3.fp8_checkpoint import FP8_BLOCK
from kern_qwen3.fragments import BF16_IN, BF16_OUT, Json, buf, call, gemm_of, i32, kernel
from kern_qwen3.shape import Qwen3Shape

__all__ = [
    "FP8_ENTRIES",
    "FP8_GEMMS",
    "WEIGHT_FORMATS",
    "WeightFormat",
    "apply_fp8",
    "check_fp8_shape",
    "fp8_gemm_shapes",
]

WeightFormat = Literal["bf16", "qwen-fp8"]
WEIGHT_FORMATS: tuple[WeightFormat, ...] = ("bf16", "qwen-fp8")
FP8_GEMMS: Final = ("qkv", "o", "gate_up", "down")
"""The GEMMs over e4m3 weights: the layers' linears (lm_head stays bf16)."""
FP8_ENTRIES: Final = ("kern_gemv_e4m3_b128", "kern_dequant_e4m3_b128")
GEMV_COLUMNS: Final = 4
"""Columns of one kern_gemv_e4m3_b128 block (a warp each)."""
DEQUANT_THREADS: Final = 256
"""Threads of a kern_dequant_e4m3_b128 block (16 weights each)."""
FP8_IN: Final = "in buffer<fp8e4m3>"
F32_IN: Final = "in buffer<f32>"


def fp8_gemm_shapes(s: Qwen3Shape) -> dict[str, tuple[tuple[int, ...], int]]:
    """GEMM -> (the row counts of the checkpoint tensors its weight concatenates, k)."""
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    return {"qkv": ((q, kv, kv), s.hidden), "o": ((s.hidden,), q), "gate_up": ((s.inter, s.inter), s.hidden),
            "down": ((s.hidden,), s.inter)}


def check_fp8_shape(s: Qwen3Shape) -> None:
    """The shape's linears fit block-scaled e4m3: every concatenated tensor's rows a multiple of 128
    (so the scales concatenate as the weights do) and k a multiple of 16 (the kernels' 16-byte pieces).

    Raises:
        GenError: one that does not, named.
    """
    for gemm, (parts, k) in fp8_gemm_shapes(s).items():
        bad = [n for n in parts if n % FP8_BLOCK]
        if bad or k % 16:
            raise GenError(f"{gemm}: FP8 weights need each tensor's rows a multiple of {FP8_BLOCK} and k a "
                           f"multiple of 16, got rows {list(parts)} and k {k}")


def _scale_buffer(weight: Json, n: int, k: int) -> Json:
    tensors = [seg["tensor"] for seg in weight["bind"]]
    return {"dtype": "f32", "shape": [n // FP8_BLOCK, -(-k // FP8_BLOCK)], "kind": "weight",
            "bind": [{"tensor": f"{t}_scale_inv"} for t in tensors]}


def _weights(manifest: Json, s: Qwen3Shape) -> dict[str, tuple[int, int]]:
    """Retypes the layers' linear weights to e4m3 and adds their scale buffers (in place); returns
    weight buffer -> (n, k)."""
    buffers = manifest["buffers"]
    out: dict[str, tuple[int, int]] = {}
    rebuilt: Json = {}
    for name, spec in buffers.items():
        rebuilt[name] = spec
        gemm = gemm_of(name)
        if not name.startswith("l") or gemm not in FP8_GEMMS or spec.get("kind") != "weight":
            continue
        n, k = (int(d) for d in spec["shape"])
        rebuilt[name] = {**spec, "dtype": "fp8e4m3"}
        rebuilt[f"{name}.scale"] = _scale_buffer(spec, n, k)
        out[name] = (n, k)
    manifest["buffers"] = rebuilt
    return out


def _gemv_op(mods: Mapping[str, str], n: int, k: int) -> Json:
    la = kernel(mods, "kern_gemv_e4m3_b128", [-(-n // GEMV_COLUMNS), 1, 1], 32 * GEMV_COLUMNS,
                params=[BF16_IN, FP8_IN, F32_IN, BF16_OUT, "i32", "i32", "i32", "i32"],
                args=[{"param": 0}, {"param": 1}, {"param": 2}, {"param": 3}, i32(1), i32(n), i32(k), i32(n)])
    return {"params": [BF16_IN, FP8_IN, F32_IN, BF16_OUT], "impl": {"launches": [la]}}


def _gemm_op(mods: Mapping[str, str], n: int, k: int) -> Json:
    dequant = kernel(mods, "kern_dequant_e4m3_b128", [-(-(n * k // 16) // DEQUANT_THREADS), 1, 1], DEQUANT_THREADS,
                     params=[FP8_IN, F32_IN, BF16_OUT, "i32", "i32"],
                     args=[{"param": 1}, {"param": 2}, {"scratch": "w"}, i32(n), i32(k)])
    gemm = {"entry": "extern:cublaslt_bf16_tn",
            "args": [{"param": 0}, {"scratch": "w"}, {"param": 3}, {"param": 4}, i32(n), i32(k)]}
    return {"params": [BF16_IN, FP8_IN, F32_IN, BF16_OUT, "i32"],
            "impl": {"scratch": {"w": {"dtype": "bf16", "shape": [n, k]}}, "launches": [dequant, gemm]}}


def _rewrite(c: Json, shapes: Mapping[str, tuple[int, int]], one_row: bool, ops: Json,
             mods: Mapping[str, str]) -> Json:
    if c["op"] != "gemm" or c["args"][1]["buf"] not in shapes:
        if c["op"].startswith("gemv") and c["args"][1]["buf"] in shapes:
            raise GenError(f"{c['label']}: a bf16 GEMV over an FP8 weight; leave {gemm_of(c['label'])} to the "
                           "FP8 GEMV (drop it from --gemv)")
        return c
    x, w, y, rows, *_ = c["args"]
    n, k = shapes[w["buf"]]
    scale = buf(f"{w['buf']}.scale")
    if one_row:
        op = f"gemv_e4m3_{n}x{k}"
        ops.setdefault(op, _gemv_op(mods, n, k))
        return call(c["label"], op, x, w, scale, y)
    op = f"gemm_e4m3_{n}x{k}"
    ops.setdefault(op, _gemm_op(mods, n, k))
    return call(c["label"], op, x, w, scale, y, rows)


def apply_fp8(manifest: Json, s: Qwen3Shape, mods: Mapping[str, str]) -> None:
    """The rewrite of the module's docstring (in place); `mods` maps kernel entry -> module.

    Raises:
        GenError: the shape does not fit block-scaled e4m3, or a GEMV pick reads an FP8 weight.
    """
    check_fp8_shape(s)
    shapes = _weights(manifest, s)
    ops = manifest["ops"]
    for name, program in manifest["programs"].items():
        one_row = name == "decode"  # NOTE: the one-row step; prefill and the head run chunk rows
        program["calls"] = [_rewrite(c, shapes, one_row, ops, mods) for c in program["calls"]]
