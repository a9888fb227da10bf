"""The original algorithm as the 2016 code and the Ray example compute it: every input
a dense float64 vector of 6400 values, a full 200x6400 product per step, and every
input and hidden vector kept until the episode ends.

pgpong does not train with it. The tests check pgpong's sparse float32 inputs,
forward pass and gradients against it, and `pgpong bench` times it to show what the
faster path gains.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from pgpong.envs import DOWN, UP
from pgpong.frames import D, preprocess
from pgpong.policy import Params
from pgpong.returns import discounted_returns, standardise
from pgpong.rollout import EpisodeId, episode_seeds


class DenseEpisode(NamedTuple):
    W1: np.ndarray  # (H, D) float64 gradient
    W2: np.ndarray  # (H,)
    score: float
    steps: int


def play_episode_dense(env, weights: Params, episode: EpisodeId, gamma: float) -> DenseEpisode:
    """Play one episode on an environment that observes RGB frames; the same seeds,
    actions and returns as rollout.play_episode, in dense float64."""
    W1, W2 = weights.W1.astype(np.float64), weights.W2.astype(np.float64)
    env_seed, rng = episode_seeds(episode)
    uniforms = rng.random(4096)
    frame, _ = env.reset(seed=env_seed)
    previous = None
    xs: list[np.ndarray] = []
    hs: list[np.ndarray] = []
    dlogps: list[float] = []
    rewards: list[float] = []
    while True:
        current = preprocess(frame).astype(np.float64)
        x = current - previous if previous is not None else np.zeros(D)
        previous = current
        h = np.maximum(W1 @ x, 0)
        p = 1.0 / (1.0 + np.exp(-(W2 @ h)))
        t = len(xs)
        if t and t % len(uniforms) == 0:  # the same stream of draws as play_episode
            uniforms = rng.random(len(uniforms))
        up = uniforms[t % len(uniforms)] < p
        xs.append(x)
        hs.append(h)
        dlogps.append(float(up) - float(p))
        frame, reward, terminated, truncated, _ = env.step(UP if up else DOWN)
        rewards.append(reward)
        if terminated or truncated:
            break
    advantages = standardise(discounted_returns(np.array(rewards), gamma))
    eph, epx, epdlogp = np.vstack(hs), np.vstack(xs), np.array(dlogps) * advantages
    dW2 = eph.T @ epdlogp
    dh = np.outer(epdlogp, W2)
    dh[eph <= 0] = 0
    dW1 = dh.T @ epx
    return DenseEpisode(dW1, dW2, float(sum(rewards)), len(rewards))


def forward_dense(weights: Params, x: np.ndarray) -> tuple[np.ndarray, float]:
    """The forward pass with a dense input: the reference policy.forward must match."""
    h = np.maximum(weights.W1 @ x, 0)
    return h, float(1.0 / (1.0 + np.exp(-float(h @ weights.W2))))


def dense_difference(current: np.ndarray, previous: np.ndarray) -> np.ndarray:
    """The plain float form of the input difference (frames.sparse_difference's reference)."""
    return current.astype(np.float32) - previous.astype(np.float32)


def to_dense(indices: np.ndarray, values: np.ndarray, size: int = D) -> np.ndarray:
    """A sparse input (indices, values) as a dense vector."""
    dense = np.zeros(size, dtype=np.float32)
    dense[indices] = values
    return dense
