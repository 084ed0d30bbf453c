"""Loads kern's cubins with cupy and launches them on torch tensors; torch references that mirror
transformers' eager Qwen3 rounding; the paged KV layout of docs/qwen3.md. Test and tool code only."""

from __future__ import annotations

import os
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

import cupy as cp
import numpy as np
import torch

from kern_mining.build import build_kernels

REPO = Path(__file__).resolve().parents[3]
KERNELS_SRC = Path(os.environ.get("KERN_TEST_SRC", REPO / "tools" / "kernels-src"))
"""The kernel sources built and loaded; `KERN_TEST_SRC=DIR` swaps in another tree (to compare two
versions of a kernel with the same tests and timings)."""

BF16 = torch.bfloat16
DEV = "cuda"


def i32(v: int) -> np.int32:
    return np.int32(v)


def i64(v: int) -> np.int64:
    return np.int64(v)


def f32(v: float) -> np.float32:
    return np.float32(v)


def ptr(t: torch.Tensor, offset_elems: int = 0) -> np.uint64:
    assert t.is_cuda and t.is_contiguous()
    return np.uint64(t.data_ptr() + offset_elems * t.element_size())


class Kernels:
    """Every `extern "C"` entry of the built modules, by name (`lab`: the lab's modules too, built
    against the product's headers). `KERN_TEST_KERNELS=DIR` builds into DIR instead of `out_dir`
    (build_kernels' cache then spares a rebuild shared with another run)."""

    def __init__(self, out_dir: Path, *, lab: bool = False) -> None:
        nvcc = shutil.which("nvcc") or "/usr/local/bin/nvcc"
        shared = os.environ.get("KERN_TEST_KERNELS")
        out = Path(shared) if shared else out_dir
        built = build_kernels(KERNELS_SRC, out, compiler=(nvcc,))
        if lab:
            from kern_lab import build_lab_kernels

            built |= build_lab_kernels(out, lab_src=REPO / "tools" / "lab" / "kernels-src", product_src=KERNELS_SRC,
                                       compiler=(nvcc,))
        self.modules = {m: cp.RawModule(path=str(p)) for m, (p, _sha) in built.items()}
        self.shas = {m: sha for m, (_p, sha) in built.items()}
        self._fns: dict[str, cp.RawKernel] = {}

    def fn(self, name: str) -> cp.RawKernel:
        if name not in self._fns:
            for module in self.modules.values():
                try:
                    self._fns[name] = module.get_function(name)
                    break
                except cp.cuda.driver.CUDADriverError:
                    continue
            else:
                raise KeyError(name)
        return self._fns[name]

    def launch(
        self, name: str, grid: tuple[int, ...], block: tuple[int, ...], *args: object, shared_mem: int = 0
    ) -> None:
        """Launches on torch's current stream (so torch graph capture records it); `shared_mem`
        bytes of dynamic shared memory (past the entry's default the opt-in attribute is raised)."""
        launch(self.fn(name), grid, block, *args, shared_mem=shared_mem)


def launch(
    fn: cp.RawKernel, grid: tuple[int, ...], block: tuple[int, ...], *args: object, shared_mem: int = 0
) -> None:
    """Launches `fn` on torch's current stream (so torch graph capture records it) with `shared_mem`
    bytes of dynamic shared memory (past the entry's default, 48 KiB less its static part, the opt-in
    attribute is raised first)."""
    if shared_mem > 0 and fn.max_dynamic_shared_size_bytes < shared_mem:
        fn.max_dynamic_shared_size_bytes = shared_mem
    with _torch_stream():
        fn(grid, block, args, shared_mem=shared_mem)


_STREAMS: dict[int, cp.cuda.ExternalStream] = {}


def _torch_stream() -> cp.cuda.ExternalStream:
    handle = torch.cuda.current_stream().cuda_stream
    if handle not in _STREAMS:
        with warnings.catch_warnings():
            # NOTE: cupy 14 deprecates ExternalStream for Stream.from_external; both wrap the handle.
            warnings.simplefilter("ignore", DeprecationWarning)
            _STREAMS[handle] = cp.cuda.ExternalStream(handle)
    return _STREAMS[handle]


# ------------------------------------------------------------------------------------------------
# References (transformers' eager Qwen3 rounding, docs/qwen3.md "Numerics").


def rms_ref(x: torch.Tensor, w: torch.Tensor, eps: float, rscale: float = 1.0) -> torch.Tensor:
    """Qwen3RMSNorm; `rscale` perturbs rsqrt(mean + eps) to bound reduction-order effects."""
    x32 = x.float()
    r = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * rscale
    return w * (x32 * r).to(x.dtype)


def rope_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """apply_rotary_pos_emb on [..., D] with cos/sin [..., D] (halves repeated)."""
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos) + (rot * sin)


def silu_mul_ref(gu: torch.Tensor) -> torch.Tensor:
    inter = gu.shape[-1] // 2
    return torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]


# ------------------------------------------------------------------------------------------------
# Paged KV state, docs/qwen3.md: [page][layer][k|v][P][NKV][D] bf16.


@dataclass
class Paged:
    state: torch.Tensor  # flat bf16
    layers: int
    pages: int
    page_tokens: int
    nkv: int
    head_dim: int

    @property
    def page_stride(self) -> int:
        return self.layers * 2 * self.page_tokens * self.nkv * self.head_dim

    def layer_offset(self, layer: int) -> int:
        return layer * 2 * self.page_tokens * self.nkv * self.head_dim

    def view(self) -> torch.Tensor:
        return self.state.view(
            self.pages, self.layers, 2, self.page_tokens, self.nkv, self.head_dim
        )

    def gather(self, layer: int, block_table: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of the sequence's first `length` tokens: [length, NKV, D] each."""
        v = self.view()[:, layer]
        pos = torch.arange(length, device=DEV)
        pages = block_table.long()[pos // self.page_tokens]
        rows = pos % self.page_tokens
        return v[pages, 0, rows], v[pages, 1, rows]


def new_paged(layers: int, pages: int, page_tokens: int, nkv: int, head_dim: int, gen: torch.Generator) -> Paged:
    n = pages * layers * 2 * page_tokens * nkv * head_dim
    state = torch.randn(n, generator=gen, device=DEV).to(BF16)
    return Paged(state, layers, pages, page_tokens, nkv, head_dim)


def attention_ref(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qpos: torch.Tensor, scale: float
) -> torch.Tensor:
    """sdpa in f32 over gathered K/V: q [rows, NQ, D], k/v [L, NKV, D], query i sees keys <= qpos[i]."""
    nq, nkv = q.shape[1], k.shape[1]
    kk = k.float().repeat_interleave(nq // nkv, dim=1).transpose(0, 1)
    vv = v.float().repeat_interleave(nq // nkv, dim=1).transpose(0, 1)
    qq = q.float().transpose(0, 1)
    mask = torch.arange(k.shape[0], device=DEV)[None, :] <= qpos[:, None]
    out = torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask, scale=scale)
    return out.transpose(0, 1).reshape(q.shape[0], nq * q.shape[2])
