"""One sequence on a loaded runtime: chunked prefill, then greedy decode steps.

The first n-1 prompt tokens go through the manifest's chunk program in chunks; the last one goes
through the decode step, whose graph ends in an on-device argmax (and, in a device-fed manifest, an
advance kernel that feeds the next step's inputs). Each further step is one issue of the step
program and an 8-byte readback of the next token.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from numpy.typing import ArrayLike, NDArray

from kern_manifest import Manifest
from kern_pool import Capacity

from ._manifest import read_manifest
from .errors import InputFileError, SessionError
from .roles import ServingRoles, prefill_chunks, serving_roles
from .runtime import Progress, Runtime
from .weights import Safetensors

__all__ = ["Inputs", "Session", "check_capacity", "check_prompt", "stage", "weight_files", "widen"]


def weight_files(paths: Sequence[Path]) -> list[Path]:
    """Expand checkpoint directories into their .safetensors files (files stay as given).

    Raises:
        InputFileError: a path does not exist or a directory holds no .safetensors file.
    """
    files: list[Path] = []
    for p in paths:
        if p.is_dir():
            found = sorted(p.glob("*.safetensors"))
            if not found:
                raise InputFileError(f"weights {p}: directory holds no .safetensors file")
            files += found
        elif p.is_file():
            files.append(p)
        else:
            raise InputFileError(f"weights {p}: no such file or directory")
    return files


def check_capacity(roles: ServingRoles, capacity: int) -> None:
    """Refuse a capacity below 1 or beyond the model's reach (see `ServingRoles.reach`).

    Raises:
        SessionError: the capacity does not fit.
    """
    if capacity < 1:
        raise SessionError(f"capacity must be at least 1 token, got {capacity}")
    reach = roles.reach(capacity)
    if capacity > reach:
        raise SessionError(f"capacity {capacity} exceeds the model's reach of {reach} positions")


def check_prompt(roles: ServingRoles, capacity: int, prompt: Sequence[int]) -> None:
    """Refuse an empty prompt, ids outside the model's token ids, or more tokens than `capacity`.

    Raises:
        SessionError: the prompt cannot be prefilled.
    """
    if not prompt:
        raise SessionError("the prompt is empty")
    top = roles.token_max
    if not _ids_within(prompt, top):
        bad = next(t for t in prompt if t < 0 or (top is not None and t > top))
        raise SessionError(f"prompt id {bad} is outside the model's token ids 0..{top}")
    if len(prompt) > capacity:
        raise SessionError(f"the prompt has {len(prompt)} tokens; capacity is {capacity}")


def _ids_within(prompt: Sequence[int], top: int | None) -> bool:
    """Whether every id of a non-empty prompt is in [0, top] (top None: no upper bound)."""
    # NOTE: a list or tuple goes through one C-level pass into unsigned 64-bit ids, then numpy's
    # max; what that pass refuses (a negative id, one past 2**64 - 1, a non-integer) and any other
    # sequence (bytes would be read as raw memory) are judged by min and max
    if type(prompt) is list or type(prompt) is tuple:
        try:
            ids = array("Q", prompt)
        except (OverflowError, TypeError):
            pass
        else:
            return top is None or int(np.frombuffer(ids, dtype=np.uint64).max()) <= top
    return not (min(prompt) < 0 or (top is not None and max(prompt) > top))


def _block_table(roles: ServingRoles, capacity: int, pages: Sequence[int] | None) -> NDArray[np.int32]:
    # NOTE: entries past the sequence's pages are never read; they hold page 0 so that every
    # entry is a page the pool has (the runtime checks the block table's domain).
    table = np.zeros(roles.blocks_len, dtype=np.int32)
    need = -(-capacity // roles.page_tokens)
    chosen: Sequence[int] = range(need) if pages is None else pages
    if len(chosen) > roles.blocks_len:
        raise SessionError(f"{len(chosen)} pages do not fit the block table of {roles.blocks_len}")
    if len(chosen) < need:
        raise SessionError(f"{len(chosen)} pages hold {len(chosen) * roles.page_tokens} tokens; capacity "
                           f"{capacity} needs {need}: pass more pages or a smaller capacity")
    table[: len(chosen)] = np.asarray(chosen, dtype=np.int32)
    return table


class Inputs(Protocol):
    """What `stage` writes to: a runtime, or an engine's backend."""

    def write_input(self, name: str, array: ArrayLike) -> None: ...


