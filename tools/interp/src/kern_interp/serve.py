"""`kern serve` on a CPU: the tiny Qwen3 through the numpy interpreter, and a tokenizer that fits
its 4,096 ids.

    kern serve qwen3-tiny-batch --backend kern_interp.serve:engine     # kern.toml's CPU target

`engine(spec)` builds the `kern_runtime.Engine` over `InterpBackend` (the pool holds `spec.tokens`
KV tokens in chunks of 8 pages, a host tier of `spec.host_bytes`); without weights it writes (once)
and uses the seeded random checkpoint the provider writes for a tiny Qwen3 manifest (an FP8 one for
e4m3 weights: `examples/qwen3-tiny-fp8.json`). The weights' headers are checked
against the manifest before any tensor is read (a checkpoint of another model is one line, a
`WeightArtifactError`), and `engine.ram(spec)` tells kern serve the RAM it will take.
`tokenizer()` is `ByteTokenizer`: UTF-8 bytes are ids 0..255, the chat template's special tokens
ids 4000..4004, every other id decodes to one CJK character (a random model says anything).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import kern_runtime as kr
from kern_interp import qwen3 as interp
from kern_interp.backend import InterpBackend
from kern_manifest import Manifest, manifest_to_json
from kern_qwen3 import QWEN3_TINY_CONFIG, random_checkpoint
from kern_qwen3.provider import QWEN3
from kern_runtime.serving import EngineSpec

__all__ = ["CHUNK_PAGES", "SPECIAL", "ByteTokenizer", "CpuBackend", "engine", "tokenizer"]

CHUNK_PAGES = 8
"""Pages of one pool chunk."""
SPECIAL: dict[str, int] = {"<|endoftext|>": 4000, "<|im_start|>": 4001, "<|im_end|>": 4002, "<think>": 4003,
                           "</think>": 4004}
"""The special tokens' ids."""
VOCAB = 4096
"""The ids `ByteTokenizer` decodes (the tiny Qwen3's vocabulary)."""
_F32 = 4
_DEFAULT = "the CPU backend's default checkpoint is the tiny Qwen3's: pass --weights for this manifest, or serve " \
           "the tiny model (kern serve qwen3-tiny-batch --backend kern_interp.serve:engine)"


@dataclass(frozen=True, slots=True)
class _Plan:
    """What `engine(spec)` loads, checked: the manifest (`read_manifest`'s model), its roles, the
    weight files and the sizes of its KV pool and host tier in pages."""

    manifest: Manifest
    roles: kr.ServingRoles
    files: tuple[Path, ...]
    heads: dict[str, interp.TensorHead]
    pages: int
    host_pages: int

    @property
    def page_floats(self) -> int:
        """float32 elements of one KV page (the interpreter widens the bf16 state)."""
        return self.roles.page_tokens * interp.kv_token_bytes(self.manifest) // interp.kv_element_bytes(self.manifest)


