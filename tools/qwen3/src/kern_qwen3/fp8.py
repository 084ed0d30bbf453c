"""FP8 weights: the rewrite that makes a bf16 manifest run its layers' linears over e4m3 weights
and their float32 scales, from one of three checkpoints:

- `weights="qwen-fp8"`: a Qwen FP8 checkpoint as it is downloaded. Every linear weight of the
  layers (qkv, o, gate_up, down) becomes a float8 e4m3 buffer with a float32 scale buffer beside
  it (`<weight>.scale`, [n / 128, ceil(k / 128)]) bound to the checkpoint's `weight_scale_inv`
  tensors, concatenated as the weights are.
- `weights="fp8-dynamic"`: a compressed-tensors FP8-dynamic checkpoint (llm-compressor's
  FP8_DYNAMIC) as it is downloaded: the same e4m3 weights with one float32 scale per output row
  (`weight_scale` [n, 1], scale buffers [n, 1]), run by the `_row` forms of the kernels. Its
  activations' per-token dynamic quantisation is not applied: activations stay bf16.
- `weights="bf16-to-fp8"`: a bf16 checkpoint, quantised on the device at load. The same e4m3 and
  scale buffers are unbound weights that one `derive` program per layer (`quantise.l<i>`) writes
  with `kern_quant_e4m3_b128` from the bf16 tensors, bound to `<weight>.bf16` source buffers that
  live only while the layer's program runs: the bytes Qwen's quantisation gives
  (`kern_qwen3.quantize_blocks`), so the manifest computes what the `"qwen-fp8"` one computes over
  the FP8 checkpoint of the same weights.

Activations stay bf16 (weights-only FP8); the embedding, the norms and lm_head stay bf16.

- Decode and the head program (one row): each of those GEMMs is `kern_gemv_e4m3_b128` (fp8.cu; its
  `_row` form for per-row scales), which reads the e4m3 bytes and their scales: about half the
  bytes of the bf16 step's weights.
- Prefill chunks: each is one op of two launches: `kern_dequant_e4m3_b128` (or `_row`) writes the
  bf16 weight into the op's scratch, then cuBLASLt's bf16 GEMM runs over it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from kern_qwen3.errors import GenError
from kern_qwen3.fp8_checkpoint import FP8_BLOCK
from kern_qwen3.fragments import BF16_IN, BF16_OUT, Json, buf, call, gemm_of, i32, kernel
from kern_qwen3.shape import Qwen3Shape

__all__ = [
    "FP8_ENTRIES",
    "FP8_FORMS",
    "FP8_GEMMS",
    "QUANT_ENTRY",
    "WEIGHT_FORMATS",
    "Fp8Form",
    "WeightFormat",
    "apply_fp8",
    "check_fp8_shape",
    "fp8_gemm_shapes",
]

WeightFormat = Literal["bf16", "qwen-fp8", "fp8-dynamic", "bf16-to-fp8"]
WEIGHT_FORMATS: tuple[WeightFormat, ...] = ("bf16", "qwen-fp8", "fp8-dynamic", "bf16-to-fp8")
FP8_GEMMS: Final = ("qkv", "o", "gate_up", "down")
"""The GEMMs over e4m3 weights: the layers' linears (lm_head stays bf16)."""
QUANT_ENTRY: Final = "kern_quant_e4m3_b128"
"""The load-time quantiser of `"bf16-to-fp8"`."""
QUANT_THREADS: Final = 256
GEMV_COLUMNS: Final = 4
"""Columns of one FP8 GEMV block (a warp each)."""
DEQUANT_THREADS: Final = 256
"""Threads of a dequantiser block (16 weights each)."""
FP8_IN: Final = "in buffer<fp8e4m3>"
F32_IN: Final = "in buffer<f32>"


@dataclass(frozen=True, slots=True)
class Fp8Form:
    """One FP8 weight format: its kernels and its scales.

    Attributes:
        gemv: the decode GEMV entry. dequant: the prefill dequantiser's entry.
        suffix: the op names' scale-layout part ("" for blocks, "_row").
        scales: what a weight's scale tensor name adds to the weight's (`_scale_inv`, `_scale`).
        per_row: one scale per output row ([n, 1]) instead of one per 128 x 128 block.
        quantise: the e4m3 bytes and scales are computed at load from a bf16 checkpoint.
    """

    gemv: str
    dequant: str
    suffix: str
    scales: str
    per_row: bool = False
    quantise: bool = False

    @property
    def entries(self) -> tuple[str, ...]:
        """The kernel entries a manifest of this form launches."""
        return (self.gemv, self.dequant, *((QUANT_ENTRY,) if self.quantise else ()))


