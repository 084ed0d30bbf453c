"""The two manifests of an A/B test, read and checked against each other before any GPU is looked
for: both serve (their serving roles), they are one model (the same checkpoint tensors bound) with
one vocabulary (the logits' width and the token ids taken), and they run a program in common."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from kern_manifest import BufArg, Buffer, Expr, Manifest, State

from ..inputs import check_capacity
from ..roles import ServingRoles, serving_roles
from .options import AbTestError

__all__ = ["Facts", "Pair", "check_pair", "read_facts"]

Domain = tuple[float | None, float | None]


@dataclass(frozen=True, slots=True)
class Facts:
    """One manifest as the harness drives it.

    Attributes:
        model: the manifest's `model` name.
        manifest: the manifest (`read_manifest`'s model).
        roles: its serving roles.
        logits: the output buffer that holds the logits (the output with no `fill`).
        vocab: the logits' width.
        capacity: KV tokens of the one sequence a run holds.
        states: bytes of each state from its start that a run can reach at this capacity.
        domains: the declared (min, max) of the outputs read: the next token (held to the token
            input's domain when it declares none) and the logits where declared.
        row_logits: the buffer of the batched step's logits ([rows, vocab], the one its program
            passes), or None: no batched step, or none such.
    """

    model: str
    manifest: Manifest
    roles: ServingRoles
    logits: str
    vocab: int
    capacity: int
    states: Mapping[str, int]
    domains: Mapping[str, Domain]
    row_logits: str | None = None

    @property
    def programs(self) -> tuple[str, ...]:
        """The programs a run, a batch and the timing drive: chunk, step, the head and step seed,
        and the batched step and its row seed."""
        r = self.roles
        rows = (r.rows.program, r.rows.seed_program) if r.rows is not None else (None, None)
        return tuple(p for p in (r.chunk_program, r.step_program, r.head_program, r.start_program, *rows) if p)

    def layout(self, state: str) -> str:
        """A state's declaration and page size, as text: two states compare byte for byte only
        when theirs are equal."""
        declared = self.manifest.states[state].model_dump(mode="json", exclude_none=True)
        return json.dumps([declared, self.roles.page_tokens], sort_keys=True)


@dataclass(frozen=True, slots=True)
class Pair:
    """A (reference) and B (candidate), checked against each other.

    Attributes:
        a: the reference.
        b: the candidate.
        common: the programs both drive, by name.
    """

    a: Facts
    b: Facts
    common: tuple[str, ...]

    def no_batch(self) -> str | None:
        """Why batched rows are not driven (None: both manifests have a batched step to drive)."""
        missing = [who for who, f in (("A", self.a), ("B", self.b)) if f.row_logits is None]
        if not missing:
            return None
        who = "neither manifest has a" if len(missing) == 2 else f"{missing[0]} has no"
        return f"{who} batched step with a [rows, vocab] logits buffer"


def _logits(manifest: Manifest, who: str) -> tuple[str, int]:
    outs = [n for n, b in manifest.buffers.items() if b.kind == "output" and b.fill is None]
    if len(outs) != 1:
        raise AbTestError(f"{who} needs exactly one output without a fill (its logits), found {outs or 'none'}")
    width = manifest.buffers[outs[0]].shape[-1]
    if width.const is None:
        raise AbTestError(f"{who}'s logits output {outs[0]!r} has no fixed width (its last dim is "
                          f"{width.to_json()!r})")
    return outs[0], width.const


def _state_bytes(state: State, capacity: int, page: int) -> int:
    if state.bytes is not None:
        return state.bytes
    if state.bytes_per_token is not None:
        return -(-capacity // page) * page * state.bytes_per_token
    return state.bytes_per_seq or 0


def _number(bound: float | Expr | None) -> float | None:
    return bound.const if isinstance(bound, Expr) else bound


def _domain(buf: Buffer) -> Domain | None:
    if buf.domain is None:
        return None
    lo, hi = _number(buf.domain.min), _number(buf.domain.max)
    return None if lo is None and hi is None else (lo, hi)


def _domains(manifest: Manifest, roles: ServingRoles, logits: str) -> dict[str, Domain]:
    buffers = manifest.buffers
    token = _domain(buffers[roles.next_token]) or (0, roles.token_max)
    out = {roles.next_token: token}
    if (d := _domain(buffers[logits])) is not None:
        out[logits] = d
    return out


def _is_row_logits(buf: Buffer, var: str, max_rows: int, vocab: int) -> bool:
    if buf.kind == "weight" or buf.dtype not in ("bf16", "f16", "f32") or len(buf.shape) != 2:
        return False
    first, last = buf.shape
    return last.const == vocab and (first == Expr.of(var) or first.const == max_rows)


def _row_logits(manifest: Manifest, roles: ServingRoles, vocab: int) -> str | None:
    rows = roles.rows
    if rows is None:
        return None
    calls = manifest.programs[rows.program].calls
    passed = sorted({a.buf for c in calls for a in c.args if isinstance(a, BufArg)})
    found = [n for n in passed if _is_row_logits(manifest.buffers[n], rows.var, rows.max_rows, vocab)]
    return found[0] if len(found) == 1 else None


def read_facts(manifest: Manifest, capacity: int, who: str) -> Facts:
    """One manifest's facts (`who` names it in errors: `A` or `B`).

    Raises:
        ServingRolesError: no serving roles. PromptError: the capacity is past its reach.
        AbTestError: no single logits output.
    """
    roles = serving_roles(manifest)
    check_capacity(roles, capacity)
    logits, vocab = _logits(manifest, who)
    states = {n: _state_bytes(s, capacity, roles.page_tokens) for n, s in manifest.states.items()}
    return Facts(manifest.model, manifest, roles, logits, vocab, capacity, states,
                 _domains(manifest, roles, logits), _row_logits(manifest, roles, vocab))


SCALE_SUFFIXES = ("_scale_inv", "_scale")
"""Checkpoint tensors a quantised checkpoint adds beside its weights (Qwen FP8's `weight_scale_inv`,
compressed-tensors' `weight_scale`): an FP8 manifest and a bf16 one of the same model bind the same
tensors but these."""


def _tensors(manifest: Manifest) -> set[str]:
    """The checkpoint tensors the manifest binds (weights, and sources its derive programs read)."""
    names = {str(seg.model_dump(mode="json")["tensor"]) for buf in manifest.buffers.values()
             if buf.kind in ("weight", "source") for seg in buf.bind or ()}
    return {n for n in names if not n.endswith(SCALE_SUFFIXES)}


def _same_model(a: Facts, b: Facts) -> None:
    ta, tb = _tensors(a.manifest), _tensors(b.manifest)
    if ta != tb:
        only = sorted(ta - tb) or sorted(tb - ta)
        side = "A" if ta - tb else "B"
        raise AbTestError(f"different models: {side} binds checkpoint tensors the other does not "
                          f"({', '.join(only[:3])}{', ...' if len(only) > 3 else ''})")


def _same_vocabulary(a: Facts, b: Facts) -> None:
    if a.vocab != b.vocab:
        raise AbTestError(f"different vocabularies: A's logits have {a.vocab} token ids, B's {b.vocab}")
    ta, tb = a.roles.token_max, b.roles.token_max
    if ta != tb:
        raise AbTestError(f"different vocabularies: A takes token ids up to {ta}, B up to {tb}")
    if ta is None:
        raise AbTestError("neither manifest declares its token ids' domain (the token input's domain max)")


def check_pair(a_manifest: Manifest, b_manifest: Manifest, capacity: int) -> Pair:
    """Check A against B: one model, one vocabulary, a program in common.

    Raises:
        AbTestError: different models or vocabularies, or no program in common.
        ServingRolesError, PromptError: as `read_facts`.
    """
    a, b = read_facts(a_manifest, capacity, "A"), read_facts(b_manifest, capacity, "B")
    _same_model(a, b)
    _same_vocabulary(a, b)
    common = tuple(p for p in a.programs if p in b.programs)
    if not common:
        raise AbTestError(f"no common program: A runs {', '.join(a.programs)}; B runs {', '.join(b.programs)}")
    return Pair(a, b, common)
