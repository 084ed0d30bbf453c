"""The lab's generator experiments as passes (`kern_qwen3.Pass`): each rewrites the generated
manifest; a lab plan lists them beside the product's (`variants`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kern_lab.entries import (
    CLUSTER_ENTRY,
    DECODE_CLUSTER,
    DECODE_SPLITS_WIDE,
    FOLD_ENTRIES,
    FOLDED,
    LATE_ENTRIES,
    QKN_MAX_GROUP,
    TAIL_GROUP,
    TAIL_OF,
    TAIL_STRIDE,
    WIDE_ENTRY,
)
from kern_qwen3 import (
    DECODE_SPLITS,
    GEMV_GEMMS,
    Context,
    GenError,
    Layout,
    Plan,
    Qwen3Shape,
    add_workspace,
    fold_norms,
    fold_shape,
    gemv_launch,
    silu_entries,
)
from kern_qwen3.fragments import BF16_IN, BF16_OUT, gemm_of, i32
from kern_qwen3.gemv import Launch
from kern_qwen3.shape import PAGE_TOKENS

Json = dict[str, Any]
"""A JSON object of the manifest."""

__all__ = [
    "Carveout",
    "FoldNorms",
    "LateTrigger",
    "NormTail",
    "PdlOff",
    "Qkn",
    "RowsPlan",
    "Splits",
    "tail_counters",
    "tail_launch",
]

def _fused_launch(manifest: Json) -> Json:
    (launch,) = manifest["ops"]["attn_decode_fused"]["impl"]["launches"]
    return launch


def _cluster_launch(manifest: Json, ctx: Context) -> Json:
    """The fused attention's launch, turned from kern_attn_decode_one into kern_attn_decode
    (attention_cluster.cu, the same args but the table stride, no dynamic shared memory) in place."""
    launch = _fused_launch(manifest)
    if launch["entry"] == "kern_attn_decode_one":
        # NOTE: the rows entry's 14th parameter, table_stride, is the one kern_attn_decode lacks.
        launch["params"] = [*launch["params"][:13], *launch["params"][14:]]
        launch["args"] = [*launch["args"][:13], *launch["args"][14:]]
        launch.pop("shared_mem", None)
        launch |= {"module": ctx.entries[CLUSTER_ENTRY], "entry": CLUSTER_ENTRY}
    return launch


def _needs_fuse(plan: Plan, what: str) -> None:
    if not plan.fuse:
        raise GenError(f"{what} rewrites the fused decode attention: it needs fuse (--fuse)")


@dataclass(frozen=True, slots=True)
class FoldNorms:
    """The add + RMSNorm before qkv and gate_up in those GEMVs' prologue (gemv_norm.cu, gemv_ring.cu,
    gemv_pnorm.cu): a pick with a FOLDED form folds into its own layout, any other into
    FOLD_ENTRIES' band; the residual alternates between `h` and `h2`."""

    name: str = "fold_norm"

    def needs(self, plan: Plan, shape: Qwen3Shape) -> tuple[str, ...]:
        """The folded entries of the qkv and gate_up picks."""
        if not {"qkv", "gate_up"} <= set(plan.gemv):
            raise GenError("fold_norm runs the norms inside the qkv and gate_up GEMVs: it needs both as our GEMV")
        picks = plan.picked()
        if picks["gate_up"] not in silu_entries(plan.table):
            raise GenError(f"fold_norm needs gate_up on a SiLU entry, not {picks['gate_up']}")
        return tuple(FOLDED.get(picks[g], FOLD_ENTRIES[g][0]) for g in FOLD_ENTRIES)

    def __call__(self, manifest: Json, ctx: Context) -> None:
        """Folds the norms before qkv and gate_up into their prologues (in place)."""
        def fold_of(gemm: str, picks: Mapping[str, str]) -> tuple[str, Launch]:
            n, k = fold_shape(ctx.shape, gemm)
            pick = picks[gemm]
            entry, layout = (FOLDED[pick], pick) if pick in FOLDED else FOLD_ENTRIES[gemm]
            return entry, gemv_launch(layout, n, k, folded=True, table=ctx.plan.table)
        fold_norms(manifest, ctx, fold_of)


