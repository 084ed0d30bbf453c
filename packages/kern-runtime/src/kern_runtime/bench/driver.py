"""`kern bench`'s instrument: one row of a runtime that nothing else uses, driven at positions of
the bench's choosing, so that a step can be timed at a context exactly, replayed back to back, or
its calls timed apart.

The row's block table holds pages 0, 1, 2, ... for the capacity (the bench owns the whole pool; no
engine leases from it meanwhile). A prefill runs every prompt token but the last through the chunk
program; the last is staged as the step's input and the step seed (the start program) run, as a
turn's prefill leaves an engine's row. `rewind` stages it again, so the next step recomputes that
position whatever steps ran since. Sequences are run through `Engine`; this only measures.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import PromptError
from ..inputs import block_table, check_capacity, check_prompt, stage
from ..roles import ServingRoles, prefill_chunks
from ..runtime import Runtime

__all__ = ["Driver"]


class Driver:
    """The bench's row on `rt` for up to `capacity` tokens (block table written at construction).

    Attributes:
        rt: the runtime driven.
        roles: the manifest's serving roles.
        capacity: the tokens the row may hold.
        seen: the position of the next step's input token.
    """

    def __init__(self, rt: Runtime, roles: ServingRoles, capacity: int) -> None:
        """Raises:
        PromptError: the capacity exceeds the model's reach or the block table."""
        check_capacity(roles, capacity)
        table = block_table(roles, capacity)
        self.rt = rt
        self.roles = roles
        self.capacity = capacity
        self.seen = 0
        self._pages = table[: roles.pages_of(capacity)].astype("int64")
        self._last: tuple[int, int] | None = None
        rt.write_input(roles.blocks, table)

    def _stage(self, ids: Sequence[int], start: int) -> None:
        stage(self.rt, self.roles, self._pages, ids, start)

    def prefill(self, prompt: Sequence[int], chunk: int) -> None:
        """Every prompt token but the last through the chunk program in chunks of at most `chunk`
        rows, then the last staged as the step's input (`rewind`).

        Raises:
            PromptError: a bad prompt (see `check_prompt`) or a chunk below 1; nothing runs.
        """
        check_prompt(self.roles, self.capacity, prompt)
        if chunk < 1:
            raise PromptError(f"the prefill chunk must be at least 1 row, got {chunk}")
        for a, b in prefill_chunks(len(prompt), min(chunk, self.roles.chunk_max)):
            self._stage(prompt[a:b], a)
            self.rt.run(self.roles.chunk_program, {self.roles.chunk_var: b - a})
        self._last = (prompt[-1], len(prompt) - 1)
        self.rewind()

    def rewind(self) -> None:
        """Back to right after the last prefill: its last token staged again (and the step seed
        run), so the next step recomputes that position; later positions' KV stays, unread.

        Raises:
            PromptError: no prefill yet.
        """
        if self._last is None:
            raise PromptError("nothing to rewind to: prefill a prompt first")
        token, pos = self._last
        self._stage([token], pos)
        if self.roles.start_program is not None:
            self.rt.run(self.roles.start_program, {})
        self.seen = pos

    def step(self) -> int:
        """One issue of the step program and the 8-byte readback of its token (a host-fed manifest's
        next input staged).

        Raises:
            PromptError: the row is at its capacity.
        """
        if self.seen >= self.capacity:
            raise PromptError(f"the row reached the capacity of {self.capacity} tokens")
        self.rt.issue(self.roles.step_program, self.roles.step_vars)
        self.seen += 1
        token = int(self.rt.read_output(self.roles.next_token)[0])
        # NOTE: at capacity there is no next step to stage for (its position may be past the domain).
        if self.roles.start_program is None and self.seen < self.capacity:
            self._stage([token], self.seen)
        return token
