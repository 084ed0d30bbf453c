"""Extern GEMMs on cuBLASLt (nvmath-python's low-level bindings).

Row-major C[m,n] = A[m,k] @ W[n,k]^T is column-major C'[n,m] = W'^T[n,k] x A'[k,m]: cuBLASLt's
"A" is W (k x n, ld k, transposed), "B" is A (k x m, ld lda), C is n x m with ld ldc. Heuristics
(or a pinned algo, checked at both var ends) are resolved when a record is compiled, never per
step; a compiled GEMM is one cublasLtMatmul call, capturable in a CUDA graph.

An fp8 GEMM (e4m3 A and W, f32 accumulation, bf16 or f32 C) takes two one-element f32 device
buffers, A's scale and W's: cuBLASLt's per-tensor scale pointers (its "A" scale is W's, its "B"
scale is A's), read by the GEMM on the device, so a graph replays it with whatever the scales hold
then. They are attributes of the matmul descriptor: an fp8 plan is cached per shape and scale pair.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .errors import BlasError, KernelArtifactError

__all__ = ["WORKSPACE_BYTES", "Blas", "GemmShape"]

WORKSPACE_BYTES = 32 << 20
_COMPUTE_32F = 68
_R_32F = 0
_R_16BF = 14
_R_8F_E4M3 = 28
_OP_N, _OP_T = 0, 1
_ALGO_FIELDS = (  # (manifest field, MatmulAlgoConfigAttribute value)
    ("tile", 1), ("split_k", 2), ("reduction", 3), ("swizzle", 4),
    ("custom", 5), ("stages", 6), ("inner_shape", 7), ("cluster_shape", 8),
)  # fmt: skip


def _lt() -> Any:
    from nvmath.bindings import cublasLt

    return cublasLt


@dataclass(frozen=True, slots=True)
class GemmShape:
    """One GEMM problem: sizes, row strides (elements), output dtype, accumulate flag, and e4m3
    operands (`fp8`)."""

    m: int
    n: int
    k: int
    ldc: int
    lda: int
    out_f32: bool
    accumulate: bool
    fp8: bool = False


def _status(exc: Exception) -> str:
    return str(exc) or type(exc).__name__


class Blas:
    """One cuBLASLt handle, a 32 MiB workspace, and descriptors/algos cached by shape."""

    def __init__(self, stack: ExitStack, workspace: int) -> None:
        lt = _lt()
        self._lt = lt
        self._stack = stack
        self.workspace = workspace
        try:
            self.handle = lt.create()
        except Exception as exc:
            raise BlasError("cublasLtCreate", _status(exc)) from None
        stack.callback(lt.destroy, self.handle)
        self._alpha = np.ones(1, dtype=np.float32)
        self._beta0 = np.zeros(1, dtype=np.float32)
        self._beta1 = np.ones(1, dtype=np.float32)
        self._alpha_ptr = int(self._alpha.ctypes.data)  # NOTE: a matmul's host cost counts: no ctypes per call
        self._plans: dict[tuple[GemmShape, tuple[int, ...] | None, tuple[int, int] | None], _Plan] = {}

    def _desc(self, scales: tuple[int, int] | None) -> int:
        lt = self._lt
        desc = lt.matmul_desc_create(_COMPUTE_32F, _R_32F)
        self._stack.callback(lt.matmul_desc_destroy, desc)
        for attr, value in ((lt.MatmulDescAttribute.TRANSA, _OP_T), (lt.MatmulDescAttribute.TRANSB, _OP_N)):
            buf = np.array([value], dtype=np.int32)
            lt.matmul_desc_set_attribute(desc, attr, buf.ctypes.data, 4)
        if scales is not None:
            a_scale, w_scale = scales
            for attr, ptr in ((lt.MatmulDescAttribute.A_SCALE_POINTER, w_scale),
                              (lt.MatmulDescAttribute.B_SCALE_POINTER, a_scale)):
                buf = np.array([ptr], dtype=np.uint64)
                lt.matmul_desc_set_attribute(desc, attr, buf.ctypes.data, 8)
        return desc

    def _layout(self, dtype: int, rows: int, cols: int, ld: int) -> int:
        lay = self._lt.matrix_layout_create(dtype, rows, cols, ld)
        self._stack.callback(self._lt.matrix_layout_destroy, lay)
        return lay

    def plan(self, shape: GemmShape, algo: tuple[int, ...] | None, scales: tuple[int, int] | None = None) -> _Plan:
        """Descriptors and the algo for one shape (cached); heuristics run here, once. `scales`:
        an fp8 shape's (A scale, W scale) device pointers.

        Raises:
            BlasError: cuBLASLt refuses the shape, or an fp8 shape comes without its scales.
        """
        if shape.fp8 != (scales is not None):
            raise BlasError("cublasLt plan", f"an fp8 GEMM takes its two scale pointers, another none: {shape}")
        key = (shape, algo, scales)
        cached = self._plans.get(key)
        if cached is not None:
            return cached
        try:
            plan = self._build(shape, algo, scales)
        except KernelArtifactError:
            raise
        except Exception as exc:
            raise BlasError("cublasLt plan", f"{_status(exc)} for {shape}") from None
        self._plans[key] = plan
        return plan

    def _build(self, s: GemmShape, algo: tuple[int, ...] | None, scales: tuple[int, int] | None) -> _Plan:
        out = _R_32F if s.out_f32 else _R_16BF
        operand = _R_8F_E4M3 if s.fp8 else _R_16BF
        desc = self._desc(scales)
        a = self._layout(operand, s.k, s.n, s.k)
        b = self._layout(operand, s.k, s.m, s.lda)
        c = self._layout(out, s.n, s.m, s.ldc)
        if algo is None:
            chosen = self._heuristic(desc, a, b, c, s)
        else:
            chosen = self._pinned(desc, a, b, c, s, algo)
        beta = self._beta1 if s.accumulate else self._beta0  # NOTE: the Blas holds both betas
        return _Plan(desc, a, b, c, chosen, int(chosen.ctypes.data), int(beta.ctypes.data))

    def _heuristic(self, desc: int, a: int, b: int, c: int, s: GemmShape) -> npt.NDArray[Any]:
        lt = self._lt
        pref = lt.matmul_preference_create()
        try:
            ws = np.array([WORKSPACE_BYTES], dtype=np.uint64)
            lt.matmul_preference_set_attribute(pref, lt.MatmulPreferenceAttribute.MAX_WORKSPACE_BYTES, ws.ctypes.data, 8)
            results = np.zeros(1, dtype=lt.matmul_heuristic_result_dtype)
            count = np.zeros(1, dtype=np.int32)
            lt.matmul_algo_get_heuristic(self.handle, desc, a, b, c, c, pref, 1, results.ctypes.data, count.ctypes.data)
        finally:
            lt.matmul_preference_destroy(pref)
        if count[0] < 1:
            raise BlasError("cublasLtMatmulAlgoGetHeuristic", f"no algorithm for {s}")
        return np.array(results[0]["algo"]["data_"], dtype=np.uint64)

    def _pinned(self, desc: int, a: int, b: int, c: int, s: GemmShape, algo: tuple[int, ...]) -> npt.NDArray[Any]:
        lt = self._lt
        buf = np.zeros(8, dtype=np.uint64)
        out = _R_32F if s.out_f32 else _R_16BF
        try:
            lt.matmul_algo_init(self.handle, _COMPUTE_32F, _R_32F, _R_16BF, _R_16BF, out, out, algo[0], buf.ctypes.data)
            for (name, attr), value in zip(_ALGO_FIELDS, algo[1:], strict=True):
                dt = lt.get_matmul_algo_config_attribute_dtype(attr)
                v = np.array([value], dtype=dt)
                try:
                    lt.matmul_algo_config_set_attribute(buf.ctypes.data, attr, v.ctypes.data, v.nbytes)
                except Exception as exc:
                    raise KernelArtifactError(f"pinned algo {algo[0]}: {name}={value} rejected ({_status(exc)})") from None
        except KernelArtifactError:
            raise
        except Exception as exc:
            raise KernelArtifactError(f"pinned algo {algo[0]} does not initialize: {_status(exc)}") from None
        self._check(desc, a, b, c, s, buf, algo[0])
        return buf

    def _check(self, desc: int, a: int, b: int, c: int, s: GemmShape, algo: npt.NDArray[Any], algo_id: int) -> None:
        lt = self._lt
        result = np.zeros(1, dtype=lt.matmul_heuristic_result_dtype)
        try:
            lt.matmul_algo_check(self.handle, desc, a, b, c, c, algo.ctypes.data, result.ctypes.data)
        except Exception as exc:
            raise KernelArtifactError(
                f"pinned algo {algo_id} fails AlgoCheck at m={s.m} n={s.n} k={s.k}: {_status(exc)}"
            ) from None
        need = int(result[0]["workspace_size"])
        if need > WORKSPACE_BYTES:
            raise KernelArtifactError(
                f"pinned algo {algo_id} needs {need} bytes of workspace at m={s.m}, over {WORKSPACE_BYTES}"
            )

    def describe(self, plan: _Plan) -> dict[str, int]:
        """The plan's algo as manifest `algo` fields (id, tile, split_k, ...), to pin it."""
        lt = self._lt
        out: dict[str, int] = {}
        for name, attr in (("id", 0), *_ALGO_FIELDS):
            dt = lt.get_matmul_algo_config_attribute_dtype(attr)
            v = np.zeros(1, dtype=dt)
            written = np.zeros(1, dtype=np.uint64)
            lt.matmul_algo_config_get_attribute(plan.algo.ctypes.data, attr, v.ctypes.data, v.nbytes, written.ctypes.data)
            out[name] = int(v[0])
        return out

    def matmul(self, plan: _Plan, a: int, w: int, c: int, stream: int) -> None:
        """One cublasLtMatmul; C (and D) at `c`."""
        try:
            self._lt.matmul(
                self.handle, plan.desc, self._alpha_ptr, w, plan.a, a, plan.b,
                plan.beta_ptr, c, plan.c, c, plan.c, plan.algo_ptr,
                self.workspace, WORKSPACE_BYTES, stream,
            )  # fmt: skip
        except Exception as exc:
            raise BlasError("cublasLtMatmul", _status(exc)) from None


@dataclass(frozen=True, slots=True)
class _Plan:
    desc: int
    a: int
    b: int
    c: int
    algo: npt.NDArray[Any]
    algo_ptr: int  # algo's address (the plan holds algo, so it stays valid)
    beta_ptr: int  # the address of the Blas's beta 0 or 1
