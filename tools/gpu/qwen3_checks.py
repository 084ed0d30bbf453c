"""Qwen3 on kern, checked against transformers and benchmarked, in one command on a GPU host:

    python3 tools/gpu/qwen3_checks.py OUTDIR [--gpu 0] [--models tiny,4b] [--no-bench] [--long]

1. builds tools/kernels-src into OUTDIR/kernels and generates OUTDIR/manifests/qwen3-{tiny,4b}.json
   from the checkpoints' config.json (kern_qwen3);
2. writes random-weight checkpoints with transformers' save_pretrained (torch.manual_seed(0), bf16)
   for a 2-layer tiny Qwen3 and the Qwen3-4B shape under OUTDIR/ckpt/;
3. references from transformers (eager attention): greedy tokens in bf16 for 64 steps on prompts of
   1, 37 and 709 ids (with --long, on the 4B, also 8,200 and 32,800 ids: past 8k and 32k, computed
   with SDPA attention and the last position's logits only) with the top-1 minus top-2 logit gap of
   every step, and first-step logits in float32; its eager decode and 709-token prefill times (4B);
4. kern, for each model and prompt: greedy tokens (graph, --chunk 512) == transformers (a divergence
   passes only where transformers' gap is <= 4 bf16 ulps: reported), first-step logits within 1e-2
   relative error (L2) of float32 (and, as a regression guard, within 1.25x of transformers' own
   bf16 error), graph == eager, --chunk 512 == 1 == 97 (512 == 2048 == 97 past 4,096 ids; the
   runtime's pool holds the longest prompt and its steps; each run is a fresh `Engine` over the
   runtime loaded once per manifest, its first token from the decode step; exact equality is
   reported; a divergence passes only at a near-tie of the --chunk 512 run: its top-1 logit minus
   the other run's token's logit <= 4 bf16 ulps, reported); kern-run as a process (--output ids
   equals the in-process tokens; kern.toml + random checkpoint + text prompt); the same checks for
   each variant of --variants: `-gemv` (examples/qwen3-4b-gemv.json: o, gate_up and lm_head as our
   GEMV), `-fast` (examples/qwen3-4b-fast.json, `--gemv all --fuse --pdl --fold-norm --defer-norm`:
   every decode GEMM as our GEMV, fused q/k-norm+rope+KV write and one-launch decode attention, the
   add + RMSNorm before qkv and gate_up in those GEMVs with the norm's scale in their epilogue
   (gemv_defer.cu), PDL), `-f32` (examples/qwen3-4b-f32.json, the reference-precision manifest:
   greedy tokens against transformers float32's, a divergence passing only where its gap is <= 1/16
   bf16 ulp, first-step logits within 1e-4 of float32's; not benched). The lab's variants run through
   tools/lab/qwen3_variants.py, which calls `main` with its own variants and kernel sources;
5. `kern bench` rows (decode at contexts 128 and 8192, prefill 709, the copy-bandwidth and
   cuBLAS-only floors) plus transformers eager, as OUTDIR/bench.json and a table, for the base
   manifest and each variant but `-f32` (rows `4b.*`, `4b-fast.*`, ...; the floor is the all-cublasLt step's
   GEMMs); the per-kernel time of one decode step (OUTDIR/4b.decode_profile.txt,
   4b-fast.decode_profile.txt, ...) for docs/perf.md.

Every check is recorded even when an earlier one failed; logs go to OUTDIR/logs/, results to
OUTDIR/summary.json. Exit status 0 only when every check passed.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import inspect
import io
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from kern_runtime.bench import row as _row

if TYPE_CHECKING:
    from kern_runtime import Backend, ServingRoles

ROOT = Path(__file__).resolve().parents[2]
STEPS = 64
PROMPT_LENS = (1, 37, 709)
LONG_PROMPT_LENS = (8200, 32800)
"""`--long`: prompts past 8k and 32k tokens (the 4B only; its positions reach 40,960)."""
LONG = 4096
"""Prompts longer than this take the long path: transformers' references with SDPA attention (eager
would hold a [heads, n, n] score matrix: 137 GB in float32 at 32,800) and only the last position's
logits, kern's chunk runs at CHUNKS_LONG."""
CHUNKS = (512, 1, 97)
CHUNKS_LONG = (512, 2048, 97)
"""The chunk runs of a long prompt (a chunk of 1 would prefill 32,800 tokens one by one)."""
NEAR_TIE_ULPS = 4.0
LOGIT_REL_TOL = 1e-2
F32_NEAR_TIE_ULPS = 1 / 16
"""The near-tie rule of the f32 manifest against transformers float32 (greedy tokens, --chunk runs):
a divergence passes only where the reference's top-1 minus top-2 gap is at most 1/16 bf16 ulp
(2^-11..2^-12 relative), some 100x the f32 logits' error (~1e-5 relative L2)."""
F32_LOGIT_REL_TOL = 1e-4
"""The f32 manifest's first-step logits bound against transformers float32 (relative L2): the H200
measured 1.62e-6 / 7.65e-6 / 1.15e-5 on the 4B (prompts 1 / 37 / 709), the precision study's f32
forward with an f32 KV cache 2.6e-5. LOGIT_REL_TOL is 1000x that: it would pass an f32 manifest
that lost its precision somewhere (a bf16 workspace or KV cache; the bf16 manifests measure 2e-2
to 4e-2 on the random 4B)."""
LOGIT_NOISE_FACTOR = 1.25
"""kern's first-step logits error against fp32 may be at most this multiple of transformers' own
bf16 error on the same prompt (a regression guard beside the absolute 1e-2 bound, which no bf16
KV cache meets on random weights: docs/qwen3.md)."""
CAPACITY = 4096
DEVICE = "cuda"
"""torch's device for the transformers side (a CPU smoke run of the reference code sets "cpu")."""


def _load_gen() -> ModuleType:
    import kern_qwen3

    return kern_qwen3


