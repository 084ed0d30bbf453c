"""Synthetic captures with known ground truth, for tests and benchmarks of the analyzer.

A synthetic process runs a layered model: a window of warm-up forwards (large dummy token counts),
then one window per request (a prefill of the prompt length and `decode_steps` forwards of one
token). Each kernel declares its grid as closed forms of t, its scalar params as closed forms and
its pointer params as classes. Launch times carry jitter; with `boundary_jitter`, a variable
number of copy kernels ends each forward and a mask kernel sometimes starts one, so forward
boundaries move by a launch or two. `write_capture` writes the dump in the capture's format and
returns what an exact analysis must find.
"""

from __future__ import annotations

import hashlib
import json
import random
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from kern_mining.fit import Fit

__all__ = ["GroundTruth", "KernelSpec", "SiteTruth", "SynthSpec", "default_model", "write_capture"]

WEIGHTS = 0x7A0000000000
PERSISTENT = 0x7B0000000000
ARENA = 0x7C0000000000
RANGE_SIZE = 1 << 34
JITTER_SYMBOLS = frozenset({"copy_tail", "mask_fill"})


@dataclass(frozen=True)
class KernelSpec:
    """One kernel of the synthetic model.

    Attributes:
        symbol: mangled name.
        grid: closed forms of t for grid x, y, z.
        pointers: per pointer param: "weight", "persistent:<key>" or "workspace:<key>"; "{layer}" in
            a key becomes the layer number. Pointer params come first, then scalars.
        scalars: closed forms of t, one 4-byte param each.
        layout: "flat" (params recorded), "packed" (launched through `extra`) or "unknown".
    """

    symbol: str
    grid: tuple[Fit, Fit, Fit]
    pointers: tuple[str, ...] = ()
    scalars: tuple[Fit, ...] = ()
    layout: Literal["flat", "packed", "unknown"] = "flat"


def _c(v: int) -> Fit:
    return Fit("const", c=v)


T = Fit("tokens")
ONE = _c(1)


def default_model() -> tuple[
    tuple[KernelSpec, ...], tuple[KernelSpec, ...], tuple[KernelSpec, ...]
]:
    """(head, layer, tail) kernels of a small decoder; "add" (twice per layer) is the core kernel."""
    eps = struct.unpack("<I", struct.pack("<f", 1e-6))[0]
    head = (
        KernelSpec(
            "embed",
            (Fit("ceil_div", c=4), ONE, ONE),
            ("weight", "persistent:ids", "workspace:x"),
            (T,),
        ),
    )
    layer = (
        KernelSpec(
            "fused_add_rms_norm",
            (T, ONE, ONE),
            ("persistent:residual", "weight", "workspace:x"),
            (_c(eps), _c(2560), T),
        ),
        KernelSpec("gemm_qkv", (Fit("ceil_div", c=64), _c(48), ONE), layout="packed"),
        KernelSpec(
            "rope",
            (T, _c(32), ONE),
            ("workspace:qkv", "persistent:cos_sin"),
            (Fit("affine", a=1, b=7), Fit("mul", a=32)),
        ),
        KernelSpec(
            "cache_write",
            (Fit("ceil_div_mul", a=3, c=4), ONE, ONE),
            ("workspace:qkv", "persistent:kv{layer}", "persistent:slots"),
            (_c(6144),),
        ),
        KernelSpec(
            "attention",
            (Fit("mul_ceil_div", a=2, c=16), _c(8), ONE),
            ("workspace:qkv", "persistent:kv{layer}", "workspace:attn"),
            (_c(1065353216),),
        ),
        KernelSpec("gemm_o", (Fit("ceil_div", c=64), _c(20), ONE), layout="packed"),
        KernelSpec("add", (Fit("mul", a=20), ONE, ONE), ("persistent:residual", "workspace:attn")),
        KernelSpec("mystery", (ONE, ONE, ONE), layout="unknown"),
        KernelSpec(
            "act_and_mul", (Fit("mul", a=12), ONE, ONE), ("workspace:gate", "workspace:act"), (T,)
        ),
        KernelSpec("add", (Fit("mul", a=20), ONE, ONE), ("persistent:residual", "workspace:act")),
    )
    tail = (
        KernelSpec(
            "rms_norm", (T, ONE, ONE), ("persistent:residual", "weight", "workspace:x"), (_c(eps),)
        ),
        KernelSpec("gemm_lm_head", (Fit("ceil_div", c=128), _c(1187), ONE), layout="packed"),
        KernelSpec("argmax", (ONE, ONE, ONE), ("workspace:logits", "persistent:ids")),
    )
    return head, layer, tail


