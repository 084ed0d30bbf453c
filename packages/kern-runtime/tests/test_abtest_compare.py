"""kern test's comparisons: per-row logit statistics, the noise band, identity, domains, write sets."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from kern_runtime import abtest as ab


def _rows(seed: int, rows: int = 4, vocab: int = 64) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((rows, vocab)) * 3).astype(np.float32)


def test_identical_rows() -> None:
    a = _rows(0)
    s = ab.row_stats(a, a.copy())
    assert s.rows == 4 and np.all(s.kl == 0) and s.agree.all()
    assert np.all(s.rank == 0) and np.all(s.overlap == ab.TOP_K) and not s.nonfinite.any()
    np.testing.assert_allclose(s.margin, [np.sort(r)[-1] - np.sort(r)[-2] for r in a.astype(np.float64)])


def test_kl_matches_a_float64_reference() -> None:
    a, b = _rows(1), _rows(2)
    pa = np.exp(a.astype(np.float64)) / np.exp(a.astype(np.float64)).sum(1, keepdims=True)
    pb = np.exp(b.astype(np.float64)) / np.exp(b.astype(np.float64)).sum(1, keepdims=True)
    np.testing.assert_allclose(ab.row_stats(a, b).kl, (pa * np.log(pa / pb)).sum(1), rtol=1e-12)


def test_a_swapped_argmax_flips_with_its_rank() -> None:
    a = _rows(3)
    b = a.copy()
    top, low = int(np.argmax(a[0])), int(np.argmin(a[0]))
    b[0, top], b[0, low] = b[0, low], b[0, top]
    s = ab.row_stats(a, b)
    assert list(s.agree) == [False, True, True, True]
    assert s.rank[0] == 63 and s.overlap[0] == ab.TOP_K - 1
    assert list(s.flips(0.01)) == [True, False, False, False]
    assert not s.flips(float(s.kl[0])).any()  # a flip at or below the threshold is a near-tie


def test_non_finite_b_where_a_is_finite() -> None:
    a = _rows(4)
    b = a.copy()
    b[1, 3] = np.nan
    b[2, 5] = np.inf
    s = ab.row_stats(a, b)
    assert list(s.nonfinite) == [0, 1, 1, 0] and np.isinf(s.kl[1:3]).all() and s.kl[0] == 0


def test_tokens_a_masks_out_are_not_compared() -> None:
    a = _rows(5)
    a[:, :10] = -np.inf
    b = a.copy()
    b[:, :10] = np.nan
    s = ab.row_stats(a, b)
    assert np.all(s.kl == 0) and not s.nonfinite.any() and s.agree.all()


def test_shapes_must_match() -> None:
    with pytest.raises(ValueError, match="one shape"):
        ab.row_stats(_rows(0, 2), _rows(0, 3))


@settings(max_examples=50, deadline=None)
@given(hnp.arrays(np.float32, (3, 32), elements=st.floats(-20, 20, width=32)),
       hnp.arrays(np.float32, (3, 32), elements=st.floats(-20, 20, width=32)))
def test_kl_is_non_negative_and_zero_on_itself(a: np.ndarray, b: np.ndarray) -> None:
    assert np.all(ab.row_stats(a, b).kl >= 0)
    assert np.all(ab.row_stats(a, a).kl == 0)
    s = ab.row_stats(a, b)
    assert np.all((s.overlap >= 0) & (s.overlap <= ab.TOP_K)) and np.all(s.rank < 32)


def test_within_noise() -> None:
    a = _rows(6)
    near, far = a + 1e-3, a + _rows(7) * 1e-2
    noise = ab.row_stats(a, far)
    assert ab.within_noise(ab.row_stats(a, near), noise)
    assert not ab.within_noise(noise, ab.row_stats(a, near))
    assert not ab.within_noise(ab.row_stats(a, near), ab.row_stats(a[:2], far[:2]))  # other rows


def test_the_kl_band_is_the_factor_over_the_noise_pass() -> None:
    a = _rows(9)
    noise = ab.row_stats(a, a + _rows(10) * 1e-2)
    bound = ab.NOISE_KL_FACTOR * float(noise.kl.max())
    for scale, inside in ((0.95, True), (1.05, False)):
        # NOTE: KL grows with the square of a small logit error: scale the noise's error by sqrt.
        b = ab.row_stats(a, a + _rows(10) * 1e-2 * float(np.sqrt(ab.NOISE_KL_FACTOR * scale)))
        assert (float(b.kl.max()) <= bound) is inside
        assert ab.within_noise(b, noise) is inside


def test_shift_is_the_largest_move_of_a_top_logit() -> None:
    a = _rows(11, vocab=64)
    b = a.copy()
    low = int(np.argmin(a[0]))
    b[0, low] += 5.0  # not among A's top 20: no shift
    top = int(np.argmax(a[1]))
    b[1, top] -= 0.25
    b[2, 0] = np.nan if a[2, 0] >= np.sort(a[2])[-ab.TOP_K] else b[2, 0]
    s = ab.row_stats(a, b)
    assert s.shift[0] == 0 and s.shift[1] == pytest.approx(0.25) and s.shift[3] == 0


def _swap_top2(a: np.ndarray, rows: slice) -> np.ndarray:
    b = a.copy()
    order = np.argsort(a, axis=1)
    for r in range(*rows.indices(len(a))):
        t1, t2 = order[r, -1], order[r, -2]
        b[r, t1], b[r, t2] = a[r, t2], a[r, t1]
    return b


def test_a_flip_is_within_noise_where_a_against_itself_flips() -> None:
    a = _rows(8)
    flipped = a.copy()
    top = np.argmax(a, axis=1)
    flipped[np.arange(4), top] -= 100
    noise = ab.row_stats(a, flipped)
    assert ab.within_noise(ab.row_stats(a, flipped), noise)
    a[0, top[0]] += 10  # row 0: a clear winner
    b = a.copy()
    b[0, top[0]] -= 100
    steady = _swap_top2(a, slice(1, 4))  # the noise pass flips rows 1-3 at their near ties only
    noise = ab.row_stats(a, steady)
    assert noise.agree[0] and not noise.agree[1:].any()
    assert not ab.within_noise(ab.row_stats(a, b), noise)


def _moved(a: np.ndarray, by: float) -> np.ndarray:
    """`a` with every logit moved by +-`by`, row 0's top-1 up and top-2 down (its argmax kept)."""
    out = a + by * np.sign(_rows(13)).astype(np.float32)
    t1, t2 = np.argsort(a[0])[-1], np.argsort(a[0])[-2]
    out[0, t1], out[0, t2] = a[0, t1] + by, a[0, t2] - by
    return out


