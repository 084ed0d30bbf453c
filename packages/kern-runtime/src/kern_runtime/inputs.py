"""A row's inputs and the rules they obey: a prompt's ids and length (`check_prompt`), a
capacity within the model's reach (`check_capacity`), the block table of a row's pages
(`block_table`), the token, position, KV slot and length inputs of ids at their positions
(`stage`), a checkpoint's weight files (`weight_files`), and an output read back as float32
(`widen`). The engine's rows (`Engine`), kern test's and kern bench's drivers stage through these.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .errors import InputFileError, PromptError
from .roles import ServingRoles

__all__ = ["Inputs", "block_table", "check_capacity", "check_prompt", "stage", "weight_files", "widen"]


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
        PromptError: the capacity does not fit.
    """
    if capacity < 1:
        raise PromptError(f"capacity must be at least 1 token, got {capacity}")
    reach = roles.reach(capacity)
    if capacity > reach:
        raise PromptError(f"capacity {capacity} exceeds the model's reach of {reach} positions")


def check_prompt(roles: ServingRoles, capacity: int, prompt: Sequence[int]) -> None:
    """Refuse an empty prompt, ids outside the model's token ids, or more tokens than `capacity`.

    Raises:
        PromptError: the prompt cannot be prefilled.
    """
    if not prompt:
        raise PromptError("the prompt is empty")
    top = roles.token_max
    if not _ids_within(prompt, top):
        bad = next(t for t in prompt if t < 0 or (top is not None and t > top))
        raise PromptError(f"prompt id {bad} is outside the model's token ids 0..{top}")
    if len(prompt) > capacity:
        raise PromptError(f"the prompt has {len(prompt)} tokens; capacity is {capacity}")


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


def block_table(roles: ServingRoles, capacity: int, pages: Sequence[int] | None = None) -> NDArray[np.int32]:
    """A row's block table for `capacity` tokens: `pages` in order (default 0, 1, 2, ...), then 0.

    Raises:
        PromptError: the pages do not fit the table, or hold fewer tokens than `capacity`.
    """
    # NOTE: entries past the sequence's pages are never read; they hold page 0 so that every
    # entry is a page the pool has (the runtime checks the block table's domain).
    table = np.zeros(roles.blocks_len, dtype=np.int32)
    need = roles.pages_of(capacity)
    chosen: Sequence[int] = range(need) if pages is None else pages
    if len(chosen) > roles.blocks_len:
        raise PromptError(f"{len(chosen)} pages do not fit the block table of {roles.blocks_len}")
    if len(chosen) < need:
        raise PromptError(f"{len(chosen)} pages hold {len(chosen) * roles.page_tokens} tokens; capacity "
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
