"""Which GEMM should the FP8 manifests run in prefill and in a batched step? On the local GPU, for
the Qwen3-4B linears at a batched step's rows (8, 32, 64) and prefill chunk sizes,
C[m, n] = X[m, k] @ W[n, k]^T timed three ways over the same weights:

- `bf16`: torch.mm over the bf16 weight (the bf16 manifest's GEMM, cuBLASLt);
- `dequant+bf16`: the FP8 manifests' prefill today: the e4m3 weight and its 128 x 128 block scales
  dequantised to bf16 (torch, standing in for kern_dequant_e4m3_b128's pass over W), then torch.mm;
- `fp8 block-scaled`: torch's scaled_mm with X quantised per token and 128-wide k block (1 x 128,
  float32 scales) and W's own 128 x 128 block scales (DeepSeek's recipe, which cuBLASLt runs on
  Hopper with its VEC128_32F / BLK128x128_32F scale modes); X's quantisation is timed with it.

Before them, `layouts()` calls cuBLASLt itself (nvmath's bindings, kern_runtime.blas's
descriptors: W as cuBLAS's A with TRANSA, X as B) in its block-scaled modes (A_SCALE_MODE
BLK128x128_32F, B_SCALE_MODE VEC128_32F) with each candidate layout of the two scale tensors
(W's [n/128][k/128] or [k/128][n/128]; X's [m][k/128] or [k/128][m]) and prints which one gives the
float64 product: the layout an extern of ours must hand it.

Each path is checked against float64 over the same values first (relative L2 of C printed: the fp8 path
also quantises X, so it is expected at the e4m3 level, ~2^-5, the others at bf16's). Each is timed as
the median of CUDA-event spans over rotating weight copies that miss L2.

    PYTHONPATH=tools/tests:tools/lab python3 tools/lab/probe_fp8_gemm.py [out.md] [--m 8,32,64,709,4096,16384]

The answer decides between an extern over cuBLASLt's block-scaled fp8 GEMM (with a per-token
activation quantiser of our own) and our own block-scaled kernel, for prefill and for an FP8
batched step alike; the product's prefill runs `dequant+bf16` until one of them measures faster.
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from helpers import fp8_kernels as fp8

SHAPES = {"qkv": (6144, 2560), "o": (2560, 4096), "gate_up": (19456, 2560), "down": (2560, 9728)}
MIN_ROTATION_BYTES = 512 << 20
E4M3_MAX = 448.0


def quantise_rows_1x128(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """X [m, k] bf16 -> (e4m3 [m, k], float32 scales [m, k / 128]): each token's 128-wide block by
    its amax / 448."""
    m, k = x.shape
    blocks = x.float().reshape(m, k // fp8.BLOCK, fp8.BLOCK)
    amax = blocks.abs().amax(dim=2)
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    q = (blocks / scale[:, :, None]).clamp(-E4M3_MAX, E4M3_MAX).reshape(m, k).to(torch.float8_e4m3fn)
    return q, scale


def _scaled_mm(xq: torch.Tensor, xs: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor) -> torch.Tensor:
    """torch's block-scaled fp8 GEMM: X (1 x 128 scales, laid out outer-dim major as cuBLASLt reads
    them) against W^T (128 x 128 scales), bf16 out."""
    a_scale = xs.t().contiguous().t()  # NOTE: [m, k/128] with stride (1, m)
    b_scale = ws.t()  # NOTE: W^T is [k, n]: its blocks [k/128, n/128]
    return torch._scaled_mm(xq, wq.view(torch.float8_e4m3fn).t(), scale_a=a_scale, scale_b=b_scale,
                            out_dtype=torch.bfloat16)


_COMPUTE_32F, _R_32F, _R_16BF, _R_8F_E4M3 = 68, 0, 14, 28
_WORKSPACE = 32 << 20


def _lt_blockscaled(xq: torch.Tensor, xs: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor,
                    out: torch.Tensor) -> None:
    """out[m, n] = (X e4m3 with its VEC128 scales) @ (W e4m3 with its BLK128x128 scales)^T through
    cublasLtMatmul, the scale tensors passed as laid out in memory (`xs`, `ws` contiguous)."""
    import numpy as np
    from nvmath.bindings import cublasLt as lt

    m, k = xq.shape
    n = wq.shape[0]
    handle = lt.create()
    desc = lt.matmul_desc_create(_COMPUTE_32F, _R_32F)
    layouts = [lt.matrix_layout_create(_R_8F_E4M3, k, n, k), lt.matrix_layout_create(_R_8F_E4M3, k, m, k),
               lt.matrix_layout_create(_R_16BF, n, m, n)]
    pref = lt.matmul_preference_create()
    workspace = torch.empty(_WORKSPACE, dtype=torch.uint8, device="cuda")
    try:
        attrs = ((lt.MatmulDescAttribute.TRANSA, np.array([1], dtype=np.int32)),
                 (lt.MatmulDescAttribute.TRANSB, np.array([0], dtype=np.int32)),
                 (lt.MatmulDescAttribute.A_SCALE_MODE, np.array([int(lt.MatmulMatrixScale.BLK128x128_32F)], dtype=np.int32)),
                 (lt.MatmulDescAttribute.B_SCALE_MODE, np.array([int(lt.MatmulMatrixScale.VEC128_32F)], dtype=np.int32)),
                 (lt.MatmulDescAttribute.A_SCALE_POINTER, np.array([ws.data_ptr()], dtype=np.uint64)),
                 (lt.MatmulDescAttribute.B_SCALE_POINTER, np.array([xs.data_ptr()], dtype=np.uint64)))
        for attr, value in attrs:
            lt.matmul_desc_set_attribute(desc, attr, value.ctypes.data, value.nbytes)
        size = np.array([_WORKSPACE], dtype=np.uint64)
        lt.matmul_preference_set_attribute(pref, lt.MatmulPreferenceAttribute.MAX_WORKSPACE_BYTES, size.ctypes.data, 8)
        a, b, c = layouts
        results = np.zeros(1, dtype=lt.matmul_heuristic_result_dtype)
        count = np.zeros(1, dtype=np.int32)
        lt.matmul_algo_get_heuristic(handle, desc, a, b, c, c, pref, 1, results.ctypes.data, count.ctypes.data)
        if count[0] < 1:
            raise RuntimeError("cuBLASLt has no algorithm for this block-scaled problem")
        algo = np.array(results[0]["algo"]["data_"], dtype=np.uint64)
        alpha, beta = np.ones(1, dtype=np.float32), np.zeros(1, dtype=np.float32)
        lt.matmul(handle, desc, alpha.ctypes.data, wq.data_ptr(), a, xq.data_ptr(), b, beta.ctypes.data,
                  out.data_ptr(), c, out.data_ptr(), c, algo.ctypes.data, workspace.data_ptr(), _WORKSPACE,
                  torch.cuda.current_stream().cuda_stream)
        torch.cuda.synchronize()
    finally:
        lt.matmul_preference_destroy(pref)
        for lay in layouts:
            lt.matrix_layout_destroy(lay)
        lt.matmul_desc_destroy(desc)
        lt.destroy(handle)


def layouts(m: int = 256, n: int = 384, k: int = 512) -> list[str]:
    """Which scale layouts make cuBLASLt's block-scaled GEMM the float64 product (one line each)."""
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    xq, xs = quantise_rows_1x128(x)
    _x, wq, ws = fp8.operands(n, k, 1, seed=7)
    ref = ((xq.double() * xs.double().repeat_interleave(fp8.BLOCK, 1)[:, :k])
           @ (wq.view(torch.float8_e4m3fn).double() * fp8.scales_of(ws.double(), n, k)).T)
    lines = []
    for wname, wlay in (("W [n/128][k/128]", ws.contiguous()), ("W [k/128][n/128]", ws.t().contiguous())):
        for xname, xlay in (("X [m][k/128]", xs.contiguous()), ("X [k/128][m]", xs.t().contiguous())):
            out = torch.zeros(m, n, device="cuda", dtype=torch.bfloat16)
            try:
                _lt_blockscaled(xq, xlay, wq, wlay, out)
                lines.append(f"{wname}, {xname}: relative L2 {_rel(out, ref):.2e}")
            except Exception as exc:
                lines.append(f"{wname}, {xname}: refused: {str(exc).splitlines()[0][:160]}")
    return lines


