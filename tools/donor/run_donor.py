"""The donor: our Qwen3 kernels (tools/kernels-src) run in a PyTorch process the way a serving
engine runs them, so that a capture of it can feed the generator (kern_qwen3.mined).

    python tools/donor/run_donor.py [--kernels DIR] [--layers N] [--chunk N] [--prompts 6,23,64,157]
        [--expected FILE] [--timing FILE]

A tiny Qwen3 (kern_qwen3.QWEN3_TINY_CONFIG, layers overridable) with random bf16
weights held as torch tensors (fused qkv and gate_up), one paged KV pool laid out as docs/qwen3.md
says ([page][layer][k|v][P][NKV][D]), preallocated workspaces sized for the largest chunk, a block
table, slots and seq_len. GEMMs go through torch.mm (cuBLAS); every other kernel is ours, loaded
with cuModuleLoadData and launched with cuLaunchKernel and a flat kernelParams array, on torch's
current stream. Each request: its prompt minus the last token in prefill chunks of at most
--chunk rows (`prefill` program: writes KV only), the `start` copies, then NEW_TOKENS decode
steps (device-fed: `kern_decode_advance` moves the step carries), the host reading the 8-byte
next token after each. Forwards are separated by a short host sleep (the scheduling gap),
requests by a longer idle. A GEMM warm-up and one warm-up request run first. Deterministic:
weights, prompts and page assignment come from fixed seeds. Prints every forward it ran;
--expected writes the schedule and the addresses of the buffers the wiring checks are about.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import math
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from cuda.bindings import driver as cu

from kern_mining.build import build_kernels
from kern_qwen3 import PAGE_TOKENS as _GEN_PAGE_TOKENS
from kern_qwen3 import (
    PREFILL_BM,
    PREFILL_THREADS,
    QWEN3_TINY_CONFIG,
    Qwen3Shape,
    prefill_smem,
    shape_from_config,
)

REPO = Path(__file__).resolve().parents[2]

BF16 = torch.bfloat16
DEV = "cuda"
PAGE_TOKENS = 16
DECODE_SPLITS = 16
PREFILL_SPLITS = 16
PREFILL_SPLIT_ROWS = 512
ARGMAX_PARTS = 64
NEW_TOKENS = 4
WARMUP_PROMPT = 11
FORWARD_GAP_S = 0.002  # NOTE: above the analyzer's 0.5 ms forward gap, below its 5 ms window gap
REQUEST_GAP_S = 0.1
POOL_PAGES = 64


class DonorError(Exception):
    """A driver call failed or the donor was configured out of range."""


def check(name: str, result: Any) -> Any:
    values = result if isinstance(result, tuple) else (result,)
    if values[0] != cu.CUresult.CUDA_SUCCESS:
        raise DonorError(f"{name} failed: {values[0]}")
    return values[1] if len(values) == 2 else values[1:]


# ----------------------------------------------------------------------------- launching


class Ptr(int):
    """A device address argument."""


class I32(int):
    """An int argument."""


class I64(int):
    """An int64_t argument."""


class F32(float):
    """A float argument."""


def _ctype(arg: object) -> ctypes._SimpleCData[Any]:
    if isinstance(arg, torch.Tensor):
        return ctypes.c_uint64(arg.data_ptr())
    if isinstance(arg, Ptr):
        return ctypes.c_uint64(int(arg))
    if isinstance(arg, I32):
        return ctypes.c_int32(int(arg))
    if isinstance(arg, I64):
        return ctypes.c_int64(int(arg))
    if isinstance(arg, F32):
        return ctypes.c_float(float(arg))
    raise DonorError(f"untyped kernel argument {arg!r}")


class Kernels:
    """Our cubins loaded through the driver; `launch` passes a flat kernelParams array."""

    def __init__(self, cubins: Sequence[Path]) -> None:
        self._modules = [check("cuModuleLoadData", cu.cuModuleLoadData(p.read_bytes())) for p in cubins]
        self._fns: dict[str, Any] = {}
        self.log: list[dict[str, object]] = []

    def fn(self, name: str) -> Any:
        if name not in self._fns:
            for module in self._modules:
                err, func = cu.cuModuleGetFunction(module, name.encode())
                if err == cu.CUresult.CUDA_SUCCESS:
                    self._fns[name] = func
                    break
            else:
                raise DonorError(f"no loaded module defines {name}")
        return self._fns[name]

    def launch(self, name: str, grid: Sequence[int], block: int, *args: object, smem: int = 0) -> None:
        values = [_ctype(a) for a in args]
        array = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
        stream = cu.CUstream(torch.cuda.current_stream().cuda_stream)
        gx, gy, gz = grid
        fn = self.fn(name)
        if smem > 48 * 1024:
            attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            check(f"{name} shared memory", cu.cuFuncSetAttribute(fn, attr, smem))
        check(name, cu.cuLaunchKernel(fn, gx, gy, gz, block, 1, 1, smem, stream, ctypes.addressof(array), 0))


# ------------------------------------------------------------------------------- model


Shape = Qwen3Shape
"""The model's numbers, as the provider reads them from a config.json."""