Variant = Callable[[str], Any]
"""A manifest variant: the feed the kernel sources allow -> its kern_qwen3.Plan."""


def product_variants(gen: ModuleType) -> dict[str, Variant]:
    """The shipped manifests' options: `gemv` (examples/qwen3-4b-gemv.json), `fast`
    (examples/qwen3-4b-fast.json) and `f32` (examples/qwen3-4b-f32.json)."""
    fast = gen.plan_passes(fold_norm=True, defer_norm=True, pdl=True, gemm_algos="h200")
    return {
        "gemv": lambda feed: gen.Plan(feed=feed, gemv=gen.GEMV_DEFAULT),
        "fast": lambda feed: gen.Plan(feed=feed, gemv=gen.GEMV_GEMMS, fuse=True, passes=fast),
        "f32": lambda feed: gen.Plan(feed=feed, precision="f32"),
    }


@dataclass(frozen=True)
class Sources:
    """The kernels a run builds (into OUTDIR/kernels: module -> sha256) and the entries they define."""

    build: Callable[[Path], dict[str, str]]
    entries: Callable[[], dict[str, str]]


def _product_build(out: Path) -> dict[str, str]:
    from kern_mining.build import build_kernels

    return {m: sha for m, (_p, sha) in build_kernels(ROOT / "tools" / "kernels-src", out).items()}


def _product_entries() -> dict[str, str]:
    return _load_gen().entry_modules(ROOT / "tools" / "kernels-src")


PRODUCT_SOURCES = Sources(_product_build, _product_entries)


# --------------------------------------------------------------------------------------------
# Check bookkeeping.


@dataclass
class Check:
    name: str
    status: str = "PENDING"  # PASS / FAIL / ERROR / SKIP
    detail: str = ""
    data: dict[str, Any] = field(default_factory=dict[str, Any])


class Recorder:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.logs = out / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.checks: list[Check] = []
        self.bench: list[dict[str, Any]] = []
        # NOTE: rows of an earlier run into the same OUTDIR (e.g. `--models tiny`, then `--models 4b`)
        # are kept unless this run repeats the check.
        old = out / "summary.json"
        self.earlier: list[dict[str, Any]] = json.loads(old.read_text()) if old.is_file() else []

    @contextlib.contextmanager
    def check(self, name: str) -> Iterator[Check]:
        c = Check(name)
        self.checks.append(c)
        t0 = time.perf_counter()
        print(f"[....] {name}", flush=True)
        try:
            yield c
            if c.status == "PENDING":
                c.status = "PASS"
        except Exception as exc:
            c.status = "ERROR"
            c.detail = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            (self.logs / f"{name}.log").write_text(traceback.format_exc())
        c.data["seconds"] = round(time.perf_counter() - t0, 2)
        print(f"[{c.status:4}] {name} {c.detail}", flush=True)
        self.save()

    def passed(self, name: str) -> bool:
        return any(c.name == name and c.status == "PASS" for c in self.checks)

    def save(self) -> None:
        rows = [{"name": c.name, "status": c.status, "detail": c.detail, **c.data} for c in self.checks]
        now = {c.name for c in self.checks}
        rows = [r for r in self.earlier if r.get("name") not in now] + rows
        (self.out / "summary.json").write_text(json.dumps(rows, indent=1, default=str) + "\n")
        if self.bench:
            (self.out / "bench.json").write_text(json.dumps(self.bench, indent=1) + "\n")


def _fail(c: Check, detail: str) -> None:
    c.status = "FAIL"
    c.detail = detail


# --------------------------------------------------------------------------------------------
# Build, generate, checkpoints.


def build(rec: Recorder, sources: Sources = PRODUCT_SOURCES) -> dict[str, str]:
    hashes: dict[str, str] = {}
    with rec.check("build_kernels") as c:
        hashes = sources.build(rec.out / "kernels")
        c.detail = ", ".join(f"{m} {h[:12]}" for m, h in hashes.items())
    return hashes


def configs() -> dict[str, dict[str, Any]]:
    from kern_qwen3 import QWEN3_4B_CONFIG, QWEN3_TINY_CONFIG

    return {"tiny": dict(QWEN3_TINY_CONFIG), "4b": dict(QWEN3_4B_CONFIG)}


def write_checkpoint(rec: Recorder, name: str, cfg: dict[str, Any]) -> Path | None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    path = rec.out / "ckpt" / name
    ok = False
    with rec.check(f"{name}.checkpoint") as c:
        if (path / "config.json").is_file() and any(path.glob("*.safetensors")):
            c.detail = f"reused {path}"
        else:
            keep = {k: v for k, v in cfg.items() if k not in ("architectures", "torch_dtype") and v is not None}
            if "rope_parameters" in inspect.signature(Qwen3Config.__init__).parameters:
                keep["rope_parameters"] = {"rope_type": "default", "rope_theta": float(keep.pop("rope_theta"))}
            config = Qwen3Config(**keep)
            torch.manual_seed(0)
            with torch.device(DEVICE):
                model = Qwen3ForCausalLM(config)
            model.to(torch.bfloat16).save_pretrained(path)
            del model
            _free()
            c.detail = f"wrote {path}"
        ok = True
    return path if ok else None


