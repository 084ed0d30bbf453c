"""What to generate: the options of one manifest as a frozen `Plan`, validated in one place, with
its rewrite passes as an explicit ordered list."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

from kern_qwen3.entries import GEMV_ENTRIES, GEMV_GEMMS, GEMV_PICK, GemvEntry, silu_entries
from kern_qwen3.errors import GenError
from kern_qwen3.fp8 import FP8_FORMS, FP8_GEMMS, WEIGHT_FORMATS, WeightFormat
from kern_qwen3.fragments import Json
from kern_qwen3.shape import Qwen3Shape

__all__ = ["DEFAULT_CHUNK", "FEEDS", "PRECISIONS", "Context", "Feed", "Pass", "Plan", "Precision"]

DEFAULT_CHUNK = 2048
"""The largest prefill chunk when a plan names none (the `tokens` var's max)."""
Feed = Literal["host", "device"]
FEEDS: tuple[Feed, ...] = ("host", "device")
Precision = Literal["bf16", "f32"]
PRECISIONS: tuple[Precision, ...] = ("bf16", "f32")


@dataclass(frozen=True, slots=True)
class Context:
    """What a pass reads besides the manifest: the shape, the plan, the resolved GEMV picks and
    kernel entry -> module."""

    shape: Qwen3Shape
    plan: Plan
    picks: Mapping[str, str]
    entries: Mapping[str, str]


class Pass(Protocol):
    """A rewrite of a generated manifest (its `buffers`, `ops` and `programs`, in place), run in the
    plan's order before the ops no call uses are dropped and the modules are pinned."""

    @property
    def name(self) -> str:
        """The pass's name in error messages."""
        ...

    def needs(self, plan: Plan, shape: Qwen3Shape) -> tuple[str, ...]:
        """The kernel entries the pass launches.

        Raises:
            GenError: the pass cannot apply to this plan and shape (one line saying why).
        """
        ...

    def __call__(self, manifest: Json, ctx: Context) -> None:
        """Rewrites `manifest` in place."""
        ...


@dataclass(frozen=True, slots=True)
class Plan:
    """The options of one manifest.

    Attributes:
        chunk: the largest prefill chunk (the `tokens` var's max).
        feed: "host": the caller writes the step's four inputs before every decode step;
            "device": decode reads carry buffers that the `start` program seeds and
            `kern_decode_advance` moves on, so the host only replays and reads 8 bytes.
        precision: "bf16" (transformers' bf16 rounding points) or "f32": the reference-precision
            manifest (qwen3_f32.cu; activations, residual, logits and KV in float32, bf16 weights),
            which takes none of the speed options.
        gemv: decode GEMMs (of GEMV_GEMMS) that run as our GEMV (the entry `picks` names) instead
            of cublasLt; prefill always uses cublasLt.
        fuse: q/k norm + rope writes the KV pages itself (`kern_qk_norm_rope_kv`, prefill and
            decode) and decode attention is one launch (`kern_attn_decode_rows`).
        picks: decode GEMM -> its GEMV entry (an entry of `table`).
        table: the GEMV entries the picks may name, with their launch shapes.
        passes: the rewrites run on the generated manifest, in order (`passes.plan_passes` builds
            the product's).
        rows: 0, or R >= 2: add the batched decode step over 1..R rows (`kern_qwen3.rows`;
            device-fed, bf16, R <= chunk); the one-row `decode` program stays as it is.
        head: add the `head` program (`kern_qwen3.head`): after the last prefill chunk it
            computes the first generated token from the chunk's last row (bf16 only).
        weights: "bf16"; "qwen-fp8": the layers' linear weights are a Qwen FP8 checkpoint's e4m3
            bytes and block scales; "fp8-dynamic": a compressed-tensors FP8-dynamic checkpoint's
            (one scale per output row); "bf16-to-fp8": Qwen's layout quantised from a bf16
            checkpoint on the device at load (`kern_qwen3.fp8`). Over FP8 weights the linears' decode GEMMs are the
            FP8 GEMV, so `gemv` names none of them.
    """

    chunk: int = DEFAULT_CHUNK
    feed: Feed = "host"
    precision: Precision = "bf16"
    gemv: tuple[str, ...] = ()
    fuse: bool = False
    picks: Mapping[str, str] = field(default_factory=lambda: dict(GEMV_PICK))
    table: Mapping[str, GemvEntry] = field(default_factory=lambda: dict(GEMV_ENTRIES))
    passes: tuple[Pass, ...] = ()
    rows: int = 0
    head: bool = True
    weights: WeightFormat = "bf16"

    def __post_init__(self) -> None:
        self._check_basics()
        self._check_rows()
        self._check_gemv()
        self._check_weights()
        if self.precision == "f32" and self.bf16_options():
            raise GenError(f"precision f32 runs its own plain kernels and takes none of the bf16 speed options: "
                           f"drop {', '.join(self.bf16_options())} (or use precision bf16)")

    def _check_basics(self) -> None:
        if self.feed not in FEEDS:
            raise GenError(f"feed must be one of {', '.join(FEEDS)}, got {self.feed!r}")
        if self.precision not in PRECISIONS:
            raise GenError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if isinstance(self.chunk, bool) or self.chunk < 1:
            raise GenError(f"chunk {self.chunk!r} must be a positive integer")

    def _check_rows(self) -> None:
        if self.rows == 0:
            return
        if isinstance(self.rows, bool) or not isinstance(self.rows, int) or self.rows < 2:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise GenError(f"rows {self.rows!r} must be an integer >= 2 (one row is the decode program itself)")
        if self.feed != "device" or self.precision != "bf16":
            raise GenError(f"rows needs feed device and precision bf16, got feed {self.feed} and precision "
                           f"{self.precision}")
        if self.rows > self.chunk:
            raise GenError(f"rows {self.rows} exceeds the chunk {self.chunk}: the step's workspaces hold chunk rows")

    def _check_gemv(self) -> None:
        unknown = sorted(set(self.gemv) - set(GEMV_GEMMS))
        if unknown:
            raise GenError(f"gemv names {', '.join(unknown)}; choose from {', '.join(GEMV_GEMMS)}")
        silu = silu_entries(self.table)
        bad_gemm = sorted(set(self.picks) - set(GEMV_GEMMS))
        bad_entry = sorted(e for e in self.picks.values() if e not in self.table)
        misplaced = sorted(g for g, e in self.picks.items() if e in silu and g != "gate_up")
        missing = sorted(g for g in self.gemv if g not in self.picks)
        if bad_gemm or bad_entry or misplaced or missing:
            raise GenError(f"picks: unknown GEMM(s) {bad_gemm}, unknown entries {bad_entry}, a SiLU entry "
                           f"({', '.join(silu)}) outside gate_up {misplaced}, or no pick for {missing}; "
                           f"entries: {', '.join(self.table)}")

    def _check_weights(self) -> None:
        if self.weights not in WEIGHT_FORMATS:
            raise GenError(f"weights must be one of {', '.join(WEIGHT_FORMATS)}, got {self.weights!r}")
        if self.weights == "bf16":
            return
        on_fp8 = sorted(set(self.gemv) & set(FP8_GEMMS))
        if on_fp8:
            raise GenError(f"weights {self.weights}: {', '.join(on_fp8)} run as the FP8 GEMV; give --gemv only "
                           "lm_head (or nothing)")
        if self.rows:
            raise GenError(f"weights {self.weights}: the batched step over FP8 weights is not built; drop rows")
        folded = [p.name for p in self.passes if p.name == "defer_norm"]
        if folded:
            raise GenError(f"weights {self.weights}: the norm fold runs inside bf16 GEMVs; drop --fold-norm "
                           "--defer-norm")

    def bf16_options(self) -> list[str]:
        """The bf16-only options that are set (gemv, fuse, passes by name, FP8 weights)."""
        return [*(["gemv"] if self.gemv else []), *(["fuse"] if self.fuse else []), *(p.name for p in self.passes),
                *(["weights"] if self.weights != "bf16" else [])]

    def gemv_gemms(self) -> set[str]:
        """The decode GEMMs that run as one of our GEMVs (bf16 picks, and the FP8 ones)."""
        return set(self.gemv) | (set(FP8_GEMMS) if self.weights != "bf16" else set())

    def picked(self) -> dict[str, str]:
        """Decode GEMM -> its GEMV entry, for the GEMMs in `gemv`."""
        return {g: self.picks[g] for g in self.gemv}

    def needs(self, shape: Qwen3Shape) -> tuple[str, ...]:
        """The entries the passes launch, in pass order.

        Raises:
            GenError: a pass cannot apply to this plan and shape, or the chunk exceeds the model.
        """
        if self.chunk > shape.max_pos:
            raise GenError(f"chunk {self.chunk} must be in [1, {shape.max_pos}]")
        fp8 = FP8_FORMS[self.weights].entries if self.weights != "bf16" else ()
        return fp8 + tuple(e for p in self.passes for e in p.needs(self, shape))
