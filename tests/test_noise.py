"""The gradient noise scale: the estimator against a known covariance, and real
per-match gradients of a small policy."""

import numpy as np

from pgpong.noise import noise_scale, per_match_gradients
from pgpong.policy import Params


def test_noise_scale_recovers_a_known_signal_and_noise():
    rng = np.random.default_rng(0)
    H, D, n = 4, 50, 4000
    mean = Params(rng.normal(size=(H, D)), rng.normal(size=H))
    sigma = 3.0  # every coordinate's noise: tr(Sigma) = sigma^2 * (H * D + H)
    grads = (Params(mean.W1 + sigma * rng.normal(size=(H, D)), mean.W2 + sigma * rng.normal(size=H)) for _ in range(n))
    found = noise_scale(grads)
    trace = sigma**2 * (H * D + H)
    g2 = float((mean.W1**2).sum() + (mean.W2**2).sum())
    assert abs(found["trace_sigma"] / trace - 1) < 0.02
    assert abs(found["g_squared"] / g2 - 1) < 0.05
    assert abs(found["b_simple_matches"] / (trace / g2) - 1) < 0.06


def test_pure_noise_has_no_finite_scale_and_real_matches_give_numbers():
    rng = np.random.default_rng(1)
    zero_mean = (Params(rng.normal(size=(2, 5)), rng.normal(size=2)) for _ in range(2000))
    found = noise_scale(zero_mean)
    assert abs(found["g_squared"]) < 0.01 * found["trace_sigma"]  # about 0: no signal to see
    weights = Params.initial(8, 0)
    pairs = list(per_match_gradients(weights, 4, 0, "ALE/Pong-v5", 400))  # long enough to score
    assert [steps for _, steps in pairs] == [400] * 4
    found = noise_scale(g for g, _ in pairs)
    assert found["matches"] == 4 and found["trace_sigma"] > 0
