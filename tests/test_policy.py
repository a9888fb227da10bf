import numpy as np
import pytest
import scipy.sparse as sp

from pgpong.frames import D
from pgpong.original import forward_dense
from pgpong.policy import Params, RMSProp, backward, forward, inputs_matrix


def small_episode(rng, steps=9, inputs=12, hidden=5):
    weights = Params.of(rng.standard_normal((hidden, inputs)), rng.standard_normal(hidden), np.float64)
    indices, values, indptr = [], [], [0]
    for _ in range(steps):
        idx = np.sort(rng.choice(inputs, size=rng.integers(1, 5), replace=False)).astype(np.int16)
        indices.append(idx)
        values.append(rng.choice([-1, 1], size=len(idx)).astype(np.int8))
        indptr.append(indptr[-1] + len(idx))
    X = inputs_matrix(np.concatenate(indices), np.concatenate(values), np.array(indptr), inputs)
    actions_up = rng.random(steps) < 0.5
    advantages = rng.standard_normal(steps)
    return weights, X, actions_up, advantages


def objective(weights, X, actions_up, advantages):
    """sum_t A_t log pi(a_t | x_t): the quantity whose gradient REINFORCE follows."""
    total = 0.0
    for t, x in enumerate(X.toarray()):
        _, p = forward_dense(weights, x)
        total += advantages[t] * np.log(p if actions_up[t] else 1 - p)
    return total


@pytest.mark.parametrize("chunk", [None, 4])  # 9 steps: one chunk, or chunks of 4, 4 and 1
def test_backward_matches_finite_differences(chunk, monkeypatch):
    if chunk:
        monkeypatch.setattr("pgpong.policy.BACKWARD_STEPS", chunk)
    rng = np.random.default_rng(0)
    weights, X, up, adv = small_episode(rng)
    ps = np.array([forward_dense(weights, x)[1] for x in X.toarray()])
    grad = backward(weights, X, adv * (up.astype(float) - ps)).dense(inputs=12)

    eps = 1e-6
    for name in ("W1", "W2"):
        w = getattr(weights, name)
        numeric = np.zeros_like(w)
        for i in np.ndindex(w.shape):
            old = w[i]
            w[i] = old + eps
            plus = objective(weights, X, up, adv)
            w[i] = old - eps
            minus = objective(weights, X, up, adv)
            w[i] = old
            numeric[i] = (plus - minus) / (2 * eps)
        np.testing.assert_allclose(getattr(grad, name), numeric, rtol=1e-5, atol=1e-8)
    assert np.abs(grad.W1).sum() > 0


def test_backward_keeps_exactly_the_touched_pixels_in_order():
    rng = np.random.default_rng(1)
    weights, X, _, adv = small_episode(rng, steps=40, inputs=30)
    grad = backward(weights, X, adv)
    np.testing.assert_array_equal(grad.columns, np.unique(X.indices))
    dense = grad.dense(inputs=30)
    untouched = np.setdiff1d(np.arange(30), X.indices)
    assert len(untouched) > 0 and not dense.W1[:, untouched].any()


def scipy_backward(weights, X, dlogits):
    """The backward pass as plain scipy.sparse and numpy products, chunk by chunk."""
    import pgpong.policy

    g_all = dlogits.astype(weights.W1.dtype)
    columns, compact = np.unique(X.indices, return_inverse=True)
    Xc = sp.csr_matrix((X.data, compact.astype(X.indices.dtype), X.indptr), shape=(X.shape[0], len(columns)))
    W1c = weights.W1.T.take(columns, axis=0)
    dW1c, dW2 = np.zeros_like(W1c), np.zeros_like(weights.W2)
    chunk = pgpong.policy.BACKWARD_STEPS
    for start in range(0, X.shape[0], chunk):
        x, g = Xc[start : start + chunk], g_all[start : start + chunk]
        hs = np.maximum(np.asarray(x @ W1c), 0)
        dW2 += hs.T @ g
        dh = np.multiply.outer(g, weights.W2)
        dh[hs <= 0] = 0
        dW1c += x.T @ dh
    return columns, dW1c.T, dW2


@pytest.mark.parametrize("chunk", [None, 16])  # 60 steps: one chunk, or four
def test_compiled_backward_equals_scipy_products_bit_for_bit(chunk, monkeypatch):
    if chunk:
        monkeypatch.setattr("pgpong.policy.BACKWARD_STEPS", chunk)
    rng = np.random.default_rng(5)
    weights64, X, _, adv = small_episode(rng, steps=60, inputs=50, hidden=24)
    weights = Params.of(weights64.W1, weights64.W2)  # float32, as trained
    grad = backward(weights, X, adv)
    columns, W1_columns, W2 = scipy_backward(weights, X, adv)
    np.testing.assert_array_equal(grad.columns, columns)
    assert grad.W1_columns.dtype == np.float32
    np.testing.assert_array_equal(grad.W1_columns, W1_columns)
    np.testing.assert_array_equal(grad.W2, W2)


def test_compiled_kernels_are_ready_for_read_only_weights():
    from pgpong.policy import _input_gradient, compile_kernels, sparse_forward

    compile_kernels()
    # Ray hands workers read-only weights: no compile mid-episode
    assert {sig[0].mutable for sig in sparse_forward.signatures} == {True, False}
    assert {sig[5].mutable for sig in _input_gradient.signatures} >= {True, False}


def test_sparse_forward_equals_dense():
    rng = np.random.default_rng(1)
    weights = Params.initial(hidden=200, seed=4)
    for _ in range(10):
        idx = np.sort(rng.choice(D, size=30, replace=False)).astype(np.int16)
        vals = rng.choice([-1, 1], size=30).astype(np.int8)
        x = np.zeros(D, dtype=np.float32)
        x[idx] = vals
        h_sparse, p_sparse = forward(weights, idx, vals)
        h_dense, p_dense = forward_dense(weights, x)
        np.testing.assert_allclose(h_sparse, h_dense, rtol=1e-5, atol=1e-6)
        assert p_sparse == pytest.approx(p_dense, rel=1e-5)


def test_empty_input_gives_one_half():
    weights = Params.initial(hidden=8, seed=0)
    h, p = forward(weights, np.array([], dtype=np.int16), np.array([], dtype=np.int8))
    assert p == 0.5 and not h.any()


def test_initialisation_scale_and_layout():
    w = Params.initial(hidden=200, seed=0)
    assert w.W1.shape == (200, D) and w.W2.shape == (200,)
    assert w.W1.dtype == np.float32 and w.W1.flags.f_contiguous
    assert w.W1.std() == pytest.approx(1 / np.sqrt(D), rel=0.02)
    assert w.W2.std() == pytest.approx(1 / np.sqrt(200), rel=0.15)
    np.testing.assert_array_equal(Params.initial(200, 0).W1, w.W1)
    assert not np.array_equal(Params.initial(200, 1).W1, w.W1)


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
