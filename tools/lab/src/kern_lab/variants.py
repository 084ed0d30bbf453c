"""The manifest variants the lab checks and benches beside the product's (tools/gpu/qwen3_checks.py
runs them through `tools/lab/qwen3_variants.py`): each is a `kern_qwen3.Plan`, its experiments as
passes, built for the feed the kernel sources allow."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from kern_lab.entries import DEFER_P4, LAB_GEMV_ENTRIES, ring_table
from kern_lab.passes import (
    Carveout,
    FoldNorms,
    LateTrigger,
    NormTail,
    PdlOff,
    Qkn,
    RowsPlan,
    Splits,
)
from kern_qwen3 import (
    GEMV_DEFAULT,
    GEMV_GEMMS,
    GEMV_PICK,
    PDL,
    DeferNorms,
    Feed,
    GemvEntry,
    Pass,
    Plan,
)

__all__ = ["BAND_PICK", "DEFER", "RING_PICK", "STREAM_PICK", "Variant", "lab_variants"]

Variant = Callable[[Feed], Plan]
"""A variant: the feed the kernel sources allow -> its plan."""

RING_PICK = {"qkv": "kern_gemv_bf16_r4", "gate_up": "kern_gemv_bf16_r4_silu"}
STREAM_PICK = {"qkv": "kern_gemv_bf16_tma", "o": "kern_gemv_bf16_tma", "gate_up": "kern_gemv_bf16_tma_silu",
               "down": "kern_gemv_bf16_tma", "lm_head": "kern_gemv_bf16_tma"}
"""`stream`: every decode GEMM on the streaming (bulk-copy ring) GEMVs."""
BAND_PICK = {"qkv": "kern_gemv_bf16_b4", "o": "kern_gemv_bf16_b4", "gate_up": "kern_gemv_bf16_b4_silu",
             "down": "kern_gemv_bf16_b4", "lm_head": "kern_gemv_bf16_c2"}
"""`band`: the per-layer GEMMs on the balanced-band GEMVs (one resident wave)."""
DEFER = DeferNorms(prefetched=DEFER_P4)
"""The product's deferred fold, a `_p4` pick folding into its deferred form (gemv_defer_p4.cu)."""


@dataclass(frozen=True, slots=True)
class _Spec:
    """Every decode GEMM as our GEMV, fused attention; `fold`: "defer" (the product's), "prologue"
    (gemv_norm.cu's) or "" (none); `pre` before the fold, `mid` between the fold and PDL, `post`
    after PDL."""

    picks: Mapping[str, str] = field(default_factory=lambda: {})
    fold: str = ""
    pdl: bool = True
    defer: Pass = DEFER
    pre: tuple[Pass, ...] = ()
    mid: tuple[Pass, ...] = ()
    post: tuple[Pass, ...] = ()
    table: Mapping[str, GemvEntry] | None = None

    def plan(self, feed: Feed) -> Plan:
        folds: dict[str, tuple[Pass, ...]] = {"defer": (self.defer,), "prologue": (FoldNorms(),), "": ()}
        passes = (*self.pre, *folds[self.fold], *self.mid, *((PDL,) if self.pdl else ()), *self.post)
        table = dict(self.table or LAB_GEMV_ENTRIES)
        return Plan(feed=feed, gemv=GEMV_GEMMS, fuse=True, picks={**GEMV_PICK, **self.picks},
                    table=table, passes=passes)


UNFOLDED = _Spec()
FOLD = _Spec(fold="prologue")

_TRIALS: dict[str, tuple[int, dict[str, str]]] = {
    "carve100": (100, {}), "carve50": (50, {}), "carve0": (0, {}),
    "p4o": (-1, {"o": "kern_gemv_bf16_p4"}), "p4o100": (100, {"o": "kern_gemv_bf16_p4"}),
    "deep4": (-1, {"qkv": "kern_gemv_bf16_d4", "o": "kern_gemv_bf16_d4", "gate_up": "kern_gemv_bf16_d4_silu",
                   "down": "kern_gemv_bf16_d4"}),
    "deep8": (-1, {"qkv": "kern_gemv_bf16_d8", "o": "kern_gemv_bf16_d8", "gate_up": "kern_gemv_bf16_d4_silu",
                   "down": "kern_gemv_bf16_d8"}),
    "od4": (-1, {"o": "kern_gemv_bf16_d4"}), "b4gu": (-1, {"gate_up": "kern_gemv_bf16_b4_silu"}),
    "p4gu": (-1, {"gate_up": "kern_gemv_bf16_p4_silu"}),
    "p4qd": (-1, {"qkv": "kern_gemv_bf16_p4", "down": "kern_gemv_bf16_p4"}),
    "p4all": (-1, {"qkv": "kern_gemv_bf16_p4", "gate_up": "kern_gemv_bf16_p4_silu", "down": "kern_gemv_bf16_p4"}),
}
"""`unfolded` with a shared-memory carveout (percent; -1: the driver's) and GEMV picks over GEMV_PICK."""

