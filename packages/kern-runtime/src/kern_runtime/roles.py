"""A manifest's serving roles: which buffers and programs a sequence is served through.

Buffer `fill`s say which input carries token ids, positions, KV slots, the sequence length and the
block table, and which output carries the next token; program `batch` shapes say which program takes
prefill chunks (rows = a var) and which is the one-row decode step. A second one-row program that
reads the `span_at` input is the head: run after a chunk that ends at the last prompt token, it
computes the first generated token from that chunk's row `span_at`. Everything here is pure (the
kern_manifest model in, plain values out) and runs on any machine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kern_manifest import BufArg, Buffer, Manifest, Program, VarArg

from ._manifest import read_manifest
from .errors import PromptError, ServingRolesError

__all__ = ["RowRoles", "ServingRoles", "prefill_chunks", "read_manifest", "serving_roles"]

_INPUT_ROLES = ("token", "position", "slot", "seq_len", "blocks")
_ROW_ROLES = ("valid", "sampling", "seed", "logprobs", "top_tokens")


@dataclass(frozen=True, slots=True)
class RowRoles:
    """The batched decode step: a graph program of up to `max_rows` one-row sequences (`batch`
    groups > 1, rows 1) over the var `var`, its per-row buffers and the program that seeds rows.

    Row r reads token, position, slot and seq_len entry r and block-table row r (the shared fill
    buffers, `ServingRoles`' names) once `seed_program` has copied the rows marked in `valid` into
    its carries; the step then feeds each row's next inputs on the device. `sampling` holds
    (temperature, top_p, top_k, logprobs) per row (f32), `seed` the row's seed (i64); the step
    writes row r's token to the `tokens` output, its logprob and top-N logprobs to `logprobs`
    [rows, 1 + top_n] and the top-N ids to `top_tokens` [rows, top_n]."""

    program: str
    var: str
    max_rows: int
    seed_program: str
    valid: str
    sampling: str
    seed: str
    logprobs: str
    top_tokens: str
    top_n: int
    params: int
    """Per-row sampling parameters (the `sampling` buffer's last dim)."""


@dataclass(frozen=True, slots=True)
class ServingRoles:
    """Buffer and program names by serving role, read from a manifest's `fill` and `batch`."""

    token: str
    position: str
    slot: str
    seq_len: str
    blocks: str
    blocks_len: int
    next_token: str
    chunk_program: str
    chunk_var: str
    chunk_max: int
    step_program: str
    step_vars: Mapping[str, int] = field(default_factory=dict[str, int])
    start_program: str | None = None
    """A plain program (no batch, once or derive) that seeds device-fed step inputs; when None,
    the host writes the step's inputs before every step."""
    token_max: int | None = None
    """The largest token id the model takes (the token input's domain max), when declared."""
    page_tokens: int = 1
    """Tokens per KV page: the block table's domain stride (1 when undeclared)."""
    position_max: int | None = None
    """The largest position the model takes (the position input's domain max), when declared."""
    rows: RowRoles | None = None
    """The batched decode step, when the manifest has one."""
    head_program: str | None = None
    """The head: a one-row program run right after the chunk that ends at the last prompt token
    (its KV written); it computes the first generated token into the next-token output from the
    chunk's row `head_row` holds and, when device-fed, seeds the step's inputs as a decode step
    would have left them (the staged inputs must hold the last prompt token, as for the step
    seed). None: the first decode step computes the last prompt token."""
    head_row: str | None = None
    """The head's input (fill `span_at`, i64[1]): the last prompt token's row of that chunk."""

    def pages_of(self, tokens: int) -> int:
        """The KV pages that hold `tokens` tokens."""
        return -(-tokens // self.page_tokens)

    def whole_pages(self, tokens: int) -> int:
        """`tokens` rounded up to whole KV pages (a pool holds whole pages)."""
        return self.pages_of(tokens) * self.page_tokens

    def reach(self, capacity: int) -> int:
        """The most positions one sequence can hold: the block table's pages and the position
        input's domain (`capacity` itself when neither bounds it further)."""
        positions = self.position_max + 1 if self.position_max is not None else capacity
        return min(self.blocks_len * self.page_tokens, positions)


def _row_roles(manifest: Manifest, fills: Mapping[str, str], many: list[str], seed: str | None) -> RowRoles | None:
    if not many:
        return None
    missing = [r for r in _ROW_ROLES if r not in fills]
    if len(many) > 1 or seed is None or missing:
        raise ServingRolesError(f"a batched step needs one such program (found {many}), a row seed program (a "
                                f"plain program reading the valid buffer) and buffers with fills {missing}")
    program = manifest.programs[many[0]]
    used = sorted({a.var for c in program.calls for a in c.args if isinstance(a, VarArg)})
    if len(used) != 1 or used[0] not in manifest.vars:
        raise ServingRolesError(f"batched step {many[0]!r} must pass exactly one declared var (its rows), got {used}")
    assert program.batch is not None  # NOTE: `many` holds batched programs only
    buffers = manifest.buffers
    return RowRoles(
        program=many[0], var=used[0], max_rows=program.batch.groups, seed_program=seed,
        valid=fills["valid"], sampling=fills["sampling"], seed=fills["seed"], logprobs=fills["logprobs"],
        top_tokens=fills["top_tokens"], top_n=_last_dim(buffers, fills["top_tokens"]),
        params=_last_dim(buffers, fills["sampling"]),
    )


def _last_dim(buffers: Mapping[str, Buffer], name: str) -> int:
    dim = buffers[name].shape[-1]
    if dim.const is None:
        raise ServingRolesError(f"buffer {name!r} needs a fixed last dim, got {dim.to_json()!r}")
    return dim.const


def _fills(manifest: Manifest) -> dict[str, str]:
    fills: dict[str, list[str]] = {}
    for name, buf in manifest.buffers.items():
        if buf.fill is not None:
            fills.setdefault(buf.fill, []).append(name)
    for role in (*_INPUT_ROLES, "tokens"):
        if len(fills.get(role, [])) != 1:
            raise ServingRolesError(
                f"manifest needs exactly one buffer with fill {role!r}, found {fills.get(role, [])}")
    return {role: names[0] for role, names in fills.items()}


def _reads(program: Program, name: str) -> bool:
    return any(isinstance(a, BufArg) and a.buf == name for c in program.calls for a in c.args)


def _head(programs: Mapping[str, Program], single: list[str], span: str | None) -> str | None:
    """The one-row program that reads the `span_at` buffer (None without that buffer)."""
    if span is None:
        return None
    heads = [n for n in single if _reads(programs[n], span)]
    if len(heads) != 1:
        raise ServingRolesError(f"the span_at input {span!r} must be read by exactly one one-row program (the head), "
                                f"read by {heads}")
    return heads[0]


def _groups(program: Program) -> int:
    return program.batch.groups if program.batch is not None else 1


def _programs(manifest: Manifest, valid: str | None,
              span: str | None) -> tuple[str, str, str | None, list[str], str | None, str | None]:
    """(chunk, step, step seed, batched steps, row seed, head): the row seed is the plain program
    that reads the `valid` buffer, the head the one-row program that reads the `span_at` one."""
    programs = manifest.programs
    chunk = [n for n, p in programs.items() if p.batch is not None and isinstance(p.batch.rows, str)]
    one = [n for n, p in programs.items() if p.batch is not None and p.batch.rows == 1]
    single = [n for n in one if _groups(programs[n]) == 1]
    head = _head(programs, single, span)
    step = [n for n in single if n != head]
    many = [n for n in one if _groups(programs[n]) > 1]
    if len(chunk) != 1 or len(step) != 1:
        raise ServingRolesError(f"manifest needs one chunk program (batch rows = a var) and one step "
                                f"program (groups 1, rows 1); found {chunk} and {step}")
    plain = [n for n, p in programs.items() if not (p.batch is not None or p.once or p.derive)]
    seeds = [n for n in plain if valid is not None and _reads(programs[n], valid)]
    starts = [n for n in plain if n not in seeds]
    if len(starts) > 1 or len(seeds) > 1:
        raise ServingRolesError(f"manifest has several plain programs {plain}; at most one step seed and one row seed "
                                "(the one reading the valid buffer) are allowed")
    return chunk[0], step[0], starts[0] if starts else None, many, seeds[0] if seeds else None, head


def _domain_max(buf: Buffer) -> int | None:
    bound = buf.domain.max if buf.domain is not None else None
    return bound if isinstance(bound, int) and not isinstance(bound, bool) else None


def serving_roles(manifest: Manifest) -> ServingRoles:
    """Find the serving roles a single-sequence greedy run needs (from the kern_manifest model, e.g.
    `read_manifest`'s).

    Raises:
        ServingRolesError: a role is missing or declared twice, or there is no chunk or step program.
    """
    fills = _fills(manifest)
    chunk, step, start, many, seed, head = _programs(manifest, fills.get("valid"), fills.get("span_at"))
    buffers = manifest.buffers
    batch = manifest.programs[chunk].batch
    assert batch is not None and isinstance(batch.rows, str)  # NOTE: `_programs` picks the chunk by its rows var
    var = batch.rows
    if var not in manifest.vars:
        raise ServingRolesError(f"chunk program {chunk!r} takes rows = {var!r}, which is no declared var")
    blocks = buffers[fills["blocks"]]
    return ServingRoles(
        token=fills["token"], position=fills["position"], slot=fills["slot"],
        seq_len=fills["seq_len"], blocks=fills["blocks"], blocks_len=_last_dim(buffers, fills["blocks"]),
        next_token=fills["tokens"], chunk_program=chunk, chunk_var=var,
        chunk_max=manifest.vars[var].max, step_program=step,
        step_vars=dict.fromkeys(manifest.vars, 1),
        start_program=start,
        token_max=_domain_max(buffers[fills["token"]]),
        page_tokens=(blocks.domain.stride if blocks.domain is not None else None) or 1,
        position_max=_domain_max(buffers[fills["position"]]),
        rows=_row_roles(manifest, fills, many, seed),
        head_program=head, head_row=fills.get("span_at") if head is not None else None,
    )


def prefill_chunks(prompt_len: int, chunk: int, *, last: bool = False) -> list[tuple[int, int]]:
    """[start, end) ranges covering the first prompt_len - 1 tokens (`last`: all prompt_len) in
    chunks of at most `chunk`.

    Raises:
        PromptError: `chunk` is below 1 or `prompt_len` is negative.
    """
    if chunk < 1 or prompt_len < 0:
        raise PromptError(f"prefill chunks need chunk >= 1 and a prompt length >= 0, got {chunk} and {prompt_len}")
    end = prompt_len if last else prompt_len - 1
    return [(a, min(a + chunk, end)) for a in range(0, end, chunk)]
