"""The verdict ladder: the evidence of one A/B test in, one verdict out; the first match wins.

1. FAIL: B left a declared output domain, or wrote non-finite logits where A's are finite.
2. FAIL: B wrote state bytes outside A's write set (kern owns sequence memory).
3. FAIL: B crashed.
4. FAIL: an argmax flip on a row whose KL(A || B) exceeds the threshold, unless A against itself
   flips there too; or B's next token off its own top logit on a row where A's is on A's.
5. PASS bit-identical: logits, next tokens and states, byte for byte.
6. PASS values identical: only the sign of zero differs in the logits.
7. PASS logits identical: the logits byte for byte, the states differ (or are laid out apart).
8. PASS within the noise band: B against A no worse than A against itself with another chunking.
9. PASS logit evidence: every row's KL(A || B) at most the threshold.
10. Otherwise INCONCLUSIVE.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["Evidence", "Outcome", "Verdict", "judge"]


class Outcome(enum.Enum):
    """A verdict's kind; its value is `kern test`'s exit status."""

    PASS = 0
    FAIL = 1
    INCONCLUSIVE = 3


@dataclass(frozen=True, slots=True)
class Evidence:
    """What the comparison found.

    Attributes:
        rows: rows compared (B's rows up to a crash).
        domain: B's outputs outside a declared domain, one line each.
        nonfinite_rows: rows where B's logits are not finite where A's are.
        outside_bytes: state bytes B wrote outside A's write set, all states together.
        crash: B's error, one line (None: B ran every run).
        flips: rows whose argmax flips with KL above `logit_kl` where A against itself does not.
        token_flips: rows where B's next token is not its top logit while A's is A's top.
        bits_identical: logits, next tokens and every state byte for byte.
        values_identical: logits equal as values (+0 = -0), next tokens and states byte for byte.
        logits_identical: logits byte for byte.
        within_noise: B no worse than the noise pass (False when there was none).
        kl_max: the largest row KL(A || B).
        logit_kl: the evidence threshold in nats.
    """

    rows: int
    domain: tuple[str, ...]
    nonfinite_rows: int
    outside_bytes: int
    crash: str | None
    flips: int
    token_flips: int
    bits_identical: bool
    values_identical: bool
    logits_identical: bool
    within_noise: bool
    kl_max: float
    logit_kl: float


@dataclass(frozen=True, slots=True)
class Verdict:
    """The ladder's answer: its outcome and the line that says why."""

    outcome: Outcome
    reason: str

    @property
    def exit_code(self) -> int:
        """`kern test`'s exit status: 0 PASS, 1 FAIL, 3 INCONCLUSIVE."""
        return self.outcome.value

    def line(self) -> str:
        """The report's last line."""
        return f"{self.outcome.name} {self.reason}"


def _fail(e: Evidence) -> str | None:
    if e.domain:
        return f"output domain: {e.domain[0]}" + (f" (and {len(e.domain) - 1} more)" if len(e.domain) > 1 else "")
    if e.nonfinite_rows:
        return f"non-finite logits where A's are finite on {e.nonfinite_rows} of {e.rows} rows"
    if e.outside_bytes:
        return f"memory: B wrote {e.outside_bytes} state bytes outside A's write set"
    if e.crash is not None:
        return f"B crashed: {e.crash}"
    if e.flips:
        return (f"argmax flips on {e.flips} of {e.rows} rows with KL above {e.logit_kl:g} nat "
                "where A against itself does not flip")
    if e.token_flips:
        return f"next token: B's is off its top logit on {e.token_flips} of {e.rows} rows where A's is on A's"
    return None


def _pass(e: Evidence) -> str | None:
    if e.bits_identical:
        return "bit-identical: logits, next tokens and states byte for byte"
    if e.values_identical:
        return "values identical: only the sign of zero differs"
    if e.logits_identical:
        return "logits identical: the logits byte for byte, the states differ"
    if e.within_noise:
        return f"within the noise band: KL max {e.kl_max:.3g} nat, no worse than A against itself"
    if e.kl_max <= e.logit_kl:
        return f"logit evidence: KL max {e.kl_max:.3g} nat <= {e.logit_kl:g} on all {e.rows} rows"
    return None


def judge(evidence: Evidence) -> Verdict:
    """The first rung of the ladder that `evidence` matches (see the module's docstring)."""
    failed = _fail(evidence)
    if failed is not None:
        return Verdict(Outcome.FAIL, failed)
    if not evidence.rows:
        return Verdict(Outcome.INCONCLUSIVE, "no rows were compared")
    passed = _pass(evidence)
    if passed is not None:
        return Verdict(Outcome.PASS, passed)
    return Verdict(Outcome.INCONCLUSIVE, f"KL max {evidence.kl_max:.3g} nat above {evidence.logit_kl:g} "
                                         "with no argmax flip to fail on, outside the noise band")
