"""`kern serve` on a CPU: the tiny Qwen3 through the numpy interpreter, and a tokenizer that fits
its 4,096 ids.

    kern serve --backend kern_interp.serve:engine --tokenizer kern_interp.serve:tokenizer \\
        --manifest examples/qwen3-tiny-batch.json --capacity 4096

`engine(spec)` builds the `kern_runtime.Engine` over `InterpBackend` (the pool holds `spec.tokens`
KV tokens in chunks of 8 pages, a host tier of `spec.host_bytes`); without weights it writes (once)
and uses the seeded random checkpoint of `QWEN3_TINY_CONFIG`. `tokenizer()` is `ByteTokenizer`:
UTF-8 bytes are ids 0..255, the chat template's special tokens ids 4000..4004, every other id
decodes to one CJK character (a random model says anything).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import kern_runtime as kr
from kern_interp import qwen3 as interp
from kern_interp.backend import InterpBackend
from kern_qwen3 import QWEN3_TINY_CONFIG, random_checkpoint
from kern_runtime.serving import EngineSpec

__all__ = ["CHUNK_PAGES", "SPECIAL", "ByteTokenizer", "engine", "tokenizer"]

CHUNK_PAGES = 8
"""Pages of one pool chunk."""
SPECIAL: dict[str, int] = {"<|endoftext|>": 4000, "<|im_start|>": 4001, "<|im_end|>": 4002, "<think>": 4003,
                           "</think>": 4004}
"""The special tokens' ids."""


def engine(spec: EngineSpec) -> kr.Engine:
    """The interpreter's engine for `spec` (gpu and kernels are not used)."""
    manifest = kr.read_manifest(spec.manifest)
    files = kr.weight_files(spec.weights) if spec.weights else kr.weight_files([_default_weights()])
    tensors = interp.read_files(files)
    roles = kr.serving_roles(manifest)
    page_bytes = roles.page_tokens * manifest["states"]["kv"]["bytes_per_token"]
    pages = -(-spec.tokens // (roles.page_tokens * CHUNK_PAGES)) * CHUNK_PAGES
    host = spec.host_bytes // page_bytes
    backend = InterpBackend(manifest, tensors, pages=pages, chunk_pages=CHUNK_PAGES, host_pages=host)
    return kr.Engine(backend, roles, kr.EngineConfig(chunk=spec.chunk, park=host > 0))


def _default_weights() -> Path:
    path, _ = random_checkpoint(dict(QWEN3_TINY_CONFIG), seed=0, name="qwen3-tiny")
    return path


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255 and `SPECIAL`'s tokens; decodes any id below 4096."""

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
