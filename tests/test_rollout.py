"""Real ALE episodes: shapes, score range, reuse of one environment, the original dense algorithm as reference."""

import pickle

import numpy as np
import pytest

from pgpong.envs import DOWN, UP, SeededAtari, make_env
from pgpong.frames import D
from pgpong.original import play_episode_dense
from pgpong.policy import Params, backward, forward, inputs_matrix, sparse_forward
from pgpong.returns import discounted_returns, standardise
from pgpong.rollout import (
    QUICK_LOSS_FRAMES,
    Diagnostics,
    EpisodeId,
    _diagnostics,
    entropy_gradient,
    episode_seeds,
    play_episode,
)

GAMMA = 0.99


@pytest.fixture(scope="module")
def weights():
    return Params.initial(hidden=200, seed=11)


def assert_same_episode(a, b):
    assert (a.score, a.steps) == (b.score, b.steps)
    np.testing.assert_array_equal(a.grad.columns, b.grad.columns)
    np.testing.assert_array_equal(a.grad.W1_columns, b.grad.W1_columns)
    np.testing.assert_array_equal(a.grad.W2, b.grad.W2)


def test_short_episode_gives_gradient_score_and_steps(weights):
    env = make_env("ALE/Pong-v5", max_episode_steps=400)
    result = play_episode(env, weights, EpisodeId(0, 0, 0), GAMMA)
    assert result.steps == 400  # cut by the time limit
    grad = result.grad.dense()
    assert grad.W1.shape == (200, D) and grad.W2.shape == (200,)
    assert grad.W1.dtype == np.float32
    assert result.grad.nbytes < grad.nbytes / 3  # only the touched pixels' columns travel
    assert -21 <= result.score <= 21 and result.score < 0  # a random policy loses points
    assert np.abs(grad.W1).sum() > 0 and np.isfinite(grad.W1).all()
    assert result.record_bytes / result.steps < 1024


def test_reused_environment_replays_an_episode_exactly(weights):
    episode = EpisodeId(5, 3, 1)
    fresh = play_episode(make_env("ALE/Pong-v5", 300), weights, episode, GAMMA)
    used_env = make_env("ALE/Pong-v5", 300)
    for k in range(3):  # play other episodes first
        play_episode(used_env, weights, EpisodeId(9, 0, k), GAMMA)
    again = play_episode(used_env, weights, episode, GAMMA)
    assert_same_episode(fresh, again)
    other = play_episode(used_env, weights, EpisodeId(5, 3, 2), GAMMA)
    assert not np.array_equal(other.grad.W2, fresh.grad.W2)


def reference_steps(env, weights, episode):
    """play_episode's steps played plainly: env.step()'s observations, forward() on
    each, gathered in lists. The inputs (T, D), the dlogits, rewards and logits."""
    env_seed, rng = episode_seeds(episode)
    uniforms, drawn = rng.random(4096), 0
    (indices, values), _ = env.reset(seed=env_seed)
    inputs, dlogits, rewards, logits = [], [], [], []
    while True:
        _, p_up = forward(weights, indices, values)
        logits.append(sparse_forward(weights.W1.T, weights.W2, indices, values)[1])  # forward's, as summed there
        if drawn == len(uniforms):
            uniforms, drawn = rng.random(len(uniforms)), 0
        up = uniforms[drawn] < p_up
        drawn += 1
        inputs.append((indices, values))
        dlogits.append((1.0 if up else 0.0) - p_up)
        (indices, values), reward, terminated, truncated, _ = env.step(UP if up else DOWN)
        rewards.append(reward)
        if terminated or truncated:
            break
    indptr = np.cumsum([0] + [len(i) for i, _ in inputs])
    X = inputs_matrix(np.concatenate([i for i, _ in inputs]), np.concatenate([v for _, v in inputs]), indptr)
    return X, np.array(dlogits, dtype=np.float32), np.array(rewards, dtype=np.int8), np.array(logits, np.float32)


