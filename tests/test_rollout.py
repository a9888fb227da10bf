"""Real ALE episodes: shapes, score range, reuse of one environment, the original dense algorithm as reference."""

import numpy as np
import pytest

from pgpong.envs import DOWN, UP, SeededAtari, make_env
from pgpong.frames import D
from pgpong.original import play_episode_dense
from pgpong.policy import Params, backward, forward, inputs_matrix
from pgpong.returns import discounted_returns, standardise
from pgpong.rollout import EpisodeId, episode_seeds, play_episode

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


def reference_episode(env, weights, episode, gamma):
    """play_episode as plain steps: env.step()'s observations, forward() on each, the
    inputs gathered in lists; what the one compiled call a step must reproduce."""
    env_seed, rng = episode_seeds(episode)
    uniforms, drawn = rng.random(4096), 0
    (indices, values), _ = env.reset(seed=env_seed)
    inputs, dlogits, rewards = [], [], []
    while True:
        _, p_up = forward(weights, indices, values)
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
    advantages = standardise(discounted_returns(np.array(rewards, dtype=np.int8), gamma))
    return backward(weights, X, np.array(dlogits, dtype=np.float32) * advantages), sum(rewards), len(rewards)


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


@pytest.mark.slow
def test_full_match(weights):
    env = make_env("ALE/Pong-v5")
    result = play_episode(env, weights, EpisodeId(0, 0, 0), GAMMA)
    assert result.score in range(-21, 0)  # an untrained policy loses the match...
    assert result.score == -21 or result.steps > 700  # ...which ends at 21 points
    assert 500 < result.steps < 27_000
    assert result.record_bytes / result.steps < 1024
