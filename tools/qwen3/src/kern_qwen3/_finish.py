"""The checks every manifest passes before it is built, and the last step of building it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kern_qwen3.entries import DECODE_CLUSTER, DECODE_ROWS_MAX_GROUP, DECODE_SPLITS
from kern_qwen3.errors import KernelsError
from kern_qwen3.fragments import Json
from kern_qwen3.shape import Qwen3Shape

__all__ = ["check_kernel_limits", "check_needed", "finish"]


def check_kernel_limits(s: Qwen3Shape, *, attn_rows: bool = False, attn_one: bool = False) -> None:
    """What tools/kernels-src supports (its comments): vector widths and the attention's GQA tiling
    (`attn_rows`: the manifest runs kern_attn_decode_one or kern_attn_decode_rows, fused or batched
    step: their limits too; `attn_one`: kern_attn_decode_one, the fused one-row step: its clusters).

    Raises:
        KernelsError: the shape is outside what the kernels hold.
    """
    group = s.heads // s.kv_heads
    problems = [
        *([f"head_dim {s.head_dim} (needs 64 or 128)"] if s.head_dim not in (64, 128) else []),
        *([f"{group} query heads per kv head (needs <= 8 or a multiple of 8)"] if group > 8 and group % 8 else []),
        *([f"hidden_size {s.hidden} (needs a multiple of 8)"] if s.hidden % 8 else []),
        *([f"intermediate_size {s.inter} (needs a multiple of 8)"] if s.inter % 8 else []),
        *([f"DECODE_SPLITS {DECODE_SPLITS} (kern_attn_decode_one needs a multiple of {DECODE_CLUSTER})"]
          if attn_one and DECODE_SPLITS % DECODE_CLUSTER else []),
        *([f"{group} query heads per kv head in kern_attn_decode_rows (needs <= {DECODE_ROWS_MAX_GROUP})"]
          if attn_rows and group > DECODE_ROWS_MAX_GROUP else []),
    ]
    if problems:
        raise KernelsError("our kernels do not support " + "; ".join(problems))


def check_needed(modules: Mapping[str, str], entries: Mapping[str, str], needed: Sequence[str], *,
                 missing_hint: str, unhashed_hint: str) -> None:
    """Raises KernelsError when a needed entry is not in the kernel sources or its module has no hash."""
    missing = [e for e in needed if e not in entries]
    if missing:
        raise KernelsError(f"kernel sources define no {', '.join(missing)}: {missing_hint}")
    unhashed = sorted({entries[e] for e in needed} - set(modules))
    if unhashed:
        raise KernelsError(f"no sha256 for module(s) {', '.join(unhashed)}: {unhashed_hint}")


def finish(manifest: Json, modules: Mapping[str, str], *, model: str, chunk: int, kv_bytes_per_token: int,
           layers: int, rows: int = 0) -> Json:
    """The manifest document: the ops no call uses dropped, the modules the launches use pinned
    (`rows`: the batched step's `rows` var max, 0 for none); the KV state declares its pages as
    `layers` slices (a page is [layer][k|v][page_tokens][nkv][head_dim], every call reads one layer).

    Raises:
        KernelsError: a launch's module has no hash.
    """
    used_ops = {c["op"] for p in manifest["programs"].values() for c in p["calls"]}
    ops = {name: op for name, op in manifest["ops"].items() if name in used_ops}
    used = sorted({la["module"] for op in ops.values() for la in op["impl"]["launches"] if "module" in la})
    unhashed = [m for m in used if m not in modules]
    if unhashed:
        raise KernelsError(f"no sha256 for module(s) {', '.join(unhashed)}: build the kernels first")
    return {
        "schema_version": 5,
        "model": model,
        "vars": {"tokens": {"max": chunk}, **({"rows": {"max": rows}} if rows else {})},
        "states": {"kv": {"bytes_per_token": kv_bytes_per_token, "slices": layers}},
        "buffers": manifest["buffers"],
        "modules": {m: {"source": f"{m}-{modules[m][:12]}.cubin", "sha256": modules[m]} for m in used},
        "ops": ops,
        "programs": manifest["programs"],
    }
