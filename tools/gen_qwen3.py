"""Qwen3 manifest generator: any Qwen3 `config.json` + our kernels -> a kern manifest (schema v5).

    python tools/gen_qwen3.py (CONFIG.json | --preset qwen3-4b|qwen3-tiny) -o OUT.json [--model NAME]
        [--kernels-src tools/kernels-src] [--kernels kernels] [--chunk 2048] [--feed device|host]
        [--precision bf16|f32]

builds tools/kernels-src into kernels/ (`build_kernels`, cached by hash), finds which module defines
each entry, and writes the manifest. The layout, kernels and programs follow docs/qwen3.md:
`load` (once: rope tables), `prefill` (chunk rows, writes only KV), `decode` (graph, one row:
logits + two-stage argmax into `next_token`) and, when device-fed, `start` (seeds the step's carry
buffers from the staged inputs; the decode step ends with `kern_decode_advance`). Weights bind
straight onto the Hugging Face checkpoint names (q/k/v and gate/up concatenated in the bind); a tied
lm_head reads the embedding buffer. docs/run.md says how kern-run drives these programs.
`--precision f32` writes the reference-precision manifest instead (qwen3_f32.cu: activations,
residual, logits and the KV cache in float32 over the bf16 weights; docs/qwen3.md).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Any

__all__ = [
    "ARGMAX_PARTS",
    "DECODE_CLUSTER",
    "DECODE_SPLITS",
    "DEFER_ENTRIES",
    "DEFER_MAX_K",
    "DEFER_P4",
    "DEVICE_FEED_ENTRIES",
    "ENTRIES",
    "F32_ENTRIES",
    "F32_GEMM_TILE",
    "F32_GEMV_COLS",
    "FEEDS",
    "FOLDED",
    "FOLD_ENTRIES",
    "FUSED_ENTRIES",
    "GEMV_BAND",
    "GEMV_DEFAULT",
    "GEMV_DEFER_BLOCKS",
    "GEMV_ENTRIES",
    "GEMV_GEMMS",
    "GEMV_P4_MAX_ROW",
    "GEMV_P4_SMEM",
    "GEMV_PICK",
    "GEMV_RING_BLOCKS",
    "GEMV_RING_MAX_STAGES",
    "GEMV_RING_SMEM",
    "GEMV_SMS",
    "GEMV_TMA_BLOCKS",
    "GEMV_TMA_SMEM",
    "GEMV_TMA_STAGE_CAP",
    "LATE_ENTRIES",
    "PAGE_TOKENS",
    "PRECISIONS",
    "PREFILL_BM",
    "PRESETS",
    "QKN_ENTRIES",
    "QKN_MAX_GROUP",
    "SILU_ENTRIES",
    "TAIL_GROUP",
    "TAIL_OF",
    "TAIL_STRIDE",
    "ConfigError",
    "GenError",
    "KernelsError",
    "Qwen3Shape",
    "build_and_hash",
    "decode_gemm_shapes",
    "decode_weight_bytes",
    "defer_launch",
    "entry_modules",
    "gemv_launch",
    "generate",
    "main",
    "shape_from_config",
    "tail_counters",
    "tail_launch",
]

Json = dict[str, Any]

PAGE_TOKENS = 16
"""Tokens per KV page (docs/qwen3.md "KV state layout")."""
DECODE_SPLITS = 32
"""Split-KV partitions of the decode attention (grid y of kern_attn_decode_partial and
kern_attn_decode). A multiple of DECODE_CLUSTER: kern_attn_decode runs in clusters of that many
blocks along y, and the driver refuses any other grid."""
DECODE_CLUSTER = 8
"""attention.cu's DEC_CLUSTER: kern_attn_decode's `__cluster_dims__(1, 8, 1)`."""
PREFILL_BM = 64
"""Query rows per block of kern_attn_prefill (grid x = ceil_div(tokens, PREFILL_BM))."""
ARGMAX_PARTS = 64
"""Blocks of the first argmax stage."""
DEFAULT_CHUNK = 2048
MAX_ROPE_POSITIONS = 131072

ENTRIES: tuple[str, ...] = (
    "kern_embed",
    "kern_rmsnorm",
    "kern_add_rmsnorm",
    "kern_qk_norm_rope",
    "kern_kv_write",
    "kern_attn_decode_partial",
    "kern_attn_decode_reduce",
    "kern_attn_prefill",
    "kern_silu_mul",
    "kern_argmax_partial",
    "kern_argmax_final",
    "kern_rope_table",
)
"""Entries every manifest needs."""
DEVICE_FEED_ENTRIES: tuple[str, ...] = ("kern_decode_advance", "kern_copy_i64", "kern_copy_i32")
"""Extra entries of `feed="device"`: the step's inputs live in carry buffers that a `start`
program seeds from the host inputs and `kern_decode_advance` moves on (the verifier forbids kernels
writing input buffers)."""
FEEDS = ("host", "device")
GEMV_GEMMS = ("qkv", "o", "gate_up", "down", "lm_head")
"""Decode GEMMs (m = 1) that `--gemv` may move from cublasLt to our GEMV kernels (gemv.cu)."""
GEMV_DEFAULT = ("o", "gate_up", "lm_head")
"""`--gemv default` (examples/qwen3-4b-gemv.json): the decode GEMMs where kern_gemv_bf16 beat cuBLAS
on the H200 before the per-shape entries (docs/kernels.md, "GEMV for decode"). `--gemv all` takes
every decode GEMM, so the decode chain holds no cuBLAS launch and can run with `--pdl`
(examples/qwen3-4b-fast.json: `--gemv all --fuse --pdl --fold-norm`)."""
GEMV_ENTRIES: dict[str, tuple[int, int]] = {
    "kern_gemv_bf16": (4, 128),
    "kern_gemv_bf16_s2": (2, 128),
    "kern_gemv_bf16_s4": (1, 128),
    "kern_gemv_bf16_s8": (1, 256),
    "kern_gemv_bf16_c2": (8, 128),
    "kern_gemv_bf16_q4": (16, 128),
    "kern_gemv_bf16_s2q4": (8, 128),
    "kern_gemv_bf16_s4q4": (4, 128),
    "kern_gemv_bf16_silu": (4, 128),
    "kern_gemv_bf16_tma": (0, 512),
    "kern_gemv_bf16_tma_silu": (0, 512),
    "kern_gemv_bf16_b4": (-1, 128),
    "kern_gemv_bf16_b4_silu": (-1, 128),
    "kern_gemv_bf16_d4": (-1, 128),
    "kern_gemv_bf16_d8": (-1, 128),
    "kern_gemv_bf16_d4_silu": (-1, 128),
    "kern_gemv_bf16_p4": (-2, 128),
    "kern_gemv_bf16_p4_silu": (-2, 128),
    "kern_gemv_bf16_r4": (-3, 128),
    "kern_gemv_bf16_r4_silu": (-3, 128),
}
"""GEMV entries (gemv.cu) -> (output columns per block, threads per block); grid x is
ceil_div(n, columns). Columns 0: a streaming entry (W through a shared-memory ring filled by bulk
copies), min(n, GEMV_TMA_BLOCKS) blocks with GEMV_TMA_SMEM bytes of dynamic shared memory each;
columns -1: a band entry, one resident wave of blocks that each sum a balanced band of columns
(GEMV_BAND); columns -2: a prefetched entry, whose blocks copy their columns' W rows into
GEMV_P4_SMEM bytes of dynamic shared memory before the PDL wait; columns -3: a ring entry (gemv_ring.cu),
one resident wave of GEMV_RING_BLOCKS blocks per SM whose bands stream through a ring of
shared-memory stages (GEMV_RING_SMEM bytes). `gemv_launch` turns an entry and a shape into the launch."""
SILU_ENTRIES = ("kern_gemv_bf16_silu", "kern_gemv_bf16_tma_silu", "kern_gemv_bf16_b4_silu", "kern_gemv_bf16_d4_silu",
                "kern_gemv_bf16_p4_silu", "kern_gemv_bf16_r4_silu")
"""GEMV entries with SiLU-and-mul in their epilogue (gate_up only: W is [2n, k], y is `act`)."""
GEMV_SMS = 132
"""Streaming multiprocessors the GEMV grids are sized for: the H200's (the kernels split the
columns over any grid, so another GPU runs them correctly; only the balance changes)."""
GEMV_TMA_BLOCKS = GEMV_SMS
"""Blocks of a streaming GEMV launch: one per SM."""
GEMV_BAND: dict[str, int] = {"kern_gemv_bf16_b4": 7, "kern_gemv_bf16_b4_silu": 6, "kern_gemv_bf16_d4": 4,
                             "kern_gemv_bf16_d8": 4, "kern_gemv_bf16_d4_silu": 4}
"""Band entries -> blocks per SM their `__launch_bounds__` guarantee (registers: 72 and 80 of 64K
per SM at 128 threads for `_b4` / `_b4_silu`, at most 128 for the deep bands); a band launch runs ceil_div(n, ceil_div(n, GEMV_SMS * that)) blocks, so
every block has its band from the start and bands differ by at most one column."""
GEMV_TMA_SMEM = 196608
"""Dynamic shared memory of a streaming GEMV block (its ring of W stages): 192 KiB of the SM's
227 KiB, leaving room for the small kernels that run beside it under PDL."""
GEMV_P4_SMEM = 32768
"""Shared-memory budget of a prefetched GEMV block (`_p4`, `_p4_silu`): it owns max(1, min(n, budget //
(rows * 2k))) columns (rows: 2 for `_p4_silu`'s gate and up), so lm_head (k 2560) runs 25323 blocks of 6
columns and o (k 4096) 640 blocks of 4."""
GEMV_P4_MAX_ROW = 227 * 1024 - 1024
"""The most dynamic shared memory a `_p4` block may have: sm_90's 227 KiB per block less 1 KiB for the
entries' static shared memory (384-768 B: the mbarrier and the column sums); a block holds at least
one column's rows."""
GEMV_RING_BLOCKS = 2
"""Blocks per SM of a ring GEMV launch (`_r4`, `_r4_silu` and their folded forms): the grid is one
wave of balanced bands, ceil_div(n, ceil_div(n, GEMV_SMS * that)) blocks."""
GEMV_RING_SMEM = 65536
"""Bytes of W stages per ring block: the ring has min(32, this // (rows * 2k), the band's columns)
stages of one column's rows each (rows: 2 for the SiLU form), at least one; a folded (`_n`) launch
adds 4k bytes for the norm's h and x in front of them."""
GEMV_RING_MAX_STAGES = 32
"""gemv_ring.cu's RING_MAX_STAGES: the mbarriers a ring block has."""
GEMV_TMA_STAGE_CAP = 32768
"""gemv.cu's TMA_STAGE_CAP: a stage holds max(1, cap // (rows * 2k)) columns."""
GEMV_PICK: dict[str, str] = {
    "qkv": "kern_gemv_bf16_b4",
    "o": "kern_gemv_bf16_s4",
    "gate_up": "kern_gemv_bf16_silu",
    "down": "kern_gemv_bf16_p4",
    "lm_head": "kern_gemv_bf16_p4",
}
"""The GEMV entry of each decode GEMM, by the step's critical path on the H200 (docs/perf.md, fourth
and fifth passes): split-k over the block's 4 warps, over balanced column bands (`_b4`) for qkv and
one column per block (`_s4`) for o; lm_head's and down's rows bulk-copied into shared memory (`_p4`:
lm_head 168-171 us in the step against `_c2`'s 185.9; down 11.6 against `_b4`'s 14.2 behind gate_up,
the step 30 us faster with `fold_norm`); gate_up runs `_silu`, which applies SiLU-and-mul in its
epilogue and writes `act` (no kern_silu_mul in the decode step), or `_b4_silu_n` with `fold_norm`.
`_p4` / `_p4_silu` for qkv and gate_up made those GEMVs faster (gate_up 28.4 -> 24.1 us) but the
add + RMSNorm launch before each 3-4 us slower, the step by 41-89 us."""
FOLD_ENTRIES: dict[str, tuple[str, str]] = {
    "qkv": ("kern_gemv_bf16_b4_n", "kern_gemv_bf16_b4"),
    "gate_up": ("kern_gemv_bf16_b4_silu_n", "kern_gemv_bf16_b4_silu"),
}
"""`fold_norm=True` (gemv_norm.cu): decode GEMM -> (the band GEMV with the add + RMSNorm before it in
its prologue, the band entry whose grid it takes): the fold of a GEMM whose pick has no folded form
(`FOLDED`). The norm launches before qkv (the previous layer's next_norm) and before gate_up
(post_norm) go; the residual alternates between `h` and `h2`."""
FOLDED: dict[str, str] = {
    "kern_gemv_bf16_b4": "kern_gemv_bf16_b4_n",
    "kern_gemv_bf16_b4_silu": "kern_gemv_bf16_b4_silu_n",
    "kern_gemv_bf16_r4": "kern_gemv_bf16_r4_n",
    "kern_gemv_bf16_r4_silu": "kern_gemv_bf16_r4_silu_n",
    "kern_gemv_bf16_p4": "kern_gemv_bf16_p4_n",
    "kern_gemv_bf16_p4_silu": "kern_gemv_bf16_p4_silu_n",
}
"""GEMV entry -> its form with the add + RMSNorm in its prologue (gemv_norm.cu, gemv_ring.cu, gemv_pnorm.cu), which
takes that entry's launch: with `fold_norm`, a qkv or gate_up pick listed here folds into its own
layout (`--gemv-pick qkv=kern_gemv_bf16_r4` runs `_r4_n`), any other into FOLD_ENTRIES' band."""
DEFER_ENTRIES: dict[str, str] = {"qkv": "kern_gemv_bf16_b4_d", "gate_up": "kern_gemv_bf16_b4_silu_d"}
"""`fold_norm=True, defer_norm=True` (gemv_defer.cu): decode GEMM -> the band GEMV that applies the
add + RMSNorm before it as r * (W (h * w_norm)), r in its epilogue, so nothing stands between its
PDL wait and its first FMA but one load of h; one wave of GEMV_DEFER_BLOCKS blocks per SM."""
DEFER_P4: dict[str, str] = {"kern_gemv_bf16_p4": "kern_gemv_bf16_p4_d", "kern_gemv_bf16_p4_silu": "kern_gemv_bf16_p4_silu_d"}
"""With `defer_norm`, a qkv / gate_up pick on a prefetched entry folds into its deferred form
(gemv_defer.cu), on that entry's launch (its rows' shared memory only)."""
GEMV_DEFER_BLOCKS = 4
"""Blocks per SM of a deferred-norm band launch (`__launch_bounds__(128, 4)`: 106 / 122 registers)."""
DEFER_MAX_K = 4096
"""gemv_defer.cu's k limit (DEFER_MAXP 16-byte pieces per thread of 128)."""
TAIL_OF: dict[str, str] = {"kern_gemv_bf16_s4": "kern_gemv_bf16_s4_an", "kern_gemv_bf16_p4": "kern_gemv_bf16_p4_an"}
"""`norm_tail=True` (gemv_tail.cu): GEMV entry -> its form with the add + RMSNorm after it run by its
last block, on the entry's launch (its dynamic shared memory at least h and x: 4n bytes)."""
TAIL_GROUP, TAIL_STRIDE = 64, 32
"""gemv_tail.cu's two-level block counter: a first-level counter per TAIL_GROUP blocks, TAIL_STRIDE
i32 apart, after the top one (`tail_counters`)."""
QKN_MAX_GROUP = 32
"""attention_qkn.cu's QKN_MAX_GROUP: query heads per kv head its shared memory holds."""
WIDE_ENTRIES: tuple[str, ...] = ("kern_attn_decode_wide",)
"""The entry of `wide_attention=True` (attention_wide.cu): kern_attn_decode whose global path (beyond
512 tokens) combines each cluster of 8 splits in distributed shared memory before the last block
folds the clusters' partials, so the grid can take `DECODE_SPLITS_WIDE` splits."""
LATE_ENTRIES: dict[str, str] = {"kern_attn_decode": "kern_attn_decode_late",
                                 "kern_attn_decode_wide": "kern_attn_decode_wide_late"}
"""The decode attention entries of `late_trigger=True` (attention_wide.cu): the same bits, but their
blocks let the next launch start only once they have folded their splits, not at their start."""
DECODE_SPLITS_WIDE = 128
"""Splits of the decode attention's grid with `wide_attention` (a multiple of DECODE_CLUSTER)."""
QKN_ENTRIES: tuple[str, ...] = ("kern_attn_decode_qkn",)
"""The extra entry of `fuse_qkn=True` (attention_qkn.cu): decode attention that norms and rotates q
and k and writes the step's k / v row itself, so the decode step has no q/k-norm launch."""
FUSED_ENTRIES: tuple[str, ...] = ("kern_qk_norm_rope_kv", "kern_attn_decode", "kern_zero_i32")
"""Extra entries of `fuse=True`: q/k norm + rope writes k / v into the pages itself (no
kern_kv_write), decode attention is one launch (its last block per kv head reduces; counters in a
carry buffer that the load program zeroes)."""

# NOTE: device-fed decode reads these carries instead of the host inputs.
STEP_CARRIES: dict[str, tuple[str, str]] = {
    "ids": ("step_ids", "i64"),
    "positions": ("step_pos", "i64"),
    "slots": ("step_slot", "i64"),
    "seq_len": ("step_len", "i32"),
}


class GenError(Exception):
    """Base of the generator's errors."""


class ConfigError(GenError):
    """The config.json does not describe a Qwen3 model this generator supports."""


class KernelsError(GenError):
    """The kernel sources or hashes do not provide every entry the manifest needs."""


@dataclass(frozen=True, slots=True)
class Qwen3Shape:
    """The numbers of a Qwen3 config that the manifest depends on."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    vocab: int
    eps: float
    theta: float
    tied: bool
    max_pos: int

    @property
    def qkv_rows(self) -> int:
        return (self.heads + 2 * self.kv_heads) * self.head_dim

    @property
    def kv_bytes_per_token(self) -> int:
        return self.layers * 2 * self.kv_heads * self.head_dim * 2

    @property
    def page_stride(self) -> int:
        """Elements from one KV page to the next: every layer's k and v for PAGE_TOKENS tokens."""
        return self.layers * 2 * PAGE_TOKENS * self.kv_heads * self.head_dim

    def kv_offset(self, layer: int) -> int:
        """Byte offset of `layer`'s k|v block inside a page of the `kv` state."""
        return layer * 2 * PAGE_TOKENS * self.kv_heads * self.head_dim * 2

    @property
    def max_pages(self) -> int:
        """Block-table entries: the pages of positions 0 .. max_pos. The last one is the position after
        the model's reach, which kern_decode_advance maps (reads) after the step at the last position."""
        return self.max_pos // PAGE_TOKENS + 1


def _int_field(cfg: Mapping[str, Any], key: str) -> int:
    value = cfg.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"config.json: {key!r} must be a positive integer, got {value!r}")
    return value