def test_a_flip_at_a_tie_the_noise_pass_could_break_is_within_noise() -> None:
    a = _rows(12)
    a[0] *= 0.001  # a flat row with two leaders 0.02 apart: its flip moves little probability
    t1, t2 = np.argsort(a[0])[-1], np.argsort(a[0])[-2]
    a[0, t1], a[0, t2] = 1.0, 0.98
    b = ab.row_stats(a, _swap_top2(a, slice(0, 1)))
    assert not b.agree[0] and b.agree[1:].all()
    for by, inside in ((0.011, True), (0.009, False)):  # the tie band is twice the largest move
        noise = ab.row_stats(a, _moved(a, by))
        assert noise.agree.all() and float(noise.shift.max()) == pytest.approx(by, rel=1e-3)
        assert float(b.kl.max()) <= ab.NOISE_KL_FACTOR * float(noise.kl.max())
        assert ab.within_noise(b, noise) is inside


def test_bits_and_values() -> None:
    a = np.array([0.0, 1.0, np.nan], dtype=np.float32)
    b = np.array([-0.0, 1.0, np.nan], dtype=np.float32)
    assert ab.values_equal(a, b) and not ab.bits_equal(a, b)
    assert ab.bits_equal(a, a.copy())
    assert not ab.bits_equal(a, a.astype(np.float64)) and not ab.values_equal(a, a[:2])


def test_off_top() -> None:
    logits = np.array([[1.0, 3.0, 3.0], [0.0, 1.0, 2.0], [np.nan, 1.0, 0.0], [1.0, 2.0, 0.0]], dtype=np.float32)
    tokens = np.array([2, 0, 1, 7])
    assert list(ab.off_top(logits, tokens)) == [False, True, True, True]  # a tie is top; NaN and outside are off


def test_out_of_domain() -> None:
    v = np.array([-1, 0, 5, 4095, 4096])
    assert ab.out_of_domain(v, 0, 4095) == 2
    assert ab.out_of_domain(v, None, 4095) == 1
    assert ab.out_of_domain(np.array([np.nan, 1.0]), 0, None) == 1


def test_write_sets_in_blocks() -> None:
    a = np.zeros(200, dtype=np.uint8)
    a[3] = 1  # block 0
    a[130] = 7  # block 2
    written = ab.written_blocks(a)
    assert list(written) == [True, False, True, False]
    b = a.copy()
    b[10] = 9  # inside block 0: A wrote there
    assert ab.outside_bytes(written, b) == 0
    b[64:67] = 1  # block 1
    b[199] = 2  # block 3, the padded tail
    assert ab.outside_bytes(written, b) == 4
    with pytest.raises(ValueError, match="blocks"):
        ab.outside_bytes(written, b[:64])


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(np.float32, (4, 48), elements=st.floats(-8, 8, width=32)),
       hnp.arrays(np.float32, (4, 48), elements=st.floats(-1, 1, width=32)),
       st.floats(1e-4, 1e-1))
def test_a_candidate_is_within_the_band_of_its_own_rerounding(a: np.ndarray, d: np.ndarray, size: float) -> None:
    """B identical to A is within any band of the same rows; B the noise pass itself is within its
    own band; B moved four times as far as the noise pass is not: KL(A || A + t d) is convex in t and
    0 at 0, so 4x the move is at least 4x the KL, past the band's 2x (a noise pass of no KL aside)."""
    noise = ab.row_stats(a, a + d * np.float32(size))
    assert ab.within_noise(ab.row_stats(a, a.copy()), noise)
    assert ab.within_noise(noise, noise)
    far = ab.row_stats(a, a + d * np.float32(4 * size))
    if float(noise.kl.max()) > 1e-9:
        assert float(far.kl.max()) >= 3.9 * float(noise.kl.max())
        assert not ab.within_noise(far, noise)
