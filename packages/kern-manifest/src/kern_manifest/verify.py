"""The verifier: what a parsed manifest means must hold before anything is loaded.

`check(manifest)` returns every problem as a `ManifestVerify` (JSON pointer, message, hint);
`verify(manifest)` raises `ManifestRejected` when there is any; `load_manifest(data)` parses and
verifies. All static checks are made at the var bounds (every var in [1, max]; a launch's `when`
narrows its var). The checks, by section:

- header: model label; var max >= 1; group sizes >= 1 (every problem that follows from a var
  max or group size below 1 is folded into that one problem: `ManifestError.follows`); each state has exactly one size in 1..2^40;
  module sha256 (64 lowercase hex) and source (`hf:org/repo/path[@rev]`, `https://...` or a file).
- buffers: no buffer named like a state; shapes resolve, every dim >= 1, at most 1 TiB (`MAX_BUFFER_BYTES`) at the maxima; placement host only
  for weights; export not on host buffers or peers; `of`/`group` only on peers; peer rules (u64
  [group size], `of` an export buffer or a state, no domain); bind only (and always) on
  weight/source, with sane ranges and rank tables; fill roles on i32/i64 input/output buffers,
  each once; domains self-consistent.
- ops and launches: no `bytes<n>` in interfaces; kernel launches: module resolves, block <= 1024
  threads, grid non-zero at the minimum and within CUDA limits at the maximum, dynamic shared
  memory <= 232448 bytes, cluster <= 16 blocks dividing the grid, `when` inside the var's range,
  ABI <= 32764 bytes; args match params in count and type, literals and var/expr ranges fit their
  types, packs and tensormaps fit; extern launches: arg count, `algo` only on cublasLt bf16 GEMMs,
  fp8 GEMMs take k % 16 == 0 at every var value and one-element f32 scales (at the launch, or at
  each call where forwarded), collectives take `{"rank": g}`; impl dataflow: no writes through `in`, every `out` written,
  scratch written before read, no unused scratch.
- programs: flag exclusions (derive excludes once/batch/graph, once excludes batch/graph), batch
  shape; calls: labels unique within the program, op resolves, args match the interface (dtype, state, ranges), byte offsets aligned
  and in bounds at the maxima, tensormap footprints in bounds; dataflow: no read before write of
  workspace or output within a program, no writes to input, weight (outside derive) or source or
  peer, sources read only by derive programs, derive touches no state/input/output/peer and no
  collective, no peer reaches an extern; every output and carry (and every unbound weight) is
  written by some program.
- nothing declared is unused: buffers, states, vars, ops, modules, groups, scratch.
"""

from __future__ import annotations

from kern_manifest._verify_base import CUDA_LIMITS, MAX_BUFFER_BYTES
from kern_manifest._verify_buffers import BufferChecks
from kern_manifest._verify_ops import OpChecks
from kern_manifest._verify_programs import ProgramChecks
from kern_manifest.errors import (
    ManifestError,
    ManifestRejected,
    ManifestVerify,
)
from kern_manifest.schema import (
    Manifest,
    parse_manifest,
)

__all__ = [
    "CUDA_LIMITS",
    "MAX_BUFFER_BYTES",
    "check",
    "load_manifest",
    "verify",
]


class _Verifier(BufferChecks, OpChecks, ProgramChecks):
    """All checks, in document order: header and buffers, ops, programs, then coverage."""

    def run(self) -> list[ManifestVerify]:
        self.header()
        for name, buf in self.m.buffers.items():
            self.buffer(name, buf)
        for name, op in self.m.ops.items():
            self.op(name, op)
        for name, program in self.m.programs.items():
            self.program(name, program)
        self.coverage()
        self.unused()
        return self.folded()


def check(manifest: Manifest) -> list[ManifestVerify]:
    """Every problem with a parsed manifest's meaning, in document order of discovery; those that
    follow from a var max or group size below 1 are counted in that problem's `follows` instead."""
    return _Verifier(manifest).run()


def verify(manifest: Manifest) -> None:
    """Checks a parsed manifest.

    Raises:
        ManifestRejected: with every `ManifestVerify` problem found.
    """
    problems = check(manifest)
    if problems:
        raise ManifestRejected(problems)


def load_manifest(data: str | bytes) -> Manifest:
    """Parses and verifies manifest text.

    Raises:
        ManifestRejected: with every `ManifestParse` problem, or else every `ManifestVerify` one.
    """
    manifest = parse_manifest(data)
    problems: list[ManifestError] = [*check(manifest)]
    if problems:
        raise ManifestRejected(problems)
    return manifest
