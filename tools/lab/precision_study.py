"""Which activation precision meets the first-step logits bound (1e-2 relative L2 against
transformers in float32)? One command on the GPU host (torch, transformers; the 4B run is expected
to take about a minute plus writing the checkpoint when OUT has none; not yet timed on a GPU):

    PYTHONPATH=tools/gpu python3 tools/lab/precision_study.py OUT [--weights DIR] [--config 4b|tiny] [--layers N]
                                             [--prompts 1,37,709] [--no-ablations] [--device cuda]

Without --weights it writes (or reuses) the random checkpoint of tools/gpu/qwen3_checks.py
(`write_checkpoint`: transformers' save_pretrained, torch.manual_seed(0), bf16) under OUT/ckpt/;
pointing OUT at a qwen3_checks OUTDIR reuses its ckpt/4b. --layers N builds an N-layer variant of
the config (OUT/ckpt/<config>-l<N>) for a quick smoke run; --config tiny is the checks' 2-layer one.

1. references, as qwen3_checks takes them (eager attention, prompts of 1, 37 and 709 seeded random
   ids): transformers float32 (bf16 weights upcast; TF32 off) and transformers bf16;
2. a functional Qwen3 forward written here (embedding, RMSNorm, q/k head norm, neox rope with theta
   from config.json, GQA causal attention over a K/V cache, SiLU MLP, lm_head) computing in float32
   on the float32 model's own weight tensors (no second copy), with a rounding to bf16 (round to
   nearest even) at each of these sites that a scheme names (`SITES`):
     resid       the residual stream after the embedding and after each residual add
     norm_inner  RMSNorm's x * rsqrt(mean(x^2) + eps) before the weight multiply (transformers'
                 own intermediate rounding: it casts to the input dtype, then multiplies)
     gemm_in     the inputs of the linear GEMMs: normed x (q/k/v, gate/up, lm_head), the attention
                 output (o_proj), silu(gate) * up (down_proj)
     gemm_out    the outputs of every linear GEMM: q, k, v, o, gate, up, down and the logits
     qk_norm     the q/k head-norm outputs
     rope_table  the cos / sin tables
     rope        rope's products and sum (q * cos, rotate_half(q) * sin, their sum; k alike)
     q           the query entering attention
     kv          K and V as written to the KV cache (and read back by attention, the current
                 token's own included)
     scores      q.k^T and its product with 1/sqrt(head_dim)
     probs       the softmax output P entering P.V
     act         silu(gate)
   Every scheme is: the sites rounded for prompt tokens 0..n-2, and those for the last prompt
   token, whose logits are compared (one forward when both are the same set):
     f32                      nothing rounded: validates the functional model (must be ~1e-5
                              from transformers float32)
     (a) bf16-all             every site: transformers bf16's own rounding points (sanity: lands
                              near transformers bf16's distance, measured in the same run)
     (b) f32-residual         gemm_in, gemm_out, kv: the residual stream and everything between
                              the GEMMs (norm math, q/k norm, rope with f32 tables, attention
                              scores / softmax / P) in f32
     (c) f32-resid-f32-out    gemm_in, kv: as (b) with the GEMM outputs kept f32
     (d) f32-act-bf16-kv      kv only
     (e) prefill-bf16-decode-f32   tokens 0..n-2 under (a) (their K/V in bf16), the last under (d):
                              kern's structure (chunked prefill on bf16 cublasLt GEMMs, the last
                              prompt token through the decode step)
     (f) prefill-f32resid-decode-f32  tokens 0..n-2 under (b), the last under (d)
   plus, unless --no-ablations, for every site s: only-s (kv + s, the rest f32: what s alone
   costs) and all-but-s (every site but s: what keeping s in f32 buys over bf16-all). (b) and (c)
   keep the KV cache bf16 like every kern design does. The random checkpoint's norm weights are all
   1.0 (transformers' init), so there norm_inner rounds the same values as the norm output, and
   all-but-{norm_inner,qk_norm,q,kv} equal bf16-all (the neighbouring site rounds the same value).
3. prints and writes OUT/precision_study.json and OUT/precision_study.md: for each scheme and
   prompt the relative L2 error of the first-step logits (||x - ref|| / ||ref||, as qwen3_checks
   measures it) against transformers float32, and whether the top-1 token agrees with
   transformers float32's.

Exit status 0 unless the functional f32 forward misses transformers float32 by more than
VALIDATION_TOL on some prompt (the study's numbers then mean nothing; they are still written).

Smoke run without a GPU (2-layer config, about 20 s on 2 CPU cores):
    PYTHONPATH=tools/gpu python3 tools/lab/precision_study.py /tmp/ps --config tiny --device cpu
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
SITES = ("resid", "norm_inner", "gemm_in", "gemm_out", "qk_norm", "rope_table", "rope", "q", "kv",
         "scores", "probs", "act")
ALL = frozenset(SITES)
LOGIT_REL_TOL = 1e-2
VALIDATION_TOL = 1e-4
"""The functional f32 forward against transformers float32 (expected ~1e-5: summation order)."""


def load_checks() -> ModuleType:
    """tools/gpu/qwen3_checks.py (its checkpoint writer, prompts and loaders), imported by name:
    run this script with tools/gpu on PYTHONPATH."""
    import qwen3_checks

    return qwen3_checks


# --------------------------------------------------------------------------------------------
# Schemes.


@dataclass(frozen=True)
class Scheme:
    name: str
    prefill: frozenset[str]
    """Sites rounded to bf16 for prompt tokens 0..n-2."""
    last: frozenset[str]
    """Sites rounded to bf16 for the last prompt token (whose logits are compared)."""
    what: str
    group: str = "main"


def _one(name: str, sites: Iterable[str], what: str, group: str = "main") -> Scheme:
    s = frozenset(sites)
    return Scheme(name, s, s, what, group)


BF16_ALL = ALL
F32_RESIDUAL = frozenset({"gemm_in", "gemm_out", "kv"})
F32_RESID_F32_OUT = frozenset({"gemm_in", "kv"})
F32_ACT_BF16_KV = frozenset({"kv"})


def schemes(ablations: bool) -> list[Scheme]:
    main = [
        _one("f32", (), "nothing rounded (validates the functional model)", "validation"),
        _one("(a) bf16-all", BF16_ALL, "every activation bf16 after every op, as transformers bf16"),
        _one("(b) f32-residual", F32_RESIDUAL, "f32 residual; GEMM inputs and outputs bf16; KV bf16"),
        _one("(c) f32-resid-f32-out", F32_RESID_F32_OUT, "f32 residual; GEMM inputs bf16, outputs f32; KV bf16"),
        _one("(d) f32-act-bf16-kv", F32_ACT_BF16_KV, "every activation f32; only the KV cache bf16"),
        Scheme("(e) prefill-bf16-decode-f32", BF16_ALL, F32_ACT_BF16_KV,
               "prompt tokens 0..n-2 under (a), the last under (d)"),
        Scheme("(f) prefill-f32resid-decode-f32", F32_RESIDUAL, F32_ACT_BF16_KV,
               "prompt tokens 0..n-2 under (b), the last under (d)"),
    ]
    if not ablations:
        return main
    extra = [_one(f"only-{s}", {"kv", s}, f"kv and {s} bf16, the rest f32", "ablation") for s in SITES if s != "kv"]
    extra += [_one(f"all-but-{s}", ALL - {s}, f"every site bf16 but {s}", "ablation") for s in SITES]
    return main + extra


# --------------------------------------------------------------------------------------------
# The functional Qwen3 forward.


@dataclass
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    theta: float
    tied: bool

    @classmethod
    def of(cls, cfg: dict[str, Any]) -> Shape:
        params = cfg.get("rope_parameters") or {}
        theta = cfg.get("rope_theta", params.get("rope_theta"))
        if theta is None:
            raise SystemExit("config.json names no rope_theta (top level or rope_parameters)")
        heads = int(cfg["num_attention_heads"])
        return cls(hidden=int(cfg["hidden_size"]), layers=int(cfg["num_hidden_layers"]), heads=heads,
                   kv_heads=int(cfg["num_key_value_heads"]),
                   head_dim=int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads),
                   eps=float(cfg["rms_norm_eps"]), theta=float(theta),
                   tied=bool(cfg.get("tie_word_embeddings", False)))


def inv_freq(shape: Shape) -> np.ndarray:
    """1 / theta^(2i / D), the power in float64 rounded once to float32 (kern's rope table)."""
    d = shape.head_dim
    return (1.0 / (shape.theta ** (np.arange(0, d, 2, dtype=np.float64) / d))).astype(np.float32)


class Qwen3F:
    """Qwen3 in float32 on given weight tensors (Hugging Face names), rounding to bf16 at the sites
    of the set passed to `forward`."""

    def __init__(self, shape: Shape, weights: dict[str, Any], device: str) -> None:
        import torch

        self.s = shape
        self.w = weights
        self.inv_freq = torch.from_numpy(inv_freq(shape)).to(device)
        self.lm_head = weights["model.embed_tokens.weight"] if shape.tied else weights["lm_head.weight"]
        self.sites: frozenset[str] = frozenset()

    def r(self, x: Any, site: str) -> Any:
        import torch

        return x.to(torch.bfloat16).to(torch.float32) if site in self.sites else x

    def norm(self, x: Any, weight: Any, out_site: str) -> Any:
        import torch

        xn = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.s.eps)
        return self.r(weight * self.r(xn, "norm_inner"), out_site)

    def linear(self, x: Any, name: str) -> Any:
        import torch

        return self.r(torch.nn.functional.linear(x, self.w[name]), "gemm_out")

    def rope(self, x: Any, cos: Any, sin: Any) -> Any:
        import torch

        half = x.shape[-1] // 2
        rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return self.r(self.r(x * cos, "rope") + self.r(rot * sin, "rope"), "rope")

    def tables(self, start: int, n: int) -> tuple[Any, Any]:
        import torch

        pos = torch.arange(start, start + n, device=self.inv_freq.device, dtype=torch.float32)
        freqs = pos[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]  # [T, 1, D]
        return self.r(emb.cos(), "rope_table"), self.r(emb.sin(), "rope_table")

    def attention(self, q: Any, k: Any, v: Any, start: int) -> Any:
        """q [T, NQ, D] at positions start.., k / v [S, NKV, D] (S = start + T): [T, NQ * D]."""
        import torch

        t, nq, d = q.shape
        nkv = self.s.kv_heads
        g = nq // nkv
        qh = q.view(t, nkv, g, d).permute(1, 2, 0, 3)  # [NKV, G, T, D]; query head = kv * G + g
        kh = k.permute(1, 0, 2)[:, None]  # [NKV, 1, S, D]
        vh = v.permute(1, 0, 2)[:, None]
        scores = self.r(self.r(qh @ kh.transpose(-1, -2), "scores") * (d**-0.5), "scores")
        mask = torch.ones(t, k.shape[0], dtype=torch.bool, device=q.device).tril(diagonal=start)
        probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        out = self.r(probs, "probs") @ vh  # [NKV, G, T, D]
        return out.permute(2, 0, 1, 3).reshape(t, nq * d)

    def layer(self, i: int, h: Any, cache: list[tuple[Any, Any]], start: int, cos: Any, sin: Any) -> Any:
        import torch

        p = f"model.layers.{i}."
        s = self.s
        t = h.shape[0]
        x = self.norm(h, self.w[p + "input_layernorm.weight"], "gemm_in")
        q = self.norm(self.linear(x, p + "self_attn.q_proj.weight").view(t, s.heads, s.head_dim),
                      self.w[p + "self_attn.q_norm.weight"], "qk_norm")
        k = self.norm(self.linear(x, p + "self_attn.k_proj.weight").view(t, s.kv_heads, s.head_dim),
                      self.w[p + "self_attn.k_norm.weight"], "qk_norm")
        v = self.linear(x, p + "self_attn.v_proj.weight").view(t, s.kv_heads, s.head_dim)
        q = self.r(self.rope(q, cos, sin), "q")
        k = self.r(self.rope(k, cos, sin), "kv")
        v = self.r(v, "kv")
        if i < len(cache):
            k = torch.cat((cache[i][0], k))
            v = torch.cat((cache[i][1], v))
            cache[i] = (k, v)
        else:
            cache.append((k, v))
        a = self.r(self.attention(q, k, v, start), "gemm_in")
        h = self.r(h + self.linear(a, p + "self_attn.o_proj.weight"), "resid")
        x = self.norm(h, self.w[p + "post_attention_layernorm.weight"], "gemm_in")
        gate = self.linear(x, p + "mlp.gate_proj.weight")
        up = self.linear(x, p + "mlp.up_proj.weight")
        m = self.r(self.r(torch.nn.functional.silu(gate), "act") * up, "gemm_in")
        return self.r(h + self.linear(m, p + "mlp.down_proj.weight"), "resid")

    def forward(self, ids: Sequence[int], start: int, cache: list[tuple[Any, Any]], sites: frozenset[str],
                logits: bool) -> Any:
        """Runs `ids` at positions start.. over `cache` (per layer K, V [S, NKV, D], extended in
        place); returns the last token's float32 logits [V] when `logits`, else None."""
        import torch

        self.sites = sites
        emb = self.w["model.embed_tokens.weight"]
        h = self.r(emb[torch.tensor(list(ids), device=emb.device)], "resid")
        cos, sin = self.tables(start, len(ids))
        for i in range(self.s.layers):
            h = self.layer(i, h, cache, start, cos, sin)
        if not logits:
            return None
        x = self.norm(h[-1:], self.w["model.norm.weight"], "gemm_in")
        return self.r(torch.nn.functional.linear(x, self.lm_head), "gemm_out")[0]

    def first_logits(self, prompt: Sequence[int], scheme: Scheme) -> np.ndarray:
        import torch

        cache: list[tuple[Any, Any]] = []
        with torch.inference_mode():
            if scheme.prefill == scheme.last or len(prompt) == 1:
                out = self.forward(prompt, 0, cache, scheme.last, logits=True)
            else:
                self.forward(prompt[:-1], 0, cache, scheme.prefill, logits=False)
                out = self.forward(prompt[-1:], len(prompt) - 1, cache, scheme.last, logits=True)
        return out.float().cpu().numpy()


