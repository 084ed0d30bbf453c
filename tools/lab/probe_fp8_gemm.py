"""Which prefill GEMM should the FP8 manifests run? On the local GPU, for the Qwen3-4B linears at
prefill chunk sizes, C[m, n] = X[m, k] @ W[n, k]^T timed three ways over the same weights:

- `bf16`: torch.mm over the bf16 weight (the bf16 manifest's GEMM, cuBLASLt);
- `dequant+bf16`: the FP8 manifests' prefill today: the e4m3 weight and its 128 x 128 block scales
  dequantised to bf16 (torch, standing in for kern_dequant_e4m3_b128's pass over W), then torch.mm;
- `fp8 block-scaled`: torch's scaled_mm with X quantised per token and 128-wide k block (1 x 128,
  float32 scales) and W's own 128 x 128 block scales (DeepSeek's recipe, which cuBLASLt runs on
  Hopper with its VEC128_32F / BLK128x128_32F scale modes); X's quantisation is timed with it.

Each is checked against float64 over the same values first (relative L2 of C printed: the fp8 path
also quantises X, so it is expected at the e4m3 level, ~2^-5, the others at bf16's). Each is timed as
the median of CUDA-event spans over rotating weight copies that miss L2.

    PYTHONPATH=tools/tests:tools/lab python3 tools/lab/probe_fp8_gemm.py [out.md] [--m 709,4096,16384]

The answer decides between an extern over cuBLASLt's block-scaled fp8 GEMM (with a per-token
activation quantiser of our own) and our own block-scaled kernel; the product runs `dequant+bf16`
until one of them measures faster.
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
    p.add_argument("--m", default="709,4096,16384")
    args = p.parse_args()
    torch.manual_seed(0)
    rows = [probe(name, n, k, m) for m in (int(v) for v in args.m.split(",")) for name, (n, k) in SHAPES.items()]
    text = f"{torch.cuda.get_device_name()}, torch {torch.__version__}\n\n{_table(rows)}\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