def generate_manifest(rec: Recorder, gen: ModuleType, name: str, ckpt: Path, hashes: dict[str, str],
                      variant: Variant | None = None, sources: Sources = PRODUCT_SOURCES) -> Path | None:
    """`name` is the model (tiny, 4b), plus "-<variant>" for a variant's plan (None: all cublasLt)."""
    out = rec.out / "manifests" / f"qwen3-{name}.json"
    ok = False
    with rec.check(f"{name}.manifest") as c:
        from kern_manifest import parse_manifest, verify

        cfg = json.loads((ckpt / "config.json").read_text())
        entries = sources.entries()
        feed = "device" if all(e in entries for e in gen.DEVICE_FEED_ENTRIES) else "host"
        plan = variant(feed) if variant is not None else gen.Plan(feed=feed)
        m = gen.generate(gen.shape_from_config(cfg), hashes, entries, model=f"qwen3-{name}", plan=plan)
        verify(parse_manifest(json.dumps(m)))
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(m, indent=1) + "\n")
        c.data |= {"feed": feed, "decode_calls": len(m["programs"]["decode"]["calls"]),
                   "weight_gb_per_step": gen.decode_weight_bytes(m) / 1e9, "options": plan.bf16_options()}
        c.detail = f"feed={feed}, decode {c.data['decode_calls']} calls, {c.data['weight_gb_per_step']:.3f} GB/step"
        ok = True
    return out if ok else None


def _free() -> None:
    import torch

    gc.collect()
    torch.cuda.empty_cache()


def prompts(vocab: int, lens: Sequence[int] = PROMPT_LENS) -> dict[int, list[int]]:
    rng = np.random.default_rng(1234)
    hi = min(vocab, 151643)  # NOTE: ordinary (non-special) ids
    return {n: [int(x) for x in rng.integers(0, hi, size=n)] for n in lens}


def capacity(ps: dict[int, list[int]]) -> int:
    """The KV tokens a runtime's pool needs for `ps`: CAPACITY, or the longest prompt, its STEPS and a page."""
    return max(CAPACITY, max(ps, default=0) + STEPS + 16)


def chunks_of(n: int) -> tuple[int, ...]:
    """The --chunk runs of an n-token prompt (the first is the base run)."""
    return CHUNKS_LONG if n > LONG else CHUNKS


# --------------------------------------------------------------------------------------------
# transformers references.


def bf16_ulp(v: float) -> float:
    """Spacing of bf16 numbers at |v| (8 significant bits)."""
    if v == 0:
        return 2.0**-133
    return 2.0 ** (math.floor(math.log2(abs(v))) - 7)


@dataclass
class Reference:
    tokens: dict[int, list[int]]
    gaps_ulps: dict[int, list[float]]
    logits32: dict[int, np.ndarray]
    logits_bf16: dict[int, np.ndarray] = field(default_factory=dict[int, np.ndarray])
    """transformers' own bf16 first-step logits: its distance to float32 is the noise floor."""
    tokens32: dict[int, list[int]] = field(default_factory=dict[int, list[int]])
    """transformers float32's greedy tokens (when an f32 variant is checked)."""
    gaps32_ulps: dict[int, list[float]] = field(default_factory=dict[int, list[float]])
    """Their top-1 minus top-2 gaps, in bf16 ulps of the top-1 logit."""


def _hf(path: Path, dtype: Any, attn: str = "eager") -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=attn)
    return model.to(DEVICE).eval()


def _last_only(prompt: list[int]) -> dict[str, Any]:
    """Forward kwargs for a prompt: a long one computes only its last position's logits."""
    return {"logits_to_keep": 1} if len(prompt) > LONG else {}


def _cache_kw(model: Any) -> str:
    """transformers renamed `past_key_values` to `cache` (5.2x); use whichever forward takes."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _cache_of(out: Any) -> Any:
    return out["cache"] if "cache" in out else out["past_key_values"]


def hf_greedy(model: Any, prompt: list[int], steps: int) -> tuple[list[int], list[float], np.ndarray]:
    """Greedy tokens, the top1-top2 gap of each step in bf16 ulps, and the first step's logits."""
    import torch

    tokens: list[int] = []
    gaps: list[float] = []
    first = np.empty(0)
    with torch.no_grad():
        out = model(input_ids=torch.tensor([prompt], device=DEVICE), use_cache=True, **_last_only(prompt))
        for i in range(steps):
            logits = out.logits[0, -1]
            if i == 0:
                first = logits.float().cpu().numpy()
            top = torch.topk(logits.float(), 2)
            tok = int(torch.argmax(logits))
            v1, v2 = float(top.values[0]), float(top.values[1])
            gaps.append((v1 - v2) / bf16_ulp(v1))
            tokens.append(tok)
            kw = {_cache_kw(model): _cache_of(out)}
            out = model(input_ids=torch.tensor([[tok]], device=DEVICE), use_cache=True, **kw)
    return tokens, gaps, first