def stage(target: Inputs, roles: ServingRoles, pages: NDArray[np.integer[Any]], ids: Sequence[int], start: int) -> None:
    """Writes the row's inputs for `ids` at positions from `start`: the tokens, their positions,
    their KV slots through `pages` (the sequence's pages in order) and the sequence length."""
    n = len(ids)
    pos = np.arange(start, start + n, dtype=np.int64)
    p = roles.page_tokens
    target.write_input(roles.token, np.asarray(ids, dtype=np.int64))
    target.write_input(roles.position, pos)
    target.write_input(roles.slot, pages[pos // p].astype(np.int64) * p + pos % p)
    target.write_input(roles.seq_len, np.array([start + n], dtype=np.int32))


def widen(values: NDArray[Any]) -> NDArray[np.float32]:
    """An output read back as float32: bf16 bit patterns (uint16) widened exactly, other dtypes
    converted."""
    if values.dtype == np.uint16:
        return (values.astype(np.uint32) << 16).view(np.float32)
    return values.astype(np.float32)


class Session:
    """One sequence on a loaded runtime: chunked prefill, then decode steps.

    Factory: `Session.open(...)` loads a runtime for it; `Session(rt, roles, capacity)` binds one
    already loaded. Close with `close()` (or use as a context manager).

    Attributes:
        rt: the runtime the sequence runs on.
        roles: the manifest's serving roles.
        capacity: the tokens the sequence may hold.
        seen: the position of the next decode step's input token.
        table: the block table written to the runtime (page per entry).
    """

    def __init__(self, rt: Runtime, roles: ServingRoles, capacity: int,
                 pages: Sequence[int] | None = None) -> None:
        """Bind a loaded runtime; `pages` are the KV pages the sequence owns, in order (default:
        pages 0, 1, 2, ... for `capacity` tokens). Writes the block table.

        Raises:
            SessionError: the capacity exceeds the model's reach or the pages do not fit it.
        """
        check_capacity(roles, capacity)
        self.table = _block_table(roles, capacity, pages)
        self.rt = rt
        self.roles = roles
        self.capacity = capacity
        self.seen = 0
        self._last: tuple[int, int] | None = None  # the last prompt token and its position
        rt.write_input(roles.blocks, self.table)

    @classmethod
    def open(cls, manifest: Manifest | str | os.PathLike[str], kernels: str | os.PathLike[str],
             weights: Sequence[str | os.PathLike[str]], *, gpu: int, capacity: int,
             log: Callable[[str], None] = lambda s: None, progress: Progress | None = None,
             roles: ServingRoles | None = None) -> Session:
        """Load the manifest (`read_manifest`'s model, or a file's path), kernels and weights
        (.safetensors files) onto `gpu` and return a ready session; `roles` are the manifest's
        serving roles when the caller has read them already (else read here). `log` receives the
        runtime's startup summary.

        Raises:
            ServingRolesError, ManifestParseError, ManifestVerifyError, InputFileError: the manifest.
            SessionError: the capacity does not fit the model.
            NoDriverError: no NVIDIA driver on this machine.
            Other kern_runtime errors: manifest, kernel, weight or CUDA failures at load.
        """
        model = manifest if isinstance(manifest, Manifest) else read_manifest(manifest)
        roles = roles or serving_roles(model)
        check_capacity(roles, capacity)
        # NOTE: the pool holds whole pages: room for `capacity` tokens is its pages rounded up.
        tokens = -(-capacity // roles.page_tokens) * roles.page_tokens
        rt = Runtime.load(model, kernels, gpu=gpu, capacity=Capacity(tokens=tokens, seqs=1))
        try:
            log(rt.summary())
            rt.load_weights(Safetensors.open([str(p) for p in weights]), threads=8, progress=progress)
            return cls(rt, roles, capacity)
        except BaseException:
            rt.close()
            raise

    def close(self) -> None:
        """Release the runtime (device memory, graphs, modules)."""
        self.rt.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _stage(self, ids: Sequence[int], start: int) -> None:
        stage(self.rt, self.roles, self.table, ids, start)

    def prefill(self, prompt: Sequence[int], chunk: int) -> None:
        """Run every prompt token but the last through the chunk program in chunks of at most
        `chunk` rows, then stage the last token as the decode step's input.

        Raises:
            SessionError: a bad prompt (see `check_prompt`) or a chunk below 1; nothing runs.
        """
        check_prompt(self.roles, self.capacity, prompt)
        if chunk < 1:
            raise SessionError(f"the prefill chunk must be at least 1 row, got {chunk}")
        for a, b in prefill_chunks(len(prompt), min(chunk, self.roles.chunk_max)):
            self._stage(prompt[a:b], a)
            self.rt.run(self.roles.chunk_program, {self.roles.chunk_var: b - a})
        self._last = (prompt[-1], len(prompt) - 1)
        self.rewind()

    def rewind(self) -> None:
        """Go back to right after the last prefill: its last prompt token is staged again as the
        step's input (and the step carries reseeded), so the next step recomputes that position.
        The KV of later positions stays but is not read (seq_len goes back too).

        Raises:
            SessionError: no prefill yet.
        """
        if self._last is None:
            raise SessionError("nothing to rewind to: prefill a prompt first")
        token, pos = self._last
        self._stage([token], pos)
        if self.roles.start_program is not None:
            self.rt.run(self.roles.start_program, {})
        self.seen = pos

    def generate(self, prompt: Sequence[int], steps: int, *, chunk: int, eager: bool = False) -> list[int]:
        """Prefill `prompt` and decode `steps` tokens; earlier sequences' KV is simply overwritten."""
        self.prefill(prompt, chunk)
        return list(self.decode(steps, eager))

    def step(self, eager: bool = False) -> int:
        """One decode step: issue the step program (`eager`: call by call), read the next token.

        Raises:
            SessionError: the sequence is at its capacity.
        """
        if self.seen >= self.capacity:
            raise SessionError(f"the sequence reached the capacity of {self.capacity} tokens")
        if eager:
            self.rt.run(self.roles.step_program, self.roles.step_vars)
        else:
            self.rt.issue(self.roles.step_program, self.roles.step_vars)
        self.seen += 1
        token = int(self.rt.read_output(self.roles.next_token)[0])
        # NOTE: at capacity there is no next step to stage for (its position may be past the domain).
        if self.roles.start_program is None and self.seen < self.capacity:
            self._stage([token], self.seen)
        return token

    def decode(self, steps: int, eager: bool = False) -> Iterator[int]:
        """Generate `steps` tokens greedily (the inputs advance on the device)."""
        for _ in range(steps):
            yield self.step(eager)

    def read_f32(self, name: str) -> NDArray[np.float32]:
        """An output buffer as float32 (bf16 outputs widened exactly)."""
        return widen(np.asarray(self.rt.read_output(name)))