_BLOCKS = Fp8Form("kern_gemv_e4m3_b128", "kern_dequant_e4m3_b128", "", "_scale_inv")
FP8_FORMS: Final[Mapping[str, Fp8Form]] = {
    "qwen-fp8": _BLOCKS,
    "fp8-dynamic": Fp8Form("kern_gemv_e4m3_row", "kern_dequant_e4m3_row", "_row", "_scale", per_row=True),
    "bf16-to-fp8": Fp8Form(_BLOCKS.gemv, _BLOCKS.dequant, "", _BLOCKS.scales, quantise=True),
}
"""Weight format (other than bf16) -> its form."""
FP8_ENTRIES: Final = tuple(dict.fromkeys(e for f in FP8_FORMS.values() for e in f.entries))
"""Every entry an FP8 manifest may launch."""


def fp8_gemm_shapes(s: Qwen3Shape) -> dict[str, tuple[tuple[int, ...], int]]:
    """GEMM -> (the row counts of the checkpoint tensors its weight concatenates, k)."""
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    return {"qkv": ((q, kv, kv), s.hidden), "o": ((s.hidden,), q), "gate_up": ((s.inter, s.inter), s.hidden),
            "down": ((s.hidden,), s.inter)}


def check_fp8_shape(s: Qwen3Shape, form: Fp8Form = _BLOCKS) -> None:
    """The shape's linears fit the form: k a multiple of 16 (the kernels' 16-byte pieces) and, for
    block scales, every concatenated tensor's rows a multiple of 128 (so the scales concatenate as
    the weights do).

    Raises:
        GenError: one that does not, named.
    """
    for gemm, (parts, k) in fp8_gemm_shapes(s).items():
        bad = [] if form.per_row else [n for n in parts if n % FP8_BLOCK]
        if bad or k % 16:
            rows = "" if form.per_row else f"each tensor's rows a multiple of {FP8_BLOCK} and "
            raise GenError(f"{gemm}: FP8 weights need {rows}k a multiple of 16, got rows {list(parts)} and k {k}")