_FOLD_TRIALS: dict[str, _Spec] = {
    "b4d": _Spec(fold="prologue", picks={"down": "kern_gemv_bf16_b4"}),
    "b4o": _Spec(fold="prologue", picks={"o": "kern_gemv_bf16_b4"}),
    "onopdl": _Spec(fold="prologue", post=(PdlOff(("o",)),)),
    "ring": _Spec(fold="prologue", picks=RING_PICK),
    "ringgu": _Spec(fold="prologue", picks={"gate_up": RING_PICK["gate_up"]}),
    "ring1": _Spec(fold="prologue", picks=RING_PICK, table=ring_table(1, 131072)),
    "ring3": _Spec(fold="prologue", picks=RING_PICK, table=ring_table(3, 40960)),
    "ringo": _Spec(fold="prologue", picks={**RING_PICK, "o": "kern_gemv_bf16_r4"}),
    "latep4o": _Spec(fold="prologue", picks={"o": "kern_gemv_bf16_p4"}, mid=(LateTrigger(),)),
    "p4gun": _Spec(fold="prologue", picks={"gate_up": "kern_gemv_bf16_p4_silu"}),
    "deferp4": _Spec(fold="defer", picks={"gate_up": "kern_gemv_bf16_p4_silu"}),
    "deferp4q": _Spec(fold="defer", picks={"qkv": "kern_gemv_bf16_p4"}),
    "p4qgun": _Spec(fold="prologue", picks={"gate_up": "kern_gemv_bf16_p4_silu", "qkv": "kern_gemv_bf16_p4"}),
    "latero": _Spec(fold="prologue", picks={"o": "kern_gemv_bf16_r4"}, mid=(LateTrigger(),)),
}
"""`fold` (the prologue fold) with other picks, PDL off for o, the ring GEMVs at other waves, the
late-trigger attention; and the deferred fold with prefetched picks."""

_SPLITS: dict[str, tuple[Pass, ...]] = {
    "s64": (Splits(64, wide=False),), "s128": (Splits(128, wide=False),), "s256": (Splits(256, wide=False),),
    "wide": (Splits(),), "wide64": (Splits(64),), "wide256": (Splits(256),),
    "late": (LateTrigger(),), "widelate": (Splits(), LateTrigger()),
    "rowsplan": (RowsPlan(),),
}
"""`fast` with the decode attention at other splits, on the wide entry, with the late trigger, or on
the batched step's kern_attn_decode_rows (`rowsplan`)."""

_TAILS: dict[str, dict[str, str]] = {
    "tail": {"gate_up": "kern_gemv_bf16_p4_silu"},
    "tailb4gu": {"gate_up": "kern_gemv_bf16_b4_silu"},
    "tailp4q": {"gate_up": "kern_gemv_bf16_p4_silu", "qkv": "kern_gemv_bf16_p4"},
}
"""`unfolded` with the norms in the last block of the o / down GEMV before them (gemv_tail.cu)."""


def _specs(pick: Mapping[str, str] | None) -> dict[str, _Spec]:
    specs: dict[str, _Spec] = {
        "unfolded": UNFOLDED, "fold": FOLD, "nopdl": _Spec(fold="defer", pdl=False),
        "qkn": _Spec(fold="defer", pre=(Qkn(),)),
        "stream": _Spec(picks=STREAM_PICK), "band": _Spec(picks=BAND_PICK),
        "gu_nopdl": _Spec(post=(PdlOff(("gate_up",)),)), "qkv_nopdl": _Spec(post=(PdlOff(("qkv",)),)),
        **_FOLD_TRIALS,
        **{n: _Spec(fold="defer", mid=p) for n, p in _SPLITS.items()},
        **{f"defer{b}": _Spec(fold="defer", defer=DeferNorms(blocks_per_sm=b, prefetched=DEFER_P4)) for b in (1, 2, 3)},
        **{n: _Spec(picks=p, mid=(NormTail(),)) for n, p in _TAILS.items()},
        **{n: _Spec(picks=p, post=(Carveout(c),) if c >= 0 else ()) for n, (c, p) in _TRIALS.items()},
    }
    if pick:
        specs["picked"] = _Spec(picks=dict(pick))
    return specs


def lab_variants(pick: Mapping[str, str] | None = None) -> dict[str, Variant]:
    """Variant name -> its plan builder; `pick` (GEMM -> entry, time_gemv.py --entries writes it)
    adds the `picked` variant (`unfolded` with those picks)."""
    variants: dict[str, Variant] = {n: s.plan for n, s in _specs(pick).items()}
    variants["gemv"] = lambda feed: Plan(feed=feed, gemv=GEMV_DEFAULT)
    return variants
