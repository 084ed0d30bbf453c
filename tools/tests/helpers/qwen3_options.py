"""Tests' shorthand for a kern_qwen3 manifest from the generator's flags as keywords."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import kern_qwen3 as gen


def plan_of(*, chunk: int = gen.DEFAULT_CHUNK, feed: str = "host", precision: str = "bf16",
            gemv: Sequence[str] = (), fuse: bool = False, pdl: bool = False, fold_norm: bool = False,
            defer_norm: bool = False, gemv_pick: Mapping[str, str] | None = None) -> gen.Plan:
    """The Plan of `kern-qwen3`'s flags (`gemv_pick` overrides GEMV_PICK per GEMM)."""
    picks = {**gen.GEMV_PICK, **(gemv_pick or {})}
    passes = gen.plan_passes(fold_norm=fold_norm, defer_norm=defer_norm, pdl=pdl)
    return gen.Plan(chunk=chunk, feed=feed, precision=precision, gemv=tuple(gemv), fuse=fuse,  # type: ignore[arg-type]
                    picks=picks, passes=passes)


def generate(shape: gen.Qwen3Shape, modules: Mapping[str, str], entries: Mapping[str, str], *, model: str,
             **options: Any) -> dict[str, Any]:
    """kern_qwen3.generate with the plan of `options` (plan_of's keywords)."""
    return gen.generate(shape, modules, entries, model=model, plan=plan_of(**options))