def _rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.double() - ref).norm() / ref.norm())


def _time(fns: list[Callable[[], Any]], reps: int = 20) -> float:
    """Median ms of one call, cycling through `fns` (one per weight copy)."""
    for f in fns[:3]:
        f()
    spans = []
    for i in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fns[i % len(fns)]()
        end.record()
        end.synchronize()
        spans.append(start.elapsed_time(end))
    return statistics.median(spans)


def probe(name: str, n: int, k: int, m: int) -> dict[str, Any]:
    """One shape at one m: the three paths' errors and times."""
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    copies = max(2, math.ceil(MIN_ROTATION_BYTES / (n * k)))
    weights = [fp8.operands(n, k, 1, seed=i)[1:] for i in range(copies)]
    w0, s0 = weights[0]
    wd = [fp8.dequantised(w, s) for w, s in weights[:2]]
    ref = x.double() @ (w0.view(torch.float8_e4m3fn).double() * fp8.scales_of(s0.double(), n, k)).T
    out: dict[str, Any] = {"gemm": name, "m": m, "n": n, "k": k}
    out["bf16_err"] = _rel(x @ wd[0].T, ref)
    out["bf16_ms"] = _time([lambda w=w: x @ w.T for w in wd])

    def dequant_mm(w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return x @ fp8.dequantised(w, s).T

    out["dequant_ms"] = _time([lambda w=w, s=s: dequant_mm(w, s) for w, s in weights])
    try:
        xq, xs = quantise_rows_1x128(x)
        got = _scaled_mm(xq, xs, w0, s0)
        out["fp8_err"] = _rel(got, ref)

        def fp8_mm(w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
            q, sc = quantise_rows_1x128(x)
            return _scaled_mm(q, sc, w, s)

        out["fp8_ms"] = _time([lambda w=w, s=s: fp8_mm(w, s) for w, s in weights])
        out["fp8_gemm_only_ms"] = _time([lambda w=w, s=s: _scaled_mm(xq, xs, w, s) for w, s in weights])
    except (RuntimeError, TypeError, ValueError) as exc:
        out["fp8_error"] = str(exc).splitlines()[0][:200]
    return out


def _table(rows: list[dict[str, Any]]) -> str:
    head = ("| gemm | m | bf16 ms | dequant+bf16 ms | fp8 ms (with X quantised) | fp8 GEMM alone ms | "
            "fp8 / bf16 | err bf16 | err fp8 |")
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        if "fp8_error" in r:
            tail = f"refused: {r['fp8_error']} | | | {r['bf16_err']:.2e} | |"
            lines.append(f"| {r['gemm']} | {r['m']} | {r['bf16_ms']:.3f} | {r['dequant_ms']:.3f} | {tail}")
            continue
        lines.append(f"| {r['gemm']} | {r['m']} | {r['bf16_ms']:.3f} | {r['dequant_ms']:.3f} | {r['fp8_ms']:.3f} | "
                     f"{r['fp8_gemm_only_ms']:.3f} | {r['fp8_ms'] / r['bf16_ms']:.2f} | {r['bf16_err']:.2e} | "
                     f"{r['fp8_err']:.2e} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("out", nargs="?", type=Path)
    p.add_argument("--m", default="8,32,64,709,4096,16384")
    args = p.parse_args()
    torch.manual_seed(0)
    found = "\n".join(f"- cuBLASLt block-scaled, {line}" for line in layouts())
    print(found)
    rows = [probe(name, n, k, m) for m in (int(v) for v in args.m.split(",")) for name, (n, k) in SHAPES.items()]
    text = f"{torch.cuda.get_device_name()}, torch {torch.__version__}\n\n{found}\n\n{_table(rows)}\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
