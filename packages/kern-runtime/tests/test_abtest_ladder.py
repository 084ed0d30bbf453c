"""kern test's verdict ladder: one case per rung, the first match wins."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from kern_runtime import abtest as ab

CLEAN = ab.Evidence(rows=10, domain=(), nonfinite_rows=0, outside_bytes=0, crash=None, flips=0, token_flips=0,
                    bits_identical=False,
                    values_identical=False, logits_identical=False, within_noise=False, kl_max=0.5, logit_kl=0.01)


def _judge(**changes: object) -> tuple[str, int, str]:
    v = ab.judge(dataclasses.replace(CLEAN, **changes))  # type: ignore[arg-type]
    return v.outcome.name, v.exit_code, v.reason


def test_one_case_per_rung() -> None:
    assert _judge(domain=("next_token: 3 values outside [0, 4095]",))[:2] == ("FAIL", 1)
    assert _judge(nonfinite_rows=2)[2].startswith("non-finite logits where A's are finite on 2 of 10 rows")
    assert _judge(outside_bytes=64)[2] == "memory: B wrote 64 state bytes outside A's write set"
    assert _judge(crash="in run 3: CudaError: boom")[2] == "B crashed: in run 3: CudaError: boom"
    assert _judge(flips=1)[2].startswith("argmax flips on 1 of 10 rows")
    assert _judge(token_flips=2)[2] == "next token: B's is off its top logit on 2 of 10 rows where A's is on A's"
    assert _judge(bits_identical=True)[:3] == ("PASS", 0, "bit-identical: logits, next tokens and states byte for byte")
    assert _judge(values_identical=True)[2].startswith("values identical")
    assert _judge(logits_identical=True)[2].startswith("logits identical")
    assert _judge(within_noise=True)[2].startswith("within the noise band")
    assert _judge(kl_max=0.01)[2].startswith("logit evidence")
    assert _judge()[:2] == ("INCONCLUSIVE", 3)
    assert _judge(rows=0, kl_max=float("inf"))[:3] == ("INCONCLUSIVE", 3, "no rows were compared")


def test_the_first_match_wins() -> None:
    everything = {"domain": ("d: 1 values outside [0, 1]",), "nonfinite_rows": 1, "outside_bytes": 1,
                  "crash": "x", "flips": 1, "bits_identical": True}
    assert _judge(**everything)[2].startswith("output domain: d:")
    assert _judge(**{**everything, "domain": ()})[2].startswith("non-finite")
    assert _judge(**{**everything, "domain": (), "nonfinite_rows": 0})[2].startswith("memory")
    assert _judge(crash="x", flips=1)[2].startswith("B crashed")
    assert _judge(flips=1, bits_identical=True)[0] == "FAIL"
    assert _judge(flips=1, token_flips=1)[2].startswith("argmax flips")
    assert _judge(token_flips=1, logits_identical=True)[0] == "FAIL"
    assert _judge(values_identical=True, logits_identical=True, within_noise=True)[2].startswith("values")
    assert _judge(within_noise=True, kl_max=0.001)[2].startswith("within the noise band")


def test_several_domain_lines_are_counted() -> None:
    assert _judge(domain=("a: 1", "b: 2", "c: 3"))[2] == "output domain: a: 1 (and 2 more)"


def test_the_verdict_line() -> None:
    v = ab.judge(dataclasses.replace(CLEAN, kl_max=0.002))
    assert v.line() == "PASS logit evidence: KL max 0.002 nat <= 0.01 on all 10 rows"


@given(domain=st.booleans(), nonfinite=st.integers(0, 3), outside=st.integers(0, 3), crash=st.booleans(),
       flips=st.integers(0, 3), tokens=st.integers(0, 2), bits=st.booleans(), values=st.booleans(), logits=st.booleans(), noise=st.booleans(),
       kl=st.floats(0, 1))
def test_a_failure_is_never_passed(domain: bool, nonfinite: int, outside: int, crash: bool, flips: int, tokens: int,
                                   bits: bool, values: bool, logits: bool, noise: bool, kl: float) -> None:
    v = ab.judge(ab.Evidence(10, ("x",) if domain else (), nonfinite, outside, "c" if crash else None, flips, tokens,
                             bits, values, logits, noise, kl, 0.01))
    failing = domain or nonfinite or outside or crash or flips or tokens
    assert (v.outcome is ab.Outcome.FAIL) == bool(failing)
    assert v.exit_code in (0, 1, 3)
