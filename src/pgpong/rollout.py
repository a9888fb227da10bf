"""Play one episode with given weights and return its gradient: no Ray, no files."""

from __future__ import annotations

from dataclasses import dataclass, field
from time import perf_counter
from typing import NamedTuple

import numba
import numpy as np

from pgpong import policy
from pgpong.envs import DOWN, UP, SeededAtari
from pgpong.frames import SCREEN, D, palette_difference
from pgpong.policy import EpisodeGradient, Params, backward, forward, inputs_matrix, sigmoid, sparse_forward
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

    def stats(self) -> EpisodeStats:
        return EpisodeStats(self.episode, self.score, self.steps, self.seconds, self.timings, self.record_bytes)


@dataclass
class EpisodeStats:
    """An episode without its gradient: what the driver keeps once the gradient is
    in its chunk's sum (pool/sums.py)."""

    episode: EpisodeId
    score: float
    steps: int
    seconds: float
    timings: dict[str, float] = field(default_factory=dict)
    record_bytes: int = 0


class EpisodeRecord:
    """What an episode keeps per step, in growable arrays: about 3 bytes per
    non-zero input pixel plus 9 bytes, instead of 6400 floats.

    A step's input is written in place, at `indices[nnz:]` and `values[nnz:]`
    (`make_room()` first), then added with its entry count and dlogit."""

    def __init__(self, capacity: int = 1024):
        self.steps = 0
        self.nnz = 0
        self.indices = np.empty(capacity * 32, dtype=np.int16)
        self.values = np.empty(capacity * 32, dtype=np.int8)
        self.indptr = np.zeros(capacity + 1, dtype=np.int32)
        self.dlogits = np.empty(capacity, dtype=np.float32)
        self.rewards = np.empty(capacity, dtype=np.int8)

    def make_room(self) -> None:
        """Room for one more step whose input may have all D pixels."""
        if self.steps + 1 >= len(self.dlogits):
            self.indptr = _grown(self.indptr)
            self.dlogits = _grown(self.dlogits)
            self.rewards = _grown(self.rewards)
        if self.nnz + D > len(self.indices):
            self.indices = _grown(self.indices, self.nnz + D)
            self.values = _grown(self.values, self.nnz + D)

    def add(self, entries: int, dlogit: float) -> None:
        """The step whose input is the `entries` written at nnz, and its dlogit."""
        t, end = self.steps, self.nnz + entries
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


def play_episode(env: SeededAtari, weights: Params, episode: EpisodeId, gamma: float) -> EpisodeResult:
    """Play one match with the policy `weights` and return its policy gradient.

    After each step the environment hands its new screen and the previous one to
    _input_and_logit, which writes the network's next input straight into the
    record and returns the network's logit for it: one compiled call a step."""
    began = perf_counter()
    env_seed, rng = episode_seeds(episode)
    record = EpisodeRecord()
    uniforms, drawn = rng.random(4096), 0
    W1T, W2 = weights.W1.T, weights.W2
    observed_before = env.observe_seconds

    t0 = perf_counter()
    (indices, values), _ = env.reset(seed=env_seed)  # the first input, with no previous frame, is all zeros
    _, p_up = forward(weights, indices, values)
    entries = 0
    t1 = perf_counter()
    reset, stepping = t1 - t0, 0.0
    while True:
        if drawn == len(uniforms):  # the same stream of draws, taken in blocks
            uniforms, drawn = rng.random(len(uniforms)), 0
        up = uniforms[drawn] < p_up
        drawn += 1
        record.add(entries, (1.0 if up else 0.0) - p_up)  # grad of log p(action) w.r.t. logit
        record.make_room()
        t0 = perf_counter()
        (entries, logit), reward, terminated, truncated = env.step_with(
            UP if up else DOWN, _input_and_logit, W1T, W2, record.indices, record.values, record.nnz
        )
        stepping += perf_counter() - t0
        record.set_reward(reward)
        if terminated or truncated:
            break
        p_up = sigmoid(float(logit))

    t0 = perf_counter()
    steps = record.steps
    rewards = record.rewards[:steps]
    advantages = standardise(discounted_returns(rewards, gamma))
    X = inputs_matrix(record.indices[: record.nnz], record.values[: record.nnz], record.indptr[: steps + 1])
    grad = backward(weights, X, record.dlogits[:steps] * advantages)
    t1 = perf_counter()
    seconds = t1 - began
    observed = env.observe_seconds - observed_before
    timings = {
        "reset": reset,
        "emulator": stepping - observed,
        "input and forward": observed,
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


@numba.njit(cache=True, nogil=True)
def _input_and_logit(new, old, foreground, W1T, W2, indices, values, start):
    """The per-step work after the emulator's, in one compiled call: the network's
    input (the difference of two palette screens, frames.palette_difference)
    written into the record's arrays at `start`, and the network's logit for it
    (policy.sparse_forward). (-1, 0) when a changed pixel's colour is unknown."""
    found = palette_difference(new, old, foreground, indices[start:], values[start:])
    if found < 0:
        return found, W2.dtype.type(0)
    _, logit = sparse_forward(W1T, W2, indices[start : start + found], values[start : start + found])
    return found, logit


def compile_kernels() -> None:
    """Compile the per-step kernels (or load them from numba's cache) for writable
    weights and for read-only ones, as Ray's object store gives them, so that the
    first episode does not pay for it."""
    policy.compile_kernels()
    screens = np.zeros((2, *SCREEN), dtype=np.uint8)
    foreground = np.zeros(256, dtype=np.int8)
    record = EpisodeRecord(1)
    for tiny in policy.tiny_weights():
        _input_and_logit(screens[0], screens[1], foreground, tiny.W1.T, tiny.W2, record.indices, record.values, 0)


def _grown(array: np.ndarray, at_least: int = 0) -> np.ndarray:
    bigger = np.zeros(max(2 * len(array), at_least), dtype=array.dtype)
    bigger[: len(array)] = array
    return bigger