def _plan(spec: EngineSpec) -> _Plan:
    manifest = kr.read_manifest(spec.manifest)
    roles = kr.serving_roles(manifest)
    files = tuple(kr.weight_files(spec.weights) if spec.weights else kr.weight_files([_default_weights(manifest)]))
    heads: dict[str, interp.TensorHead] = {}
    for f in files:
        heads.update(interp.read_header(f))
    _check_weights(manifest, heads, spec.manifest.name, _DEFAULT if not spec.weights else "these weights are another "
                   "model's: pass this manifest's checkpoint")
    page_bytes = roles.page_tokens * interp.kv_token_bytes(manifest)
    pages = -(-spec.tokens // (roles.page_tokens * CHUNK_PAGES)) * CHUNK_PAGES
    return _Plan(manifest, roles, files, heads, pages, spec.host_bytes // page_bytes)


def _check_weights(manifest: Manifest, heads: Mapping[str, interp.TensorHead], name: str, hint: str) -> None:
    """Every weight buffer's tensors are in the checkpoint and fill it exactly (the interpreter
    concatenates them)."""
    env = manifest.var_max
    where = f"the weights do not fit {name[:48]}"
    for buf, b in manifest.buffers.items():
        if b.kind not in ("weight", "source") or b.bind is None:
            continue  # NOTE: a weight without a bind is a derive program's to write
        tensors = [str(s.tensor) for s in b.bind]
        missing = next((t for t in tensors if t not in heads), None)
        if missing is not None:
            raise kr.WeightArtifactError(f"{where}: the checkpoint has no tensor {missing[:48]!r} ({hint})")
        want = b.elements(env)
        have = sum(heads[t].size for t in tensors)
        if have != want:
            raise kr.WeightArtifactError(f"{where}: buffer {buf[:48]!r} holds {want} values, the checkpoint's "
                                         f"{tensors[0][:48]}{' ...' if len(tensors) > 1 else ''} {have} ({hint})")


def _buffer_bytes(manifest: Manifest) -> int:
    """RAM of the interpreter's buffers at the vars' maxima (bf16 and e4m3 widened to float32)."""
    sizes = {"bf16": 4, "fp8e4m3": 4, "f32": 4, "i64": 8, "i32": 4}
    return sum(b.elements(manifest.var_max) * sizes[b.dtype] for b in manifest.buffers.values())


class CpuBackend:
    """The engine factory `kern serve --backend kern_interp.serve:engine` calls (`engine(spec)`),
    with the RAM it takes (`engine.ram(spec)`), which kern serve checks against the RAM available
    before calling it."""

    def ram(self, spec: EngineSpec) -> dict[str, int]:
        """Bytes of RAM `self(spec)` allocates, by what: the KV pool, the host tier, the
        interpreter's buffers and the checkpoint, all as float32.

        Raises:
            kern_runtime.WeightArtifactError, InputFileError: weights that are not a checkpoint
                of this manifest's model (bf16, or e4m3 with f32 scales).
        """
        plan = _plan(spec)
        checkpoint = sum(t.size for t in plan.heads.values()) * _F32
        return {"the KV pool": plan.pages * plan.page_floats * _F32,
                "the host tier": plan.host_pages * plan.page_floats * _F32,
                "the buffers": _buffer_bytes(plan.manifest), "the checkpoint": checkpoint}

    def __call__(self, spec: EngineSpec) -> kr.Engine:
        """The interpreter's engine for `spec` (gpu and kernels are not used).

        Raises:
            as `ram`.
        """
        plan = _plan(spec)
        tensors = interp.read_files(plan.files)
        backend = InterpBackend(plan.manifest, tensors, pages=plan.pages, chunk_pages=CHUNK_PAGES,
                                host_pages=plan.host_pages)
        return kr.Engine(backend, plan.roles, kr.EngineConfig(chunk=spec.chunk, park=plan.host_pages > 0))


engine = CpuBackend()
"""`engine(spec)`: the CPU engine (the pool holds `spec.tokens` KV tokens in chunks of
`CHUNK_PAGES` pages, a host tier of `spec.host_bytes`; without weights the seeded random tiny
checkpoint)."""


def _default_weights(manifest: Manifest) -> Path:
    """A tiny Qwen3 manifest's seeded random checkpoint as the provider writes it (FP8 for e4m3
    weights); the tiny bf16 one for any other manifest (which the weight check then refuses)."""
    if manifest.model.lower().startswith("qwen3-tiny"):
        path, _what, _written = QWEN3.random_checkpoint(manifest_to_json(manifest), None)
        return path
    path, _ = random_checkpoint(dict(QWEN3_TINY_CONFIG), seed=0, name="qwen3-tiny")
    return path


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255 and `SPECIAL`'s tokens; decodes any id below `VOCAB`."""

    vocab_size = VOCAB
    """The ids it decodes (kern serve checks them against the model's token ids)."""

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (special tokens matched first, then bytes)."""
        out: list[int] = []
        i = 0
        while i < len(text):
            special = next((s for s in SPECIAL if text.startswith(s, i)), None)
            if special is not None:
                out.append(SPECIAL[special])
                i += len(special)
            else:
                out += text[i].encode("utf-8")
                i += 1
        return out

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`: byte runs as UTF-8 (invalid bytes as U+FFFD), special tokens by name."""
        names = {v: k for k, v in SPECIAL.items()}
        out: list[str] = []
        run = bytearray()
        for i in ids:
            if i < 256:
                run.append(i)
                continue
            out.append(run.decode("utf-8", errors="replace"))
            run.clear()
            out.append(names.get(i, chr(0x4E00 + i)))
        out.append(run.decode("utf-8", errors="replace"))
        return "".join(out)


def tokenizer() -> ByteTokenizer:
    """The tiny model's tokenizer."""
    return ByteTokenizer()