@dataclass(frozen=True)
class SynthSpec:
    """Shape of a synthetic capture."""

    prompts: tuple[int, ...] = (7, 34, 85, 175)
    decode_steps: int = 3
    warmup: tuple[int, ...] = (512, 256)
    layers: int = 4
    seed: int = 0
    boundary_jitter: bool = True
    model: tuple[tuple[KernelSpec, ...], tuple[KernelSpec, ...], tuple[KernelSpec, ...]] = field(
        default_factory=default_model
    )


@dataclass(frozen=True)
class SiteTruth:
    """What the analysis must find at one call site."""

    grid: tuple[Fit, Fit, Fit]
    scalars: dict[int, Fit]
    pointers: dict[int, str]


@dataclass(frozen=True)
class GroundTruth:
    """The windows (token counts per forward), sites, and the kernels fit to be tokens reference
    (those that run once per forward with grid.x = t) of a synthetic capture."""

    windows: tuple[tuple[int, ...], ...]
    tokens_references: frozenset[str]
    sites: dict[tuple[str, int], SiteTruth]
    launches: int
    jitter_symbols: frozenset[str]


def _forward_kernels(spec: SynthSpec) -> list[tuple[KernelSpec, int]]:
    head, layer, tail = spec.model
    kernels = [(k, -1) for k in head]
    for n in range(spec.layers):
        kernels += [(k, n) for k in layer]
    return kernels + [(k, -1) for k in tail]


def _site_truths(spec: SynthSpec) -> dict[tuple[str, int], tuple[KernelSpec, int]]:
    sites: dict[tuple[str, int], tuple[KernelSpec, int]] = {}
    seen: dict[str, int] = {}
    for kernel, layer in _forward_kernels(spec):
        ordinal = seen.get(kernel.symbol, 0)
        seen[kernel.symbol] = ordinal + 1
        sites[(kernel.symbol, ordinal)] = (kernel, layer)
    return sites


def _truth(spec: SynthSpec, windows: list[list[int]], launches: int) -> GroundTruth:
    sites = _site_truths(spec)
    users: dict[str, set[tuple[str, int]]] = {}
    for key, (kernel, layer) in sites.items():
        for role in kernel.pointers:
            if role.startswith("persistent:"):
                users.setdefault(role.format(layer=layer), set()).add(key)
    truths: dict[tuple[str, int], SiteTruth] = {}
    for key, (kernel, layer) in sites.items():
        pointers: dict[int, str] = {}
        for i, role in enumerate(kernel.pointers):
            kind = role.split(":")[0]
            # NOTE: a stable buffer used by one site is, by the analyzer's definition, a weight.
            if kind == "persistent" and len(users[role.format(layer=layer)]) < 2:
                kind = "weight"
            pointers[i] = kind
        n = len(kernel.pointers)
        scalars = (
            {n + j: f for j, f in enumerate(kernel.scalars)} if kernel.layout == "flat" else {}
        )
        truths[key] = SiteTruth(kernel.grid, scalars, pointers if kernel.layout == "flat" else {})
    return GroundTruth(
        windows=tuple(tuple(w) for w in windows),
        tokens_references=frozenset(
            symbol
            for (symbol, _), t in truths.items()
            if t.grid[0] == T and (symbol, 1) not in truths
        ),
        sites=truths,
        launches=launches,
        jitter_symbols=JITTER_SYMBOLS if spec.boundary_jitter else frozenset(),
    )


class _Addresses:
    def __init__(self) -> None:
        self.weights: dict[tuple[str, int, int], int] = {}
        self.persistent: dict[str, int] = {}
        self.workspace: dict[str, int] = {}

    def resolve(
        self, role: str, site: tuple[str, int], param: int, layer: int, forward: int
    ) -> tuple[int, int]:
        kind, _, key = role.partition(":")
        key = key.format(layer=layer)
        if kind == "weight":
            n = self.weights.setdefault((site[0], site[1], param), len(self.weights))
            return WEIGHTS, WEIGHTS + n * 0x100000
        if kind == "persistent":
            n = self.persistent.setdefault(key, len(self.persistent))
            return PERSISTENT, PERSISTENT + n * 0x10000
        n = self.workspace.setdefault(key, len(self.workspace))
        return ARENA, ARENA + (forward * 64 + n) * 0x4000