def hf_logits32(model: Any, prompt: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        out = model(input_ids=torch.tensor([prompt], device=DEVICE), **_last_only(prompt))
    return out.logits[0, -1].float().cpu().numpy()


def references(rec: Recorder, name: str, ckpt: Path, ps: dict[int, list[int]],
               f32_greedy: bool = False) -> Reference | None:
    """transformers' references; with `f32_greedy` also float32's greedy tokens and gaps (the f32
    variant's reference), whose first step gives the float32 logits."""
    import torch

    ref = Reference({}, {}, {})
    ok = False
    with rec.check(f"{name}.reference") as c:
        for attn, part in _by_attention(ps):
            model = _hf(ckpt, torch.bfloat16, attn)
            for n, p in part.items():
                ref.tokens[n], ref.gaps_ulps[n], ref.logits_bf16[n] = hf_greedy(model, p, STEPS)
            if name == "4b" and attn == "eager":
                rec.bench += hf_bench(model)
            del model
            _free()
            model = _hf(ckpt, torch.float32, attn)
            for n, p in part.items():
                if f32_greedy:
                    ref.tokens32[n], ref.gaps32_ulps[n], ref.logits32[n] = hf_greedy(model, p, STEPS)
                else:
                    ref.logits32[n] = hf_logits32(model, p)
            del model
            _free()
        c.data["min_gap_ulps"] = {n: round(min(g), 2) for n, g in ref.gaps_ulps.items()}
        c.detail = f"min top1-top2 gap (bf16 ulps) by prompt: {c.data['min_gap_ulps']}"
        ok = True
    return ref if ok else None


def _by_attention(ps: dict[int, list[int]]) -> list[tuple[str, dict[int, list[int]]]]:
    """The prompts by the attention transformers computes them with: eager up to LONG tokens,
    SDPA beyond (only the sets that have prompts)."""
    short = {n: p for n, p in ps.items() if n <= LONG}
    long = {n: p for n, p in ps.items() if n > LONG}
    return [(attn, part) for attn, part in (("eager", short), ("sdpa", long)) if part]


def _sync() -> None:
    import torch

    if DEVICE.startswith("cuda"):
        torch.cuda.synchronize()


def _cuda_ms(fn: Callable[[], Any], reps: int) -> float:

    samples = []
    for _ in range(reps):
        _sync()
        t0 = time.perf_counter()
        fn()
        _sync()
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def hf_bench(model: Any) -> list[dict[str, Any]]:
    """transformers eager: decode ms/token at context 128 (median of 64 steps), 709-token prefill."""
    import torch

    rng = np.random.default_rng(7)
    hi = min(int(model.config.vocab_size), 150000)
    rows = []
    with torch.no_grad():
        prompt = torch.tensor([rng.integers(0, hi, size=128).tolist()], device=DEVICE)
        out = model(input_ids=prompt, use_cache=True)
        past = _cache_of(out)
        tok = torch.argmax(out.logits[0, -1]).view(1, 1)
        samples = []
        for _ in range(8 + STEPS):
            _sync()
            t0 = time.perf_counter()
            out = model(input_ids=tok, use_cache=True, **{_cache_kw(model): past})
            tok = torch.argmax(out.logits[0, -1]).view(1, 1)
            int(tok)
            samples.append((time.perf_counter() - t0) * 1e3)
        rows.append(_row("transformers_eager_decode_ms_per_token@ctx128", statistics.median(samples[8:]), "ms",
                         peer="transformers eager, bf16, same checkpoint"))
        p709 = torch.tensor([rng.integers(0, hi, size=709).tolist()], device=DEVICE)
        ms = _cuda_ms(lambda: model(input_ids=p709), 6)
        rows.append(_row("transformers_prefill_ms@709", ms, "ms", peer="transformers eager, bf16"))
    return rows


# --------------------------------------------------------------------------------------------
# kern side.


@dataclass
class KernRun:
    tokens: list[int]
    logits: np.ndarray | None = None
    """First-step logits (when asked)."""
    steps: list[np.ndarray] = field(default_factory=list[np.ndarray])
    """Every step's logits (when asked with all_logits)."""


@dataclass(frozen=True)
class Loaded:
    """A runtime loaded once per manifest (or any `kern_runtime.Backend`: the interpreter's on the
    CPU) and its manifest's serving roles; every kern run is a fresh `Engine` over it. `closer`
    releases the backend (`close()`, or use as a context manager)."""

    backend: Backend
    roles: ServingRoles
    closer: Callable[[], None] = lambda: None

    def close(self) -> None:
        self.closer()

    def __enter__(self) -> Loaded:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load(manifest: Path, kernels: Path, ckpt: Path, *, gpu: int, tokens: int,
         log: Callable[[str], None] = lambda s: None) -> Loaded:
    """A runtime of `manifest` on `gpu` whose pool holds `tokens` KV tokens (rounded up to whole
    pages) for one sequence, `ckpt`'s weights loaded; `log` receives its startup summary."""
    import kern_runtime as kr

    model = kr.read_manifest(manifest)
    roles = kr.serving_roles(model)
    pages = roles.whole_pages(tokens)
    rt = kr.Runtime.open(model, kernels, kr.weight_files([ckpt]), gpu=gpu, capacity=kr.Capacity(tokens=pages, seqs=1),
                         log=log)
    return Loaded(rt, roles, rt.close)


def engine_greedy(backend: Any, roles: Any, prompt: Sequence[int], steps: int, *, chunk: int, eager: bool = False,
                  logit_steps: int = 0) -> tuple[list[int], list[np.ndarray]]:
    """`steps` greedy tokens of `prompt` on a fresh `Engine` over `backend` (a loaded runtime, or
    the interpreter's): prefill chunks of at most `chunk` rows, all but the last prompt token (the
    first decode step computes the first token); `eager`: steps and chunks call by call, else the
    step graph and the engine's chunk graphs. The logits (float32) of the first `logit_steps`
    steps. Nothing is reused from an earlier run: the engine, its prefix index and its lease go
    when it closes."""
    import kern_runtime as kr

    tokens: list[int] = []
    logits: list[np.ndarray] = []
    with kr.Engine(backend, roles, kr.EngineConfig(chunk=chunk, eager=eager)) as eng:
        seq = eng.sequence()
        eng.prefill(seq, prompt, steps)
        for i in range(steps):
            tokens.append(eng.step(seq))
            if i < logit_steps:
                logits.append(kr.widen(np.asarray(backend.read_output("logits"))).reshape(-1))
    return tokens, logits


def kern_generate(target: Loaded, prompt: list[int], *, chunk: int, eager: bool, logits: bool = False,
                  all_logits: bool = False) -> KernRun:
    """STEPS greedy tokens of `prompt` on a fresh `Engine` over `target` (`engine_greedy`), with the
    first step's logits (`logits`) or every step's (`all_logits`)."""
    read = STEPS if all_logits else int(logits)
    tokens, steps = engine_greedy(target.backend, target.roles, prompt, STEPS, chunk=chunk, eager=eager,
                                  logit_steps=read)
    return KernRun(tokens, steps[0] if logits else None, steps if all_logits else [])


def compare_logits_to_fp32(c: Check, got: np.ndarray, ref32: np.ndarray, noise: float, tol: float) -> float:
    """Records kern's first-step logits `got` against transformers fp32's `ref32` (relative L2, max
    abs, argmax; `noise`: transformers bf16's own relative L2) and fails `c` above `tol`
    (LOGIT_REL_TOL, or F32_LOGIT_REL_TOL for the f32 manifest). Returns the relative L2 error."""
    rel = float(np.linalg.norm(got - ref32) / np.linalg.norm(ref32))
    c.data |= {"rel_l2": rel, "max_abs": float(np.max(np.abs(got - ref32))),
               "argmax_equal": int(np.argmax(got)) == int(np.argmax(ref32)), "transformers_bf16_rel_l2": noise}
    c.detail = (f"relative L2 error {rel:.2e} (tol {tol}; transformers bf16 vs fp32: "
                f"{noise:.2e}), max abs {c.data['max_abs']:.3e}")
    if not rel <= tol:
        _fail(c, c.detail)
    return rel


def compare_logits_to_bf16_noise(c: Check, rel: float, noise: float) -> bool:
    """Passes when kern's relative L2 error `rel` is within LOGIT_NOISE_FACTOR of transformers'
    bf16 error `noise` (both against transformers fp32); fails on a missing or non-finite one."""
    c.data |= {"rel_l2": rel, "transformers_bf16_rel_l2": noise, "ratio": rel / noise if noise > 0 else math.nan}
    if not (math.isfinite(rel) and math.isfinite(noise) and noise > 0):
        _fail(c, f"no comparison: kern {rel:.2e}, transformers bf16 {noise:.2e}")
        return False
    c.detail = f"{rel:.2e} is {rel / noise:.2f}x transformers bf16's {noise:.2e} (bound {LOGIT_NOISE_FACTOR}x)"
    if rel > LOGIT_NOISE_FACTOR * noise:
        _fail(c, c.detail)
        return False
    return True


def compare_chunks(c: Check, chunk: int, got: list[int], base: KernRun, tie_ulps: float = NEAR_TIE_ULPS) -> bool:
    """`got` (a --chunk `chunk` run) against the --chunk 512 run `base` (with every step's logits).
    Records exact equality; a divergence passes only at a near-tie of the base run: its top-1 logit
    minus its logit of `got`'s token <= `tie_ulps` bf16 ulps. Returns whether it passed."""
    return compare_runs(c, f"chunk{chunk}", f"--chunk {chunk}", got, base, tie_ulps)


def compare_runs(c: Check, key: str, what: str, got: list[int], base: KernRun,
                 tie_ulps: float = NEAR_TIE_ULPS) -> bool:
    """`got` (the run `what`, recorded under `key`) against the --chunk 512 run `base`, by
    `compare_chunks`' rule. Returns whether it passed."""
    if got == base.tokens:
        c.data[key] = {"identical": True}
        return True
    j = next(i for i, (a, b) in enumerate(zip(got, base.tokens, strict=True)) if a != b)
    lg = base.steps[j]
    top = float(lg[base.tokens[j]])
    gap = (top - float(lg[got[j]])) / bf16_ulp(top)
    c.data[key] = {"identical": False, "diverge_at": j, "gap_ulps": round(gap, 3), "this": got[j],
                   "chunk512": base.tokens[j]}
    note = (f"{what} differs from --chunk 512 at step {j} ({got[j]} vs {base.tokens[j]}); "
            f"chunk-512 top-1 minus its logit of {got[j]}: {gap:.2f} bf16 ulps")
    if gap <= tie_ulps:
        c.detail = "; ".join(x for x in (c.detail, f"{note} (near-tie, <= {tie_ulps})") if x)
        return True
    _fail(c, f"{note} (> {tie_ulps})")
    return False


def compare_greedy(c: Check, got: list[int], ref: list[int], gaps: list[float],
                   tie_ulps: float = NEAR_TIE_ULPS) -> None:
    if got == ref:
        c.detail = f"{len(got)} tokens identical"
        return
    j = next(i for i, (a, b) in enumerate(zip(got, ref, strict=True)) if a != b)
    c.data |= {"diverge_at": j, "gap_ulps": round(gaps[j], 3), "kern": got[j], "transformers": ref[j]}
    if gaps[j] <= tie_ulps:
        c.detail = (f"diverges at step {j} at a near-tie: transformers' top1-top2 gap {gaps[j]:.4g} bf16 ulps "
                    f"(<= {tie_ulps}); kern {got[j]} vs {ref[j]}")
    else:
        _fail(c, f"diverges at step {j}: kern {got[j]} vs transformers {ref[j]}, gap {gaps[j]:.4g} ulps "
                 f"(> {tie_ulps})")


def kern_checks(rec: Recorder, name: str, manifest: Path, ckpt: Path, ps: dict[int, list[int]],
                ref: Reference | None, gpu: int, f32: bool = False) -> dict[int, KernRun]:
    """The checks of one manifest; `f32` (the reference-precision manifest): greedy tokens against
    transformers float32's, the near-tie rule at F32_NEAR_TIE_ULPS, logits within F32_LOGIT_REL_TOL."""
    graph_runs: dict[int, KernRun] = {}
    loaded: list[Loaded] = []
    with rec.check(f"{name}.load") as c:
        logs: list[str] = []
        loaded.append(load(manifest, rec.out / "kernels", ckpt, gpu=gpu, tokens=capacity(ps), log=logs.append))
        (rec.logs / f"{name}.summary.txt").write_text("\n".join(logs) + "\n")
        c.detail = logs[0].splitlines()[0] if logs else ""
    if not loaded:
        return graph_runs
    with loaded[0] as target:
        for n, p in ps.items():
            _prompt_checks(rec, name, target, n, p, ref, graph_runs, f32)
    return graph_runs


def _prompt_checks(rec: Recorder, name: str, target: Loaded, n: int, p: list[int], ref: Reference | None,
                   graph_runs: dict[int, KernRun], f32: bool = False) -> None:
    base: KernRun | None = None
    with rec.check(f"{name}.p{n}.run") as c:
        base = kern_generate(target, p, chunk=512, eager=False, logits=True, all_logits=True)
        graph_runs[n] = base
        c.detail = f"first tokens {base.tokens[:8]}"
    if base is None:
        return
    if ref is not None:
        with rec.check(f"{name}.p{n}.greedy_vs_transformers") as c:
            if f32:
                compare_greedy(c, base.tokens, ref.tokens32[n], ref.gaps32_ulps[n], F32_NEAR_TIE_ULPS)
                c.detail = f"vs transformers float32: {c.detail}"
            else:
                compare_greedy(c, base.tokens, ref.tokens[n], ref.gaps_ulps[n])
        rel = noise = math.nan
        with rec.check(f"{name}.p{n}.logits_vs_fp32") as c:
            assert base.logits is not None
            r = ref.logits32[n]
            noise = float(np.linalg.norm(ref.logits_bf16[n] - r) / np.linalg.norm(r)) if n in ref.logits_bf16 else float("nan")
            rel = compare_logits_to_fp32(c, base.logits, r, noise, F32_LOGIT_REL_TOL if f32 else LOGIT_REL_TOL)
        with rec.check(f"{name}.p{n}.logits_within_bf16_noise") as c:
            compare_logits_to_bf16_noise(c, rel, noise)
    with rec.check(f"{name}.p{n}.graph_eq_eager") as c:
        eager = kern_generate(target, p, chunk=512, eager=True)
        if eager.tokens != base.tokens:
            j = next(i for i, (a, b) in enumerate(zip(eager.tokens, base.tokens, strict=True)) if a != b)
            _fail(c, f"eager differs from graph at step {j}: {eager.tokens[j]} vs {base.tokens[j]}")
    with rec.check(f"{name}.p{n}.chunks_{'_'.join(map(str, chunks_of(n)))}") as c:
        for chunk in chunks_of(n)[1:]:
            other = kern_generate(target, p, chunk=chunk, eager=False)
            if not compare_chunks(c, chunk, other.tokens, base, F32_NEAR_TIE_ULPS if f32 else NEAR_TIE_ULPS):
                break
        if c.status == "PENDING" and not c.detail:
            c.detail = "token streams identical"


def cli_checks(rec: Recorder, name: str, manifest: Path, ckpt: Path, ps: dict[int, list[int]],
               expect: dict[int, KernRun], gpu: int) -> None:
    """kern-run as a process (an Engine turn: the head gives the first token) against the
    in-process --chunk 512 run of the same prompt, by the near-tie rule."""
    n = 37 if 37 in expect else next(iter(expect), None)
    if n is None:
        return
    with rec.check(f"{name}.kern_run_cli_ids") as c:
        cmd = [sys.executable, "-m", "kern_cli.run", "--manifest", str(manifest), "--kernels",
               str(rec.out / "kernels"), "--weights", str(ckpt), "--prompt-ids", ",".join(map(str, ps[n])),
               "--steps", str(STEPS), "--output", "ids", "--gpu", str(gpu), "--capacity", str(CAPACITY)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=rec.out)
        (rec.logs / f"{name}.kern_run.stderr").write_text(proc.stderr)
        got = [int(t) for t in proc.stdout.split()]
        c.data["stdout_lines"] = len(proc.stdout.splitlines())
        if proc.returncode != 0 or len(got) != len(expect[n].tokens) or c.data["stdout_lines"] != 1:
            _fail(c, f"rc {proc.returncode}, {len(got)} ids; stderr tail: {proc.stderr.strip().splitlines()[-1:]}")
        else:
            compare_runs(c, "kern_run", "kern-run", got, expect[n])


def cli_default_check(rec: Recorder, manifest: Path, gpu: int) -> None:
    """Plain kern-run from a kern.toml with no weights: builds kernels, writes the random 4B
    checkpoint once into the cache, tokenizes a text prompt."""
    with rec.check("4b.kern_run_toml_random_checkpoint") as c:
        work = rec.out / "toml"
        work.mkdir(exist_ok=True)
        (work / "kern.toml").write_text(
            f'target = "qwen3-4b"\ngpu = {gpu}\n[targets.qwen3-4b]\nmanifest = "{manifest}"\n'
            f'kernels = "kernels"\n[kernels]\nsources = "{ROOT / "tools" / "kernels-src"}"\n'
            '[run]\nprompt = "The capital of France is"\nsteps = 16\n')
        env = {**os.environ, "KERN_CACHE_DIR": str(rec.out / "cache")}
        proc = subprocess.run([sys.executable, "-m", "kern_cli.run"], capture_output=True, text=True,
                              timeout=1200, cwd=work, env=env)
        (rec.logs / "4b.kern_run_toml.stderr").write_text(proc.stderr)
        c.data["stdout"] = proc.stdout[:200]
        said = "random Qwen3-4B checkpoint" in proc.stderr
        if proc.returncode != 0 or not said or not proc.stdout.strip():
            _fail(c, f"rc {proc.returncode}, announced checkpoint={said}; stderr tail "
                     f"{proc.stderr.strip().splitlines()[-1:]}")
        else:
            c.detail = f"stdout {proc.stdout.strip()[:80]!r}"


# --------------------------------------------------------------------------------------------
# Bench.


TARGETS = {"decode_fixed_ms_per_token@ctx128": 2.9, "prefill_ms@709": 25.0}
"""The decode targets. Decode's is "ms/token at context 128": the fixed-context row, whose every step
runs at context 128; the walking `decode_ms_per_token@ctx128` row runs contexts 138-394."""


def kern_bench(rec: Recorder, label: str, manifest: Path, floor: Path, ckpt: Path, gpu: int) -> None:
    """kern bench rows of one manifest variant, named `<label>.<row>` (decode at 128 and 8192,
    prefill 709, the copy and GEMM-only floors: kern bench's own, measured in the same run)."""
    from kern_runtime.bench import BenchOptions, bench_session, table
    from kern_runtime.loading import LoadOptions

    with rec.check(f"{label}.bench") as c:
        opts = LoadOptions(manifest=manifest, kernels=rec.out / "kernels", kernel_sources=None,
                           weights=(ckpt,), gpu=gpu, capacity=None)
        logs = io.StringIO()
        options = BenchOptions(contexts=(128, 8192), steps=256, prefill=(709,), floor_manifest=floor)
        rows = bench_session(opts, options, log=lambda s: logs.write(s + "\n")).rows
        (rec.logs / f"{label}.bench.log").write_text(logs.getvalue())
        by = {r["name"]: r["value"] for r in rows}
        for r in rows:
            r["target"] = TARGETS.get(r["name"], r.get("target"))
            r["name"] = f"{label}.{r['name']}"
        rec.bench = rows + rec.bench
        text = table(rec.bench)
        (rec.out / "bench.txt").write_text(text + "\n")
        print(text, flush=True)
        c.detail = (f"decode@128 {by.get('decode_ms_per_token@ctx128')} ms (fixed context "
                    f"{by.get('decode_fixed_ms_per_token@ctx128')}), @8192 "
                    f"{by.get('decode_ms_per_token@ctx8192')} ms, prefill709 {by.get('prefill_ms@709')} ms, "
                    f"gemm floor {by.get('gemm_floor_ms_per_step')} ms, bandwidth floor@128 "
                    f"{by.get('bandwidth_floor_ms_per_step@ctx128')} ms")


def step_launch_labels(manifest: dict[str, Any]) -> list[str]:
    """The decode program's kernel launches in order, each named by its call's label without the
    layer prefix (`l3.qkv` -> `qkv`); an extern op counts as one launch."""
    labels = []
    for call in manifest["programs"]["decode"]["calls"]:
        name = re.sub(r"^l\d+\.", "", call["label"])
        impl = manifest["ops"].get(call["op"], {}).get("impl", {})
        labels += [name] * max(1, len(impl.get("launches", [])))
    return labels


def chain_table(events: Sequence[tuple[str, float, float]], labels: Sequence[str], reps: int) -> str:
    """Where a step's time goes on its critical path: GPU activities (name, start us, end us) in
    start order; each one is charged end - (the previous one's end), the time the stream advanced
    while it was the last to finish (under PDL a kernel's own duration includes its wait, this
    does not; a launch gap inside the step counts to the launch after it). Charged to the
    manifest's call labels when the activities per step match the decode program's launches (plus
    one readback copy), else to the kernel names. With labels, the time between two profiled steps
    when nothing runs (the host) is reported apart as idle: a step's first launch is charged from
    its own start. `lead` is how long before the stream's previous activities ended an activity
    started, on average (under PDL: its blocks were resident and waiting; negative: a gap), over
    the activities that are not a step's first."""
    per_step = len(events) / reps if reps else 0
    use_labels = per_step in (len(labels), len(labels) + 1)
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    leads: dict[str, list[float]] = {}
    prev_end = None
    idle = 0.0
    for i, (name, start, end) in enumerate(events):
        key = name[:60]
        j = i % int(per_step) if use_labels else -1
        if use_labels:
            key = labels[j] if j < len(labels) else "readback copy"
        if prev_end is not None:
            since = prev_end
            if j == 0:
                idle += max(0.0, start - prev_end)
                since = max(prev_end, start)
            else:
                leads.setdefault(key, []).append(prev_end - start)
            sums[key] = sums.get(key, 0.0) + max(0.0, end - since)
            counts[key] = counts.get(key, 0) + 1
        prev_end = end if prev_end is None else max(prev_end, end)
    total = sum(sums.values())
    lines = [f"critical path of {reps} steps ({'call labels' if use_labels else 'kernel names'}): "
             f"{total / max(reps, 1):.1f} us per step busy, {idle / max(reps, 1):.1f} us per step idle "
             "(no GPU activity)", f"{'us/step':>9} {'n/step':>7} {'us each':>8} {'lead us':>8}  call"]
    for key, us in sorted(sums.items(), key=lambda kv: -kv[1]):
        n = counts[key] / max(reps, 1)
        lead = f"{sum(leads[key]) / len(leads[key]):8.2f}" if key in leads else f"{'':>8}"
        lines.append(f"{us / max(reps, 1):9.1f} {n:7.1f} {us / max(counts[key], 1):8.2f} {lead}  {key}")
    return "\n".join(lines)


def decode_chain(prof: Any, manifest: dict[str, Any], reps: int) -> str:
    """chain_table over a torch.profiler run's GPU activities."""
    from torch.autograd import DeviceType

    events = sorted(((e.name, e.time_range.start, e.time_range.end) for e in prof.events()
                     if e.device_type == DeviceType.CUDA), key=lambda x: x[1])
    return chain_table(events, step_launch_labels(manifest), reps)


def decode_profile(rec: Recorder, label: str, manifest: Path, ckpt: Path, gpu: int) -> None:
    """Per-kernel GPU time of one decode step at context 128 (CUPTI through torch.profiler, which
    records every kernel of the process, graph nodes included): OUTDIR/decode_profile.{json,txt}.
    The steps are an `Engine`'s (graph replays, each token read back)."""
    from kern_runtime import Engine, EngineConfig, weight_files

    with rec.check(f"{label}.decode_profile") as c:
        import torch
        from torch.profiler import ProfilerActivity, profile

        torch.cuda.init()
        reps = 20
        with Engine.open(manifest, rec.out / "kernels", weight_files([ckpt]), gpu=gpu, tokens=CAPACITY,
                         config=EngineConfig(chunk=512)) as eng:
            seq = eng.sequence()
            eng.prefill(seq, prompts(150000)[709][:128], 8 + reps)
            for _ in range(8):
                eng.step(seq)
            eng.backend.synchronize()
            t0 = time.perf_counter()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(reps):
                    eng.step(seq)
                eng.backend.synchronize()
            wall_us = (time.perf_counter() - t0) / reps * 1e6
        rows = []
        for e in prof.key_averages():
            us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
            if us:
                rows.append({"kernel": e.key, "launches_per_step": e.count / reps, "us_per_step": us / reps})
        rows.sort(key=lambda r: -r["us_per_step"])
        total = sum(r["us_per_step"] for r in rows)
        (rec.out / f"{label}.decode_profile.json").write_text(json.dumps(
            {"wall_us_per_step_profiled": wall_us, "kernel_us_per_step": total, "kernels": rows}, indent=1) + "\n")
        lines = [f"{'us/step':>9} {'n/step':>7}  kernel"]
        lines += [f"{r['us_per_step']:9.1f} {r['launches_per_step']:7.1f}  {r['kernel'][:110]}" for r in rows]
        lines.append(f"{total:9.1f} {'':7}  total kernel time per step (wall {wall_us:.1f} us under the profiler)")
        (rec.out / f"{label}.decode_profile.txt").write_text("\n".join(lines) + "\n")
        print("\n".join(lines), flush=True)
        chain = decode_chain(prof, json.loads(manifest.read_text()), reps)
        (rec.out / f"{label}.decode_chain.txt").write_text(chain + "\n")
        print(chain, flush=True)
        c.detail = f"{len(rows)} kernels, {total:.1f} us of kernels per step, wall {wall_us:.1f} us"
        if not rows:
            _fail(c, "the profiler recorded no kernel")


# --------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None, *, variants: dict[str, Variant] | None = None,
         sources: Sources = PRODUCT_SOURCES) -> int:
    """The command line; `variants` (default `product_variants`) and `sources` let the lab run its own."""
    gen = _load_gen()
    table = variants if variants is not None else product_variants(gen)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("out", type=Path, help="output directory (logs, JSON, checkpoints, kernels)")
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--models", default="tiny,4b", help="comma-separated subset of tiny,4b")
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--long", action="store_true",
                    help=f"the 4B also on prompts of {' and '.join(map(str, LONG_PROMPT_LENS))} tokens")
    ap.add_argument("--variants", default="fast",
                    help=f"comma-separated manifest variants beside the all-cublasLt one ({','.join(table)}; "
                         "default fast)")
    args = ap.parse_args(argv)
    chosen = [v for v in args.variants.split(",") if v]
    unknown = [v for v in chosen if v not in table]
    if unknown:  # NOTE: a bad variant fails here, before the kernels are built
        ap.error(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(table)}")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.gpu != 0:  # NOTE: torch and kern then both see the chosen GPU as device 0
        os.environ["CUDA_VISIBLE_DEVICES"] = str(args.gpu)
    rec = Recorder(out)
    hashes = build(rec, sources)
    cfgs = configs()
    for name in [m for m in args.models.split(",") if m]:
        run_model(rec, gen, name, cfgs[name], hashes, 0, bench=(name == "4b" and not args.no_bench),
                  variants={v: table[v] for v in chosen}, sources=sources, long=args.long and name == "4b")
    return summarize(rec)


