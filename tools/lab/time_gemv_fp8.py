"""GB/s of the FP8 GEMV (fp8.cu's kern_gemv_e4m3_b128, helpers/fp8_kernels.py) at the Qwen3-4B decode
shapes, beside the product's bf16 GEMV (kern_gemv_bf16_s4) and cuBLAS (torch.mm, bf16) on the same
shapes and a device-to-device copy, in one run on the local GPU, as tools/lab/time_gemv.py times
(launches in one CUDA graph rotating over copies of W that miss L2; the median replay). Bytes
counted: W (1 byte per weight for e4m3, 2 for bf16) + scales + x + y. The last row: a decode
step's GEMV time (36 layers; lm_head stays bf16 in Qwen's FP8 checkpoints, so it is left out).

Usage: PYTHONPATH=tools/tests:tools/lab python3 tools/lab/time_gemv_fp8.py [out.md]
"""

from __future__ import annotations

import math
import sys
import tempfile
from pathlib import Path

import torch
from helpers import fp8_kernels as fp8
from helpers import kernel_harness as h
from time_gemv import LAYERS, MIN_ROTATION_BYTES, copy_bandwidth, time_graph

SHAPES = [("qkv 6144x2560", 6144, 2560), ("o 2560x4096", 2560, 4096), ("gate_up 19456x2560", 19456, 2560),
          ("down 2560x9728", 2560, 9728)]


def _cells(k: h.Kernels, n: int, kk: int) -> list[tuple[float, int]]:
    """(us per launch, bytes moved) of cuBLAS bf16, kern's bf16 GEMV and the FP8 GEMV."""
    copies = max(2, math.ceil(MIN_ROTATION_BYTES / (n * kk)))
    x, _, _ = fp8.operands(1, kk, 1, seed=1)
    fp8_ops = [fp8.operands(n, kk, 1, seed=i)[1:] for i in range(copies)]
    bf = [torch.randn(n, kk, device="cuda").to(torch.bfloat16) for _ in range(max(2, copies // 2))]
    y = torch.empty(1, n, device="cuda", dtype=torch.bfloat16)
    io = 2 * kk + 2 * n
    mm = time_graph([lambda w=w: torch.mm(x, w.t(), out=y) for w in bf])
    ours = time_graph([lambda w=w: k.launch("kern_gemv_bf16_s4", (n, 1, 1), (128, 1, 1), h.ptr(x), h.ptr(w),
                                            h.ptr(y), h.i32(1), h.i32(n), h.i32(kk), h.i32(n)) for w in bf])
    e4m3 = time_graph([lambda w=w, s=s: fp8.launch(k, x, w, s, y) for w, s in fp8_ops])
    scales = fp8_ops[0][1].numel() * 4
    return [(mm, 2 * n * kk + io), (ours, 2 * n * kk + io), (e4m3, n * kk + scales + io)]


def main(out: Path | None) -> None:
    torch.manual_seed(0)
    k = h.Kernels(Path(tempfile.mkdtemp(prefix="time_gemv_fp8_")))
    copy = copy_bandwidth()
    labels = ["cuBLAS bf16 torch.mm", "kern_gemv_bf16_s4", fp8.ENTRY]
    lines = [f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}; 1 GiB D2D copy {copy:.0f} GB/s",
             "", "| shape (n x k), rows 1 | " + " | ".join(labels) + " |", "|---" * (len(labels) + 1) + "|"]
    step = [0.0] * len(labels)
    for name, n, kk in SHAPES:
        cells = _cells(k, n, kk)
        for i, (us, _) in enumerate(cells):
            step[i] += us * LAYERS
        lines.append(f"| {name} | " + " | ".join(f"{us:.2f} us, {b / us / 1e3:.0f} GB/s ({b / us / 1e3 / copy:.0%})"
                                                 for us, b in cells) + " |")
        torch.cuda.empty_cache()
    lines.append("| GEMVs of a decode step (36 layers, no lm_head) | " + " | ".join(f"{s / 1e3:.3f} ms" for s in step)
                 + " |")
    text = "\n".join(lines)
    print(text)
    if out is not None:
        out.write_text(text + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else None)