def tail_launch(entry: str, n: int, k: int) -> Launch:
    """The launch of TAIL_OF[entry] for n outputs of depth k: the entry's launch with room for the
    norm's h and x (4n bytes) in its dynamic shared memory (a `_p4` block then holds as many columns
    as that fits)."""
    from kern_qwen3 import GEMV_ENTRIES

    grid, threads, smem = gemv_launch(entry, n, k)
    smem = max(smem, 4 * n)
    if GEMV_ENTRIES[entry].layout is Layout.PREFETCH:
        grid = -(-n // (smem // (2 * k)))
    return grid, threads, smem


def tail_counters(grid: int) -> int:
    """i32 of the block counter a tail launch of `grid` blocks needs (gemv_tail.cu)."""
    return 1 + TAIL_STRIDE * -(-grid // TAIL_GROUP)


@dataclass(frozen=True, slots=True)
class NormTail:
    """Each decode add + RMSNorm right after an o or down GEMV runs in that GEMV's last block
    (TAIL_OF; gemv_tail.cu), which writes x for the GEMV after it; the residual alternates between
    `h` and `h2`; the block counters live in a `norm_count` carry the load program zeroes."""

    name: str = "norm_tail"

    def needs(self, plan: Plan, shape: Qwen3Shape) -> tuple[str, ...]:
        """The tail forms of the o and down picks, and kern_zero_i32."""
        if not {"o", "down"} <= set(plan.gemv):
            raise GenError("norm_tail runs the norms in the o and down GEMVs: it needs both as our GEMV")
        picks = plan.picked()
        if any(picks[g] not in TAIL_OF for g in ("o", "down")):
            raise GenError(f"norm_tail needs o and down on an entry with a tail ({', '.join(TAIL_OF)}), "
                           f"not o {picks['o']} / down {picks['down']}")
        return (*(TAIL_OF[picks[g]] for g in ("o", "down")), "kern_zero_i32")

    def _op(self, ctx: Context, gemm: str) -> tuple[str, Json]:
        s, pick = ctx.shape, ctx.picks[gemm]
        entry = TAIL_OF[pick]
        n, k = (s.hidden, s.heads * s.head_dim) if gemm == "o" else (s.hidden, s.inter)
        grid, threads, smem = tail_launch(pick, n, k)
        io = [BF16_IN, BF16_IN, BF16_OUT, BF16_IN, BF16_IN, BF16_OUT, BF16_OUT, "inout buffer<i32>"]
        launch = {"module": ctx.entries[entry], "entry": entry, "block": [threads, 1, 1], "grid": [grid, 1, 1],
                  "shared_mem": smem, "params": [BF16_IN, BF16_IN, BF16_OUT, "i32", "i32", "i32", "i32", *io[3:], "f32"],
                  "args": [*({"param": j} for j in range(3)), i32(1), i32(n), i32(k), i32(n),
                           *({"param": j} for j in range(3, 8)), {"f32": s.eps}]}
        return f"gemv{entry.removeprefix('kern_gemv_bf16')}_{n}x{k}", {"params": io, "impl": {"launches": [launch]}}

    def __call__(self, manifest: Json, ctx: Context) -> None:
        """Moves the norms after o and down into those GEMVs' last blocks (in place)."""
        ops: Json = manifest["ops"]
        out: list[Json] = []
        cur, other = "h", "h2"
        for c in manifest["programs"]["decode"]["calls"]:
            prev = out[-1] if out else None
            if c["op"] != "add_rmsnorm" or prev is None or gemm_of(prev["label"]) not in ("o", "down"):
                out.append(c if c["op"] != "add_rmsnorm" else {**c, "args": [{"buf": cur}, *c["args"][1:]]})
                continue
            _res, _y_add, w_norm, x_norm, *_rest = c["args"]
            x, w, y = prev["args"]
            op, spec = self._op(ctx, gemm_of(prev["label"]))
            ops.setdefault(op, spec)
            out[-1] = {"label": prev["label"], "op": op,
                       "args": [x, w, y, {"buf": cur}, w_norm, {"buf": other}, x_norm, {"buf": "norm_count"}]}
            cur, other = other, cur
        manifest["programs"]["decode"]["calls"] = out
        add_workspace(manifest, "h2", [ctx.shape.hidden], after="act")
        ops.setdefault("zero_i32", {"params": ["out buffer<i32>", "i32"], "impl": {"launches": [{
            "module": ctx.entries["kern_zero_i32"], "entry": "kern_zero_i32", "block": [32, 1, 1],
            "grid": [1, 1, 1]}]}})
        count = max(tail_counters(la["grid"][0]) for o in ops.values() for la in o["impl"]["launches"]
                    if la.get("entry", "").endswith("_an"))
        manifest["buffers"]["norm_count"] = {"dtype": "i32", "shape": [count], "kind": "carry"}
        manifest["programs"]["load"]["calls"].append(
            {"label": "norm_count", "op": "zero_i32", "args": [{"buf": "norm_count"}, i32(count)]})


@dataclass(frozen=True, slots=True)
class Qkn:
    """Decode attention also norms and rotates q and k and writes the step's KV row
    (kern_attn_decode_qkn, attention_qkn.cu): no q/k-norm launch in the decode step."""

    name: str = "fuse_qkn"

    def needs(self, plan: Plan, shape: Qwen3Shape) -> tuple[str, ...]:
        """kern_attn_decode_qkn."""
        _needs_fuse(plan, self.name)
        if shape.heads // shape.kv_heads > QKN_MAX_GROUP:
            raise GenError(f"fuse_qkn holds at most {QKN_MAX_GROUP} query heads per kv head in shared memory")
        return ("kern_attn_decode_qkn",)

    def _op(self, ctx: Context) -> Json:
        s = ctx.shape
        d, nq, nkv = s.head_dim, s.heads, s.kv_heads
        params = [BF16_IN, BF16_IN, BF16_IN, "in buffer<i64>", BF16_IN, BF16_IN, "inout state", "in buffer<i64>", "in buffer<i32>",
                  "in buffer<i32>"]
        launch = {"module": ctx.entries["kern_attn_decode_qkn"], "entry": "kern_attn_decode_qkn",
                  "block": [128, 1, 1], "grid": [nkv, DECODE_SPLITS, 1],
                  "params": [*params, "out buffer<f32>", "out buffer<f32>", "inout buffer<i32>", BF16_OUT, "i32", "i32",
                             "i32", "i32", "i64", "i32", "f32", "f32"],
                  "args": [*({"param": j} for j in range(10)), {"scratch": "part_o"}, {"scratch": "part_lse"},
                           {"param": 11}, {"param": 10}, i32(nq), i32(nkv), i32(d), i32(PAGE_TOKENS),
                           {"i64": s.page_stride}, i32(DECODE_SPLITS), {"f32": d**-0.5}, {"f32": s.eps}]}
        scratch = {"part_o": {"dtype": "f32", "shape": [DECODE_SPLITS, nq * d]},
                   "part_lse": {"dtype": "f32", "shape": [DECODE_SPLITS, nq]}}
        return {"params": [*params, BF16_OUT, "inout buffer<i32>"], "impl": {"scratch": scratch, "launches": [launch]}}

    def __call__(self, manifest: Json, ctx: Context) -> None:
        """Merges each decode layer's q/k norm call into its attention call (in place)."""
        calls = manifest["programs"]["decode"]["calls"]
        out: list[Json] = []
        for c in calls:
            if c["op"] == "attn_decode_fused" and out and out[-1]["op"] == "qk_norm_rope_kv":
                qnr = out.pop()
                out.append({"label": c["label"], "op": "attn_decode_qkn", "args": [*qnr["args"][:8], *c["args"][2:]]})
            else:
                out.append(c)
        manifest["programs"]["decode"]["calls"] = out
        manifest["ops"]["attn_decode_qkn"] = self._op(ctx)


@dataclass(frozen=True, slots=True)
class Splits:
    """The fused decode attention over `splits` KV splits (its scratch sized to match), on
    kern_attn_decode (attention_cluster.cu) or, `wide`, kern_attn_decode_wide (attention_wide.cu:
    beyond 512 tokens each cluster of 8 splits combines in shared memory first)."""

    splits: int = DECODE_SPLITS_WIDE
    wide: bool = True
    name: str = "splits"

    def needs(self, plan: Plan, shape: Qwen3Shape) -> tuple[str, ...]:
        """kern_attn_decode_wide when `wide`, else kern_attn_decode."""
        _needs_fuse(plan, "wide_attention" if self.wide else self.name)
        if self.splits < 1 or self.splits % DECODE_CLUSTER:
            raise GenError(f"splits {self.splits}: kern_attn_decode needs a multiple of {DECODE_CLUSTER}")
        return (WIDE_ENTRY,) if self.wide else (CLUSTER_ENTRY,)

    def __call__(self, manifest: Json, ctx: Context) -> None:
        """Rewrites attn_decode_fused (in place)."""
        op = manifest["ops"]["attn_decode_fused"]
        launch = _cluster_launch(manifest, ctx)
        if self.wide:
            launch |= {"module": ctx.entries[WIDE_ENTRY], "entry": WIDE_ENTRY}
        launch["grid"] = [ctx.shape.kv_heads, self.splits, 1]
        launch["args"][13] = i32(self.splits)  # NOTE: kern_attn_decode's `splits` is its 14th argument
        op["impl"]["scratch"] = {name: {**b, "shape": [self.splits, *b["shape"][1:]]}
                                 for name, b in op["impl"]["scratch"].items()}


@dataclass(frozen=True, slots=True)
class RowsPlan:
    """The fused one-row step's decode attention on the batched step's kern_attn_decode_rows (the
    cluster-free plan, the same arguments, grid and shared memory) in place of kern_attn_decode_one:
    the two plans in the same step."""

    name: str = "rows_plan"

    def needs(self, plan: Plan, shape: Qwen3Shape) -> tuple[str, ...]:
        """kern_attn_decode_rows."""
        _needs_fuse(plan, self.name)
        return ("kern_attn_decode_rows",)

    def __call__(self, manifest: Json, ctx: Context) -> None:
        """Swaps attn_decode_fused's entry (in place)."""
        launch = _fused_launch(manifest)
        if launch["entry"] != "kern_attn_decode_one":
            raise GenError(f"{self.name}: attn_decode_fused launches {launch['entry']}, not kern_attn_decode_one")
        launch |= {"module": ctx.entries["kern_attn_decode_rows"], "entry": "kern_attn_decode_rows"}


@dataclass(frozen=True, slots=True)
class LateTrigger:
    """The fused decode attention's blocks let the next launch (o's GEMV) start only once they have
    folded their splits (LATE_ENTRIES, attention_wide.cu; kern_attn_decode_one becomes
    kern_attn_decode's late form)."""

    name: str = "late_trigger"

    def needs(self, plan: Plan, shape: Qwen3Shape) -> tuple[str, ...]:
        """Both late entries (which one runs depends on the passes before)."""
        _needs_fuse(plan, self.name)
        return tuple(LATE_ENTRIES.values())

    def __call__(self, manifest: Json, ctx: Context) -> None:
        """Swaps the fused attention's entry for its late form (in place)."""
        launch = _cluster_launch(manifest, ctx)
        late = LATE_ENTRIES[launch["entry"]]
        launch |= {"module": ctx.entries[late], "entry": late}


@dataclass(frozen=True, slots=True)
class PdlOff:
    """The decode calls of `gemms` launch without PDL, through `<op>.nopdl` copies of their ops (so
    no other call loses PDL). Runs after the product's PDL pass."""

    gemms: tuple[str, ...]
    name: str = "pdl_off"

    def needs(self, plan: Plan, shape: Qwen3Shape) -> tuple[str, ...]:
        """No entries of its own."""
        if not self.gemms or set(self.gemms) - set(GEMV_GEMMS):
            raise GenError(f"pdl_off {list(self.gemms)}: name decode GEMMs ({', '.join(GEMV_GEMMS)})")
        return ()

    def __call__(self, manifest: Json, ctx: Context) -> None:
        """Drops `pdl` from the named GEMMs' launches (in place)."""
        ops = manifest["ops"]
        for c in manifest["programs"]["decode"]["calls"]:
            if gemm_of(c["label"]) not in self.gemms:
                continue
            target = f"{c['op']}.nopdl"
            if target not in ops:
                spec = json.loads(json.dumps(ops[c["op"]]))
                for launch in spec["impl"]["launches"]:
                    launch.pop("pdl", None)
                ops[target] = spec
            c["op"] = target


@dataclass(frozen=True, slots=True)
class Carveout:
    """Every kernel launch's preferred shared-memory carveout, percent 0..100 (the launch `carveout`)."""

    percent: int
    name: str = "carveout"

    def needs(self, plan: Plan, shape: Qwen3Shape) -> tuple[str, ...]:
        """No entries of its own."""
        if not 0 <= self.percent <= 100:
            raise GenError(f"carveout {self.percent}: give a percentage 0..100")
        return ()

    def __call__(self, manifest: Json, ctx: Context) -> None:
        """Sets `carveout` on every kernel launch (in place)."""
        for op in manifest["ops"].values():
            for launch in op["impl"]["launches"]:
                if "module" in launch:
                    launch["carveout"] = self.percent