def run_model(rec: Recorder, gen: ModuleType, name: str, cfg: dict[str, Any], hashes: dict[str, str], gpu: int,
              *, bench: bool, variants: dict[str, Variant] | None = None,
              sources: Sources = PRODUCT_SOURCES, long: bool = False) -> None:
    ckpt = write_checkpoint(rec, name, cfg)
    if ckpt is None or not hashes:
        return
    manifest = generate_manifest(rec, gen, name, ckpt, hashes, sources=sources)
    chosen = variants if variants is not None else {"fast": product_variants(gen)["fast"]}
    plans = {v: build_plan("device") for v, build_plan in chosen.items()}
    labelled = [(f"{name}-{v}", generate_manifest(rec, gen, f"{name}-{v}", ckpt, hashes, chosen[v], sources), plans[v])
                for v in chosen]
    ps = prompts(int(cfg["vocab_size"]), PROMPT_LENS + (LONG_PROMPT_LENS if long else ()))
    ref = references(rec, name, ckpt, ps, f32_greedy=any(is_f32(p) for p in plans.values()))
    if manifest is None:
        return
    tokens = kern_checks(rec, name, manifest, ckpt, ps, ref, gpu)
    cli_checks(rec, name, manifest, ckpt, ps, tokens, gpu)
    for label, m, plan in labelled:
        if m is not None:
            kern_checks(rec, label, m, ckpt, ps, ref, gpu, f32=is_f32(plan))
    if name == "4b":
        cli_default_check(rec, manifest, gpu)
    if bench:
        for label, m in [(name, manifest), *((lb, m) for lb, m, plan in labelled if is_benched(plan))]:
            if m is not None:
                kern_bench(rec, label, m, manifest, ckpt, gpu)
                decode_profile(rec, label, m, ckpt, gpu)


def is_f32(plan: Any) -> bool:
    """A variant's plan builds the reference-precision (f32) manifest."""
    return plan.precision == "f32"


def is_benched(plan: Any) -> bool:
    """kern bench and the decode profile run for every variant but the f32 one (a correctness mode:
    its plain f32 kernels would only spend GPU time)."""
    return not is_f32(plan)


def summarize(rec: Recorder) -> int:
    rec.save()
    width = max(len(c.name) for c in rec.checks)
    print("\n== summary ==")
    for c in rec.checks:
        print(f"{c.status:5} {c.name.ljust(width)}  {c.detail}")
    bad = [c for c in rec.checks if c.status not in ("PASS", "SKIP")]
    print(f"\n{len(rec.checks) - len(bad)}/{len(rec.checks)} checks passed; results in {rec.out}/summary.json"
          + (f", bench in {rec.out}/bench.json" if rec.bench else ""))
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