# --------------------------------------------------------------------------------------------
# Comparison and report.


def rel_l2(x: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(x.astype(np.float64) - ref) / np.linalg.norm(ref.astype(np.float64)))


def compare(x: np.ndarray, ref: np.ndarray) -> dict[str, Any]:
    return {"rel_l2": rel_l2(x, ref), "max_abs": float(np.max(np.abs(x - ref))), "top1": int(np.argmax(x)),
            "top1_equal": int(np.argmax(x)) == int(np.argmax(ref))}


def ref_summary(ref: np.ndarray) -> dict[str, Any]:
    top = np.sort(ref)[-2:]
    return {"top1": int(np.argmax(ref)), "top1_minus_top2": float(top[1] - top[0]),
            "l2": float(np.linalg.norm(ref)), "rms": float(np.sqrt(np.mean(ref.astype(np.float64) ** 2)))}


def _cell(r: dict[str, Any]) -> str:
    return f"{r['rel_l2']:.2e}" + ("" if r["top1_equal"] else " (top1 differs)")


def markdown(rows: list[dict[str, Any]], lens: Sequence[int], head: str) -> str:
    cols = [f"{n} tok" for n in lens]
    out = [head, "", "| scheme | " + " | ".join(cols) + " | all <= 1e-2 | what |",
           "|---|" + "---|" * len(cols) + "---|---|"]
    group = ""
    for row in rows:
        if row["group"] != group and group:
            out.append("| | " + " | " * len(cols) + " | |")
        group = row["group"]
        res = [row["results"][str(n)] for n in lens]
        ok = "yes" if all(r["rel_l2"] <= LOGIT_REL_TOL for r in res) else "no"
        out.append(f"| {row['scheme']} | " + " | ".join(_cell(r) for r in res) + f" | {ok} | {row['what']} |")
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------------------------
# Driver.