def _scale_buffer(weight: Json, n: int, k: int, form: Fp8Form) -> Json:
    shape = [n, 1] if form.per_row else [n // FP8_BLOCK, -(-k // FP8_BLOCK)]
    spec: Json = {"dtype": "f32", "shape": shape, "kind": "weight"}
    if form.quantise:
        return spec
    return {**spec, "bind": [{"tensor": f"{seg['tensor']}{form.scales}"} for seg in weight["bind"]]}


def _weights(manifest: Json, form: Fp8Form) -> dict[str, tuple[int, int]]:
    """Retypes the layers' linear weights to e4m3 and adds their scale buffers (in place; a
    quantising form: unbound, with the bf16 `.bf16` source after them); returns weight buffer ->
    (n, k)."""
    out: dict[str, tuple[int, int]] = {}
    rebuilt: Json = {}
    for name, spec in manifest["buffers"].items():
        gemm = gemm_of(name)
        if not name.startswith("l") or gemm not in FP8_GEMMS or spec.get("kind") != "weight":
            rebuilt[name] = spec
            continue
        n, k = (int(d) for d in spec["shape"])
        rebuilt[name] = ({"dtype": "fp8e4m3", "shape": spec["shape"], "kind": "weight"} if form.quantise
                         else {**spec, "dtype": "fp8e4m3"})
        rebuilt[f"{name}.scale"] = _scale_buffer(spec, n, k, form)
        if form.quantise:
            rebuilt[f"{name}.bf16"] = {**spec, "kind": "source"}
        out[name] = (n, k)
    manifest["buffers"] = rebuilt
    return out


def _quant_op(mods: Mapping[str, str], n: int, k: int) -> Json:
    la = kernel(mods, QUANT_ENTRY, [-(-k // FP8_BLOCK), n // FP8_BLOCK, 1], QUANT_THREADS,
                params=[BF16_IN, "out buffer<fp8e4m3>", "out buffer<f32>", "i32", "i32"],
                args=[{"param": 0}, {"param": 1}, {"param": 2}, i32(n), i32(k)])
    return {"params": [BF16_IN, "out buffer<fp8e4m3>", "out buffer<f32>"], "impl": {"launches": [la]}}


def _derive_programs(manifest: Json, shapes: Mapping[str, tuple[int, int]], mods: Mapping[str, str]) -> None:
    """One derive program per layer quantising its linears from their bf16 sources (in place)."""
    layers: dict[str, list[Json]] = {}
    for name, (n, k) in shapes.items():
        op = f"quant_e4m3_{n}x{k}"
        manifest["ops"].setdefault(op, _quant_op(mods, n, k))
        layer = name.split(".", 1)[0]
        layers.setdefault(layer, []).append(call(f"{name}.quant", op, buf(f"{name}.bf16"), buf(name),
                                                 buf(f"{name}.scale")))
    for layer, calls in layers.items():
        manifest["programs"][f"quantise.{layer}"] = {"derive": True, "calls": calls}


def _gemv_op(mods: Mapping[str, str], form: Fp8Form, n: int, k: int) -> Json:
    la = kernel(mods, form.gemv, [-(-n // GEMV_COLUMNS), 1, 1], 32 * GEMV_COLUMNS,
                params=[BF16_IN, FP8_IN, F32_IN, BF16_OUT, "i32", "i32", "i32", "i32"],
                args=[{"param": 0}, {"param": 1}, {"param": 2}, {"param": 3}, i32(1), i32(n), i32(k), i32(n)])
    return {"params": [BF16_IN, FP8_IN, F32_IN, BF16_OUT], "impl": {"launches": [la]}}


def _gemm_op(mods: Mapping[str, str], form: Fp8Form, n: int, k: int) -> Json:
    dequant = kernel(mods, form.dequant, [-(-(n * k // 16) // DEQUANT_THREADS), 1, 1], DEQUANT_THREADS,
                     params=[FP8_IN, F32_IN, BF16_OUT, "i32", "i32"],
                     args=[{"param": 1}, {"param": 2}, {"scratch": "w"}, i32(n), i32(k)])
    gemm = {"entry": "extern:cublaslt_bf16_tn",
            "args": [{"param": 0}, {"scratch": "w"}, {"param": 3}, {"param": 4}, i32(n), i32(k)]}
    return {"params": [BF16_IN, FP8_IN, F32_IN, BF16_OUT, "i32"],
            "impl": {"scratch": {"w": {"dtype": "bf16", "shape": [n, k]}}, "launches": [dequant, gemm]}}


def _rewrite(c: Json, shapes: Mapping[str, tuple[int, int]], one_row: bool, ops: Json,
             mods: Mapping[str, str], form: Fp8Form) -> Json:
    if c["op"] != "gemm" or c["args"][1]["buf"] not in shapes:
        if c["op"].startswith("gemv") and c["args"][1]["buf"] in shapes:
            raise GenError(f"{c['label']}: a bf16 GEMV over an FP8 weight; leave {gemm_of(c['label'])} to the "
                           "FP8 GEMV (drop it from --gemv)")
        return c
    x, w, y, rows, *_ = c["args"]
    n, k = shapes[w["buf"]]
    scale = buf(f"{w['buf']}.scale")
    if one_row:
        op = f"gemv_e4m3{form.suffix}_{n}x{k}"
        ops.setdefault(op, _gemv_op(mods, form, n, k))
        return call(c["label"], op, x, w, scale, y)
    op = f"gemm_e4m3{form.suffix}_{n}x{k}"
    ops.setdefault(op, _gemm_op(mods, form, n, k))
    return call(c["label"], op, x, w, scale, y, rows)


def apply_fp8(manifest: Json, s: Qwen3Shape, mods: Mapping[str, str], weights: WeightFormat = "qwen-fp8") -> None:
    """The rewrite of the module's docstring for `weights` (in place); `mods` maps kernel entry ->
    module.

    Raises:
        GenError: the shape does not fit the format, or a GEMV pick reads an FP8 weight.
    """
    form = FP8_FORMS[weights]
    check_fp8_shape(s, form)
    shapes = _weights(manifest, form)
    ops = manifest["ops"]
    for name, program in manifest["programs"].items():
        one_row = name == "decode"  # NOTE: the one-row step; prefill and the head run chunk rows
        program["calls"] = [_rewrite(c, shapes, one_row, ops, mods, form) for c in program["calls"]]
    if form.quantise:
        _derive_programs(manifest, shapes, mods)