def reference_episode(env, weights, episode, gamma, entropy_bonus=0.0):
    """play_episode as plain steps (reference_steps): what the one compiled call a step
    must reproduce."""
    X, dlogits, rewards, logits = reference_steps(env, weights, episode)
    signal = dlogits * standardise(discounted_returns(rewards, gamma))
    if entropy_bonus:
        signal += entropy_bonus * entropy_gradient(logits)
    return backward(weights, X, signal), int(rewards.sum()), len(rewards)


def test_one_compiled_call_a_step_gives_exactly_the_plain_steps_gradient(weights):
    # 2,500 steps of endless matches: the record grows past its first 1,024 steps,
    # and a new match starts inside the episode (its first input is empty again).
    episode = EpisodeId(3, 0, 0)
    result = play_episode(make_env("ALE/Pong-v5", 2500, endless=True), weights, episode, GAMMA)
    grad, score, steps = reference_episode(make_env("ALE/Pong-v5", 2500, endless=True), weights, episode, GAMMA)
    assert (result.score, result.steps) == (score, steps) == (score, 2500)
    assert score < -21  # points lost in a second match
    np.testing.assert_array_equal(result.grad.columns, grad.columns)
    np.testing.assert_array_equal(result.grad.W1_columns, grad.W1_columns)
    np.testing.assert_array_equal(result.grad.W2, grad.W2)


@pytest.mark.parametrize("env_id", ["Pong-v0", "PongNoFrameskip-v4"])
def test_other_pong_ids_work_and_replay(weights, env_id):
    env = make_env(env_id, 200)
    a = play_episode(env, weights, EpisodeId(1, 0, 0), GAMMA)
    play_episode(env, weights, EpisodeId(1, 0, 1), GAMMA)
    b = play_episode(env, weights, EpisodeId(1, 0, 0), GAMMA)
    assert a.steps == 200
    assert_same_episode(a, b)


@pytest.mark.parametrize("chunk", [None, 96])  # 500 steps: one backward chunk, or six of them
def test_sparse_float32_episode_matches_dense_float64_reference(weights, chunk, monkeypatch):
    """The reference sees RGB frames and preprocesses them; pgpong sees palette screens."""
    if chunk:
        monkeypatch.setattr("pgpong.policy.BACKWARD_STEPS", chunk)
    episode = EpisodeId(2, 1, 0)
    dW1, dW2, score, steps = play_episode_dense(
        SeededAtari("ALE/Pong-v5", 500, observation="rgb"), weights, episode, GAMMA
    )
    result = play_episode(make_env("ALE/Pong-v5", 500), weights, episode, GAMMA)
    assert (result.score, result.steps) == (score, steps)
    scale = np.abs(dW1).max()
    grad = result.grad.dense()
    np.testing.assert_allclose(grad.W1, dW1, atol=1e-4 * scale, rtol=1e-3)
    np.testing.assert_allclose(grad.W2, dW2, atol=1e-4 * np.abs(dW2).max(), rtol=1e-3)
    untouched = np.setdiff1d(np.arange(D), result.grad.columns)
    assert not dW1[:, untouched].any()  # the columns left out really are zero


def test_an_entropy_bonus_changes_the_signal_by_beta_times_the_entropys_gradient_only(weights):
    """The same play (the bonus is no part of it); the gradient is the plain steps'
    with the bonus added to the signal, to the bit, and it differs from the gradient
    without the bonus by the backward pass of beta x dH/dz alone (the pass is linear)."""
    episode, beta = EpisodeId(2, 0, 1), 0.25
    plain = play_episode(make_env("ALE/Pong-v5", 300), weights, episode, GAMMA)
    bonus = play_episode(make_env("ALE/Pong-v5", 300), weights, episode, GAMMA, entropy_bonus=beta)
    assert (plain.score, plain.steps) == (bonus.score, bonus.steps)
    assert_same_episode(plain, play_episode(make_env("ALE/Pong-v5", 300), weights, episode, GAMMA, entropy_bonus=0))
    grad, _, _ = reference_episode(make_env("ALE/Pong-v5", 300), weights, episode, GAMMA, entropy_bonus=beta)
    np.testing.assert_array_equal(bonus.grad.columns, grad.columns)
    np.testing.assert_array_equal(bonus.grad.W1_columns, grad.W1_columns)
    np.testing.assert_array_equal(bonus.grad.W2, grad.W2)
    X, _, _, logits = reference_steps(make_env("ALE/Pong-v5", 300), weights, episode)
    extra = backward(weights, X, beta * entropy_gradient(logits)).dense()
    with_bonus, without = bonus.grad.dense(), plain.grad.dense()
    for name in ("W1", "W2"):
        want = getattr(extra, name)
        np.testing.assert_allclose(
            getattr(with_bonus, name) - getattr(without, name), want, atol=1e-4 * abs(want).max()
        )
        assert np.abs(want).max() > 0