def _config(qc: ModuleType, name: str, layers: int | None) -> tuple[str, dict[str, Any]]:
    cfgs = qc.configs()
    if name not in cfgs:
        raise SystemExit(f"--config {name!r}: choose from {', '.join(cfgs)}")
    cfg = dict(cfgs[name])
    if layers is not None:
        cfg |= {"num_hidden_layers": layers, "max_window_layers": layers}
        name = f"{name}-l{layers}"
    return name, cfg


def checkpoint(qc: ModuleType, out: Path, args: argparse.Namespace) -> Path:
    if args.weights is not None:
        if args.layers is not None:
            raise SystemExit("--layers builds its own checkpoint; leave out --weights with it")
        if not (args.weights / "config.json").is_file():
            raise SystemExit(f"--weights {args.weights}: no config.json there")
        return args.weights.resolve()
    name, cfg = _config(qc, args.config, args.layers)
    rec = qc.Recorder(out)
    path = qc.write_checkpoint(rec, name, cfg)
    if path is None:
        raise SystemExit(f"writing the checkpoint failed: see {out / 'logs' / (name + '.checkpoint.log')}")
    return path


def _timed(label: str, fn: Callable[[], Any]) -> Any:
    t0 = time.perf_counter()
    value = fn()
    print(f"  {label}: {time.perf_counter() - t0:.1f} s", flush=True)
    return value


