"""Qwen3 shape + kernel hashes + a `Plan` -> a kern manifest (a JSON object, schema v5).

The layout, kernels and programs follow docs/qwen3.md. Weights bind straight onto the Hugging Face
checkpoint names (q/k/v and gate/up concatenated in the bind); a tied lm_head reads the embedding
buffer. `precision="f32"` plans go to `f32.generate_f32`.
"""

from __future__ import annotations

from collections.abc import Mapping

from kern_qwen3._finish import check_kernel_limits, check_needed, finish
from kern_qwen3.entries import (
    DEVICE_FEED_ENTRIES,
    ENTRIES,
    FUSED_ENTRIES,
    ROWS_ENTRIES,
    UNFUSED_ENTRIES,
    silu_entries,
)
from kern_qwen3.errors import GenError
from kern_qwen3.f32 import generate_f32
from kern_qwen3.fp8 import apply_fp8
from kern_qwen3.fragments import BF16_IN, BF16_OUT, Json, i32, kernel
from kern_qwen3.gemv import gemv_launch
from kern_qwen3.head import add_head
from kern_qwen3.ops import base_ops, feed_ops
from kern_qwen3.plan import Context, Plan
from kern_qwen3.programs import buffers, forward_calls, gemv_op_name, programs
from kern_qwen3.rows import ROW_CARRIES, add_rows
from kern_qwen3.shape import Qwen3Shape

__all__ = ["generate"]


def _gemv_op(plan: Plan, mods: Mapping[str, str], entry: str, n: int, k: int) -> Json:
    grid, threads, smem = gemv_launch(entry, n, k, table=plan.table)
    extra: Json = {"shared_mem": smem} if smem else {}
    launch = kernel(
        mods, entry, [grid, 1, 1], threads, **extra,
        params=[BF16_IN, BF16_IN, BF16_OUT, "i32", "i32", "i32", "i32"],
        args=[{"param": 0}, {"param": 1}, {"param": 2}, i32(1), i32(n), i32(k), i32(n)],
    )
    return {"params": [BF16_IN, BF16_IN, BF16_OUT], "impl": {"launches": [launch]}}


def _base(shape: Qwen3Shape, entries: Mapping[str, str], plan: Plan, picks: Mapping[str, str]) -> Json:
    """The manifest before the passes: ops, programs and buffers of the plain (or fused) step."""
    skip = () if plan.fuse else FUSED_ENTRIES
    ops = base_ops(shape, {e: m for e, m in entries.items() if e not in skip})
    ops |= feed_ops(entries) if plan.feed == "device" else {}
    progs = programs(shape, plan.feed, picks, plan.fuse, silu_entries(plan.table))
    used_ops = {c["op"] for p in progs.values() for c in p["calls"]}
    gemv_ops = {gemv_op_name(e, 1, 1).removesuffix("_1x1"): e for e in picks.values()}
    for op in sorted(o for o in used_ops if o.startswith("gemv")):
        prefix, shape_nk = op.rsplit("_", 1)
        n, k = (int(v) for v in shape_nk.split("x"))
        ops[op] = _gemv_op(plan, entries, gemv_ops[prefix], n, k)
    manifest: Json = {"buffers": buffers(shape, plan.feed, plan.fuse), "ops": ops, "programs": progs}
    if plan.rows:
        row_io = {k: v[0] for k, v in ROW_CARRIES.items()}
        add_rows(manifest, shape, entries, plan.rows, forward_calls(shape, row_io, decode=True, fuse=plan.fuse))
    return manifest


def generate(shape: Qwen3Shape, modules: Mapping[str, str], entries: Mapping[str, str], *, model: str,
             plan: Plan | None = None) -> Json:
    """Build the manifest (a JSON object) for one Qwen3 shape.

    Args:
        shape: the model's numbers (`shape_from_config`).
        modules: module name -> sha256 of its cubin.
        entries: kernel entry -> module name (`entry_modules`).
        model: the manifest's `model` label.
        plan: the options (default: `Plan()`, all cublasLt, host-fed).

    Raises:
        GenError: a pass cannot apply to this plan and shape, or the chunk exceeds the model.
        KernelsError: an entry is missing, or its module has no hash.
    """
    plan = plan or Plan()
    if plan.precision == "f32":
        return generate_f32(shape, modules, entries, model=model, chunk=plan.chunk, feed=plan.feed)
    picks = plan.picked()
    base = tuple(e for e in ENTRIES if not (plan.fuse and e in UNFUSED_ENTRIES))
    needed = (base + (DEVICE_FEED_ENTRIES if plan.feed == "device" else ())
              + tuple(sorted(set(picks.values()))) + (FUSED_ENTRIES if plan.fuse else ()) + plan.needs(shape)
              + (ROWS_ENTRIES if plan.rows else ()))
    check_needed(modules, entries, needed, missing_hint="see docs/qwen3.md",
                 unhashed_hint="build the kernels first (with --capture: the capture ran none of their kernels)")
    check_kernel_limits(shape, attn_rows=plan.fuse or plan.rows > 0, attn_one=plan.fuse)
    manifest = _base(shape, entries, plan, picks)
    if plan.weights != "bf16":
        apply_fp8(manifest, shape, entries, plan.weights)
    ctx = Context(shape=shape, plan=plan, picks=picks, entries=entries)
    for rewrite in plan.passes:
        try:
            rewrite(manifest, ctx)
        except KeyError as exc:
            raise GenError(f"pass {rewrite.name}: no {exc} in the manifest it rewrites") from exc
    if plan.head:
        add_head(manifest, shape, plan.feed)
    return finish(manifest, modules, model=model, chunk=plan.chunk, kv_bytes_per_token=shape.kv_bytes_per_token,
                  layers=shape.layers, rows=plan.rows)