def _shape_fields(s: Shape) -> dict[str, object]:
    """The shape as expected.json records it (Qwen3Shape has slots: no vars(); `tied` is not a
    donor fact, the donor's embedding and lm_head are separate tensors)."""
    return {k: v for k, v in asdict(s).items() if k != "tied"}


def shape(layers: int | None) -> Shape:
    """The tiny Qwen3's shape (`layers` overrides its layer count)."""
    s = shape_from_config({**QWEN3_TINY_CONFIG, **({"num_hidden_layers": layers} if layers else {})})
    # NOTE: the donor pages its KV at its own PAGE_TOKENS; the shape's strides assume the generator's.
    assert PAGE_TOKENS == _GEN_PAGE_TOKENS, "the donor's page size must be the generator's for Qwen3Shape's strides"
    return s


@dataclass
class Layer:
    in_norm: torch.Tensor
    qkv: torch.Tensor
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    o: torch.Tensor
    post_norm: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor


def _rand(gen: torch.Generator, *dims: int, scale: float = 0.05, mean: float = 0.0) -> torch.Tensor:
    return (torch.randn(*dims, generator=gen, device=DEV) * scale + mean).to(BF16)


def weights(s: Shape, gen: torch.Generator) -> tuple[torch.Tensor, list[Layer], torch.Tensor]:
    embed = _rand(gen, s.vocab, s.hidden, scale=0.5)
    layers = [
        Layer(
            in_norm=_rand(gen, s.hidden, mean=1.0), qkv=_rand(gen, s.qkv_rows, s.hidden),
            q_norm=_rand(gen, s.head_dim, mean=1.0), k_norm=_rand(gen, s.head_dim, mean=1.0),
            o=_rand(gen, s.hidden, s.heads * s.head_dim), post_norm=_rand(gen, s.hidden, mean=1.0),
            gate_up=_rand(gen, 2 * s.inter, s.hidden), down=_rand(gen, s.hidden, s.inter),
        )
        for _ in range(s.layers)
    ]
    return embed, layers, _rand(gen, s.hidden, mean=1.0)