def _param(offset: int, size: int, value: int, pointer: int | None) -> dict[str, object]:
    record: dict[str, object] = {
        "offset": offset,
        "size": size,
        "data": value.to_bytes(size, "little").hex(),
    }
    record["pointer"] = (
        None
        if pointer is None
        else {"memory_type": "device", "range_start": pointer, "range_size": RANGE_SIZE}
    )
    return record


@dataclass
class _Writer:
    spec: SynthSpec
    rng: random.Random
    modules: dict[str, int]
    addresses: _Addresses = field(default_factory=_Addresses)
    lines: list[str] = field(default_factory=list[str])
    t_ns: int = 1_000_000_000
    forward: int = 0

    def launch(self, kernel: KernelSpec, t: int, site: tuple[str, int], layer: int) -> None:
        self.t_ns += self.rng.randint(3_000, 12_000)
        params: object
        if kernel.layout == "packed":
            params = None
        elif kernel.layout == "unknown":
            params = "unknown-layout"
        else:
            items: list[dict[str, object]] = []
            for i, role in enumerate(kernel.pointers):
                start, value = self.addresses.resolve(role, site, i, layer, self.forward)
                items.append(_param(8 * i, 8, value, start))
            base = 8 * len(kernel.pointers)
            items += [
                _param(base + 4 * j, 4, f.evaluate(t), None) for j, f in enumerate(kernel.scalars)
            ]
            params = items
        record = {
            "t_ns": self.t_ns,
            "symbol": kernel.symbol,
            "module": self.modules[kernel.symbol],
            "grid": [f.evaluate(t) for f in kernel.grid],
            "block": [256, 1, 1],
            "shared_mem": 0,
            "cluster": None,
            "params": params,
        }
        self.lines.append(json.dumps(record))

    def run_forward(self, t: int) -> None:
        seen: dict[str, int] = {}
        jitter = self.spec.boundary_jitter
        if jitter and self.rng.random() < 0.4:
            self.launch(_MASK, t, ("mask_fill", 0), -1)
        for kernel, layer in _forward_kernels(self.spec):
            ordinal = seen.get(kernel.symbol, 0)
            seen[kernel.symbol] = ordinal + 1
            self.launch(kernel, t, (kernel.symbol, ordinal), layer)
        for _ in range(self.rng.randint(0, 2) if jitter else 0):
            self.launch(_COPY, t, ("copy_tail", 0), -1)
        self.forward += 1
        self.t_ns += self.rng.randint(800_000, 1_800_000)

    def run_window(self, tokens: list[int]) -> None:
        self.t_ns += self.rng.randint(20_000_000, 60_000_000)
        for t in tokens:
            self.run_forward(t)


_MASK = KernelSpec("mask_fill", (ONE, ONE, ONE), ("workspace:mask",), (_c(0),))
_COPY = KernelSpec("copy_tail", (ONE, ONE, ONE), ("workspace:ids_host", "persistent:ids"), ())


def _module_ids(spec: SynthSpec) -> dict[str, int]:
    symbols = sorted({k.symbol for k, _ in _forward_kernels(spec)} | {_MASK.symbol, _COPY.symbol})
    return {s: 1 + i % 3 for i, s in enumerate(symbols)}


def _write_modules(out: Path, modules: dict[str, int]) -> None:
    lines: list[str] = []
    for ident in sorted(set(modules.values())):
        blob = f"synthetic module {ident}\n".encode()
        (out / f"module_{ident}.cubin").write_bytes(blob)
        functions = sorted(s for s, m in modules.items() if m == ident)
        record = {
            "id": ident,
            "sha256": hashlib.sha256(blob).hexdigest(),
            "bytes": len(blob),
            "functions": functions,
        }
        lines.append(json.dumps(record))
    (out / "modules.jsonl").write_text("\n".join(lines) + "\n")


def write_capture(spec: SynthSpec, out: Path) -> GroundTruth:
    """Write a synthetic dump (launches.jsonl, modules.jsonl, module_<id>.cubin) into `out`.

    Returns:
        The ground truth an exact analysis recovers.
    """
    out.mkdir(parents=True, exist_ok=True)
    modules = _module_ids(spec)
    writer = _Writer(spec, random.Random(spec.seed), modules)
    windows: list[list[int]] = []
    if spec.warmup:
        windows.append(list(spec.warmup))
    windows += [[p] + [1] * spec.decode_steps for p in spec.prompts]
    for tokens in windows:
        writer.run_window(tokens)
    (out / "launches.jsonl").write_text("\n".join(writer.lines) + "\n")
    _write_modules(out, modules)
    return _truth(spec, windows, len(writer.lines))