def test_an_episodes_diagnostics(weights):
    result = play_episode(make_env("ALE/Pong-v5", 400), weights, EpisodeId(0, 0, 0), GAMMA)
    d = result.diagnostics
    assert d is not None and d.steps == result.steps == 400
    assert result.stats().diagnostics is d  # what the driver receives of the match
    assert 0.6 < d.entropy / d.steps <= np.log(2)  # a new policy is close to a coin
    assert 0.3 < d.p_up / d.steps < 0.7
    assert 0 < d.repeats < d.steps
    assert d.losses >= -result.score and 0 <= d.quick_losses <= d.losses
    assert d.fired is not None and d.fired.shape == (200,) and d.fired.any()
    assert len(pickle.dumps(d)) < 150  # as the driver receives them: the fired units packed 8 to a byte (not 483 B)
    again = pickle.loads(pickle.dumps(d))
    assert (again.steps, again.entropy, again.p_up, again.repeats) == (d.steps, d.entropy, d.p_up, d.repeats)
    assert (again.losses, again.quick_losses) == (d.losses, d.quick_losses)
    assert again.fired is not None and again.fired.dtype == bool and again.fired.tolist() == d.fired.tolist()
    assert pickle.loads(pickle.dumps(Diagnostics())).fired is None
    fired = np.arange(13) % 3 == 0  # not a multiple of 8 units
    back = pickle.loads(pickle.dumps(Diagnostics(fired=fired))).fired
    assert back is not None and back.tolist() == fired.tolist()


def test_quick_losses_count_points_lost_before_the_ball_came_back():
    assert QUICK_LOSS_FRAMES == 200  # 50 steps of ALE/Pong-v5
    rewards = np.zeros(200, dtype=np.int8)
    rewards[[36, 136, 156, 180]] = [-1, -1, 1, -1]  # rallies of 37, 100, 20 (won) and 24 steps
    fired = np.array([True, False, False])
    logits = np.zeros(200, dtype=np.float32)
    d = _diagnostics(logits, rewards, repeats=7, fired=fired, frames_per_step=4.0)
    assert (d.losses, d.quick_losses, d.steps, d.repeats) == (3, 2, 200, 7)
    assert d.entropy == pytest.approx(200 * np.log(2)) and d.p_up == pytest.approx(100)
    assert _diagnostics(logits, rewards, 7, fired, frames_per_step=1.0).quick_losses == 3  # NoFrameskip: 100 frames
    total = Diagnostics()
    total.add(d)
    total.add(Diagnostics(steps=5, entropy=1.0, p_up=2.0, repeats=1, losses=1, quick_losses=1, fired=~fired))
    assert (total.steps, total.losses, total.quick_losses, total.repeats) == (205, 4, 3, 8)
    assert total.fired is not None and total.fired.all() and not fired.all()  # or-ed into a copy


@pytest.mark.slow
def test_full_match(weights):
    env = make_env("ALE/Pong-v5")
    result = play_episode(env, weights, EpisodeId(0, 0, 0), GAMMA)
    assert result.score in range(-21, 0)  # an untrained policy loses the match...
    assert result.score == -21 or result.steps > 700  # ...which ends at 21 points
    assert 500 < result.steps < 27_000
    assert result.record_bytes / result.steps < 1024
