"""The exact sum of a batch's gradients (pool/sums.py): the same bits in any order and
any grouping, close to the float64 sum, and too-large values refused."""

from fractions import Fraction

import numpy as np
import pytest

from pgpong.frames import D
from pgpong.policy import EpisodeGradient
from pgpong.pool.sums import MAX_MATCHES, MAX_VALUE, SCALE_BITS, ExactSum, IntegerGradient, added

H = 8


def random_gradients(count: int, seed: int = 0) -> list[EpisodeGradient]:
    """Gradients on random pixels, with values of very different sizes, so that the
    order of a float sum shows in its bits."""
    rng = np.random.default_rng(seed)
    grads = []
    for _ in range(count):
        columns = np.sort(rng.choice(D, size=rng.integers(1, 60), replace=False)).astype(np.int16)
        scale = 10.0 ** rng.integers(-6, 3, size=(H, len(columns)))
        W1c = np.asfortranarray((rng.standard_normal((H, len(columns))) * scale).astype(np.float32))
        grads.append(EpisodeGradient(columns, W1c, rng.standard_normal(H).astype(np.float32)))
    return grads


def exact_sum(grads, order=None, groups=1, as_sent=True):
    """The exact sum of `grads` taken in `order`, in `groups` partial sums added in
    reverse; each match added as a worker sends it (float32) or first in fixed point."""
    order = range(len(grads)) if order is None else order
    parts = [ExactSum(H) for _ in range(groups)]
    for i, k in enumerate(order):
        parts[i % groups].add(grads[k] if as_sent else IntegerGradient.of(grads[k]))
    total = ExactSum(H)
    for part in reversed(parts):
        total.add(part.compact())
    return total.rounded().dense()


def test_any_order_and_any_grouping_give_the_same_bits():
    grads = random_gradients(50, seed=1)
    reference = exact_sum(grads)
    rng = np.random.default_rng(2)
    for groups, as_sent in ((1, False), (3, True), (7, False), (7, True)):
        shuffled = exact_sum(grads, rng.permutation(len(grads)), groups, as_sent)
        np.testing.assert_array_equal(shuffled.W1, reference.W1)
        np.testing.assert_array_equal(shuffled.W2, reference.W2)
    # a float32 sum in another order differs in its bits (so the test could fail)
    forward, backward = np.zeros((H, D), np.float32), np.zeros((H, D), np.float32)
    for g in grads:
        forward[:, g.columns] += g.W1_columns
    for g in reversed(grads):
        backward[:, g.columns] += g.W1_columns
    assert not np.array_equal(forward, backward)


def test_the_sum_is_the_rounded_exact_sum_of_the_fixed_point_values():
    grads = random_gradients(20, seed=3)
    total = exact_sum(grads)
    unit = Fraction(1, 2**SCALE_BITS)
    for pixel in (grads[0].columns[0], grads[5].columns[-1]):
        exact = Fraction(0)
        for g in grads:
            where = np.flatnonzero(g.columns == pixel)
            if len(where):  # each value rounded to the nearest multiple of 2**-36, then summed exactly
                exact += round(Fraction(float(g.W1_columns[3, where[0]])) / unit) * unit
        assert total.W1[3, pixel] == np.float32(float(exact))
    float64 = sum(g.W2.astype(np.float64) for g in grads)
    np.testing.assert_allclose(total.W2, float64, rtol=1e-6, atol=1e-9)


def test_a_match_keeps_only_the_pixels_it_touched():
    grad = random_gradients(1, seed=4)[0]
    fixed = IntegerGradient.of(grad)
    np.testing.assert_array_equal(fixed.columns, grad.columns)
    assert fixed.W1_rows.dtype == np.int64 and fixed.W1_rows.shape == (len(grad.columns), H)
    back = fixed.to_float()
    np.testing.assert_allclose(back.W1_columns, grad.W1_columns, rtol=1e-6, atol=2.0**-SCALE_BITS)
    dense = exact_sum([grad])
    untouched = np.setdiff1d(np.arange(D), grad.columns)
    assert not dense.W1[:, untouched].any()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_sum_in_floats_has_the_bits_of_numpys_division_and_cast(dtype):
    """ExactSum.rounded and IntegerGradient.to_float (one compiled pass each) give what
    numpy's `(rows / 2.0**36).astype(dtype)` gives, for integers of every size: those
    above 2**53 are rounded on their way to float64, and float32 rounds ties to even."""
    rng = np.random.default_rng(11)
    total = ExactSum(H)
    for _ in range(4):
        total.add(IntegerGradient.of(random_gradients(1, seed=int(rng.integers(100)))[0]))
    columns = np.flatnonzero(total.touched)
    big = rng.integers(-(2**62), 2**62, size=(3, H))  # beyond float64's 53 bits
    total.W1[columns[:3]] = big
    # rounded twice on the way (to float64, then to float32's tie: to even), not once
    total.W1[columns[3], :4] = [2**60 + 2**36 + 1, -(2**53) - 3, 3 * 2**10, 2**53 + 1]
    expected = (total.W1[columns] / 2.0**SCALE_BITS).astype(dtype)
    got = total.rounded(dtype)
    np.testing.assert_array_equal(got.columns, columns)
    assert got.W1_columns.dtype == dtype and got.W1_columns.flags.f_contiguous
    assert got.W1_columns.T.tobytes() == expected.tobytes()
    assert got.W2.tobytes() == (total.W2 / 2.0**SCALE_BITS).astype(dtype).tobytes()
    sent = total.compact().to_float(dtype)
    assert sent.W1_columns.tobytes() == got.W1_columns.tobytes()
    np.testing.assert_array_equal(sent.columns, got.columns)