def references(qc: ModuleType, ckpt: Path, ps: dict[int, list[int]]) -> tuple[dict[int, np.ndarray],
                                                                               dict[int, np.ndarray], Any]:
    """transformers bf16 and float32 first-step logits; returns the float32 model (kept: its
    weights feed the functional forward)."""
    import torch

    model = _timed("load transformers bf16", lambda: qc._hf(ckpt, torch.bfloat16))
    bf16 = {n: qc.hf_logits32(model, p) for n, p in ps.items()}
    del model
    if qc.DEVICE.startswith("cuda"):
        qc._free()
    model = _timed("load transformers float32", lambda: qc._hf(ckpt, torch.float32))
    f32 = _timed("transformers float32 forwards", lambda: {n: qc.hf_logits32(model, p) for n, p in ps.items()})
    return bf16, f32, model


def study(fwd: Qwen3F, ps: dict[int, list[int]], ref: dict[int, np.ndarray], bf16: dict[int, np.ndarray],
          todo: list[Scheme]) -> list[dict[str, Any]]:
    rows = [{"scheme": "transformers bf16", "what": "transformers' own bf16 model, same weights",
             "group": "transformers", "results": {str(n): compare(bf16[n], ref[n]) for n in ps}}]
    for sch in todo:
        res: dict[str, Any] = {}
        for n, p in ps.items():
            lg = fwd.first_logits(p, sch)
            res[str(n)] = compare(lg, ref[n])
            if sch.name.startswith("(a)"):
                res[str(n)]["rel_l2_vs_transformers_bf16"] = rel_l2(lg, bf16[n])
        rows.append({"scheme": sch.name, "what": sch.what, "group": sch.group, "results": res,
                     "prefill_sites": sorted(sch.prefill), "last_sites": sorted(sch.last)})
        print(f"  {sch.name:34} " + "  ".join(f"{n}:{_cell(res[str(n)])}" for n in ps), flush=True)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("out", type=Path, help="output directory (JSON, markdown; ckpt/ unless --weights)")
    ap.add_argument("--weights", type=Path, default=None, help="an existing Qwen3 checkpoint directory")
    ap.add_argument("--config", default="4b", help="qwen3_checks' config to build: 4b (default) or tiny")
    ap.add_argument("--layers", type=int, default=None, help="build the config with this many layers")
    ap.add_argument("--prompts", default="1,37,709", help="subset of qwen3_checks' prompt lengths 1,37,709")
    ap.add_argument("--no-ablations", action="store_true", help="only the main schemes")
    ap.add_argument("--device", default="cuda", help="torch device (cpu for a smoke run)")
    args = ap.parse_args(argv)
    if args.layers is not None and args.layers < 1:
        raise SystemExit(f"--layers {args.layers}: at least 1")
    t0 = time.perf_counter()
    import torch
    import transformers

    torch.set_float32_matmul_precision("highest")  # NOTE: no TF32 in the float32 reference
    qc = load_checks()
    qc.DEVICE = args.device
    lens = [int(x) for x in args.prompts.split(",") if x.strip().isdigit()]
    if not lens or any(n not in qc.PROMPT_LENS for n in lens):
        raise SystemExit(f"--prompts {args.prompts!r}: choose from {','.join(map(str, qc.PROMPT_LENS))}")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    ckpt = checkpoint(qc, out, args)
    cfg = json.loads((ckpt / "config.json").read_text())
    shape = Shape.of(cfg)
    all_ps = qc.prompts(int(cfg["vocab_size"]))
    ps = {n: all_ps[n] for n in lens}
    print(f"checkpoint {ckpt}: {shape}", flush=True)
    bf16, ref, model = references(qc, ckpt, ps)
    weights = dict(model.state_dict())
    fwd = Qwen3F(shape, weights, args.device)
    hf_inv = getattr(getattr(model.model, "rotary_emb", None), "inv_freq", None)
    inv_ulps = (None if hf_inv is None else
                float(np.max(np.abs(hf_inv.float().cpu().numpy() - inv_freq(shape)) /
                             np.spacing(inv_freq(shape)))))
    rows = _timed("functional forwards", lambda: study(fwd, ps, ref, bf16, schemes(not args.no_ablations)))
    validation = {str(n): next(r for r in rows if r["scheme"] == "f32")["results"][str(n)]["rel_l2"] for n in ps}
    valid = all(v <= VALIDATION_TOL for v in validation.values())
    meta = {"checkpoint": str(ckpt), "shape": shape.__dict__, "torch": torch.__version__,
            "transformers": transformers.__version__, "device": _device_name(args.device),
            "reference": "transformers float32 (bf16 weights upcast), eager attention, TF32 off",
            "prompts": lens, "tolerance": LOGIT_REL_TOL, "validation_rel_l2": validation,
            "validation_tol": VALIDATION_TOL, "validation_ok": valid,
            "inv_freq_max_ulps_vs_transformers": inv_ulps,
            "reference_logits": {str(n): ref_summary(ref[n]) for n in ps},
            "seconds": round(time.perf_counter() - t0, 1)}
    (out / "precision_study.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    head = (f"# Precision study: first-step logits, relative L2 to transformers float32\n\n"
            f"Checkpoint {ckpt} ({shape.layers} layers, hidden {shape.hidden}); {meta['device']}, torch "
            f"{torch.__version__}, transformers {transformers.__version__}. Functional f32 forward vs "
            f"transformers float32: {', '.join(f'{n} tok {v:.1e}' for n, v in validation.items())}.")
    text = markdown(rows, lens, head)
    (out / "precision_study.md").write_text(text)
    print("\n" + text, flush=True)
    print(f"validation (functional f32 vs transformers float32 <= {VALIDATION_TOL}): "
          f"{'ok' if valid else 'FAILED'}; inv_freq vs transformers' buffer: max {inv_ulps} f32 ulps; "
          f"{meta['seconds']} s; wrote {out / 'precision_study.json'} and .md", flush=True)
    return 0 if valid and all(math.isfinite(v) for v in validation.values()) else 1


def _device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else device


if __name__ == "__main__":
    sys.exit(main())
