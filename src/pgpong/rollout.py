"""Play one episode with given weights and return its gradient: no Ray, no files."""

from __future__ import annotations

from dataclasses import dataclass, field
from time import perf_counter
from typing import NamedTuple

import numpy as np

from pgpong.envs import DOWN, UP
from pgpong.policy import EpisodeGradient, Params, backward, forward, inputs_matrix
from pgpong.returns import discounted_returns, standardise


class EpisodeId(NamedTuple):
    """Episode `episode` of batch `batch` of the run seeded `seed`."""

    seed: int
    batch: int
    episode: int


def episode_seeds(episode: EpisodeId) -> tuple[int, np.random.Generator]:
    """The environment's reset seed and the action-sampling generator of an episode."""
    for_env, for_actions = np.random.SeedSequence(list(episode)).spawn(2)
    return int(for_env.generate_state(1)[0]), np.random.default_rng(for_actions)


@dataclass
class MatchResult:
    """One match played to judge a policy: no gradient."""

    episode: EpisodeId
    score: float
    points_for: int
    points_against: int
    steps: int
    seconds: float


@dataclass
class EpisodeResult:
    episode: EpisodeId
    grad: EpisodeGradient
    score: float
    steps: int
    seconds: float
    timings: dict[str, float] = field(default_factory=dict)  # seconds spent per phase
    record_bytes: int = 0  # memory the episode's record used


class EpisodeRecord:
    """What an episode keeps per step, in growable arrays: about 3 bytes per
    non-zero input pixel plus 9 bytes, instead of 6400 floats."""

    def __init__(self, capacity: int = 1024):
        self.steps = 0
        self.nnz = 0
        self.indices = np.empty(capacity * 32, dtype=np.int16)
        self.values = np.empty(capacity * 32, dtype=np.int8)
        self.indptr = np.zeros(capacity + 1, dtype=np.int32)
        self.dlogits = np.empty(capacity, dtype=np.float32)
        self.rewards = np.empty(capacity, dtype=np.int8)

    def add(self, indices: np.ndarray, values: np.ndarray, dlogit: float) -> None:
        t, start, end = self.steps, self.nnz, self.nnz + len(indices)
        if t + 1 >= len(self.dlogits):
            self.indptr = _grown(self.indptr)
            self.dlogits = _grown(self.dlogits)
            self.rewards = _grown(self.rewards)
        if end > len(self.indices):
            self.indices = _grown(self.indices, end)
            self.values = _grown(self.values, end)
        self.indices[start:end] = indices
        self.values[start:end] = values
        self.indptr[t + 1] = end
        self.dlogits[t] = dlogit
        self.steps, self.nnz = t + 1, end

    def set_reward(self, reward: float) -> None:
        self.rewards[self.steps - 1] = reward

    def used_bytes(self) -> int:
        """Bytes of the filled part: the per-step cost, without spare capacity."""
        t, n = self.steps, self.nnz
        return n * (self.indices.itemsize + self.values.itemsize) + t * (
            self.indptr.itemsize + self.dlogits.itemsize + self.rewards.itemsize
        )


def play_episode(env, weights: Params, episode: EpisodeId, gamma: float) -> EpisodeResult:
    """Play one match with the policy `weights` and return its policy gradient."""
    began = perf_counter()
    env_seed, rng = episode_seeds(episode)
    record = EpisodeRecord()
    uniforms, drawn = rng.random(4096), 0
    stepping = fwd = 0.0
    prep_before = env.unwrapped.preprocess_seconds  # the environment makes the inputs

    t0 = perf_counter()
    (indices, values), _ = env.reset(seed=env_seed)  # the first input, with no previous frame, is all zeros
    t1 = perf_counter()
    reset = t1 - t0
    while True:
        t0 = perf_counter()
        _, p_up = forward(weights, indices, values)
        t1 = perf_counter()
        if drawn == len(uniforms):  # the same stream of draws, taken in blocks
            uniforms, drawn = rng.random(len(uniforms)), 0
        up = uniforms[drawn] < p_up
        drawn += 1
        record.add(indices, values, (1.0 if up else 0.0) - p_up)  # grad of log p(action) w.r.t. logit
        t2 = perf_counter()
        (indices, values), reward, terminated, truncated, _ = env.step(UP if up else DOWN)
        t3 = perf_counter()
        record.set_reward(reward)
        fwd += t1 - t0
        stepping += t3 - t2
        if terminated or truncated:
            break

    t0 = perf_counter()
    steps = record.steps
    rewards = record.rewards[:steps]
    advantages = standardise(discounted_returns(rewards, gamma))
    X = inputs_matrix(record.indices[: record.nnz], record.values[: record.nnz], record.indptr[: steps + 1])
    grad = backward(weights, X, record.dlogits[:steps] * advantages)
    t1 = perf_counter()
    seconds = t1 - began
    prep = env.unwrapped.preprocess_seconds - prep_before
    timings = {
        "reset": reset,
        "emulator": stepping - prep,
        "preprocess": prep,
        "forward": fwd,
        "backward": t1 - t0,
    }
    timings["bookkeeping"] = max(0.0, seconds - sum(timings.values()))
    return EpisodeResult(
        episode=episode,
        grad=grad,
        score=float(rewards.sum(dtype=np.int64)),
        steps=steps,
        seconds=seconds,
        timings=timings,
        record_bytes=record.used_bytes(),
    )


def play_match(env, weights: Params, episode: EpisodeId, greedy: bool = False, observer=None) -> MatchResult:
    """Play one match against the built-in player, as play_episode would (the same
    seeds and draws, so the same score) but keeping nothing for a gradient.

    greedy=True takes the likelier action instead of sampling. `observer`, if given,
    is called after every decision with (env, indices, values, p_up, up): what the
    network was shown, what it made of it and what it did (the recorder draws it).
    """
    began = perf_counter()
    env_seed, rng = episode_seeds(episode)
    uniforms, drawn = rng.random(4096), 0
    (indices, values), _ = env.reset(seed=env_seed)
    steps = points_for = points_against = 0
    while True:
        _, p_up = forward(weights, indices, values)
        if drawn == len(uniforms):  # the same stream of draws as play_episode
            uniforms, drawn = rng.random(len(uniforms)), 0
        up = p_up > 0.5 if greedy else uniforms[drawn] < p_up
        drawn += 1
        if observer is not None:
            observer(env, indices, values, p_up, up)
        (indices, values), reward, terminated, truncated, _ = env.step(UP if up else DOWN)
        steps += 1
        points_for += reward > 0
        points_against += reward < 0
        if terminated or truncated:
            break
    return MatchResult(
        episode=episode,
        score=float(points_for - points_against),
        points_for=points_for,
        points_against=points_against,
        steps=steps,
        seconds=perf_counter() - began,
    )


def _grown(array: np.ndarray, at_least: int = 0) -> np.ndarray:
    bigger = np.zeros(max(2 * len(array), at_least), dtype=array.dtype)
    bigger[: len(array)] = array
    return bigger
