import numpy as np
import pytest
import scipy.sparse as sp

from pgpong.frames import D
from pgpong.original import forward_dense
from pgpong.policy import Params, backward, forward, inputs_matrix


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
    assert_gradient_of(lambda w: objective(w, X, up, adv), weights, grad)
    assert np.abs(grad.W1).sum() > 0


def assert_gradient_of(f, weights, grad, eps=1e-6):
    """`grad` is the gradient of f at `weights`, by central finite differences (float64)."""
    for name in ("W1", "W2"):
        w = getattr(weights, name)
        numeric = np.zeros_like(w)
        for i in np.ndindex(w.shape):
            old = w[i]
            w[i] = old + eps
            plus = f(weights)
            w[i] = old - eps
            minus = f(weights)
            w[i] = old
            numeric[i] = (plus - minus) / (2 * eps)
        np.testing.assert_allclose(getattr(grad, name), numeric, rtol=1e-5, atol=1e-8)


def test_backward_keeps_exactly_the_touched_pixels_in_order():
    rng = np.random.default_rng(1)
    weights, X, _, adv = small_episode(rng, steps=40, inputs=30)
    grad = backward(weights, X, adv)
    np.testing.assert_array_equal(grad.columns, np.unique(X.indices))
    dense = grad.dense(inputs=30)
    untouched = np.setdiff1d(np.arange(30), X.indices)
    assert len(untouched) > 0 and not dense.W1[:, untouched].any()


def scipy_backward(weights, X, dlogits):
    """The backward pass as plain scipy.sparse and numpy products, chunk by chunk (W2's
    gradient step by step, as the compiled pass adds it on every CPU)."""
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
        for h, g_t in zip(hs, g, strict=True):  # each unit's terms step by step, not BLAS's order
            dW2 += h * g_t
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


def test_entropy_gradient_matches_finite_differences():
    from pgpong.rollout import entropies, entropy_gradient

    z = np.array([-40.0, -8.0, -2.4, -0.3, 0.0, 1e-3, 0.7, 2.4, 9.0, 40.0])
    eps = 1e-6
    numeric = (entropies(z + eps) - entropies(z - eps)) / (2 * eps)
    np.testing.assert_allclose(entropy_gradient(z), numeric, rtol=1e-6, atol=1e-12)
    p = 1 / (1 + np.exp(-z))
    with np.errstate(divide="ignore", invalid="ignore"):
        direct = np.nan_to_num(-p * np.log(p) - (1 - p) * np.log(1 - p))
    np.testing.assert_allclose(entropies(z), direct, rtol=1e-9, atol=1e-15)
    assert entropies(np.zeros(1))[0] == pytest.approx(np.log(2))


def test_an_entropy_bonus_adds_beta_times_the_entropys_gradient(monkeypatch):
    """The signal play_episode hands backward with --entropy-bonus BETA,
    A_t (y_t - p_t) + BETA dH/dz_t, gives the gradient of
    sum_t A_t log pi(a_t | x_t) + BETA sum_t H(pi(. | x_t)): checked against finite
    differences through the whole network (in chunks of 4 steps)."""
    from pgpong.rollout import entropies, entropy_gradient

    monkeypatch.setattr("pgpong.policy.BACKWARD_STEPS", 4)
    rng = np.random.default_rng(3)
    weights, X, up, adv = small_episode(rng)
    beta = 0.3

    def logits_of(w):
        return np.array([w.W2 @ np.maximum(w.W1 @ x, 0) for x in X.toarray()])

    def bonus_objective(w):
        return objective(w, X, up, adv) + beta * entropies(logits_of(w)).sum()

    z = logits_of(weights)
    ps = 1 / (1 + np.exp(-z))
    signal = adv * (up.astype(float) - ps) + beta * entropy_gradient(z)
    grad = backward(weights, X, signal).dense(inputs=12)
    assert_gradient_of(bonus_objective, weights, grad)
    without = backward(weights, X, adv * (up.astype(float) - ps)).dense(inputs=12)
    assert not np.allclose(without.W2, grad.W2)  # the bonus changed something


def test_backward_says_which_hidden_units_fired_without_changing_the_gradient(monkeypatch):
    monkeypatch.setattr("pgpong.policy.BACKWARD_STEPS", 16)  # 60 steps: four chunks
    rng = np.random.default_rng(5)
    weights64, X, _, adv = small_episode(rng, steps=60, inputs=50, hidden=24)
    weights = Params.of(weights64.W1, weights64.W2)
    weights.W1[:3] = 0  # three units that never fire
    fired = np.zeros(24, dtype=bool)
    grad = backward(weights, X, adv, fired=fired)
    plain = backward(weights, X, adv)
    np.testing.assert_array_equal(grad.W1_columns, plain.W1_columns)
    np.testing.assert_array_equal(grad.W2, plain.W2)
    hs = np.maximum(X.toarray().astype(np.float32) @ weights.W1.T, 0)
    np.testing.assert_array_equal(fired, (hs > 0).any(axis=0))
    assert not fired[:3].any() and fired[3:].any()


def test_w2_init_scale_scales_w2_and_nothing_else():
    plain, small = Params.initial(200, 0), Params.initial(200, 0, w2_scale=0.1)
    assert plain.W1.tobytes() == small.W1.tobytes()
    np.testing.assert_allclose(small.W2, plain.W2 * 0.1, rtol=1e-6)
    assert Params.initial(200, 0, w2_scale=1.0).W2.tobytes() == plain.W2.tobytes()  # 1: today's bits
