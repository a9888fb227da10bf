"""RMSProp (rmsprop.py): the formula, clipping, and the bits of numpy's lines."""

import numpy as np
import pytest

from pgpong.policy import EpisodeGradient, Params
from pgpong.rmsprop import RMSProp, squared_norm


def test_rmsprop_step_matches_the_formula():
    W1 = np.array([[0.5, -1.0]], dtype=np.float64)
    W2 = np.array([2.0])
    g1 = np.array([[0.1, -0.2]])
    g2 = np.array([0.3])
    weights = Params.of(W1, W2, np.float64)
    cache = Params.of(np.array([[0.01, 0.0]]), np.array([0.04]), np.float64)
    opt = RMSProp(learning_rate=1e-2, decay_rate=0.9, cache=cache)
    opt.step(weights, Params.of(g1, g2, np.float64))

    c1 = 0.9 * np.array([[0.01, 0.0]]) + 0.1 * g1**2
    c2 = 0.9 * 0.04 + 0.1 * g2**2
    np.testing.assert_allclose(cache.W1, c1)
    np.testing.assert_allclose(cache.W2, c2)
    np.testing.assert_allclose(weights.W1, W1 + 1e-2 * g1 / (np.sqrt(c1) + 1e-5))
    np.testing.assert_allclose(weights.W2, W2 + 1e-2 * g2 / (np.sqrt(c2) + 1e-5))
    # by hand, one entry: cache 0.9*0.01 + 0.1*0.01 = 0.01; W += 0.01 * 0.1 / (0.1 + 1e-5)
    assert weights.W1[0, 0] == pytest.approx(0.5 + 0.01 * 0.1 / (0.1 + 1e-5))


@pytest.mark.parametrize("batch_size", [10, 20, 30, 60, 300])
def test_the_batch_rule_keeps_rmsprops_first_step_at_batch_10s_size(batch_size):
    """RMSProp's cache starts at zero, so its first step moves each weight by about
    lr / sqrt(1 - decay): 0.02 at batch 10. The rule keeps that for bigger batches (to
    the rounding of the rate), where sqrt(k) x lr at decay 0.99 would move it 2-5 times as
    far (the collapse measured at batch 60, docs/LEARNING.md)."""
    from pgpong.config import TrainConfig

    config = TrainConfig(batch_size=batch_size)
    rng = np.random.default_rng(batch_size)
    weights = Params.of(np.zeros((4, 6)), np.zeros(4), np.float64)
    grad = Params.of(rng.standard_normal((4, 6)), rng.standard_normal(4), np.float64)
    RMSProp(config.learning_rate, config.decay_rate, weights.zeros_like()).step(weights, grad)
    steps = np.abs(np.concatenate([weights.W1.ravel(), weights.W2]))
    assert steps == pytest.approx(0.02, rel=0.03)
    fixed_decay = RMSProp(config.learning_rate, 0.99, Params.of(np.zeros((4, 6)), np.zeros(4), np.float64))
    weights = Params.of(np.zeros((4, 6)), np.zeros(4), np.float64)
    fixed_decay.step(weights, grad)
    assert np.abs(weights.W2) == pytest.approx(0.02 * np.sqrt(batch_size / 10), rel=0.03)


def rmsprop_reference(w, g, cache, lr, decay, max_norm):
    """RMSProp's step in float64, then the update scaled to max_norm when longer."""
    cache = {n: decay * cache[n] + (1 - decay) * g[n] ** 2 for n in g}
    update = {n: lr * g[n] / (np.sqrt(cache[n]) + 1e-5) for n in g}
    norm = np.sqrt(sum((u**2).sum() for u in update.values()))
    scale = min(1.0, max_norm / norm) if max_norm is not None else 1.0
    return {n: w[n] + scale * update[n] for n in g}, cache, norm * scale, scale