def _rope_theta(cfg: Mapping[str, Any]) -> float:
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if not isinstance(params, Mapping):
        raise ConfigError(f"config.json: rope parameters must be an object, got {params!r}")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "default":
        raise ConfigError(f"config.json: rope_type {kind!r} is not supported (only 'default')")
    theta = cfg.get("rope_theta", params.get("rope_theta"))
    if not isinstance(theta, int | float) or isinstance(theta, bool) or theta <= 0:
        raise ConfigError(f"config.json: 'rope_theta' must be a positive number, got {theta!r}")
    return float(theta)


def shape_from_config(cfg: Mapping[str, Any]) -> Qwen3Shape:
    """Read the Qwen3 numbers from a Hugging Face config.json object.

    Raises:
        ConfigError: a field is missing or out of range, or the model is not a plain Qwen3.
    """
    arch = cfg.get("model_type")
    if arch != "qwen3":
        raise ConfigError(f"config.json: model_type must be 'qwen3', got {arch!r}")
    if cfg.get("attention_bias", False):
        raise ConfigError("config.json: attention_bias=true is not supported (Qwen3 has none)")
    heads, kv_heads = _int_field(cfg, "num_attention_heads"), _int_field(cfg, "num_key_value_heads")
    if heads % kv_heads:
        raise ConfigError(f"config.json: {heads} attention heads are not a multiple of {kv_heads} kv heads")
    hidden = _int_field(cfg, "hidden_size")
    head_dim = cfg.get("head_dim") or hidden // heads
    if not isinstance(head_dim, int) or head_dim % 2:
        raise ConfigError(f"config.json: head_dim must be an even integer, got {head_dim!r}")
    eps = cfg.get("rms_norm_eps")
    if not isinstance(eps, float) or not 0 < eps < 1:
        raise ConfigError(f"config.json: 'rms_norm_eps' must be a float in (0, 1), got {eps!r}")
    return Qwen3Shape(
        hidden=hidden,
        layers=_int_field(cfg, "num_hidden_layers"),
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        inter=_int_field(cfg, "intermediate_size"),
        vocab=_int_field(cfg, "vocab_size"),
        eps=eps,
        theta=_rope_theta(cfg),
        tied=bool(cfg.get("tie_word_embeddings", False)),
        max_pos=min(_int_field(cfg, "max_position_embeddings"), MAX_ROPE_POSITIONS),
    )


_BOUNDS = r"(?:__launch_bounds__\s*\([^)]*\)\s*)?"
_GLOBAL = re.compile(rf"__global__\s+{_BOUNDS}void\s+{_BOUNDS}(kern_\w+)\s*\(")


def entry_modules(src_dir: Path) -> dict[str, str]:
    """Map each `kern_*` kernel entry to the module (source file stem) that defines it.

    Raises:
        KernelsError: an entry is defined twice.
    """
    found: dict[str, str] = {}
    for path in sorted(src_dir.glob("*.cu")):
        for entry in _GLOBAL.findall(path.read_text()):
            if entry in found and found[entry] != path.stem:
                raise KernelsError(f"{entry} is defined in both {found[entry]}.cu and {path.name}")
            found[entry] = path.stem
    return found


# --------------------------------------------------------------------------------------------
# Small JSON builders.


def _buf(name: str, offset: int = 0) -> Json:
    return {"buf": name, "offset": offset} if offset else {"buf": name}


def _i32(v: int) -> Json:
    return {"i32": v}


def _i64(v: int) -> Json:
    return {"i64": v}


def _f32(v: float) -> Json:
    return {"f32": v}


TOKENS: Json = {"var": "tokens"}


def _call(label: str, op: str, *args: Json) -> Json:
    return {"label": label, "op": op, "args": list(args)}


def _kernel(
    mods: Mapping[str, str], entry: str, grid: Sequence[Any], block: int, **extra: Any
) -> Json:
    return {"module": mods[entry], "entry": entry, "block": [block, 1, 1], "grid": list(grid), **extra}


# --------------------------------------------------------------------------------------------
# Ops: one per kernel, interface = the kernel's ABI (docs/qwen3.md), except the two-launch
# attention and argmax ops, whose partials live in impl scratch.

BF16_IN, BF16_OUT, BF16_IO = "in buffer<bf16>", "out buffer<bf16>", "inout buffer<bf16>"