class Engine:
    """Preallocated workspaces, the paged KV pool and the step carries of one sequence at a time."""

    def __init__(self, s: Shape, k: Kernels, chunk: int, seed: int = 0) -> None:
        gen = torch.Generator(device=DEV)
        gen.manual_seed(seed)
        self.s, self.k, self.chunk = s, k, chunk
        self.embed, self.layers, self.final_norm = weights(s, gen)

        def ws(cols: int, dtype: torch.dtype = BF16) -> torch.Tensor:
            return torch.empty(chunk, cols, dtype=dtype, device=DEV)

        self.h, self.x, self.y = ws(s.hidden), ws(s.hidden), ws(s.hidden)
        self.qkv, self.attn = ws(s.qkv_rows), ws(s.heads * s.head_dim)
        self.gu, self.act = ws(2 * s.inter), ws(s.inter)
        self.logits = torch.empty(1, s.vocab, dtype=BF16, device=DEV)
        self.part_o = torch.empty(DECODE_SPLITS, s.heads * s.head_dim, dtype=torch.float32, device=DEV)
        self.part_lse = torch.empty(DECODE_SPLITS, s.heads, dtype=torch.float32, device=DEV)
        # NOTE: kern_prefill_attn's split partials: splits x rows < 2 * PREFILL_SPLIT_ROWS rows.
        self.pf_o = torch.empty(2 * PREFILL_SPLIT_ROWS, s.heads * s.head_dim, dtype=torch.float32, device=DEV)
        self.pf_lse = torch.empty(2 * PREFILL_SPLIT_ROWS, s.heads, dtype=torch.float32, device=DEV)
        self.pval = torch.empty(ARGMAX_PARTS, dtype=torch.float32, device=DEV)
        self.pidx = torch.empty(ARGMAX_PARTS, dtype=torch.int32, device=DEV)
        self.next_token = torch.empty(1, dtype=torch.int64, device=DEV)
        self.ids = torch.empty(chunk, dtype=torch.int64, device=DEV)
        self.positions = torch.empty(chunk, dtype=torch.int64, device=DEV)
        self.slots = torch.empty(chunk, dtype=torch.int64, device=DEV)
        self.seq_len = torch.empty(1, dtype=torch.int32, device=DEV)
        self.block_table = torch.zeros(-(-s.max_pos // PAGE_TOKENS), dtype=torch.int32, device=DEV)
        self.step = {n: torch.empty(1, dtype=dt, device=DEV) for n, dt in (
            ("ids", torch.int64), ("pos", torch.int64), ("slot", torch.int64), ("len", torch.int32))}
        self.kv = torch.zeros(POOL_PAGES * s.page_stride, dtype=BF16, device=DEV)
        half = s.head_dim // 2
        self.cos = torch.empty(s.max_pos, half, dtype=BF16, device=DEV)
        self.sin = torch.empty(s.max_pos, half, dtype=BF16, device=DEV)
        self.pages: list[int] = []

    # ---------------------------------------------------------------- programs

    def load(self) -> None:
        s = self.s
        self.k.launch("kern_rope_table", (s.max_pos, 1, 1), min(s.head_dim // 2, 1024), self.cos,
                      self.sin, I32(s.max_pos), I32(s.head_dim // 2), F32(s.theta))

    def _kv(self, layer: int) -> Ptr:
        return Ptr(self.kv.data_ptr() + self.s.kv_offset(layer))

    def _slot(self, pos: int) -> int:
        return self.pages[pos // PAGE_TOKENS] * PAGE_TOKENS + pos % PAGE_TOKENS

    def _attention(self, i: int, t: int, io: dict[str, torch.Tensor], decode: bool) -> bool:
        s, k = self.s, self.k
        nq, nkv, d = I32(s.heads), I32(s.kv_heads), I32(s.head_dim)
        ly = self.layers[i]
        torch.mm(self.x[:t], ly.qkv.t(), out=self.qkv[:t])
        k.launch("kern_qk_norm_rope", (t, s.heads + s.kv_heads, 1), s.head_dim // 2, self.qkv,
                 ly.q_norm, ly.k_norm, io["pos"], self.cos, self.sin, nq, nkv, d, F32(s.eps))
        k.launch("kern_kv_write", (t, s.kv_heads, 1), 32, self.qkv, self._kv(i), io["slot"], nq, nkv,
                 d, I32(PAGE_TOKENS), I64(s.page_stride))
        if i == s.layers - 1 and not decode:
            return False  # NOTE: prefill writes only KV; the last layer's attention is never read
        scale = F32(s.head_dim**-0.5)
        if decode:
            k.launch("kern_attn_decode_partial", (s.kv_heads, DECODE_SPLITS, 1), 128, self.qkv,
                     self._kv(i), self.block_table, io["len"], self.part_o, self.part_lse, nq, nkv, d,
                     I32(PAGE_TOKENS), I64(s.page_stride), I32(DECODE_SPLITS), scale)
            k.launch("kern_attn_decode_reduce", (s.heads, 1, 1), 128, self.part_o, self.part_lse,
                     self.attn, nq, d, I32(DECODE_SPLITS))
        else:
            group = s.heads // s.kv_heads
            grid = (math.ceil(t * group / PREFILL_BM), s.kv_heads, min(PREFILL_SPLITS, -(-PREFILL_SPLIT_ROWS // t)))
            k.launch("kern_prefill_attn", grid, PREFILL_THREADS, self.qkv, self._kv(i), self.block_table, io["len"],
                     self.attn, self.pf_o, self.pf_lse, I32(t), nq, nkv, d, I32(PAGE_TOKENS),
                     I64(s.page_stride), scale, smem=prefill_smem(s.head_dim))
            k.launch("kern_prefill_combine", (t, s.heads, 1), 128, self.pf_o, self.pf_lse, io["len"], self.attn,
                     I32(t), nq, nkv, d)
        return True

    def _mlp(self, i: int, t: int) -> None:
        s, k, ly = self.s, self.k, self.layers[i]
        h, eps = I32(s.hidden), F32(s.eps)
        nxt = self.final_norm if i == s.layers - 1 else self.layers[i + 1].in_norm
        torch.mm(self.attn[:t], ly.o.t(), out=self.y[:t])
        k.launch("kern_add_rmsnorm", (t, 1, 1), 256, self.h, self.y, ly.post_norm, self.x, h, eps)
        torch.mm(self.x[:t], ly.gate_up.t(), out=self.gu[:t])
        k.launch("kern_silu_mul", (t, -(-s.inter // 1024), 1), 128, self.gu, self.act, I32(s.inter))
        torch.mm(self.act[:t], ly.down.t(), out=self.y[:t])
        k.launch("kern_add_rmsnorm", (t, 1, 1), 256, self.h, self.y, nxt, self.x, h, eps)

    def forward(self, t: int, io: dict[str, torch.Tensor], decode: bool) -> None:
        s, k = self.s, self.k
        k.launch("kern_embed", (t, 1, 1), 256, io["ids"], self.embed, self.h, I32(s.hidden))
        k.launch("kern_rmsnorm", (t, 1, 1), 256, self.h, self.layers[0].in_norm, self.x,
                 I32(s.hidden), F32(s.eps))
        for i in range(s.layers):
            if self._attention(i, t, io, decode):
                self._mlp(i, t)
        if decode:
            torch.mm(self.x[:1], self.embed.t(), out=self.logits)
            k.launch("kern_argmax_partial", (ARGMAX_PARTS, 1, 1), 256, self.logits, self.pval,
                     self.pidx, I32(s.vocab))
            k.launch("kern_argmax_final", (1, 1, 1), 256, self.pval, self.pidx, self.next_token,
                     I32(ARGMAX_PARTS))
            st = self.step
            k.launch("kern_decode_advance", (1, 1, 1), 32, self.next_token, st["ids"], st["pos"],
                     st["slot"], st["len"], self.block_table, I32(PAGE_TOKENS))

    def _stage(self, tokens: Sequence[int], first_pos: int) -> None:
        t = len(tokens)
        pos = list(range(first_pos, first_pos + t))
        self.ids[:t].copy_(torch.tensor(tokens, dtype=torch.int64))
        self.positions[:t].copy_(torch.tensor(pos, dtype=torch.int64))
        self.slots[:t].copy_(torch.tensor([self._slot(p) for p in pos], dtype=torch.int64))
        self.seq_len.copy_(torch.tensor([first_pos + t], dtype=torch.int32))

    def start(self) -> None:
        st, k = self.step, self.k
        for src, dst in ((self.ids, st["ids"]), (self.positions, st["pos"]), (self.slots, st["slot"])):
            k.launch("kern_copy_i64", (1, 1, 1), 32, src, dst, I32(1))
        k.launch("kern_copy_i32", (1, 1, 1), 32, self.seq_len, st["len"], I32(1))

    def request(self, prompt: Sequence[int], pages: Sequence[int]) -> tuple[list[int], list[int]]:
        """Prefill chunks, start, NEW_TOKENS decode steps; returns (forward token counts, output)."""
        self.pages = list(pages)
        self.block_table[: len(pages)].copy_(torch.tensor(pages, dtype=torch.int32))
        host_io = {"ids": self.ids, "pos": self.positions, "slot": self.slots, "len": self.seq_len}
        step_io = {"ids": self.step["ids"], "pos": self.step["pos"], "slot": self.step["slot"],
                   "len": self.step["len"]}
        forwards: list[int] = []
        done = 0
        while done < len(prompt) - 1:
            t = min(self.chunk, len(prompt) - 1 - done)
            self._stage(prompt[done : done + t], done)
            self.forward(t, host_io, decode=False)
            torch.cuda.synchronize()
            forwards.append(t)
            done += t
            time.sleep(FORWARD_GAP_S)
        self._stage(prompt[-1:], len(prompt) - 1)
        self.start()
        out: list[int] = []
        for _ in range(NEW_TOKENS):
            self.forward(1, step_io, decode=True)
            out.append(int(self.next_token.item()))
            forwards.append(1)
            time.sleep(FORWARD_GAP_S)
        return forwards, out


# ------------------------------------------------------------------------------- driver


def warm_gemms(e: Engine, counts: Sequence[int]) -> None:
    """First cuBLAS calls per shape (handle, heuristics, lazy module loads) before anything is timed."""
    for t in sorted(set(counts)):
        for ly in e.layers:
            torch.mm(e.x[:t], ly.qkv.t(), out=e.qkv[:t])
            torch.mm(e.attn[:t], ly.o.t(), out=e.y[:t])
            torch.mm(e.x[:t], ly.gate_up.t(), out=e.gu[:t])
            torch.mm(e.act[:t], ly.down.t(), out=e.y[:t])
    torch.mm(e.x[:1], e.embed.t(), out=e.logits)
    for name in ("kern_embed", "kern_rmsnorm", "kern_add_rmsnorm", "kern_qk_norm_rope",
                 "kern_kv_write", "kern_prefill_attn", "kern_prefill_combine", "kern_attn_decode_partial",
                 "kern_attn_decode_reduce", "kern_silu_mul", "kern_argmax_partial",
                 "kern_argmax_final", "kern_decode_advance", "kern_copy_i64", "kern_copy_i32"):
        e.k.fn(name)
    torch.cuda.synchronize()


def chunks(n: int, chunk: int) -> list[int]:
    rest, out = n - 1, []
    while rest > 0:
        out.append(min(chunk, rest))
        rest -= out[-1]
    return out


def addresses(e: Engine) -> dict[str, object]:
    """The buffers the mined wiring is about (kern_qwen3.mined checks them)."""
    return {
        "h": e.h.data_ptr(), "x": e.x.data_ptr(), "qkv": e.qkv.data_ptr(), "attn": e.attn.data_ptr(),
        "kv": e.kv.data_ptr(), "block_table": e.block_table.data_ptr(), "pval": e.pval.data_ptr(),
        "pidx": e.pidx.data_ptr(), "part_o": e.part_o.data_ptr(), "part_lse": e.part_lse.data_ptr(),
        "next_token": e.next_token.data_ptr(), "embed": e.embed.data_ptr(),
        "final_norm": e.final_norm.data_ptr(),
        "layers": [{n: getattr(ly, n).data_ptr() for n in ("in_norm", "q_norm", "k_norm", "post_norm")}
                   for ly in e.layers],
    }


def nvcc() -> str:
    found = shutil.which("nvcc")
    if found:
        return found
    return next((p for p in ("/usr/local/cuda/bin/nvcc", "/usr/local/bin/nvcc") if Path(p).exists()), "nvcc")


@dataclass
class Served:
    windows: list[list[int]]
    outputs: list[list[int]]
    timed_s: float


def serve(engine: Engine, prompts: Sequence[int]) -> Served:
    """The warm-up request, then one request per prompt length, separated by REQUEST_GAP_S."""
    s = engine.s
    gen = torch.Generator().manual_seed(1)
    page_order = torch.randperm(POOL_PAGES, generator=gen).tolist()
    served = Served([], [], 0.0)
    time.sleep(REQUEST_GAP_S)
    for r, n in enumerate([WARMUP_PROMPT, *prompts]):
        prompt = torch.randint(1, s.vocab, (n,), generator=gen).tolist()
        need = -(-(n + NEW_TOKENS) // PAGE_TOKENS)
        if need > POOL_PAGES:
            raise DonorError(f"prompt of {n} tokens needs {need} pages; the pool has {POOL_PAGES}")
        pages = [page_order[(r * 7 + j) % POOL_PAGES] for j in range(need)]
        began = time.perf_counter()
        fwd, out = engine.request(prompt, pages)
        if r:
            served.timed_s += time.perf_counter() - began - FORWARD_GAP_S * len(fwd)
        served.windows.append(fwd)
        served.outputs.append(out)
        print(f"donor: request {r} prompt {n} tokens, pages {pages}, forwards {fwd}, next tokens {out}",
              flush=True)
        time.sleep(REQUEST_GAP_S)
    return served


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").strip().splitlines()[0])
    p.add_argument("--kernels", type=Path, default=REPO / "kernels")
    p.add_argument("--layers", type=int, default=None, help="override the tiny config's layers")
    p.add_argument("--chunk", type=int, default=96, help="largest prefill chunk (rows)")
    p.add_argument("--prompts", default="6,23,64,157", help="prompt lengths, comma separated")
    p.add_argument("--expected", type=Path, help="write the schedule and buffer addresses here")
    p.add_argument("--timing", type=Path, help="write seconds spent in the timed requests here")
    args = p.parse_args(argv)
    prompts = [int(x) for x in args.prompts.split(",")]
    if min(prompts) < 2 or args.chunk < 1:
        raise DonorError("prompts need at least 2 tokens and --chunk at least 1")
    torch.manual_seed(0)
    torch.zeros(1, device=DEV)  # NOTE: makes torch's primary context current for the driver calls
    built = build_kernels(REPO / "tools" / "kernels-src", args.kernels, compiler=(nvcc(),))
    kernels = Kernels([path for path, _sha in built.values()])
    s = shape(args.layers)
    engine = Engine(s, kernels, args.chunk)
    warm_gemms(engine, [c for n in [WARMUP_PROMPT, *prompts] for c in chunks(n, args.chunk)] + [1])
    engine.load()
    torch.cuda.synchronize()
    gc.disable()
    served = serve(engine, prompts)
    gc.enable()
    print(f"donor: {s}, chunk {args.chunk}, {len(served.windows)} requests, "
          f"{sum(len(w) for w in served.windows)} forwards", flush=True)
    if args.timing:
        args.timing.write_text(json.dumps({"seconds": served.timed_s}))
    if args.expected:
        args.expected.write_text(json.dumps({
            "windows": served.windows[1:], "warmup": served.windows[:1], "outputs": served.outputs,
            "shape": _shape_fields(s) | {"page_tokens": PAGE_TOKENS, "splits": DECODE_SPLITS,
                                "page_stride": s.page_stride, "chunk": args.chunk},
            "modules": {m: sha for m, (_p, sha) in built.items()},
            "addresses": addresses(engine),
        }, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