@pytest.mark.parametrize("max_norm", [None, 1e6, 0.005])  # no clipping, a bound never reached, a binding one
def test_rmsprop_update_clipping_against_a_float64_reference(max_norm):
    rng = np.random.default_rng(2)
    weights = Params.of(rng.standard_normal((6, 40)) * 0.1, rng.standard_normal(6) * 0.1)
    cache = Params.of(rng.random((6, 40)) * 1e-3, rng.random(6) * 1e-3)
    grad = Params.of(rng.standard_normal((6, 40)) * 0.01, rng.standard_normal(6) * 0.01)
    w0 = {n: getattr(weights, n).astype(np.float64) for n in ("W1", "W2")}
    c0 = {n: getattr(cache, n).astype(np.float64) for n in ("W1", "W2")}
    g = {n: getattr(grad, n).astype(np.float64) for n in ("W1", "W2")}
    optimizer = RMSProp(0.002, 0.9, cache, max_update_norm=max_norm)
    optimizer.step(weights, grad)
    want_w, want_cache, want_norm, want_scale = rmsprop_reference(w0, g, c0, 0.002, 0.9, max_norm)
    for n in ("W1", "W2"):
        np.testing.assert_allclose(getattr(weights, n), want_w[n], rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(getattr(cache, n), want_cache[n], rtol=1e-6, atol=1e-12)  # clipping leaves it
    assert optimizer.last_update_norm == pytest.approx(want_norm, rel=1e-5)
    assert optimizer.last_clip == pytest.approx(want_scale, rel=1e-6)
    if max_norm == 0.005:
        assert want_scale < 0.5 and optimizer.last_update_norm == pytest.approx(0.005, rel=1e-5)


def test_rmsprop_without_clipping_is_todays_step_to_the_bit():
    rng = np.random.default_rng(4)
    weights = Params.of(rng.standard_normal((6, 40)), rng.standard_normal(6))
    grad = Params.of(rng.standard_normal((6, 40)), rng.standard_normal(6))
    before = Params.of(weights.W1, weights.W2)
    RMSProp(0.002, 0.99, weights.zeros_like()).step(weights, grad)
    for n in ("W1", "W2"):
        w, g = getattr(before, n), getattr(grad, n)
        c = np.float32(0.99) * np.zeros_like(g) + np.float32(1 - 0.99) * (g * g)  # as 2016's numpy line
        step = np.float32(0.002) * (g / (np.sqrt(c) + np.float32(1e-5)))
        assert getattr(weights, n).tobytes() == (w + step).tobytes()


def numpy_step(weights, grad, cache, lr, decay, max_norm):
    """RMSProp as plain numpy lines (the code before its numba passes): each float32
    operation in order, the norm as numpy sums it, the clip, the add. The clip, and
    the update's norm before it."""
    updates = []
    for n in ("W1", "W2"):
        g, c = getattr(grad, n), getattr(cache, n)
        scratch = np.multiply(g, g)
        scratch *= 1 - decay
        c *= decay
        c += scratch
        update = g / (np.sqrt(c) + g.dtype.type(RMSProp.eps))
        update *= lr
        updates.append(update)
    norm = np.sqrt(sum(float(np.square(u, dtype=np.float64).sum()) for u in updates))
    clip = max_norm / norm if max_norm and norm > max_norm else 1.0
    for n, update in zip(("W1", "W2"), updates, strict=True):
        update *= update.dtype.type(clip)
        getattr(weights, n).__iadd__(update)
    return clip, norm


@pytest.mark.parametrize("max_norm", [None, 4.0, 1e-3])
def test_rmsprop_step_has_the_bits_of_numpys_lines(max_norm):
    rng = np.random.default_rng(11)
    for trial in range(3):
        shape = [(200, 6400), (7, 13), (3, 1)][trial]
        weights = Params.of(rng.standard_normal(shape) * 0.1, rng.standard_normal(shape[0]))
        cache = Params.of(rng.random(shape) * 1e-3, rng.random(shape[0]) * 1e-3)
        grad = Params.of(rng.standard_normal(shape) * 10.0 ** rng.integers(-4, 2), rng.standard_normal(shape[0]))
        grad.W1[:, ::3] = 0  # untouched pixels
        cache.W1[0, 0] = 0  # a zero cache entry: the update divides by eps
        want_w, want_c = Params.of(weights.W1, weights.W2), Params.of(cache.W1, cache.W2)
        clip, _ = numpy_step(want_w, grad, want_c, 0.011, 0.7, max_norm)
        optimizer = RMSProp(0.011, 0.7, cache, max_norm)
        optimizer.step(weights, grad)
        for got, want in [(weights, want_w), (cache, want_c)]:
            assert got.W1.tobytes() == want.W1.tobytes() and got.W2.tobytes() == want.W2.tobytes()
            assert got.W1.flags.f_contiguous
        assert optimizer.last_clip == clip
        assert optimizer.weight_squares == (squared_norm(want_w.W1), squared_norm(want_w.W2))
        assert optimizer.weights_finite and optimizer.cache_finite
    assert max_norm != 1e-3 or optimizer.last_clip < 1  # (the tight bound clips)


def test_rmsprop_says_when_the_weights_or_the_cache_stop_being_finite():
    weights, cache, grad = (Params.of(np.ones((4, 8)), np.ones(4)) for _ in range(3))
    optimizer = RMSProp(0.1, 0.9, cache)
    grad.W1[1, 2] = np.nan
    optimizer.step(weights, grad)
    assert not optimizer.weights_finite and not optimizer.cache_finite
    weights, cache, grad = (Params.of(np.ones((4, 8)), np.ones(4)) for _ in range(3))
    grad.W2[3] = 3e19  # its square overflows float32: the cache becomes infinite, the update 0
    optimizer = RMSProp(0.1, 0.9, cache)
    optimizer.step(weights, grad)
    assert not optimizer.cache_finite and optimizer.weights_finite and np.isinf(cache.W2[3])
    with pytest.raises(ValueError, match="of one shape"):
        optimizer.step(weights, Params(grad.W1[:, :7], grad.W2))
    before = Params.of(weights.W1, weights.W2), Params.of(cache.W1, cache.W2)
    with pytest.raises(ValueError, match="of one shape"):
        optimizer.step(weights, Params(grad.W1, grad.W2[:3]))  # W2's does not fit: nothing moves, W1 neither
    for got, want in zip((weights, cache), before, strict=True):
        assert got.W1.tobytes() == want.W1.tobytes() and got.W2.tobytes() == want.W2.tobytes()
    cache.W1[0, 0] = -np.inf  # (only a broken checkpoint could hold one)
    optimizer.step(Params.of(np.ones((4, 8)), np.ones(4)), Params.of(np.ones((4, 8)), np.ones(4)))
    assert not optimizer.cache_finite


def test_rmsprop_takes_one_unit_arrays_whatever_their_strides():
    """With one hidden unit a (1, D) array is C- and Fortran-contiguous at once, and
    numpy may give a sum C strides (BatchResult.plus, --lag-share)."""
    rng = np.random.default_rng(13)
    weights = Params.of(rng.standard_normal((1, 50)), np.array([0.5]))
    want = Params.of(weights.W1, weights.W2)
    grad = Params.of(rng.standard_normal((1, 50)), np.array([0.1]))
    c_strided = Params(np.empty((1, 50), dtype=np.float32, order="C"), grad.W2)
    c_strided.W1[:] = grad.W1
    assert c_strided.W1.strides == (200, 4) and weights.W1.strides == (4, 4)
    RMSProp(0.01, 0.9, weights.zeros_like()).step(weights, c_strided)
    RMSProp(0.01, 0.9, want.zeros_like()).step(want, grad)
    assert weights.W1.tobytes() == want.W1.tobytes()


def test_squared_norm_is_numpys_pairwise_sum_to_the_bit():
    rng = np.random.default_rng(12)
    sizes = [*range(0, 140), 255, 256, 257, 1000, 8191, 8192, 8193, 100_003, 200 * 6400]
    for n in sizes:
        a = (rng.standard_normal(n) * 10.0 ** rng.integers(-20, 20)).astype(np.float32)
        assert squared_norm(a) == float(np.square(a, dtype=np.float64).sum()), n
    w = np.asfortranarray(rng.standard_normal((200, 6400)).astype(np.float32))
    assert squared_norm(w) == float(np.square(w.ravel(order="K"), dtype=np.float64).sum())
    assert squared_norm(w[:, ::2]) == float(np.square(w[:, ::2].ravel(order="K"), dtype=np.float64).sum())


@pytest.mark.parametrize("max_norm", [None, 1e-3])
def test_rmsprop_on_a_gradients_touched_columns_has_the_bits_of_its_dense_step(max_norm):
    """A cluster's reducer steps on the batch's touched columns of W1 (EpisodeGradient),
    the trainer on the dense gradient: the other columns' gradient is zero, and the
    weights, cache and norms must come out the same to the bit. In two calls, apply()
    moves the weights (the reducer publishes them) before measure() sums the norms."""
    rng = np.random.default_rng(17)
    for columns in ([0, 3, 4, 90, 99], [], list(range(100))):
        weights = Params.of(rng.standard_normal((6, 100)) * 0.1, rng.standard_normal(6))
        cache = Params.of(rng.random((6, 100)) * 1e-3, rng.random(6) * 1e-3)
        cache.W1[:, 1] = 0  # an untouched column with nothing cached: its update is 0 / eps
        sparse = EpisodeGradient(
            np.array(columns, dtype=np.int16),
            np.asarray(rng.standard_normal((6, len(columns))), dtype=np.float32, order="C"),
            rng.standard_normal(6).astype(np.float32),
        )
        dense_w, dense_c = Params.of(weights.W1, weights.W2), Params.of(cache.W1, cache.W2)
        by_dense = RMSProp(0.011, 0.7, dense_c, max_norm)
        by_dense.step(dense_w, sparse.dense(100))
        by_columns = RMSProp(0.011, 0.7, cache, max_norm)
        before = weights.W1.copy()
        by_columns.apply(weights, sparse)
        assert weights.W1.tobytes() == dense_w.W1.tobytes()
        assert np.array_equal(before, weights.W1) == (not columns)  # (moved by apply(), where touched)
        assert by_columns.weight_squares == (0.0, 0.0)  # (not yet summed)
        by_columns.measure(weights)
        for got, want in [(weights, dense_w), (cache, dense_c)]:
            assert got.W1.tobytes() == want.W1.tobytes() and got.W2.tobytes() == want.W2.tobytes()
        for name in ("last_update_norm", "last_clip", "weight_squares", "weights_finite", "cache_finite"):
            assert getattr(by_columns, name) == getattr(by_dense, name), name
    assert max_norm is None or by_dense.last_clip < 1  # (the bound clips)
    for bad in ([3, 3], [5, 2], [-1, 2], [2, 100]):
        grad = EpisodeGradient(np.array(bad), np.zeros((6, 2), np.float32), np.zeros(6, np.float32))
        with pytest.raises(ValueError, match="sorted pixels of 100, each once"):
            RMSProp(0.01, 0.9, cache).step(weights, grad)


@pytest.mark.parametrize("max_norm", [None, 1e6, 4.0, 1e-3])  # no clip, one never reached, the default, a binding one
@pytest.mark.parametrize("shape", [(200, 6400), (7, 300), (1, 50), (3, 1000)])
def test_a_step_on_some_columns_has_the_bits_and_norms_of_numpys_lines(shape, max_norm):
    """A step on the columns a gradient gives (a cluster's reducer steps so) must have
    the weights, the cache, the clip and the update's norm of the numpy lines on the
    dense gradient, to the bit, at the network's size too and for any spread of
    columns (runs, strays, the first and the last, pairwise blocks of the norm that
    straddle columns). A weight of -0 in a column not given becomes +0, as numpy's add
    makes it."""
    rng = np.random.default_rng(shape[1])
    H, D = shape
    for density in (0.02, 0.3, 0.9):
        columns = np.flatnonzero(rng.random(D) < density)
        columns = np.union1d(columns, [0, D - 1] if density > 0.5 else []).astype(np.int16)
        weights = Params.of(rng.standard_normal(shape) * 0.1, rng.standard_normal(H) * 0.1)
        cache = Params.of(rng.random(shape) * 1e-4, rng.random(H) * 1e-4)
        untouched = np.setdiff1d(np.arange(D), columns)
        if len(untouched):
            weights.W1[0, untouched[0]] = -0.0
        grad = EpisodeGradient(
            columns, *(np.float32(1e-2) * rng.standard_normal(s, np.float32) for s in ((H, len(columns)), H))
        )
        want_w, want_c = Params.of(weights.W1, weights.W2), Params.of(cache.W1, cache.W2)
        clip, norm = numpy_step(want_w, grad.dense(D), want_c, 0.002, 0.99, max_norm)
        optimizer = RMSProp(0.002, 0.99, cache, max_norm)
        optimizer.step(weights, grad)
        for got, want in [(weights, want_w), (cache, want_c)]:
            assert got.W1.tobytes() == want.W1.tobytes() and got.W2.tobytes() == want.W2.tobytes()
        assert optimizer.last_clip == clip
        assert optimizer.last_update_norm == norm * clip
        if len(untouched):
            assert np.signbit(weights.W1[0, untouched[0]]) == np.signbit(want_w.W1[0, untouched[0]])
    assert max_norm != 1e-3 or clip < 1


@pytest.mark.parametrize("max_norm", [None, 1e-3])
def test_a_broken_cache_in_a_column_not_given_makes_the_norm_nan_as_numpys_lines_do(max_norm):
    rng = np.random.default_rng(21)
    weights = Params.of(rng.standard_normal((5, 40)), rng.standard_normal(5))
    cache = Params.of(rng.random((5, 40)), rng.random(5))
    cache.W1[2, 7] = np.nan  # column 7 is not given
    cache.W1[3, 9] = -1.0  # nor 9: sqrt of a negative cache is NaN
    grad = EpisodeGradient(np.array([1, 2, 30], np.int16), *(rng.standard_normal(s, np.float32) for s in ((5, 3), 5)))
    want_w, want_c = Params.of(weights.W1, weights.W2), Params.of(cache.W1, cache.W2)
    with np.errstate(invalid="ignore"):
        clip, norm = numpy_step(want_w, grad.dense(40), want_c, 0.01, 0.9, max_norm)
    optimizer = RMSProp(0.01, 0.9, cache, max_norm)
    optimizer.step(weights, grad)
    assert np.isnan(norm) and np.isnan(optimizer.last_update_norm) and optimizer.last_clip == clip == 1.0
    assert not optimizer.weights_finite and not optimizer.cache_finite
    assert np.array_equal(weights.W1, want_w.W1, equal_nan=True) and np.array_equal(cache.W1, want_c.W1, equal_nan=True)
