"""The product's rewrite passes (`Pass`): the deferred norm fold and programmatic dependent launch
(the GEMM algo pins are `kern_qwen3.gemm_algos`), and `plan_passes`, which lists them in order
for a plan's flags."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from kern_qwen3.entries import DEFER_ENTRIES, DEFER_MAX_K, GEMV_GEMMS, silu_entries
from kern_qwen3.errors import GenError
from kern_qwen3.fragments import BF16_IN, BF16_OUT, Json, buf, call, f32, gemm_of, i32, kernel
from kern_qwen3.gemm_algos import GemmAlgos
from kern_qwen3.gemv import Launch, defer_launch, gemv_launch
from kern_qwen3.plan import Context, Pass, Plan
from kern_qwen3.programs import gemv_op_name
from kern_qwen3.shape import Qwen3Shape

__all__ = ["DEFER_NORMS", "FOLD_GEMMS", "PDL", "DeferNorms", "Pdl", "add_workspace", "fold_norms", "fold_shape", "plan_passes"]

FOLD_GEMMS = ("qkv", "gate_up")
"""The decode GEMMs an add + RMSNorm stands before."""

FoldOf = Callable[[str, Mapping[str, str]], tuple[str, Launch]]
"""(GEMM, picks) -> (the folded entry, its launch for that GEMM's n, k)."""


def add_workspace(manifest: Json, name: str, dims: list[int], after: str) -> None:
    """Adds a bf16 workspace buffer [tokens, *dims] right after buffer `after` (in place)."""
    spec: Json = {"dtype": "bf16", "shape": ["tokens", *dims], "kind": "workspace"}
    items = list(manifest["buffers"].items())
    at = [n for n, _ in items].index(after) + 1
    manifest["buffers"] = dict([*items[:at], (name, spec), *items[at:]])


def fold_shape(s: Qwen3Shape, gemm: str) -> tuple[int, int]:
    """(n, k) of a GEMM an add + RMSNorm stands before (of FOLD_GEMMS)."""
    return (s.qkv_rows, s.hidden) if gemm == "qkv" else (s.inter, s.hidden)


def _folded_op(ctx: Context, entry: str, n: int, k: int, launch: Launch) -> Json:
    grid, threads, smem = launch
    io = [BF16_IN, BF16_IN, BF16_IN, BF16_OUT, BF16_IN, BF16_OUT]
    la = kernel(ctx.entries, entry, [grid, 1, 1], threads, **({"shared_mem": smem} if smem else {}),
                params=[*io, "i32", "i32", "i32", "i32", "f32"],
                args=[*({"param": j} for j in range(6)), i32(1), i32(n), i32(k), i32(n), f32(ctx.shape.eps)])
    return {"params": io, "impl": {"launches": [la]}}


def fold_norms(manifest: Json, ctx: Context, fold_of: FoldOf) -> None:
    """Each decode add + RMSNorm that a qkv or gate_up GEMV follows becomes one call of that GEMV's
    folded form (`fold_of`), reading the residual from the current buffer and writing the new
    residual to the other one (`h` / `h2` in turn); a norm that stays (the final one) reads and
    updates the current buffer. Adds `h2` (in place)."""
    ops, calls = manifest["ops"], manifest["programs"]["decode"]["calls"]
    out: list[Json] = []
    cur, other = "h", "h2"
    i = 0
    while i < len(calls):
        c = calls[i]
        gemm = gemm_of(calls[i + 1]["label"]) if i + 1 < len(calls) else ""
        if c["op"] != "add_rmsnorm" or gemm not in FOLD_GEMMS:
            out.append(c if c["op"] != "add_rmsnorm" else {**c, "args": [buf(cur), *c["args"][1:]]})
            i += 1
            continue
        _res, y_add, w_norm, *_rest = c["args"]
        entry, launch = fold_of(gemm, ctx.picks)
        n, k = fold_shape(ctx.shape, gemm)
        op = gemv_op_name(entry, n, k)
        if op not in ops:
            ops[op] = _folded_op(ctx, entry, n, k, launch)
        _x, w, y = calls[i + 1]["args"]
        out.append(call(calls[i + 1]["label"], op, buf(cur), y_add, w_norm, buf(other), w, y))
        cur, other = other, cur
        i += 2
    manifest["programs"]["decode"]["calls"] = out
    add_workspace(manifest, "h2", [ctx.shape.hidden], after="act")


@dataclass(frozen=True, slots=True)
class DeferNorms:
    """qkv and gate_up fold the add + RMSNorm before them as r * (W (h * w_norm)), the scale r in
    their epilogue (DEFER_ENTRIES' bands, gemv_defer.cu; or a pick's own deferred form, `prefetched`):
    not the bits of the norm launch + GEMV (one bf16 rounding of x fewer); two launches fewer per
    layer.

    Attributes:
        blocks_per_sm: the bands' wave (`defer_launch`).
        prefetched: GEMV entry -> its deferred form on that entry's launch (the lab's prefetched
            forms); a qkv / gate_up pick listed here folds into it instead of DEFER_ENTRIES' band.
    """

    blocks_per_sm: int = 4
    prefetched: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    name: str = "defer_norm"

    def _entry(self, gemm: str, picks: Mapping[str, str]) -> str:
        pick = picks[gemm]
        return self.prefetched.get(pick, DEFER_ENTRIES[gemm])

    def needs(self, plan: Plan, shape: Qwen3Shape) -> tuple[str, ...]:
        """The deferred forms of the qkv and gate_up picks.

        Raises:
            GenError: qkv or gate_up is not a GEMV, gate_up not on a SiLU entry, or the hidden size
                exceeds DEFER_MAX_K.
        """
        if not set(FOLD_GEMMS) <= set(plan.gemv):
            raise GenError("fold_norm runs the norms inside the qkv and gate_up GEMVs: it needs both as our GEMV (--gemv)")
        picks = plan.picked()
        silu = silu_entries(plan.table)
        if picks["gate_up"] not in silu:
            raise GenError(f"fold_norm needs gate_up on a SiLU entry ({', '.join(silu)}), not {picks['gate_up']}")
        if shape.hidden > DEFER_MAX_K:
            raise GenError(f"defer_norm keeps a row of {shape.hidden} in registers; gemv_defer.cu holds at most "
                           f"{DEFER_MAX_K}: drop --defer-norm")
        return tuple(self._entry(g, picks) for g in FOLD_GEMMS)

    def _fold_of(self, ctx: Context) -> FoldOf:
        def fold_of(gemm: str, picks: Mapping[str, str]) -> tuple[str, Launch]:
            n, k = fold_shape(ctx.shape, gemm)
            pick = picks[gemm]
            if pick in self.prefetched:
                return self.prefetched[pick], gemv_launch(pick, n, k, table=ctx.plan.table)
            return DEFER_ENTRIES[gemm], defer_launch(n, self.blocks_per_sm)
        return fold_of

    def __call__(self, manifest: Json, ctx: Context) -> None:
        """Folds the norms before qkv and gate_up (in place)."""
        fold_norms(manifest, ctx, self._fold_of(ctx))


@dataclass(frozen=True, slots=True)
class Pdl:
    """Every kernel launch of the decode program is a programmatic dependent launch (`"pdl": true`;
    the kernels wait with griddepcontrol.wait), but the first call's (the step's first launch has no
    earlier launch in the graph to overlap). Needs every decode GEMM as our GEMV: no cuBLAS launch
    may sit in the chain. An op other programs call too gets a `<op>.pdl` copy for the decode
    program, so prefill and load launch as before."""

    name: str = "pdl"

    def needs(self, plan: Plan, shape: Qwen3Shape) -> tuple[str, ...]:
        """No entries of its own.

        Raises:
            GenError: a decode GEMM runs on cuBLAS.
        """
        if plan.gemv_gemms() != set(GEMV_GEMMS):
            raise GenError(f"pdl needs every decode GEMM as our GEMV ({', '.join(GEMV_GEMMS)}): a cuBLAS launch "
                           "cannot sit in a PDL chain")
        return ()

    def __call__(self, manifest: Json, ctx: Context) -> None:
        """Marks the decode launches `pdl` (in place)."""
        ops, programs = manifest["ops"], manifest["programs"]
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
        for c in decode:
            c["op"] = renamed[c["op"]]


DEFER_NORMS = DeferNorms()
PDL = Pdl()


def plan_passes(*, fold_norm: bool = False, defer_norm: bool = False, pdl: bool = False,
                gemm_algos: str | None = None) -> tuple[Pass, ...]:
    """The product's passes for its flags, in order: the deferred norm fold, PDL, then the GEMM
    algos pinned by m range from table `gemm_algos` (`kern_qwen3.gemm_algos`).

    Raises:
        GenError: fold_norm without defer_norm or the other way round; an unknown algo table.
    """
    pins: tuple[Pass, ...] = (GemmAlgos(gemm_algos),) if gemm_algos is not None else ()
    if defer_norm and not fold_norm:
        raise GenError("defer_norm is a way to fold the norms into qkv and gate_up: it needs --fold-norm too")
    if fold_norm and not defer_norm:
        raise GenError("fold_norm folds the norms deferred (gemv_defer.cu): give --defer-norm too")
    return (*((DEFER_NORMS,) if fold_norm else ()), *((PDL,) if pdl else ()), *pins)
