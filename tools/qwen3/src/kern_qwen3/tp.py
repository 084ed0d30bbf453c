"""Tensor-parallel Qwen3: the TP-N manifest, one SPMD manifest every rank of topology group `tp`
loads with its own rank.

Each rank holds heads / N attention heads (and kv_heads / N kv heads, so its KV pages are 1 / N of
the plain manifest's), inter / N MLP columns and vocab / N rows of lm_head:

- qkv and gate_up are split by output rows (q, k, v and gate, up each by head or column band), so
  every rank computes its heads' attention and its band of the SiLU product with no exchange;
- o and down are split by input columns: each rank's GEMM gives a partial sum of the whole hidden
  vector, and an in-place `extern:nccl_allreduce_bf16` over `y` follows each (2 per layer);
- lm_head is split by vocabulary rows: each rank writes its logits band into `logits_part`, and an
  `extern:nccl_allgather_bf16` puts the bands in rank order into `logits`, which every rank's
  argmax reads, so every rank picks the same token.

The norms, the embedding and the residual stream are replicated. Weights bind by rank from the one
Hugging Face checkpoint (`{"group": "tp", "ranges": [...]}` row / column windows). The manifest is
the plain generator's output at the per-rank shape (`rank_shape`), rewritten by `tensor_parallel`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from kern_qwen3.errors import GenError
from kern_qwen3.fragments import Json, buf, call, gemm_of, i32
from kern_qwen3.generate import generate
from kern_qwen3.plan import Plan
from kern_qwen3.shape import Qwen3Shape

__all__ = ["GROUP", "generate_tp", "rank_shape", "tensor_parallel", "tp_weights"]

GROUP = "tp"
"""The topology group of a TP-N manifest."""

_REDUCED = ("o", "down")


def rank_shape(s: Qwen3Shape, n: int) -> Qwen3Shape:
    """The shape one of `n` ranks computes: heads, kv heads and MLP width divided by `n`.

    Raises:
        GenError: `n` < 1, or it does not divide the kv heads, the MLP width or the vocabulary.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:  # pyright: ignore[reportUnnecessaryIsInstance]
        raise GenError(f"tp must be a positive integer, got {n!r}")
    bad = [f"{what} {v}" for what, v in (("kv heads", s.kv_heads), ("intermediate_size", s.inter),
                                         ("vocab", s.vocab)) if v % n]
    if bad:
        raise GenError(f"tp {n} must divide the {', '.join(bad)}")
    return dataclasses.replace(s, heads=s.heads // n, kv_heads=s.kv_heads // n, inter=s.inter // n)


def _bands(width: int, n: int) -> Json:
    return {"group": GROUP, "ranges": [[r * width, (r + 1) * width] for r in range(n)]}


def _seg(tensor: str, n: int, width: int, axis: str) -> Json:
    return {"tensor": tensor, axis: _bands(width, n)}


def tp_weights(s: Qwen3Shape, n: int) -> Json:
    """The split weight buffers of a TP-`n` manifest (the others stay as the plain manifest binds
    them), each bound by rank."""
    r = rank_shape(s, n)
    h, d = s.hidden, s.head_dim
    out: Json = {}
    for i in range(s.layers):
        p = f"model.layers.{i}"
        out[f"l{i}.qkv"] = {"dtype": "bf16", "shape": [r.qkv_rows, h], "kind": "weight", "bind": [
            _seg(f"{p}.self_attn.q_proj.weight", n, r.heads * d, "rows"),
            _seg(f"{p}.self_attn.k_proj.weight", n, r.kv_heads * d, "rows"),
            _seg(f"{p}.self_attn.v_proj.weight", n, r.kv_heads * d, "rows")]}
        out[f"l{i}.o"] = {"dtype": "bf16", "shape": [h, r.heads * d], "kind": "weight",
                          "bind": [_seg(f"{p}.self_attn.o_proj.weight", n, r.heads * d, "cols")]}
        out[f"l{i}.gate_up"] = {"dtype": "bf16", "shape": [2 * r.inter, h], "kind": "weight", "bind": [
            _seg(f"{p}.mlp.gate_proj.weight", n, r.inter, "rows"),
            _seg(f"{p}.mlp.up_proj.weight", n, r.inter, "rows")]}
        out[f"l{i}.down"] = {"dtype": "bf16", "shape": [h, r.inter], "kind": "weight",
                             "bind": [_seg(f"{p}.mlp.down_proj.weight", n, r.inter, "cols")]}
    head = "model.embed_tokens.weight" if s.tied else "lm_head.weight"
    out["lm_head"] = {"dtype": "bf16", "shape": [s.vocab // n, h], "kind": "weight",
                      "bind": [_seg(head, n, s.vocab // n, "rows")]}
    return out


def _collective_op(verb: str) -> Json:
    io = ["in buffer<bf16>", "out buffer<bf16>", "i64"]
    launch = {"entry": f"extern:nccl_{verb}_bf16",
              "args": [{"param": 0}, {"param": 1}, {"param": 2}, {"rank": GROUP}]}
    return {"params": io, "impl": {"launches": [launch]}}


def _allreduce_after(calls: list[Json], hidden: int, rows: Any) -> list[Json]:
    out: list[Json] = []
    for c in calls:
        out.append(c)
        if gemm_of(c.get("label", "")) in _REDUCED and c["label"].count(".") == 1:
            count = {"expr": {"mul": [rows, hidden]}} if isinstance(rows, str) else {"i64": rows * hidden}
            out.append(call(f"{c['label']}.allreduce", "allreduce_bf16", buf("y"), buf("y"), count))
    return out


def _split_lm_head(calls: list[Json], s: Qwen3Shape, n: int) -> list[Json]:
    out: list[Json] = []
    for c in calls:
        if c.get("label") != "lm_head":
            out.append(c)
            continue
        if c["op"] != "gemm":
            raise GenError("tp splits lm_head as a cublasLt GEMM: leave lm_head out of --gemv")
        x, _w, _y, m, _n, k = c["args"]
        out.append(call("lm_head", "gemm", x, buf("lm_head"), buf("logits_part"), m, i32(s.vocab // n), k))
        out.append(call("lm_head.allgather", "allgather_bf16", buf("logits_part"), buf("logits"),
                        {"i64": s.vocab // n}))
    return out


def tensor_parallel(manifest: Json, s: Qwen3Shape, n: int) -> Json:
    """Rewrites a manifest generated at `rank_shape(s, n)` into the TP-`n` manifest (a new object).

    Raises:
        GenError: the manifest's lm_head is not a cublasLt GEMM, or `n` does not divide the shape.
    """
    rank_shape(s, n)
    out = {**manifest, "topology": {"groups": {GROUP: n}}}
    buffers = dict(manifest["buffers"])
    if s.tied:
        buffers.pop("lm_head", None)
    for name, spec in tp_weights(s, n).items():
        buffers[name] = spec
    logits = buffers["logits"]
    buffers["logits_part"] = {"dtype": logits["dtype"], "shape": [1, s.vocab // n], "kind": "workspace"}
    out["buffers"] = _ordered(buffers, manifest["buffers"])
    out["ops"] = {**manifest["ops"], "allreduce_bf16": _collective_op("allreduce"),
                  "allgather_bf16": _collective_op("allgather")}
    programs = {name: dict(p) for name, p in manifest["programs"].items()}
    programs["prefill"]["calls"] = _allreduce_after(list(programs["prefill"]["calls"]), s.hidden, "tokens")
    decode = _allreduce_after(list(programs["decode"]["calls"]), s.hidden, 1)
    programs["decode"]["calls"] = _split_lm_head(decode, s, n)
    out["programs"] = programs
    return {k: out[k] for k in ("schema_version", "model", "topology", "vars", "states", "buffers", "modules",
                                 "ops", "programs")}


def _ordered(buffers: Mapping[str, Json], before: Mapping[str, Json]) -> Json:
    """`buffers` in the plain manifest's order, new names last."""
    names = [b for b in before if b in buffers] + [b for b in buffers if b not in before]
    return {b: buffers[b] for b in names}


def generate_tp(shape: Qwen3Shape, modules: Mapping[str, str], entries: Mapping[str, str], *, model: str,
                tp: int, plan: Plan | None = None) -> Json:
    """The TP-`tp` manifest of one Qwen3 shape (see the module doc).

    Raises:
        GenError: `tp` does not divide the shape, the plan is f32 or over FP8 weights, or lm_head is a GEMV.
        KernelsError: as `generate`.
    """
    plan = plan or Plan()
    if plan.precision == "f32":
        raise GenError("tp runs the bf16 manifest: drop --precision f32")
    if plan.weights != "bf16":
        raise GenError(f"tp splits bf16 weights; FP8 weights ({plan.weights}) are not split by rank: drop --weights")
    if "lm_head" in plan.gemv:
        raise GenError("tp splits lm_head as a cublasLt GEMM: leave lm_head out of --gemv")
    # NOTE: no head program: its calls would need the allreduces and the lm_head split too
    base = generate(rank_shape(shape, tp), modules, entries, model=model, plan=dataclasses.replace(plan, head=False))
    return tensor_parallel(base, shape, tp)