def test_a_match_sent_in_float32_is_written_in_fixed_point_as_numpy_writes_it_ties_to_even():
    ties = np.array([3, 5, -5, 7, 1], np.float32) * np.float32(2.0**-37)  # 1.5, 2.5, -2.5, 3.5, 0.5 units
    grad = EpisodeGradient(np.array([10], np.int16), np.asfortranarray(ties.reshape(5, 1)), np.zeros(5, np.float32))
    sent, fixed = ExactSum(5), ExactSum(5)
    sent.add(grad)
    fixed.add(IntegerGradient.of(grad))
    assert sent.W1[10].tolist() == fixed.W1[10].tolist() == [2, 2, -2, 4, 0]


@pytest.mark.parametrize("where", ["W1", "W1's last", "W2"])
@pytest.mark.parametrize("as_sent", [True, False])
@pytest.mark.parametrize("bad", [MAX_VALUE, np.inf, np.nan, -np.inf])
def test_a_value_too_large_to_sum_exactly_makes_the_sum_nan(bad, as_sent, where):
    """Wherever it is: sent in float32, a match's range is checked as it is added."""
    grads = random_gradients(3, seed=5)
    if where == "W1":
        grads[1].W1_columns[0, 0] = bad
    elif where == "W1's last":
        grads[1].W1_columns[-1, -1] = -bad
    else:  # (a NaN there went unseen: Python's max() of a number and a NaN is the number)
        grads[1].W2[3] = bad
    total = exact_sum(grads, as_sent=as_sent)
    assert np.isnan(total.W2).all()  # the trainer stops the run, as for a NaN gradient


def test_a_sum_refuses_more_matches_than_its_range_allows():
    total = ExactSum(H)
    total.add(IntegerGradient(np.zeros(0, np.int16), np.zeros((0, H), np.int64), np.zeros(H, np.int64), MAX_MATCHES))
    with pytest.raises(ValueError, match="at most 8192 matches"):
        total.add(IntegerGradient.of(random_gradients(1)[0]))


@pytest.mark.parametrize("how", ["rows short", "hidden wrong", "pixel past the frame", "pixel negative"])
def test_a_part_whose_rows_do_not_fit_is_refused_and_leaves_the_sum_as_it_was(how):
    """The sums' compiled loops do not check their indices: a part that does not fit
    (a bug elsewhere) must raise, not write outside the sum."""
    grad = random_gradients(1, seed=3)[0]
    columns, W1c = grad.columns.copy(), grad.W1_columns
    if how == "rows short":
        W1c = np.asfortranarray(W1c[:, 1:])
    elif how == "hidden wrong":
        W1c = np.asfortranarray(W1c[1:])
    else:
        columns[-1] = D if how == "pixel past the frame" else -1
    bad = EpisodeGradient(columns, W1c, grad.W2)
    rows = IntegerGradient.of(grad).W1_rows[: W1c.shape[1], : W1c.shape[0]]  # the same misfit, in fixed point
    fixed = IntegerGradient(columns, np.ascontiguousarray(rows), IntegerGradient.of(grad).W2)
    total = ExactSum(H)
    total.add(random_gradients(1, seed=4)[0])
    before = total.W1.copy()
    for part in (bad, fixed):
        with pytest.raises(ValueError, match="do not fit"):
            total.add(part)
        assert np.array_equal(total.W1, before)
    with pytest.raises(ValueError, match="do not fit"):
        fixed.to_float()


def test_the_largest_batch_is_the_exact_sums_limit():
    from pgpong.config import MAX_BATCH

    assert MAX_BATCH == MAX_MATCHES
    assert MAX_MATCHES * MAX_VALUE * 2**SCALE_BITS <= 2**63


def test_two_float32_sums_added_on_their_pixels_give_the_bits_of_the_dense_addition():
    """sums.added (the reducer joins a batch's two parts with it): on the union of their
    pixels, shared ones included, the bits of adding the dense arrays; a NaN stays."""
    first, then = random_gradients(2, seed=8)
    shared = np.union1d(first.columns[:5], then.columns).astype(np.int16)  # five pixels in both
    rng = np.random.default_rng(9)
    scale = 10.0 ** rng.integers(-6, 3, size=(H, len(shared)))
    then = EpisodeGradient(
        shared, np.asfortranarray((rng.standard_normal((H, len(shared))) * scale).astype(np.float32)), then.W2
    )
    for a, b in ((first, then), (then, first)):
        got, dense_a, dense_b = added(a, b), a.dense(), b.dense()
        assert list(got.columns) == sorted(set(a.columns) | set(b.columns))
        assert np.array_equal(got.dense().W1, dense_a.W1 + dense_b.W1)
        assert np.array_equal(got.W2, dense_a.W2 + dense_b.W2)
    broken = EpisodeGradient(np.zeros(0, np.int16), np.zeros((H, 0), np.float32), np.full(H, np.nan, np.float32))
    assert np.isnan(added(first, broken).W2).all()
