import numpy as np
import pytest

from pgpong.returns import discounted_returns, standardise


def test_discounting_resets_at_every_point():
    rewards = np.array([0, 0, 1, 0, 0, -1, 0, 1], dtype=np.int8)
    g = 0.5
    expected = [0.25, 0.5, 1.0, 0.25 * -1, 0.5 * -1, -1.0, 0.5, 1.0]
    np.testing.assert_allclose(discounted_returns(rewards, g), expected)


def test_gamma_099_by_hand():
    rewards = np.array([0, 0, 0, -1, 0, 1], dtype=np.int8)
    expected = [-(0.99**3), -(0.99**2), -0.99, -1.0, 0.99, 1.0]
    np.testing.assert_allclose(discounted_returns(rewards, 0.99), expected)


def test_trailing_steps_without_a_point_get_zero():
    np.testing.assert_array_equal(discounted_returns(np.array([1, 0, 0]), 0.99), [1.0, 0.0, 0.0])


def test_standardise():
    r = np.array([1.0, 2.0, 3.0, 4.0])
    s = standardise(r)
    assert s.mean() == pytest.approx(0)
    assert s.std() == pytest.approx(1)
    np.testing.assert_allclose(s, (r - 2.5) / np.std(r))


def test_standardise_constant_returns_gives_zeros():
    np.testing.assert_array_equal(standardise(np.zeros(5)), np.zeros(5))