def _ops(s: Qwen3Shape, mods: Mapping[str, str]) -> Json:
    d, nq, nkv = s.head_dim, s.heads, s.kv_heads
    heads_out = nq * d
    ops: Json = {
        "embed": {
            "params": ["in buffer<i64>", BF16_IN, BF16_OUT, "i32"],
            "impl": {"launches": [_kernel(mods, "kern_embed", ["tokens", 1, 1], 256)]},
        },
        "rmsnorm": {
            "params": [BF16_IN, BF16_IN, BF16_OUT, "i32", "f32"],
            "impl": {"launches": [_kernel(mods, "kern_rmsnorm", ["tokens", 1, 1], 256)]},
        },
        "add_rmsnorm": {
            "params": [BF16_IO, BF16_IN, BF16_IN, BF16_OUT, "i32", "f32"],
            "impl": {"launches": [_kernel(mods, "kern_add_rmsnorm", ["tokens", 1, 1], 256)]},
        },
        "qk_norm_rope": {
            "params": [BF16_IO, BF16_IN, BF16_IN, "in buffer<i64>", BF16_IN, BF16_IN,
                       "i32", "i32", "i32", "f32"],
            "impl": {"launches": [_kernel(mods, "kern_qk_norm_rope", ["tokens", nq + nkv, 1], d // 2)]},
        },
        "kv_write": {
            "params": [BF16_IN, "inout state", "in buffer<i64>", "i32", "i32", "i32", "i32", "i64"],
            "impl": {"launches": [_kernel(mods, "kern_kv_write", ["tokens", nkv, 1], 32)]},
        },
        "attn_prefill": {
            "params": [BF16_IN, "in state", "in buffer<i32>", "in buffer<i32>", BF16_OUT,
                       "i32", "i32", "i32", "i32", "i32", "i64", "f32"],
            "impl": {"launches": [_kernel(
                mods, "kern_attn_prefill", [{"ceil_div": ["tokens", PREFILL_BM]}, nq, 1], 128)]},
        },
        "silu_mul": {
            "params": [BF16_IN, BF16_OUT, "i32"],
            "impl": {"launches": [_kernel(
                mods, "kern_silu_mul", ["tokens", -(-s.inter // 1024), 1], 128)]},
        },
        "gemm": {
            "params": [BF16_IN, BF16_IN, BF16_OUT, "i32", "i32", "i32"],
            "impl": {"launches": [{"entry": "extern:cublaslt_bf16_tn"}]},
        },
        "attn_decode": _attn_decode_op(s, mods, heads_out),
        **(_fused_ops(s, mods, heads_out) if "kern_attn_decode" in mods else {}),
        "argmax": _argmax_op(s, mods),
        "rope_table": {
            "params": [BF16_OUT, BF16_OUT, "i32", "i32", "f32"],
            "impl": {"launches": [_kernel(mods, "kern_rope_table", [s.max_pos, 1, 1], min(d // 2, 1024))]},
        },
    }
    return ops


def _split_scratch(nq: int, heads_out: int) -> Json:
    """The split-KV decode attention's f32 partial outputs and log-sum-exps (impl-private)."""
    return {
        "part_o": {"dtype": "f32", "shape": [DECODE_SPLITS, heads_out]},
        "part_lse": {"dtype": "f32", "shape": [DECODE_SPLITS, nq]},
    }


def _fused_ops(s: Qwen3Shape, mods: Mapping[str, str], heads_out: int) -> Json:
    d, nq, nkv = s.head_dim, s.heads, s.kv_heads
    fused = _kernel(
        mods, "kern_attn_decode", [nkv, DECODE_SPLITS, 1], 128,
        params=[BF16_IN, "in state", "in buffer<i32>", "in buffer<i32>", "out buffer<f32>",
                "out buffer<f32>", "inout buffer<i32>", BF16_OUT, "i32", "i32", "i32", "i32", "i64",
                "i32", "f32"],
        args=[{"param": 0}, {"param": 1}, {"param": 2}, {"param": 3}, {"scratch": "part_o"},
              {"scratch": "part_lse"}, {"param": 5}, {"param": 4}, _i32(nq), _i32(nkv), _i32(d),
              _i32(PAGE_TOKENS), _i64(s.page_stride), _i32(DECODE_SPLITS), _f32(d**-0.5)],
    )
    return {
        "qk_norm_rope_kv": {
            "params": [BF16_IO, BF16_IN, BF16_IN, "in buffer<i64>", BF16_IN, BF16_IN, "inout state",
                       "in buffer<i64>", "i32", "i32", "i32", "f32", "i32", "i64"],
            "impl": {"launches": [_kernel(mods, "kern_qk_norm_rope_kv", ["tokens", nq + 2 * nkv, 1], d // 2)]},
        },
        "attn_decode_fused": {
            "params": [BF16_IN, "in state", "in buffer<i32>", "in buffer<i32>", BF16_OUT, "inout buffer<i32>"],
            "impl": {
                "scratch": _split_scratch(nq, heads_out),
                "launches": [fused],
            },
        },
        "zero_i32": _zero_op(mods),
        **({"attn_decode_qkn": _qkn_op(s, mods, heads_out)} if "kern_attn_decode_qkn" in mods else {}),
    }


def _zero_op(mods: Mapping[str, str]) -> Json:
    """zero_i32(buf, n): the load program's reset of the block counters (attention, norm tails)."""
    return {"params": ["out buffer<i32>", "i32"], "impl": {"launches": [_kernel(mods, "kern_zero_i32", [1, 1, 1], 32)]}}


def _qkn_op(s: Qwen3Shape, mods: Mapping[str, str], heads_out: int) -> Json:
    """kern_attn_decode_qkn: q/k norm + rope, the step's KV write and decode attention in one launch."""
    d, nq, nkv = s.head_dim, s.heads, s.kv_heads
    launch = _kernel(
        mods, "kern_attn_decode_qkn", [nkv, DECODE_SPLITS, 1], 128,
        params=[BF16_IN, BF16_IN, BF16_IN, "in buffer<i64>", BF16_IN, BF16_IN, "inout state", "in buffer<i64>",
                "in buffer<i32>", "in buffer<i32>", "out buffer<f32>", "out buffer<f32>", "inout buffer<i32>",
                BF16_OUT, "i32", "i32", "i32", "i32", "i64", "i32", "f32", "f32"],
        args=[*({"param": j} for j in range(10)), {"scratch": "part_o"}, {"scratch": "part_lse"}, {"param": 11},
              {"param": 10}, _i32(nq), _i32(nkv), _i32(d), _i32(PAGE_TOKENS), _i64(s.page_stride),
              _i32(DECODE_SPLITS), _f32(d**-0.5), _f32(s.eps)],
    )
    return {
        "params": [BF16_IN, BF16_IN, BF16_IN, "in buffer<i64>", BF16_IN, BF16_IN, "inout state", "in buffer<i64>",
                   "in buffer<i32>", "in buffer<i32>", BF16_OUT, "inout buffer<i32>"],
        "impl": {"scratch": _split_scratch(nq, heads_out), "launches": [launch]},
    }


def _feed_ops(mods: Mapping[str, str]) -> Json:
    return {
        "decode_advance": {
            "params": ["in buffer<i64>", "inout buffer<i64>", "inout buffer<i64>", "inout buffer<i64>",
                       "inout buffer<i32>", "in buffer<i32>", "i32"],
            "impl": {"launches": [_kernel(mods, "kern_decode_advance", [1, 1, 1], 32)]},
        },
        "copy_i64": {
            "params": ["in buffer<i64>", "out buffer<i64>", "i32"],
            "impl": {"launches": [_kernel(mods, "kern_copy_i64", [1, 1, 1], 32)]},
        },
        "copy_i32": {
            "params": ["in buffer<i32>", "out buffer<i32>", "i32"],
            "impl": {"launches": [_kernel(mods, "kern_copy_i32", [1, 1, 1], 32)]},
        },
    }


def _attn_decode_op(s: Qwen3Shape, mods: Mapping[str, str], heads_out: int) -> Json:
    d, nq, nkv = s.head_dim, s.heads, s.kv_heads
    partial = _kernel(
        mods, "kern_attn_decode_partial", [nkv, DECODE_SPLITS, 1], 128,
        params=[BF16_IN, "in state", "in buffer<i32>", "in buffer<i32>", "out buffer<f32>",
                "out buffer<f32>", "i32", "i32", "i32", "i32", "i64", "i32", "f32"],
        args=[{"param": 0}, {"param": 1}, {"param": 2}, {"param": 3}, {"scratch": "part_o"},
              {"scratch": "part_lse"}, _i32(nq), _i32(nkv), _i32(d), _i32(PAGE_TOKENS),
              _i64(s.page_stride), _i32(DECODE_SPLITS), _f32(d**-0.5)],
    )
    reduce = _kernel(
        mods, "kern_attn_decode_reduce", [nq, 1, 1], 128,
        params=["in buffer<f32>", "in buffer<f32>", BF16_OUT, "i32", "i32", "i32"],
        args=[{"scratch": "part_o"}, {"scratch": "part_lse"}, {"param": 4}, _i32(nq), _i32(d),
              _i32(DECODE_SPLITS)],
    )
    return {
        "params": [BF16_IN, "in state", "in buffer<i32>", "in buffer<i32>", BF16_OUT],
        "impl": {
            "scratch": _split_scratch(nq, heads_out),
            "launches": [partial, reduce],
        },
    }


def _argmax_op(s: Qwen3Shape, mods: Mapping[str, str], partial_entry: str = "kern_argmax_partial",
               logits: str = BF16_IN) -> Json:
    """Two stages: `partial_entry` over the `logits` (bf16, or f32 with kern_f32_argmax_partial), then
    sampling.cu's kern_argmax_final over the partials (ties to the lowest index)."""
    partial = _kernel(
        mods, partial_entry, [ARGMAX_PARTS, 1, 1], 256,
        params=[logits, "out buffer<f32>", "out buffer<i32>", "i32"],
        args=[{"param": 0}, {"scratch": "pval"}, {"scratch": "pidx"}, _i32(s.vocab)],
    )
    final = _kernel(
        mods, "kern_argmax_final", [1, 1, 1], 256,
        params=["in buffer<f32>", "in buffer<i32>", "out buffer<i64>", "i32"],
        args=[{"scratch": "pval"}, {"scratch": "pidx"}, {"param": 1}, _i32(ARGMAX_PARTS)],
    )
    return {
        "params": [logits, "out buffer<i64>"],
        "impl": {
            "scratch": {
                "pval": {"dtype": "f32", "shape": [ARGMAX_PARTS]},
                "pidx": {"dtype": "i32", "shape": [ARGMAX_PARTS]},
            },
            "launches": [partial, final],
        },
    }


# --------------------------------------------------------------------------------------------
# Buffers.


def _weight(shape: Sequence[int], *tensors: str) -> Json:
    return {"dtype": "bf16", "shape": list(shape), "kind": "weight",
            "bind": [{"tensor": t} for t in tensors]}


def _layer_prefix(i: int) -> str:
    return f"model.layers.{i}"


def _weights(s: Qwen3Shape) -> Json:
    h, d = s.hidden, s.head_dim
    out: Json = {"embed": _weight([s.vocab, h], "model.embed_tokens.weight")}
    for i in range(s.layers):
        p = _layer_prefix(i)
        out[f"l{i}.in_norm"] = _weight([h], f"{p}.input_layernorm.weight")
        out[f"l{i}.qkv"] = _weight([s.qkv_rows, h], *(f"{p}.self_attn.{x}_proj.weight" for x in "qkv"))
        out[f"l{i}.q_norm"] = _weight([d], f"{p}.self_attn.q_norm.weight")
        out[f"l{i}.k_norm"] = _weight([d], f"{p}.self_attn.k_norm.weight")
        out[f"l{i}.o"] = _weight([h, s.heads * d], f"{p}.self_attn.o_proj.weight")
        out[f"l{i}.post_norm"] = _weight([h], f"{p}.post_attention_layernorm.weight")
        out[f"l{i}.gate_up"] = _weight([2 * s.inter, h], f"{p}.mlp.gate_proj.weight", f"{p}.mlp.up_proj.weight")
        out[f"l{i}.down"] = _weight([h, s.inter], f"{p}.mlp.down_proj.weight")
    out["final_norm"] = _weight([h], "model.norm.weight")
    if not s.tied:
        out["lm_head"] = _weight([s.vocab, h], "lm_head.weight")
    return out


def _buffers(s: Qwen3Shape, feed: str, fuse: bool = False, fold: bool = False) -> Json:
    bf16 = "bf16"
    work = {
        "h": [s.hidden], "x": [s.hidden], "y": [s.hidden], "qkv": [s.qkv_rows],
        "attn": [s.heads * s.head_dim], "gu": [2 * s.inter], "act": [s.inter],
        **({"h2": [s.hidden]} if fold else {}),
    }
    out: Json = {
        "ids": {"dtype": "i64", "shape": ["tokens"], "kind": "input", "fill": "token",
                "domain": {"min": 0, "max": s.vocab - 1}},
        "positions": {"dtype": "i64", "shape": ["tokens"], "kind": "input", "fill": "position",
                      "domain": {"min": 0, "max": s.max_pos - 1}},
        "slots": {"dtype": "i64", "shape": ["tokens"], "kind": "input", "fill": "slot",
                  "domain": {"index_into": "kv"}},
        "seq_len": {"dtype": "i32", "shape": [1], "kind": "input", "fill": "seq_len",
                    "domain": {"min": 1, "max": s.max_pos}},
        "block_table": {"dtype": "i32", "shape": [s.max_pages], "kind": "input", "fill": "blocks",
                        "domain": {"index_into": "kv", "stride": PAGE_TOKENS}},
        "rope_cos": {"dtype": bf16, "shape": [s.max_pos, s.head_dim // 2], "kind": "carry"},
        "rope_sin": {"dtype": bf16, "shape": [s.max_pos, s.head_dim // 2], "kind": "carry"},
        "logits": {"dtype": bf16, "shape": [1, s.vocab], "kind": "output"},
        "next_token": {"dtype": "i64", "shape": [1], "kind": "output", "fill": "tokens"},
    }
    for name, dims in work.items():
        out[name] = {"dtype": bf16, "shape": ["tokens", *dims], "kind": "workspace"}
    if feed == "device":
        for carry, dtype in STEP_CARRIES.values():
            out[carry] = {"dtype": dtype, "shape": [1], "kind": "carry"}
    if fuse:
        out["attn_count"] = {"dtype": "i32", "shape": [s.kv_heads], "kind": "carry"}
    out.update(_weights(s))
    return out


# --------------------------------------------------------------------------------------------
# Programs.


def _gemm_call(label: str, x: str, w: str, y: str, n: int, k: int, gemv: str | None) -> Json:
    """y = x W^T: cublasLt (any rows) or, for the one-row decode step, our GEMV op of that shape
    (`gemv` is the GEMV entry)."""
    if gemv is not None:
        return _call(label, _gemv_op_name(gemv, n, k), _buf(x), _buf(w), _buf(y))
    return _call(label, "gemm", _buf(x), _buf(w), _buf(y), TOKENS, _i32(n), _i32(k))


def _gemv_op_name(entry: str, n: int, k: int) -> str:
    """gemv<suffix>_<n>x<k>; the silu entry's n is its output width (W has 2n rows)."""
    return f"gemv{entry.removeprefix('kern_gemv_bf16')}_{n}x{k}"


def gemv_launch(entry: str, n: int, k: int, folded: bool = False) -> tuple[int, int, int]:
    """(grid x, threads, dynamic shared bytes) of a GEMV entry's launch for n output columns of
    depth k (`folded`: of its FOLDED form, for one x row); GenError when a column's W rows would
    not fit its shared memory."""
    cols, threads = GEMV_ENTRIES[entry]
    norm = 2 * 2 * k if folded else 0  # h and x of one row, bf16
    if cols > 0:
        return -(-n // cols), threads, 0
    if cols == -3:
        column = (2 if entry in SILU_ENTRIES else 1) * 2 * k
        if norm + column > GEMV_P4_MAX_ROW:
            raise GenError(f"{entry}: one column's W rows ({column} bytes, k = {k}) and the norm's {norm} exceed a "
                           "block's shared memory; pick another GEMV entry for this GEMM (--gemv-pick)")
        per_block = -(-n // (GEMV_SMS * GEMV_RING_BLOCKS))
        stages = max(1, min(GEMV_RING_MAX_STAGES, GEMV_RING_SMEM // column, per_block,
                            (GEMV_P4_MAX_ROW - norm) // column))
        return -(-n // per_block), threads, norm + stages * column
    if cols == -2:
        column = (2 if entry in SILU_ENTRIES else 1) * 2 * k  # W bytes of one output column
        if norm + column > GEMV_P4_MAX_ROW:
            raise GenError(f"{entry}: the W rows of one column, {column} bytes (k = {k}), and the norm's {norm} exceed "
                           "a block's shared memory; pick another GEMV entry for this GEMM (--gemv-pick)")
        per_block = max(1, min(n, GEMV_P4_SMEM // column))
        return -(-n // per_block), threads, per_block * column + norm
    if cols < 0:
        per_block = -(-n // (GEMV_SMS * GEMV_BAND[entry]))
        return -(-n // per_block), threads, norm
    rows = 2 if entry in SILU_ENTRIES else 1
    stage = max(1, GEMV_TMA_STAGE_CAP // (rows * 2 * k)) * rows * 2 * k
    # NOTE: one f32 partial per 16-byte piece of a stage, for the one x row a decode launch has.
    if stage + stage // 4 > GEMV_TMA_SMEM:
        raise GenError(f"{entry}: a stage of {stage} bytes (k = {k}) and its partials exceed the "
                       f"{GEMV_TMA_SMEM}-byte shared memory; pick another GEMV entry for this GEMM (--gemv-pick)")
    return min(n, GEMV_TMA_BLOCKS), threads, GEMV_TMA_SMEM


def _gemv_op(mods: Mapping[str, str], entry: str, n: int, k: int) -> Json:
    grid, threads, smem = gemv_launch(entry, n, k)
    extra: Json = {"shared_mem": smem} if smem else {}
    launch = _kernel(
        mods, entry, [grid, 1, 1], threads, **extra,
        params=[BF16_IN, BF16_IN, BF16_OUT, "i32", "i32", "i32", "i32"],
        args=[{"param": 0}, {"param": 1}, {"param": 2}, _i32(1), _i32(n), _i32(k), _i32(n)],
    )
    return {"params": [BF16_IN, BF16_IN, BF16_OUT], "impl": {"launches": [launch]}}


Picks = Mapping[str, str]
"""Decode GEMM name (of GEMV_GEMMS) -> the GEMV entry it runs as; absent: cublasLt."""


def _gemv_of(name: str, gemv: Picks) -> str | None:
    return gemv.get(name)


def _attention_calls(s: Qwen3Shape, i: int, io: Mapping[str, str], *, decode: bool,
                     gemv: Picks = MappingProxyType({}), fuse: bool = False, qkn: bool = False) -> list[Json]:
    d, nq, nkv = s.head_dim, s.heads, s.kv_heads
    kv = {"state": "kv", "offset": s.kv_offset(i)} if i else {"state": "kv"}
    calls = [_gemm_call(f"l{i}.qkv", "x", f"l{i}.qkv", "qkv", s.qkv_rows, s.hidden, _gemv_of("qkv", gemv))]
    if decode and qkn:
        calls.append(_call(f"l{i}.attn", "attn_decode_qkn", _buf("qkv"), _buf(f"l{i}.q_norm"), _buf(f"l{i}.k_norm"),
                           _buf(io["positions"]), _buf("rope_cos"), _buf("rope_sin"), kv, _buf(io["slots"]),
                           _buf("block_table"), _buf(io["seq_len"]), _buf("attn"), _buf("attn_count")))
        return calls
    if fuse:
        calls.append(_call(f"l{i}.qk_norm_rope_kv", "qk_norm_rope_kv", _buf("qkv"), _buf(f"l{i}.q_norm"),
                           _buf(f"l{i}.k_norm"), _buf(io["positions"]), _buf("rope_cos"), _buf("rope_sin"),
                           kv, _buf(io["slots"]), _i32(nq), _i32(nkv), _i32(d), _f32(s.eps),
                           _i32(PAGE_TOKENS), _i64(s.page_stride)))
    else:
        calls += [
            _call(f"l{i}.qk_norm_rope", "qk_norm_rope", _buf("qkv"), _buf(f"l{i}.q_norm"),
                  _buf(f"l{i}.k_norm"), _buf(io["positions"]), _buf("rope_cos"), _buf("rope_sin"),
                  _i32(nq), _i32(nkv), _i32(d), _f32(s.eps)),
            _call(f"l{i}.kv_write", "kv_write", _buf("qkv"), kv, _buf(io["slots"]), _i32(nq), _i32(nkv),
                  _i32(d), _i32(PAGE_TOKENS), _i64(s.page_stride)),
        ]
    if decode and fuse:
        calls.append(_call(f"l{i}.attn", "attn_decode_fused", _buf("qkv"), kv, _buf("block_table"),
                           _buf(io["seq_len"]), _buf("attn"), _buf("attn_count")))
    elif decode:
        calls.append(_call(f"l{i}.attn", "attn_decode", _buf("qkv"), kv, _buf("block_table"),
                           _buf(io["seq_len"]), _buf("attn")))
    else:
        calls.append(_call(f"l{i}.attn", "attn_prefill", _buf("qkv"), kv, _buf("block_table"),
                           _buf(io["seq_len"]), _buf("attn"), TOKENS, _i32(nq), _i32(nkv), _i32(d),
                           _i32(PAGE_TOKENS), _i64(s.page_stride), _f32(d**-0.5)))
    return calls


def _mlp_calls(s: Qwen3Shape, i: int, next_norm: str, gemv: Picks = MappingProxyType({})) -> list[Json]:
    h = s.hidden
    if (silu := gemv.get("gate_up")) in SILU_ENTRIES:
        # NOTE: the silu GEMV's n is its output width (act), its W the [2 * inter, h] gate_up.
        mlp = [_gemm_call(f"l{i}.gate_up", "x", f"l{i}.gate_up", "act", s.inter, h, silu)]
    else:
        mlp = [
            _gemm_call(f"l{i}.gate_up", "x", f"l{i}.gate_up", "gu", 2 * s.inter, h, _gemv_of("gate_up", gemv)),
            _call(f"l{i}.silu_mul", "silu_mul", _buf("gu"), _buf("act"), _i32(s.inter)),
        ]
    return [
        _gemm_call(f"l{i}.o", "attn", f"l{i}.o", "y", h, s.heads * s.head_dim, _gemv_of("o", gemv)),
        _call(f"l{i}.post_norm", "add_rmsnorm", _buf("h"), _buf("y"), _buf(f"l{i}.post_norm"),
              _buf("x"), _i32(h), _f32(s.eps)),
        *mlp,
        _gemm_call(f"l{i}.down", "act", f"l{i}.down", "y", h, s.inter, _gemv_of("down", gemv)),
        _call(f"l{i}.next_norm", "add_rmsnorm", _buf("h"), _buf("y"), _buf(next_norm), _buf("x"),
              _i32(h), _f32(s.eps)),
    ]


def _forward_calls(s: Qwen3Shape, io: Mapping[str, str], *, decode: bool,
                   gemv: Picks = MappingProxyType({}), fuse: bool = False, qkn: bool = False) -> list[Json]:
    calls = [
        _call("embed", "embed", _buf(io["ids"]), _buf("embed"), _buf("h"), _i32(s.hidden)),
        _call("l0.in_norm", "rmsnorm", _buf("h"), _buf("l0.in_norm"), _buf("x"), _i32(s.hidden),
              _f32(s.eps)),
    ]
    for i in range(s.layers):
        last = i == s.layers - 1
        if last and not decode:
            # NOTE: prefill writes only KV; the last layer's attention output is never read.
            calls += _attention_calls(s, i, io, decode=False, fuse=fuse)[:-1]
            break
        calls += _attention_calls(s, i, io, decode=decode, gemv=gemv, fuse=fuse, qkn=qkn)
        calls += _mlp_calls(s, i, "final_norm" if last else f"l{i + 1}.in_norm", gemv)
    return calls


def _decode_tail(s: Qwen3Shape, feed: str, gemv: Picks) -> list[Json]:
    head = "embed" if s.tied else "lm_head"
    calls = [
        _gemm_call("lm_head", "x", head, "logits", s.vocab, s.hidden, _gemv_of("lm_head", gemv)),
        _call("argmax", "argmax", _buf("logits"), _buf("next_token")),
    ]
    if feed == "device":
        c = {k: v[0] for k, v in STEP_CARRIES.items()}
        calls.append(_call("advance", "decode_advance", _buf("next_token"), _buf(c["ids"]),
                           _buf(c["positions"]), _buf(c["slots"]), _buf(c["seq_len"]),
                           _buf("block_table"), _i32(PAGE_TOKENS)))
    return calls


def _start_calls() -> list[Json]:
    """Seed the step carries from the host inputs (row 0): run once per sequence after staging
    the last prompt token."""
    return [
        _call(f"start.{name}", f"copy_{dtype}", _buf(name), _buf(carry), _i32(1))
        for name, (carry, dtype) in STEP_CARRIES.items()
    ]


def _programs(s: Qwen3Shape, feed: str, gemv: Picks, fuse: bool = False, qkn: bool = False) -> Json:
    half = s.head_dim // 2
    host = {k: k for k in STEP_CARRIES}
    step_io = host if feed == "host" else {k: v[0] for k, v in STEP_CARRIES.items()}
    load = [_call("rope_table", "rope_table", _buf("rope_cos"), _buf("rope_sin"), _i32(s.max_pos),
                  _i32(half), _f32(s.theta))]
    if fuse:
        load.append(_call("attn_count", "zero_i32", _buf("attn_count"), _i32(s.kv_heads)))
    programs: Json = {
        "load": {"once": True, "calls": load},
        "prefill": {"batch": {"groups": 1, "rows": "tokens"},
                    "calls": _forward_calls(s, host, decode=False, fuse=fuse)},
        "decode": {"batch": {"groups": 1, "rows": 1}, "graph": True,
                   "calls": _forward_calls(s, step_io, decode=True, gemv=gemv, fuse=fuse, qkn=qkn)
                   + _decode_tail(s, feed, gemv)},
    }
    if feed == "device":
        programs["start"] = {"calls": _start_calls()}
    return programs


def _check_kernel_limits(s: Qwen3Shape) -> None:
    """What tools/kernels-src supports (its comments): vector widths and the attention's GQA tiling."""
    group = s.heads // s.kv_heads
    problems = [
        *([f"head_dim {s.head_dim} (needs 64 or 128)"] if s.head_dim not in (64, 128) else []),
        *([f"{group} query heads per kv head (needs <= 8 or a multiple of 8)"] if group > 8 and group % 8 else []),
        *([f"hidden_size {s.hidden} (needs a multiple of 8)"] if s.hidden % 8 else []),
        *([f"intermediate_size {s.inter} (needs a multiple of 8)"] if s.inter % 8 else []),
        *([f"DECODE_SPLITS {DECODE_SPLITS} / DECODE_SPLITS_WIDE {DECODE_SPLITS_WIDE} (kern_attn_decode needs "
            f"multiples of {DECODE_CLUSTER})"] if DECODE_SPLITS % DECODE_CLUSTER or DECODE_SPLITS_WIDE % DECODE_CLUSTER else []),
    ]
    if problems:
        raise KernelsError("our kernels do not support " + "; ".join(problems))


def generate(
    shape: Qwen3Shape,
    modules: Mapping[str, str],
    entries: Mapping[str, str],
    *,
    model: str,
    chunk: int = DEFAULT_CHUNK,
    feed: str = "host",
    gemv: Sequence[str] = (),
    fuse: bool = False,
    pdl: bool = False,
    gemv_pick: Mapping[str, str] | None = None,
    carveout: int | None = None,
    fuse_qkn: bool = False,
    pdl_off: Sequence[str] = (),
    fold_norm: bool = False,
    wide_attention: bool = False,
    late_trigger: bool = False,
    norm_tail: bool = False,
    defer_norm: bool = False,
    precision: str = "bf16",
) -> Json:
    """Build the manifest (a JSON object) for one Qwen3 shape.

    Args:
        shape: the model's numbers (`shape_from_config`).
        modules: module name -> sha256 of its cubin.
        entries: kernel entry -> module name (`entry_modules`).
        model: the manifest's `model` label.
        chunk: the largest prefill chunk (the `tokens` var's max).
        feed: "host": the caller writes the step's four inputs before every decode step;
            "device": decode reads carry buffers that the `start` program seeds and
            `kern_decode_advance` moves on, so the host only replays and reads 8 bytes.
        gemv: decode GEMMs (of `GEMV_GEMMS`) that run as our GEMV (the entry `GEMV_PICK` names)
            instead of cublasLt; prefill always uses cublasLt.
        fuse: q/k norm + rope writes the KV pages itself (`kern_qk_norm_rope_kv`, prefill and
            decode) and decode attention is one launch (`kern_attn_decode`).
        pdl: every kernel launch of the decode program is a programmatic dependent launch
            (`"pdl": true`; the kernels wait with griddepcontrol.wait). Needs every decode GEMM in
            `gemv`: no cuBLAS launch may sit in the chain. Ops the decode program shares with other
            programs get a `<op>.pdl` copy, so prefill and load launch as before.
        gemv_pick: GEMM name -> GEMV entry (of `GEMV_ENTRIES`), overriding `GEMV_PICK`
            (tools/tests/helpers/time_gemv.py --entries writes the measured winners as JSON).
        carveout: every kernel launch's preferred shared-memory carveout, percent 0..100 (the
            manifest's launch `carveout`); None leaves it to the driver.
        fuse_qkn: (with `fuse`) decode attention also norms and rotates q / k and writes the
            step's KV row (`kern_attn_decode_qkn`): no q/k-norm launch in the decode step.
        fold_norm: the add + RMSNorm before qkv and before gate_up runs in those GEMVs' prologue
            (`FOLD_ENTRIES`, band layouts; needs both as our GEMV, gate_up on a SiLU entry): two
            launches fewer per layer; the residual alternates between buffers `h` and `h2`.
        pdl_off: (with `pdl`) decode GEMMs (of `GEMV_GEMMS`) launched without PDL, so their blocks
            start only when the launch before them has finished (an experiment: does a GEMV's
            early start slow the norm before it?).
        wide_attention: (with `fuse`, not with `fuse_qkn`) decode attention on
            kern_attn_decode_wide at `DECODE_SPLITS_WIDE` splits: beyond 512 tokens each cluster
            of 8 splits combines in shared memory first, so the last block folds 8x fewer partials.
        late_trigger: (with `fuse` and `pdl`, not with `fuse_qkn`) the decode attention's blocks let
            the next launch (o's GEMV) start only once they have folded their splits
            (`LATE_ENTRIES`), so o's early weight loads queue behind the attention's KV loads.
        norm_tail: each decode add + RMSNorm runs in the last block of the o or down GEMV before it
            (`TAIL_OF`: o and down must be on `_s4` or `_p4`; not with `fold_norm`), which writes
            x for the GEMV after it: the GEMVs after the norms (qkv, gate_up, lm_head) read a
            finished x and need no prologue; the residual alternates between `h` and `h2`.
        defer_norm: (with `fold_norm`) qkv and gate_up fold the norm as r * (W (h * w_norm)), the
            scale r in their epilogue (`DEFER_ENTRIES`, or `DEFER_P4` for a `_p4` pick;
            gemv_defer.cu): not the bits of the norm launch + GEMV (one bf16 rounding of x fewer);
            hidden size at most DEFER_MAX_K.
        precision: "bf16" (transformers' bf16 rounding points) or "f32": the reference-precision
            manifest (qwen3_f32.cu; activations, residual, logits and KV in float32, bf16 weights),
            which takes none of the options above but `chunk` and `feed`.

    Raises:
        GenError: an unknown GEMM name, or `pdl` without every decode GEMM as our GEMV.
        KernelsError: an entry is missing, or its module has no hash.
    """
    _check_options(shape, feed=feed, gemv=gemv, fuse=fuse, pdl=pdl, carveout=carveout, fuse_qkn=fuse_qkn,
                   pdl_off=pdl_off, fold_norm=fold_norm, precision=precision, gemv_pick=gemv_pick,
                   wide_attention=wide_attention, late_trigger=late_trigger, norm_tail=norm_tail,
                   defer_norm=defer_norm)
    if precision == "f32":
        return _generate_f32(shape, modules, entries, model=model, chunk=chunk, feed=feed)
    picks = _picks(gemv, gemv_pick or {})
    if norm_tail and any(picks[g] not in TAIL_OF for g in ("o", "down")):
        raise GenError(f"norm_tail runs the norms in the o and down GEMVs' last blocks: they need an entry with a "
                       f"tail ({', '.join(TAIL_OF)}), not o {picks['o']} / down {picks['down']}")
    if fold_norm and picks["gate_up"] not in SILU_ENTRIES:
        raise GenError(f"fold_norm needs gate_up on a SiLU entry ({', '.join(SILU_ENTRIES)}), not {picks['gate_up']}")
    needed = (ENTRIES + (DEVICE_FEED_ENTRIES if feed == "device" else ())
              + tuple(sorted(set(picks.values()))) + (FUSED_ENTRIES if fuse else ())
              + (QKN_ENTRIES if fuse_qkn else ()) + (WIDE_ENTRIES if wide_attention else ())
              + ((LATE_ENTRIES[WIDE_ENTRIES[0] if wide_attention else "kern_attn_decode"],) if late_trigger else ())
              + (tuple(_fold_of(g, picks, defer_norm)[0] for g in FOLD_ENTRIES) if fold_norm else ())
              + ((*(TAIL_OF[picks[g]] for g in ("o", "down")), "kern_zero_i32") if norm_tail else ()))
    _check_needed(shape, modules, entries, needed, chunk, missing_hint="see docs/qwen3.md",
                  unhashed_hint="build the kernels first (with --capture: the capture ran none of their kernels)")
    used = sorted({entries[e] for e in needed})
    skip = (() if fuse else FUSED_ENTRIES) + (() if fuse_qkn else QKN_ENTRIES)
    ops = _ops(shape, {e: m for e, m in entries.items() if e not in skip})
    ops |= _feed_ops(entries) if feed == "device" else {}
    programs = _programs(shape, feed, picks, fuse, fuse_qkn)
    used_ops = {c["op"] for p in programs.values() for c in p["calls"]}
    gemv_ops = {_gemv_op_name(e, 1, 1).removesuffix("_1x1"): e for e in picks.values()}
    for op in sorted(o for o in used_ops if o.startswith("gemv")):
        prefix, shape_nk = op.rsplit("_", 1)
        n, k = (int(v) for v in shape_nk.split("x"))
        ops[op] = _gemv_op(entries, gemv_ops[prefix], n, k)
    if fold_norm:
        _fold_norms(shape, entries, picks, ops, programs, defer_norm)
    buffers = _buffers(shape, feed, fuse, fold_norm or norm_tail)
    if norm_tail:
        _tail_norms(shape, entries, picks, ops, programs, buffers)
    if wide_attention:
        _widen_attention(shape, entries, ops)
    if late_trigger:
        (launch,) = ops["attn_decode_fused"]["impl"]["launches"]
        late = LATE_ENTRIES[launch["entry"]]
        launch |= {"module": entries[late], "entry": late}
    if pdl:
        _apply_pdl(ops, programs)
        _drop_pdl(ops, programs, pdl_off)
    used_ops = {c["op"] for p in programs.values() for c in p["calls"]}
    ops = {name: op for name, op in ops.items() if name in used_ops}
    if carveout is not None:
        for launch in (la for op in ops.values() for la in op["impl"]["launches"] if "module" in la):
            launch["carveout"] = carveout
    return {
        "schema_version": 5,
        "model": model,
        "vars": {"tokens": {"max": chunk}},
        "states": {"kv": {"bytes_per_token": shape.kv_bytes_per_token}},
        "buffers": buffers,
        "modules": {m: {"source": f"{m}-{modules[m][:12]}.cubin", "sha256": modules[m]} for m in used},
        "ops": ops,
        "programs": programs,
    }


def _check_needed(shape: Qwen3Shape, modules: Mapping[str, str], entries: Mapping[str, str], needed: Sequence[str],
                  chunk: int, *, missing_hint: str, unhashed_hint: str) -> None:
    """KernelsError when a needed entry is not in the kernel sources or its module has no hash;
    GenError when the shape exceeds what the kernels hold or the chunk is out of range."""
    missing = [e for e in needed if e not in entries]
    if missing:
        raise KernelsError(f"kernel sources define no {', '.join(missing)}: {missing_hint}")
    unhashed = sorted({entries[e] for e in needed} - set(modules))
    if unhashed:
        raise KernelsError(f"no sha256 for module(s) {', '.join(unhashed)}: {unhashed_hint}")
    _check_kernel_limits(shape)
    if not 1 <= chunk <= shape.max_pos:
        raise GenError(f"chunk {chunk} must be in [1, {shape.max_pos}]")


def _check_options(shape: Qwen3Shape, *, feed: str, gemv: Sequence[str], fuse: bool, pdl: bool,
                   carveout: int | None, fuse_qkn: bool, pdl_off: Sequence[str], fold_norm: bool,
                   precision: str = "bf16", gemv_pick: Mapping[str, str] | None = None,
                   wide_attention: bool = False, late_trigger: bool = False, norm_tail: bool = False,
                   defer_norm: bool = False) -> None:
    """GenError for a combination of `generate` options that cannot be built."""
    if feed not in FEEDS:
        raise GenError(f"feed must be one of {', '.join(FEEDS)}, got {feed!r}")
    if precision not in PRECISIONS:
        raise GenError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    bf16_only = _f32_conflicts(gemv=gemv, fuse=fuse, pdl=pdl, gemv_pick=gemv_pick, carveout=carveout,
                               fuse_qkn=fuse_qkn, pdl_off=pdl_off, fold_norm=fold_norm,
                               wide_attention=wide_attention, late_trigger=late_trigger, norm_tail=norm_tail,
                               defer_norm=defer_norm)
    if precision == "f32" and bf16_only:
        raise GenError(f"precision f32 runs its own plain kernels and takes none of the bf16 speed options: "
                       f"drop {', '.join(bf16_only)} (or use --precision bf16)")
    unknown = sorted(set(gemv) - set(GEMV_GEMMS))
    if unknown:
        raise GenError(f"--gemv names {', '.join(unknown)}; choose from {', '.join(GEMV_GEMMS)}")
    if pdl and set(gemv) != set(GEMV_GEMMS):
        raise GenError(f"pdl needs every decode GEMM as our GEMV ({', '.join(GEMV_GEMMS)}): a cuBLAS launch "
                       "cannot sit in a PDL chain")
    if sorted(set(pdl_off) - set(GEMV_GEMMS)) or (pdl_off and not pdl):
        raise GenError(f"pdl_off {list(pdl_off)}: name decode GEMMs ({', '.join(GEMV_GEMMS)}), together with pdl")
    _check_norm_options(shape, gemv=gemv, fold_norm=fold_norm, norm_tail=norm_tail, defer_norm=defer_norm)
    if fuse_qkn and not fuse:
        raise GenError("fuse_qkn folds q/k norm into the fused decode attention: it needs fuse too (--fuse)")
    if wide_attention and (not fuse or fuse_qkn):
        raise GenError("wide_attention replaces the fused decode attention: it needs --fuse, without --fuse-qkn")
    if late_trigger and (not fuse or fuse_qkn or not pdl):
        raise GenError("late_trigger moves the fused decode attention's PDL trigger: it needs --fuse and --pdl, "
                       "without --fuse-qkn")
    if fuse_qkn and shape.heads // shape.kv_heads > QKN_MAX_GROUP:
        raise GenError(f"fuse_qkn holds at most {QKN_MAX_GROUP} query heads per kv head in shared memory "
                       f"(attention_qkn.cu); this model has {shape.heads // shape.kv_heads}: drop --fuse-qkn")
    if carveout is not None and not 0 <= carveout <= 100:
        raise GenError(f"carveout {carveout}: give a percentage 0..100 (or none for the driver's choice)")


def _check_norm_options(shape: Qwen3Shape, *, gemv: Sequence[str], fold_norm: bool, norm_tail: bool,
                        defer_norm: bool) -> None:
    """GenError for a combination of the options that move the decode norms that cannot be built."""
    if fold_norm and not {"qkv", "gate_up"} <= set(gemv):
        raise GenError("fold_norm runs the norms inside the qkv and gate_up GEMVs: it needs both as our GEMV (--gemv)")
    if defer_norm and not fold_norm:
        raise GenError("defer_norm is a way to fold the norms into qkv and gate_up: it needs --fold-norm too")
    if defer_norm and shape.hidden > DEFER_MAX_K:
        raise GenError(f"defer_norm keeps a row of {shape.hidden} in registers; gemv_defer.cu holds at most "
                       f"{DEFER_MAX_K}: drop --defer-norm")
    if norm_tail and fold_norm:
        raise GenError("norm_tail and fold_norm both move the decode norms (into the GEMV before / after them): pick one")
    if norm_tail and not {"o", "down"} <= set(gemv):
        raise GenError("norm_tail runs the norms in the o and down GEMVs: it needs both as our GEMV (--gemv)")


def _picks(gemv: Sequence[str], override: Mapping[str, str]) -> dict[str, str]:
    unknown = sorted(set(override) - set(GEMV_GEMMS))
    bad = sorted(e for e in override.values() if e not in GEMV_ENTRIES)
    silu = sorted(g for g, e in override.items() if e in SILU_ENTRIES and g != "gate_up")
    if unknown or bad or silu:
        raise GenError(f"gemv_pick: unknown GEMM(s) {unknown}, unknown entries {bad}, or a SiLU entry "
                       f"({', '.join(SILU_ENTRIES)}) outside gate_up {silu}; entries: {', '.join(GEMV_ENTRIES)}")
    return {g: override.get(g, GEMV_PICK[g]) for g in gemv}


def _apply_pdl(ops: Json, programs: Json) -> None:
    """Marks every kernel launch of the decode program's ops `pdl` but the first call's (the step's
    first launch has no earlier launch in the graph to overlap); an op other programs call too is
    copied as `<op>.pdl` for the decode program (in place)."""
    decode = programs["decode"]["calls"]
    elsewhere = {c["op"] for name, p in programs.items() if name != "decode" for c in p["calls"]}
    first = decode[0]["op"]
    renamed: dict[str, str] = {first: first}
    for op in sorted({c["op"] for c in decode[1:]}):
        target = f"{op}.pdl" if op in elsewhere else op
        spec = json.loads(json.dumps(ops[op]))
        for launch in spec["impl"]["launches"]:
            if "module" in launch:
                launch["pdl"] = True
        ops[target] = spec
        renamed[op] = target
    for call in decode:
        call["op"] = renamed[call["op"]]


def _fold_of(gemm: str, picks: Picks, defer: bool = False) -> tuple[str, str]:
    """(the folded entry, the entry whose launch it takes, "" for the deferred-norm band's) of the
    qkv or gate_up GEMM."""
    pick = picks[gemm]
    if defer:
        return (DEFER_P4[pick], pick) if pick in DEFER_P4 else (DEFER_ENTRIES[gemm], "")
    return (FOLDED[pick], pick) if pick in FOLDED else FOLD_ENTRIES[gemm]


def defer_launch(n: int, blocks_per_sm: int | None = None) -> tuple[int, int, int]:
    """(grid x, threads, dynamic shared bytes) of a deferred-norm band launch for n columns: one
    wave of `blocks_per_sm` (default GEMV_DEFER_BLOCKS) blocks per SM whose bands differ by at most
    one column."""
    per_block = -(-n // (GEMV_SMS * (blocks_per_sm or GEMV_DEFER_BLOCKS)))
    return -(-n // per_block), 128, 0


def _fold_norms(s: Qwen3Shape, mods: Mapping[str, str], picks: Picks, ops: Json, programs: Json,
                defer: bool = False) -> None:
    """Each decode add + RMSNorm that a qkv or gate_up GEMV follows becomes that GEMV's prologue
    (`_fold_of`: the pick's FOLDED form, else FOLD_ENTRIES' band): the pair is one call reading the
    residual from the current buffer and writing the new residual to the other one (`h` / `h2` in
    turn); a norm that stays (the final one) reads and updates the current buffer."""
    calls = programs["decode"]["calls"]
    out: list[Json] = []
    cur, other = "h", "h2"
    i = 0
    while i < len(calls):
        call = calls[i]
        gemm = calls[i + 1]["label"].rsplit(".", 1)[-1] if i + 1 < len(calls) else ""
        if call["op"] != "add_rmsnorm":
            out.append(call)
            i += 1
            continue
        _res, y_add, w_norm, *_rest = call["args"]
        if gemm not in FOLD_ENTRIES:
            out.append({**call, "args": [_buf(cur), *call["args"][1:]]})
            i += 1
            continue
        gemv = calls[i + 1]
        entry, layout = _fold_of(gemm, picks, defer)
        n, k = (s.qkv_rows, s.hidden) if gemm == "qkv" else (s.inter, s.hidden)
        op = f"gemv{entry.removeprefix('kern_gemv_bf16')}_{n}x{k}"
        if op not in ops:
            if defer and not layout:
                grid, threads, smem = defer_launch(n)
            else:
                grid, threads, smem = gemv_launch(layout, n, k, folded=not defer)
            io = [BF16_IN, BF16_IN, BF16_IN, BF16_OUT, BF16_IN, BF16_OUT]
            launch = _kernel(mods, entry, [grid, 1, 1], threads, **({"shared_mem": smem} if smem else {}),
                             params=[*io, "i32", "i32", "i32", "i32", "f32"],
                             args=[*({"param": j} for j in range(6)), _i32(1), _i32(n), _i32(k), _i32(n), _f32(s.eps)])
            ops[op] = {"params": io, "impl": {"launches": [launch]}}
        _x, w, y = gemv["args"]
        out.append(_call(gemv["label"], op, _buf(cur), y_add, w_norm, _buf(other), w, y))
        cur, other = other, cur
        i += 2
    programs["decode"]["calls"] = out


def tail_launch(entry: str, n: int, k: int) -> tuple[int, int, int]:
    """(grid x, threads, dynamic shared bytes) of TAIL_OF[entry] for n outputs of depth k: the
    entry's launch with room for the norm's h and x (4n bytes) in its dynamic shared memory (a `_p4`
    block then holds as many columns as that fits)."""
    grid, threads, smem = gemv_launch(entry, n, k)
    smem = max(smem, 4 * n)
    if GEMV_ENTRIES[entry][0] == -2:
        grid = -(-n // (smem // (2 * k)))
    return grid, threads, smem


def tail_counters(grid: int) -> int:
    """i32 of the block counter a tail launch of `grid` blocks needs (gemv_tail.cu)."""
    return 1 + TAIL_STRIDE * -(-grid // TAIL_GROUP)


def _tail_norms(s: Qwen3Shape, mods: Mapping[str, str], picks: Picks, ops: Json, programs: Json,
                buffers: Json) -> None:
    """Each decode add + RMSNorm right after an o or down GEMV becomes that GEMV's tail (TAIL_OF): the
    pair is one call that reads the residual from the current buffer and writes the new one to the
    other (`h` / `h2` in turn) and the normed x where the norm wrote it."""
    calls = programs["decode"]["calls"]
    out: list[Json] = []
    cur, other = "h", "h2"
    for call in calls:
        prev = out[-1] if out else None
        gemm = prev["label"].rsplit(".", 1)[-1] if prev else ""
        if call["op"] != "add_rmsnorm" or gemm not in ("o", "down"):
            out.append(call if call["op"] != "add_rmsnorm" else {**call, "args": [_buf(cur), *call["args"][1:]]})
            continue
        assert prev is not None
        _res, y_add, w_norm, x_norm, *_rest = call["args"]
        x, w, y = prev["args"]
        assert y == y_add, "the norm adds the GEMV's output"
        entry = TAIL_OF[picks[gemm]]
        n, k = (s.hidden, s.heads * s.head_dim) if gemm == "o" else (s.hidden, s.inter)
        op = f"gemv{entry.removeprefix('kern_gemv_bf16')}_{n}x{k}"
        if op not in ops:
            grid, threads, smem = tail_launch(picks[gemm], n, k)
            io = [BF16_IN, BF16_IN, BF16_OUT, BF16_IN, BF16_IN, BF16_OUT, BF16_OUT, "inout buffer<i32>"]
            launch = _kernel(mods, entry, [grid, 1, 1], threads, shared_mem=smem,
                             params=[BF16_IN, BF16_IN, BF16_OUT, "i32", "i32", "i32", "i32", *io[3:], "f32"],
                             args=[*({"param": j} for j in range(3)), _i32(1), _i32(n), _i32(k), _i32(n),
                                   *({"param": j} for j in range(3, 8)), _f32(s.eps)])
            ops[op] = {"params": io, "impl": {"launches": [launch]}}
        out[-1] = _call(prev["label"], op, x, w, y, _buf(cur), w_norm, _buf(other), x_norm, _buf("norm_count"))
        cur, other = other, cur
    programs["decode"]["calls"] = out
    ops.setdefault("zero_i32", _zero_op(mods))
    count = max(tail_counters(la["grid"][0]) for op in ops.values() for la in op["impl"]["launches"]
                if la.get("entry", "").endswith("_an"))
    buffers["norm_count"] = {"dtype": "i32", "shape": [count], "kind": "carry"}
    programs["load"]["calls"].append(_call("norm_count", "zero_i32", _buf("norm_count"), _i32(count)))


def _widen_attention(s: Qwen3Shape, mods: Mapping[str, str], ops: Json) -> None:
    """The fused decode attention op launches kern_attn_decode_wide (the same ABI as
    kern_attn_decode) over DECODE_SPLITS_WIDE splits, its scratch sized to match (in place)."""
    op = ops["attn_decode_fused"]
    (launch,) = op["impl"]["launches"]
    entry = WIDE_ENTRIES[0]
    launch |= {"module": mods[entry], "entry": entry, "grid": [s.kv_heads, DECODE_SPLITS_WIDE, 1]}
    assert launch["args"][13] == _i32(DECODE_SPLITS), "kern_attn_decode's `splits` is its 14th argument"
    launch["args"][13] = _i32(DECODE_SPLITS_WIDE)
    op["impl"]["scratch"] = {
        name: {**buf, "shape": [DECODE_SPLITS_WIDE, *buf["shape"][1:]]} for name, buf in op["impl"]["scratch"].items()
    }


def _drop_pdl(ops: Json, programs: Json, gemms: Sequence[str]) -> None:
    """The decode calls of `gemms` (labels `l<i>.<gemm>` or `<gemm>`) launch without PDL, through
    `<op>.nopdl` copies of their ops (so no other call loses PDL; `generate` drops the ops no call
    uses any more)."""
    for call in programs["decode"]["calls"]:
        if call["label"].rsplit(".", 1)[-1] not in gemms:
            continue
        target = f"{call['op']}.nopdl"
        if target not in ops:
            spec = json.loads(json.dumps(ops[call["op"]]))
            for launch in spec["impl"]["launches"]:
                launch.pop("pdl", None)
            ops[target] = spec
        call["op"] = target


# --------------------------------------------------------------------------------------------
# Reference precision (`precision="f32"`, docs/qwen3.md "Reference precision (f32)"): bf16 weights
# bound as in the bf16 manifest; activations, residual, logits and the paged KV state in float32,
# through qwen3_f32.cu's plain kernels (no GEMV picks, fusion options or PDL).

PRECISIONS = ("bf16", "f32")
F32_ENTRIES: tuple[str, ...] = (
    "kern_f32_embed",
    "kern_f32_rmsnorm",
    "kern_f32_add_rmsnorm",
    "kern_f32_qk_norm_rope_kv",
    "kern_f32_attn",
    "kern_f32_gemm",
    "kern_f32_gemv",
    "kern_f32_silu_mul",
    "kern_f32_argmax_partial",
    "kern_argmax_final",
    "kern_f32_rope_table",
)
"""Entries every f32 manifest needs (module qwen3_f32, and sampling.cu's dtype-free argmax final
stage); a device-fed one adds DEVICE_FEED_ENTRIES."""
F32_GEMM_TILE = 64
"""qwen3_f32.cu's F32_GEMM_BM / F32_GEMM_BN: kern_f32_gemm's grid is [ceil_div(n, 64), ceil_div(m, 64)]."""
F32_GEMV_COLS = 8
"""qwen3_f32.cu's F32_GEMV_WARPS: output columns per kern_f32_gemv block."""
F32_ATTN_THREADS = 256
"""qwen3_f32.cu's F32_ATT_WARPS * 32."""

F32_IN, F32_OUT, F32_IO = "in buffer<f32>", "out buffer<f32>", "inout buffer<f32>"


def _f32_kv_bytes_per_token(s: Qwen3Shape) -> int:
    return s.layers * 2 * s.kv_heads * s.head_dim * 4


def _f32_kv_arg(s: Qwen3Shape, layer: int) -> Json:
    """The `kv` state at `layer`'s k block of page 0 (byte offset, f32 elements)."""
    offset = layer * 2 * PAGE_TOKENS * s.kv_heads * s.head_dim * 4
    return {"state": "kv", "offset": offset} if offset else {"state": "kv"}


def _f32_row_op(mods: Mapping[str, str], entry: str, params: list[str], grid: Sequence[Any], block: int) -> Json:
    return {"params": params, "impl": {"launches": [_kernel(mods, entry, grid, block)]}}


def _f32_ops(s: Qwen3Shape, mods: Mapping[str, str]) -> Json:
    d, nq, nkv = s.head_dim, s.heads, s.kv_heads
    i64_in, i32_in = "in buffer<i64>", "in buffer<i32>"
    return {
        "embed": _f32_row_op(mods, "kern_f32_embed", [i64_in, BF16_IN, F32_OUT, "i32"], ["tokens", 1, 1], 256),
        "rmsnorm": _f32_row_op(mods, "kern_f32_rmsnorm", [F32_IN, BF16_IN, F32_OUT, "i32", "f32"],
                               ["tokens", 1, 1], 256),
        "add_rmsnorm": _f32_row_op(mods, "kern_f32_add_rmsnorm", [F32_IO, F32_IN, BF16_IN, F32_OUT, "i32", "f32"],
                                   ["tokens", 1, 1], 256),
        "qk_norm_rope_kv": _f32_row_op(
            mods, "kern_f32_qk_norm_rope_kv",
            [F32_IO, BF16_IN, BF16_IN, i64_in, F32_IN, F32_IN, "inout state", i64_in, "i32", "i32", "i32", "f32",
             "i32", "i64"], ["tokens", nq + 2 * nkv, 1], d // 2),
        "attn": _f32_row_op(
            mods, "kern_f32_attn",
            [F32_IN, "in state", i32_in, i32_in, F32_OUT, "i32", "i32", "i32", "i32", "i32", "i64", "f32"],
            ["tokens", nq, 1], F32_ATTN_THREADS),
        "silu_mul": _f32_row_op(mods, "kern_f32_silu_mul", [F32_IN, F32_OUT, "i32"],
                                ["tokens", -(-s.inter // 1024), 1], 256),
        "argmax": _argmax_op(s, mods, "kern_f32_argmax_partial", F32_IN),
        "rope_table": _f32_row_op(mods, "kern_f32_rope_table", [F32_OUT, F32_OUT, "i32", "i32", "f32"],
                                  [s.max_pos, 1, 1], min(d // 2, 1024)),
    }


def _f32_linear_op(mods: Mapping[str, str], entry: str, n: int, k: int) -> Json:
    """y = x W^T for `m` rows (the call's 4th arg): kern_f32_gemm's tiles or kern_f32_gemv's columns."""
    if entry == "kern_f32_gemm":
        grid: list[Any] = [-(-n // F32_GEMM_TILE), {"ceil_div": ["tokens", F32_GEMM_TILE]}, 1]
    else:
        grid = [-(-n // F32_GEMV_COLS), 1, 1]
    launch = _kernel(mods, entry, grid, 256, params=[F32_IN, BF16_IN, F32_OUT, "i32", "i32", "i32"],
                     args=[{"param": 0}, {"param": 1}, {"param": 2}, {"param": 3}, _i32(n), _i32(k)])
    return {"params": [F32_IN, BF16_IN, F32_OUT, "i32"], "impl": {"launches": [launch]}}


def _f32_linear(label: str, x: str, w: str, y: str, n: int, k: int, decode: bool) -> Json:
    """A linear call; its op (`gemv_f32_<n>x<k>` in decode, `gemm_f32_<n>x<k>` in prefill) is
    built by `_f32_linear_ops`."""
    kind = "gemv" if decode else "gemm"
    return _call(label, f"{kind}_f32_{n}x{k}", _buf(x), _buf(w), _buf(y), TOKENS)


def _f32_linear_ops(mods: Mapping[str, str], programs: Json) -> Json:
    ops: Json = {}
    for call in (c for p in programs.values() for c in p["calls"]):
        kind, _f32, shape_nk = call["op"].partition("_f32_")
        if _f32 and kind in ("gemm", "gemv"):
            n, k = (int(v) for v in shape_nk.split("x"))
            ops[call["op"]] = _f32_linear_op(mods, f"kern_f32_{kind}", n, k)
    return ops


def _f32_layer_calls(s: Qwen3Shape, i: int, io: Mapping[str, str], next_norm: str, *, decode: bool,
                     last: bool) -> list[Json]:
    d, nq, nkv, h = s.head_dim, s.heads, s.kv_heads, s.hidden
    kv = _f32_kv_arg(s, i)
    calls = [
        _f32_linear(f"l{i}.qkv", "x", f"l{i}.qkv", "qkv", s.qkv_rows, h, decode),
        _call(f"l{i}.qk_norm_rope_kv", "qk_norm_rope_kv", _buf("qkv"), _buf(f"l{i}.q_norm"), _buf(f"l{i}.k_norm"),
              _buf(io["positions"]), _buf("rope_cos"), _buf("rope_sin"), kv, _buf(io["slots"]), _i32(nq),
              _i32(nkv), _i32(d), _f32(s.eps), _i32(PAGE_TOKENS), _i64(s.page_stride)),
    ]
    if last and not decode:
        return calls  # NOTE: prefill writes only KV; the last layer's attention output is never read.
    return [
        *calls,
        _call(f"l{i}.attn", "attn", _buf("qkv"), kv, _buf("block_table"), _buf(io["seq_len"]), _buf("attn"),
              TOKENS, _i32(nq), _i32(nkv), _i32(d), _i32(PAGE_TOKENS), _i64(s.page_stride), _f32(d**-0.5)),
        _f32_linear(f"l{i}.o", "attn", f"l{i}.o", "y", h, nq * d, decode),
        _call(f"l{i}.post_norm", "add_rmsnorm", _buf("h"), _buf("y"), _buf(f"l{i}.post_norm"), _buf("x"),
              _i32(h), _f32(s.eps)),
        _f32_linear(f"l{i}.gate_up", "x", f"l{i}.gate_up", "gu", 2 * s.inter, h, decode),
        _call(f"l{i}.silu_mul", "silu_mul", _buf("gu"), _buf("act"), _i32(s.inter)),
        _f32_linear(f"l{i}.down", "act", f"l{i}.down", "y", h, s.inter, decode),
        _call(f"l{i}.next_norm", "add_rmsnorm", _buf("h"), _buf("y"), _buf(next_norm), _buf("x"), _i32(h),
              _f32(s.eps)),
    ]


def _f32_forward(s: Qwen3Shape, io: Mapping[str, str], *, decode: bool) -> list[Json]:
    calls = [
        _call("embed", "embed", _buf(io["ids"]), _buf("embed"), _buf("h"), _i32(s.hidden)),
        _call("l0.in_norm", "rmsnorm", _buf("h"), _buf("l0.in_norm"), _buf("x"), _i32(s.hidden), _f32(s.eps)),
    ]
    for i in range(s.layers):
        last = i == s.layers - 1
        calls += _f32_layer_calls(s, i, io, "final_norm" if last else f"l{i + 1}.in_norm", decode=decode, last=last)
    return calls


def _f32_programs(s: Qwen3Shape, feed: str) -> Json:
    host = {k: k for k in STEP_CARRIES}
    step_io = host if feed == "host" else {k: v[0] for k, v in STEP_CARRIES.items()}
    tail = [
        _f32_linear("lm_head", "x", "embed" if s.tied else "lm_head", "logits", s.vocab, s.hidden, True),
        _call("argmax", "argmax", _buf("logits"), _buf("next_token")),
    ]
    if feed == "device":
        tail.append(_decode_tail(s, feed, {})[-1])  # kern_decode_advance over the carries
    programs: Json = {
        "load": {"once": True, "calls": [_call("rope_table", "rope_table", _buf("rope_cos"), _buf("rope_sin"),
                                               _i32(s.max_pos), _i32(s.head_dim // 2), _f32(s.theta))]},
        "prefill": {"batch": {"groups": 1, "rows": "tokens"}, "calls": _f32_forward(s, host, decode=False)},
        "decode": {"batch": {"groups": 1, "rows": 1}, "graph": True,
                   "calls": _f32_forward(s, step_io, decode=True) + tail},
    }
    if feed == "device":
        programs["start"] = {"calls": _start_calls()}
    return programs


def _f32_buffers(s: Qwen3Shape, feed: str) -> Json:
    out = _buffers(s, feed)
    for name, b in out.items():
        if b["kind"] in ("workspace", "output", "carry") and b["dtype"] == "bf16":
            out[name] = {**b, "dtype": "f32"}
    return out


def _generate_f32(shape: Qwen3Shape, modules: Mapping[str, str], entries: Mapping[str, str], *, model: str,
                  chunk: int, feed: str) -> Json:
    needed = F32_ENTRIES + (DEVICE_FEED_ENTRIES if feed == "device" else ())
    _check_needed(shape, modules, entries, needed, chunk,
                  missing_hint="precision f32 needs qwen3_f32.cu (docs/qwen3.md)",
                  unhashed_hint="build the kernels first")
    programs = _f32_programs(shape, feed)
    ops = _f32_ops(shape, entries) | (_feed_ops(entries) if feed == "device" else {}) | _f32_linear_ops(entries, programs)
    used_ops = {c["op"] for p in programs.values() for c in p["calls"]}
    return {
        "schema_version": 5,
        "model": model,
        "vars": {"tokens": {"max": chunk}},
        "states": {"kv": {"bytes_per_token": _f32_kv_bytes_per_token(shape)}},
        "buffers": _f32_buffers(shape, feed),
        "modules": {m: {"source": f"{m}-{modules[m][:12]}.cubin", "sha256": modules[m]}
                    for m in sorted({entries[e] for e in needed})},
        "ops": {name: op for name, op in ops.items() if name in used_ops},
        "programs": programs,
    }


def _f32_conflicts(*, gemv: Sequence[str], fuse: bool, pdl: bool, gemv_pick: Mapping[str, str] | None,
                   carveout: int | None, fuse_qkn: bool, pdl_off: Sequence[str], fold_norm: bool,
                   wide_attention: bool, late_trigger: bool = False, norm_tail: bool = False,
                   defer_norm: bool = False) -> list[str]:
    """The bf16-only options (as their command-line flags) that are set."""
    flags = {"--gemv": bool(gemv), "--fuse": fuse, "--pdl": pdl, "--gemv-pick": bool(gemv_pick),
             "--carveout": carveout is not None, "--fuse-qkn": fuse_qkn, "--pdl-off": bool(pdl_off),
             "--fold-norm": fold_norm, "--wide-attention": wide_attention, "--late-trigger": late_trigger,
             "--norm-tail": norm_tail, "--defer-norm": defer_norm}
    return [flag for flag, on in flags.items() if on]


# --------------------------------------------------------------------------------------------
# Facts read back from a manifest (benchmarks and tests use them).

_DTYPE_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "i32": 4, "u32": 4, "i64": 8, "u64": 8, "i8": 1, "u8": 1}


def _literal(arg: Json) -> int:
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


# --------------------------------------------------------------------------------------------
# Command line.


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="gen_qwen3", description=(__doc__ or "").splitlines()[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("config", type=Path, nargs="?", help="Hugging Face config.json of a Qwen3 model")
    src.add_argument("--preset", choices=sorted(PRESETS), help="a built-in config instead of a file")
    p.add_argument("-o", "--out", type=Path, required=True, help="manifest path to write")
    p.add_argument("--model", help="manifest model label (default: the output file's stem)")
    p.add_argument("--kernels-src", type=Path, default=Path(__file__).parent / "kernels-src")
    p.add_argument("--kernels", type=Path, default=Path("kernels"), help="cubin output dir")
    p.add_argument("--chunk", type=int, default=DEFAULT_CHUNK, help="largest prefill chunk")
    p.add_argument("--gemv", default="",
                   help=f"comma-separated decode GEMMs to run as our GEMV ({','.join(GEMV_GEMMS)}), "
                        f"'default' ({','.join(GEMV_DEFAULT)}) or 'all'; empty: all cublasLt")
    p.add_argument("--fuse", action="store_true",
                   help="q/k norm + rope writes the KV pages; decode attention in one launch")
    p.add_argument("--pdl-off", default="", metavar="GEMMS",
                   help="with --pdl: comma-separated decode GEMMs launched without PDL (an experiment)")
    p.add_argument("--fold-norm", action="store_true",
                   help="the add + RMSNorm before qkv and gate_up in those GEMVs' prologue (gemv_norm.cu)")
    p.add_argument("--fuse-qkn", action="store_true",
                   help="with --fuse: decode attention also norms / rotates q and k and writes the KV row")
    p.add_argument("--wide-attention", action="store_true",
                   help="with --fuse: decode attention combines per cluster of 8 splits first (attention_wide.cu), "
                        f"at {DECODE_SPLITS_WIDE} splits")
    p.add_argument("--defer-norm", action="store_true",
                   help="with --fold-norm: qkv and gate_up apply the norm's scale in their epilogue (gemv_defer.cu)")
    p.add_argument("--norm-tail", action="store_true",
                   help="the add + RMSNorm after o and down in those GEMVs' last block (gemv_tail.cu); "
                        "not with --fold-norm")
    p.add_argument("--late-trigger", action="store_true",
                   help="with --fuse --pdl: the decode attention lets o's GEMV start only after its fold "
                        "(attention_wide.cu's _late entries)")
    p.add_argument("--gemv-pick", type=Path, default=None,
                   help="JSON {gemm: entry} overriding GEMV_PICK (time_gemv.py --entries writes one)")
    p.add_argument("--pdl", action="store_true",
                   help="programmatic dependent launch on every decode kernel (needs --gemv all)")
    p.add_argument("--carveout", type=int, default=None,
                   help="every kernel's preferred shared-memory carveout, percent 0..100 (default: the driver's)")
    p.add_argument("--capture", type=Path, default=None,
                   help="a capture of the donor (tools/donor under kern-mine capture): pin the "
                        "cubins it ran (kern kernels --from DIR MANIFEST copies them); the "
                        "generator's constants must equal the mined ones, and the manifest is "
                        "checked against the mined entries, parameter tables, literals, grids and "
                        "wiring before it is written")
    p.add_argument("--precision", choices=PRECISIONS, default="bf16",
                   help="f32: the reference-precision manifest (qwen3_f32.cu: float32 activations, "
                        "residual, logits and KV cache over the bf16 weights; no speed options)")
    p.add_argument("--feed", choices=FEEDS, default=None,
                   help="who writes the decode step's inputs (default: device when the kernel "
                        "sources define the copy and advance kernels, else host)")
    return p.parse_args(argv)


def _qwen3_mined() -> ModuleType:
    import importlib.util

    spec = importlib.util.spec_from_file_location("qwen3_mined", Path(__file__).parent / "qwen3_mined.py")
    assert spec is not None and spec.loader is not None
    mined = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("qwen3_mined", mined)
    spec.loader.exec_module(mined)
    return mined


def captured_modules(capture: Path, entries: Mapping[str, str]) -> dict[str, str]:
    """module -> sha256 of the cubin the donor's capture ran for it (the pins `--capture` writes;
    `kern kernels --from CAPTURE MANIFEST` then copies those cubins out of the dump).

    Raises:
        GenError: the capture cannot be mined, or one module ran two different cubins.
    """
    from kern_mining import DumpError

    mined = _qwen3_mined()
    try:
        consts = mined.generator_constants(mined.mined_facts(capture))
    except (mined.MinedError, DumpError) as exc:
        raise GenError(f"capture {capture}: {exc}") from exc
    modules: dict[str, str] = {}
    for entry, sha in sorted(consts.entry_modules.items()):
        module = entries.get(entry)
        if module is not None and modules.setdefault(module, sha) != sha:
            raise GenError(f"capture {capture}: module {module} ran two cubins ({modules[module][:12]}, {sha[:12]})")
    return modules


def _against_capture(manifest: Json, capture: Path) -> list[str]:
    """What a capture of the donor says against this manifest: the generator's constants as mined
    (PAGE_TOKENS, DECODE_SPLITS, PREFILL_BM, ARGMAX_PARTS), then every launch's entry, module
    sha256, parameter table, literals, grid and the wiring asserted by tools/qwen3_mined.py.
    Empty: it agrees."""
    from kern_mining import DumpError

    mined = _qwen3_mined()
    try:
        facts = mined.mined_facts(capture)
        consts = mined.generator_constants(facts)
    except (mined.MinedError, DumpError) as exc:
        return [str(exc)]
    ours = {"page_tokens": PAGE_TOKENS, "decode_splits": DECODE_SPLITS, "argmax_parts": ARGMAX_PARTS}
    problems = [f"{k} is {v} here but {getattr(consts, k)} in the capture"
                for k, v in ours.items() if getattr(consts, k) != v]
    if consts.prefill_bm is not None and consts.prefill_bm != PREFILL_BM:
        problems.append(f"prefill_bm is {PREFILL_BM} here but {consts.prefill_bm} in the capture")
    return problems + list(mined.check_against(manifest, facts))


PRESETS = ("qwen3-4b", "qwen3-tiny")


def _preset(name: str) -> Mapping[str, Any]:
    from kern_cli.checkpoint import QWEN3_4B_CONFIG, QWEN3_TINY_CONFIG

    return {"qwen3-4b": QWEN3_4B_CONFIG, "qwen3-tiny": QWEN3_TINY_CONFIG}[name]


def build_and_hash(src: Path, out: Path) -> dict[str, str]:
    """Build the kernels (cached by hash) and return module -> sha256."""
    from kern_cli.kernels_cmd import build_kernels

    return {module: sha for module, (_path, sha) in build_kernels(src, out).items()}


def main(argv: Sequence[str] | None = None) -> int:
    from kern_cli.kernels_cmd import KernelBuildError

    args = _parse(argv)
    try:
        cfg = _preset(args.preset) if args.preset else json.loads(args.config.read_text())
        shape = shape_from_config(cfg)
        entries = entry_modules(args.kernels_src)
        modules = (captured_modules(args.capture, entries) if args.capture is not None
                   else build_and_hash(args.kernels_src, args.kernels))
        feed = args.feed or ("device" if all(e in entries for e in DEVICE_FEED_ENTRIES) else "host")
        named = {"default": list(GEMV_DEFAULT), "all": list(GEMV_GEMMS)}
        gemv = named.get(args.gemv) or [g for g in args.gemv.split(",") if g]
        manifest = generate(shape, modules, entries, model=args.model or args.out.stem,
                            chunk=args.chunk, feed=feed, gemv=gemv, fuse=args.fuse, pdl=args.pdl, fuse_qkn=args.fuse_qkn,
                            wide_attention=args.wide_attention, late_trigger=args.late_trigger,
                            norm_tail=args.norm_tail, defer_norm=args.defer_norm,
                            pdl_off=[g for g in args.pdl_off.split(",") if g], fold_norm=args.fold_norm,
                            gemv_pick=json.loads(args.gemv_pick.read_text()) if args.gemv_pick else None,
                            carveout=args.carveout, precision=args.precision)
    except (OSError, json.JSONDecodeError, GenError, KernelBuildError) as exc:
        print(f"gen_qwen3: {exc}", file=sys.stderr)
        return 2
    if args.capture is not None:
        problems = _against_capture(manifest, args.capture)
        for line in problems:
            print(f"gen_qwen3: capture {args.capture}: {line}", file=sys.stderr)
        if problems:
            return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(manifest, indent=1) + "\n")
    n_decode = len(manifest["programs"]["decode"]["calls"])
    print(f"gen_qwen3: wrote {args.out} ({len(manifest['buffers'])} buffers, decode {n_decode} calls, "
          f"{decode_weight_bytes(manifest) / 1e9:.3f} GB of weights per decode step)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
