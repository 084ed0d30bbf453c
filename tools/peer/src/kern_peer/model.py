"""The peer's Qwen3 in PyTorch: the layers' dense work compiled by torch.compile, attention over a
static KV cache (torch SDPA; for long caches a compiled attention split over the keys, its scores
in float32 as flash attention keeps them), a decode step captured as one CUDA graph that feeds
itself.

A decode step is `first` (embedding, RMSNorm, qkv, q/k norm, RoPE), then per layer the cache write
and SDPA (GQA: the query heads of each KV head are that head's query rows, so the cache is read
as it is, never repeated) and `mid` (o, residual, RMSNorm, gate/up, SiLU, down, residual, and the
next layer's RMSNorm, qkv, q/k norm, RoPE: one compiled function per layer boundary, so the norm
fuses with the add before it), and `last` (the last layer's o and MLP, the final norm, the head and
the argmax). The step's graph attends over a fixed cache length (a bucket past the context) with a
mask of the positions written so far (from SPLIT_FROM positions on, `split_attention`: the scores
in one batched product, softmax and P V per chunk of keys, the chunks combined by their maxima,
compiled); its last ops copy the argmax into the token input and add 1
to the position, so replays decode on without the host. Prefill runs the same compiled functions
over the prompt (dynamic length) with causal SDPA (flash), writing the cache.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from kern_peer.config import PeerConfig

__all__ = ["BUCKET", "SPLIT_FROM", "Peer", "bucket", "split_attention"]

BUCKET = 256
"""Cache lengths a step graph attends over are multiples of this."""
SPLIT_FROM = 2048
"""Step graphs over at least this many cache positions attend with `split_attention` (compiled);
shorter ones with torch SDPA, whose one block per (kv head, query rows) is enough there."""


def bucket(tokens: int) -> int:
    """The cache length a step graph for sequences up to `tokens` attends over."""
    return -(-tokens // BUCKET) * BUCKET


@dataclass(frozen=True)
class _Layer:
    in_norm: torch.Tensor
    wqkv: torch.Tensor
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    wo: torch.Tensor
    post_norm: torch.Tensor
    wgu: torch.Tensor
    wdown: torch.Tensor

    def pre(self) -> tuple[torch.Tensor, ...]:
        return (self.in_norm, self.wqkv, self.q_norm, self.k_norm)

    def post(self) -> tuple[torch.Tensor, ...]:
        return (self.wo, self.post_norm, self.wgu, self.wdown)


def _load_tensors(files: Sequence[Path], device: torch.device) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(load_file(str(f), device=str(device)))
    return tensors


def _layers(t: dict[str, torch.Tensor], cfg: PeerConfig) -> list[_Layer]:
    out = []
    for i in range(cfg.layers):
        p = f"model.layers.{i}."

        def w(name: str, p: str = p) -> torch.Tensor:
            return t.pop(p + name)

        qkv = torch.cat([w("self_attn.q_proj.weight"), w("self_attn.k_proj.weight"), w("self_attn.v_proj.weight")])
        gu = torch.cat([w("mlp.gate_proj.weight"), w("mlp.up_proj.weight")])
        out.append(_Layer(w("input_layernorm.weight"), qkv, w("self_attn.q_norm.weight"), w("self_attn.k_norm.weight"),
                          w("self_attn.o_proj.weight"), w("post_attention_layernorm.weight"), gu,
                          w("mlp.down_proj.weight")))
    return out


def split_attention(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, valid: torch.Tensor,
                    chunk: int = BUCKET) -> torch.Tensor:
    """Decode attention split over the keys: q [kv, g, D] (a kv head's g query heads), kc and vc
    [kv, L, D] (L a multiple of `chunk`), valid [L] bool (the positions written so far) -> [kv, g, D].
    As flash attention computes it: the scores accumulate in float32 and stay float32 (a bf16
    score is off by up to 2^-9 of its size, a whole unit of a large logit), softmax and P V run
    per chunk of `chunk` keys (each chunk's max, sum and float32-accumulated weighted V, P rounded
    to the cache's dtype), and the chunks combine by their maxima. Written as products summed
    over an axis, so that compiled, each reduction reads the bf16 cache once and accumulates in
    float32 (no float copy of the cache), over kv x L / chunk independent chunks: a long cache is
    read at the GPU's bandwidth."""
    kv, g, d = q.shape
    n = kc.shape[1] // chunk
    s = (q.float().unsqueeze(2) * kc.float().unsqueeze(1)).sum(-1) * d**-0.5
    s = s.masked_fill(~valid, float("-inf")).view(kv, g, n, chunk)
    m = s.amax(-1)
    p = torch.exp(s - torch.where(torch.isfinite(m), m, torch.zeros_like(m)).unsqueeze(-1))
    total = p.sum(-1)
    pv = p.to(vc.dtype).float().unsqueeze(-1) * vc.view(kv, 1, n, chunk, d).float()
    o = pv.sum(3)
    top = m.amax(-1, keepdim=True)
    w = torch.where(total > 0, torch.exp(m - top), torch.zeros_like(m))
    return ((w.unsqueeze(-1) * o).sum(2) / (w * total).sum(-1, keepdim=True)).to(q.dtype)


@functools.cache
def _split_compiled() -> Callable[..., torch.Tensor]:
    return torch.compile(split_attention, dynamic=True)


# --------------------------------------------------------------------------------------------
# The compiled functions (one set per model shape, so models of one shape share their compiles).


def _functions(cfg: PeerConfig) -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]:
    return _compiled(cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.eps)


@functools.cache
def _compiled(nq: int, nkv: int, d: int, eps: float) -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]:
    def rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return w * xf.to(x.dtype)

    def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = d // 2
        rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rot * sin

    def pre(h: torch.Tensor, pos: torch.Tensor, cos_t: torch.Tensor, sin_t: torch.Tensor, in_norm: torch.Tensor,
            wqkv: torch.Tensor, q_norm: torch.Tensor, k_norm: torch.Tensor) -> tuple[torch.Tensor, ...]:
        qkv = F.linear(rms(h, in_norm), wqkv)
        q, k, v = qkv.split([nq * d, nkv * d, nkv * d], dim=-1)
        cos, sin = cos_t[pos].unsqueeze(1), sin_t[pos].unsqueeze(1)
        q = rope(rms(q.reshape(-1, nq, d), q_norm), cos, sin)
        k = rope(rms(k.reshape(-1, nkv, d), k_norm), cos, sin)
        return q, k, v.reshape(-1, nkv, d)

    def post(o: torch.Tensor, h: torch.Tensor, wo: torch.Tensor, post_norm: torch.Tensor, wgu: torch.Tensor,
             wdown: torch.Tensor) -> torch.Tensor:
        h = h + F.linear(o, wo)
        gate, up = F.linear(rms(h, post_norm), wgu).chunk(2, dim=-1)
        return h + F.linear(F.silu(gate) * up, wdown)

    def first(ids: torch.Tensor, pos: torch.Tensor, cos_t: torch.Tensor, sin_t: torch.Tensor, embed: torch.Tensor,
              *pre_w: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = F.embedding(ids, embed)
        return (h, *pre(h, pos, cos_t, sin_t, *pre_w))

    def mid(o: torch.Tensor, h: torch.Tensor, pos: torch.Tensor, cos_t: torch.Tensor, sin_t: torch.Tensor,
            wo: torch.Tensor, post_norm: torch.Tensor, wgu: torch.Tensor, wdown: torch.Tensor,
            *pre_w: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = post(o, h, wo, post_norm, wgu, wdown)
        return (h, *pre(h, pos, cos_t, sin_t, *pre_w))

    def last(o: torch.Tensor, h: torch.Tensor, norm: torch.Tensor, head: torch.Tensor, *post_w: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
        h = post(o, h, *post_w)
        logits = F.linear(rms(h[-1:], norm), head)
        return logits, logits.argmax(dim=-1)

    return torch.compile(first), torch.compile(mid), torch.compile(last)


# --------------------------------------------------------------------------------------------


class Peer:
    """A Qwen3 checkpoint on one GPU with a static KV cache of `cache_tokens` positions."""

    def __init__(self, cfg: PeerConfig, files: Sequence[Path], device: torch.device, cache_tokens: int) -> None:
        self.cfg = cfg
        self.device = device
        self.cache_tokens = bucket(cache_tokens)
        t = _load_tensors(files, device)
        self.embed = t.pop("model.embed_tokens.weight")
        self.norm = t.pop("model.norm.weight")
        head = t.pop("lm_head.weight", None)
        self.head = self.embed if cfg.tied or head is None else head
        self.layers = _layers(t, cfg)
        del t
        shape = (cfg.layers, cfg.kv_heads, self.cache_tokens, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=self.embed.dtype, device=device)
        self.v = torch.zeros(shape, dtype=self.embed.dtype, device=device)
        self.cos, self.sin = self._rope_tables(self.cache_tokens)
        self.tok = torch.zeros(1, dtype=torch.long, device=device)
        self.pos = torch.zeros(1, dtype=torch.long, device=device)
        self.logits = torch.zeros(1, cfg.vocab, dtype=self.embed.dtype, device=device)
        self.arange = torch.arange(self.cache_tokens, device=device)
        self.first, self.mid, self.last = _functions(cfg)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.pool = torch.cuda.graph_pool_handle()
        self._gqa = True

    def _rope_tables(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        d = self.cfg.head_dim
        inv_freq = 1.0 / (self.cfg.theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
        freqs = torch.arange(n, device=self.device).float()[:, None] * inv_freq.to(self.device)[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(self.embed.dtype), emb.sin().to(self.embed.dtype)

    # -- decode -------------------------------------------------------------------------------

    def _attend_step(self, i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, length: int,
                     mask: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        kc, vc = self.k[i], self.v[i]
        kc.index_copy_(1, self.pos, k.transpose(0, 1))
        vc.index_copy_(1, self.pos, v.transpose(0, 1))
        qg = q.reshape(1, c.kv_heads, c.group, c.head_dim)
        if length >= SPLIT_FROM:
            o = _split_compiled()(qg[0], kc[:, :length], vc[:, :length], mask.view(length))
            return o.reshape(1, c.heads * c.head_dim)
        # NOTE: a mask rules flash out; the efficient kernel takes it (math only where it cannot).
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
            o = F.scaled_dot_product_attention(qg, kc[None, :, :length], vc[None, :, :length], attn_mask=mask)
        return o.reshape(1, c.heads * c.head_dim)

    def _step_body(self, length: int) -> None:
        """One decode step over cache positions [0, length): reads tok and pos, writes logits, then
        feeds the argmax into tok and advances pos."""
        mask = (self.arange[:length] <= self.pos).view(1, 1, 1, length)
        h, q, k, v = self.first(self.tok, self.pos, self.cos, self.sin, self.embed, *self.layers[0].pre())
        for i, layer in enumerate(self.layers):
            o = self._attend_step(i, q, k, v, length, mask)
            if i + 1 < len(self.layers):
                h, q, k, v = self.mid(o, h, self.pos, self.cos, self.sin, *layer.post(), *self.layers[i + 1].pre())
            else:
                logits, nxt = self.last(o, h, self.norm, self.head, *layer.post())
                self.logits.copy_(logits)
                self.tok.copy_(nxt)
        self.pos.add_(1)

    def graph(self, length: int) -> torch.cuda.CUDAGraph:
        """The step graph attending over `length` cache positions (a bucket), captured once: two
        warm-up runs on a side stream (they compile the decode shapes), then the capture. The
        warm-up steps run at the bucket's last two positions, whose cache rows a sequence that
        fits the bucket writes before it reads them (a step writes its own row first), so a
        capture after a prefill leaves the prompt's rows as they were; the token and position are
        restored."""
        length = bucket(length)
        if length > self.cache_tokens:
            raise ValueError(f"a step over {length} positions exceeds the cache of {self.cache_tokens}")
        if length in self.graphs:
            return self.graphs[length]
        tok, pos = self.tok.clone(), self.pos.clone()
        # NOTE: a warm-up step writes its K and V at `pos`; at the current position it would
        # overwrite rows of a prompt prefilled before the capture
        self.pos.fill_(length - 2)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                self._step_body(length)
        torch.cuda.current_stream(self.device).wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            self._step_body(length)
        self.tok.copy_(tok)
        self.pos.copy_(pos)
        self.graphs[length] = g
        return g

    def set_state(self, token: int, position: int) -> None:
        """The next step's input token and its position."""
        self.tok.fill_(token)
        self.pos.fill_(position)

    # -- prefill ------------------------------------------------------------------------------

    def _causal(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal SDPA over the prompt (flash); the KV heads repeated only if flash refuses GQA."""
        qt, kt, vt = q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None]
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            if self._gqa:
                try:
                    return F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=True)
                except RuntimeError:
                    self._gqa = False
            g = self.cfg.group
            return F.scaled_dot_product_attention(qt, kt.repeat_interleave(g, 1), vt.repeat_interleave(g, 1),
                                                  is_causal=True)

    def prefill(self, ids: torch.Tensor) -> None:
        """Writes the cache of positions [0, len(ids)) (the prompt before the step's token); runs
        no more than that needs: the last layer only writes its K and V."""
        n = int(ids.shape[0])
        c = self.cfg
        pos = torch.arange(n, device=self.device)
        for t in (ids, pos):
            torch._dynamo.maybe_mark_dynamic(t, 0)  # pyright: ignore[reportPrivateUsage]
        h, q, k, v = self.first(ids, pos, self.cos, self.sin, self.embed, *self.layers[0].pre())
        for i, layer in enumerate(self.layers):
            self.k[i, :, :n] = k.transpose(0, 1)
            self.v[i, :, :n] = v.transpose(0, 1)
            if i + 1 == len(self.layers):
                break
            o = self._causal(q, k, v)[0].transpose(0, 1).reshape(n, c.heads * c.head_dim)
            torch._dynamo.maybe_mark_dynamic(o, 0)  # pyright: ignore[reportPrivateUsage]
            torch._dynamo.maybe_mark_dynamic(h, 0)  # pyright: ignore[reportPrivateUsage]
            h, q, k, v = self.mid(o, h, pos, self.cos, self.sin, *layer.post(), *self.layers[i + 1].pre())

    def generate(self, prompt: Sequence[int], steps: int) -> list[int]:
        """Greedy tokens: prefill all prompt tokens but the last, then `steps` replays of the step
        graph (each feeding the next on the device), reading each token back."""
        return self.generate_logits(prompt, steps)[0]

    def generate_logits(self, prompt: Sequence[int], steps: int) -> tuple[list[int], torch.Tensor]:
        """`generate`'s tokens and the first step's logits (float32, [vocab])."""
        if steps < 1:
            raise ValueError(f"steps must be at least 1, got {steps}")
        n = len(prompt)
        if n > 1:
            self.prefill(torch.tensor(prompt[:-1], dtype=torch.long, device=self.device))
        g = self.graph(n + steps)
        self.set_state(prompt[-1], n - 1)
        out = []
        first = self.logits
        for i in range(steps):
            g.replay()
            if i == 0:
                first = self.logits[0].float().clone()
            out.append(int(self.tok.item()))
        return out, first
