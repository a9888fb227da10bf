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

    @property
    def finished(self) -> bool:
        """Played to its end (a side reached 21), not cut by a limit on its steps."""
        return max(self.points_for, self.points_against) >= MATCH_POINTS


MATCH_POINTS = 21  # a match of Pong ends when a side has this many

# A point lost this soon after the one before (or the serve that starts the match) was
# lost without the ball ever being returned: in ALE/Pong-v5 (4 frames a step) such
# rallies take 35-39 agent steps, and a rally with one return takes 60 or more
# (measured: 69 of 84 points lost by a new policy took 35-39 steps, none took 40-59).
QUICK_LOSS_FRAMES = 200  # emulator frames: 50 agent steps at 4 frames per step


@dataclass
class Diagnostics:
    """What an episode says about the policy that played it, beside its score: sums
    over its steps, read off what playing and the backward pass compute anyway and
    never used to learn. A batch's are its episodes' added in episode order (add), so
    they are the same whoever played which match."""

    steps: int = 0
    entropy: float = 0.0  # the policy's entropy, in nats, summed over the steps
    p_up: float = 0.0  # P(UP), summed over the steps
    repeats: int = 0  # steps whose action was the step before's (a match's first step has none)
    losses: int = 0  # points lost
    quick_losses: int = 0  # of them, lost within QUICK_LOSS_FRAMES of the point before (never returned)
    fired: np.ndarray | None = None  # (H,) bools: the hidden units active (h > 0) on some step

    def add(self, other: Diagnostics) -> None:
        self.steps += other.steps
        self.entropy += other.entropy
        self.p_up += other.p_up
        self.repeats += other.repeats
        self.losses += other.losses
        self.quick_losses += other.quick_losses
        if other.fired is not None:
            self.fired = other.fired.copy() if self.fired is None else self.fired | other.fired

    def __reduce__(self) -> tuple:
        """Pickled with the fired units packed 8 to a byte: as a numpy array each match's
        cost Ray a buffer of its own, in every process its stats pass through (at batch
        3,000, 8 ms of the driver's CPU per update and 40 of the queue's; docs/SCALING.md)."""
        fired = None if self.fired is None else (np.packbits(self.fired).tobytes(), len(self.fired))
        return _unpacked, (self.steps, self.entropy, self.p_up, self.repeats, self.losses, self.quick_losses, fired)


def _unpacked(
    steps: int, entropy: float, p_up: float, repeats: int, losses: int, quick: int, fired: tuple[bytes, int] | None
) -> Diagnostics:
    """Diagnostics from their pickled form."""
    array = None if fired is None else np.unpackbits(np.frombuffer(fired[0], np.uint8), count=fired[1]).view(bool)
    return Diagnostics(steps, entropy, p_up, repeats, losses, quick, array)


@dataclass
class EpisodeResult:
    episode: EpisodeId
    grad: EpisodeGradient
    score: float
    steps: int
    seconds: float
    timings: dict[str, float] = field(default_factory=dict)  # seconds spent per phase
    record_bytes: int = 0  # memory the episode's record used
    diagnostics: Diagnostics | None = None

    def stats(self) -> EpisodeStats:
        return EpisodeStats(
            self.episode, self.score, self.steps, self.seconds, self.timings, self.record_bytes, self.diagnostics
        )


@dataclass
class EpisodeStats:
    """An episode without its gradient: what the driver keeps once the gradient is
    in the batch's exact sum (pool/sums.py). On a cluster it reaches the driver in
    the queue's reports."""

    episode: EpisodeId
    score: float
    steps: int
    seconds: float
    timings: dict[str, float] = field(default_factory=dict)
    record_bytes: int = 0
    diagnostics: Diagnostics | None = None  # None: not measured (a simulated match)


class EpisodeRecord:
    """What an episode keeps per step, in growable arrays: about 3 bytes per
    non-zero input pixel plus 13 bytes, instead of 6400 floats.

    A step's input is written in place, at `indices[nnz:]` and `values[nnz:]`
    (`make_room()` first), then added with its entry count, dlogit and logit."""

    def __init__(self, capacity: int = 1024):
        self.steps = 0
        self.nnz = 0
        self.indices = np.empty(capacity * 32, dtype=np.int16)
        self.values = np.empty(capacity * 32, dtype=np.int8)
        self.indptr = np.zeros(capacity + 1, dtype=np.int32)
        self.dlogits = np.empty(capacity, dtype=np.float32)
        self.logits = np.empty(capacity, dtype=np.float32)  # for the entropy: its bonus, its diagnostic
        self.rewards = np.empty(capacity, dtype=np.int8)

    def make_room(self) -> None:
        """Room for one more step whose input may have all D pixels."""
        if self.steps + 1 >= len(self.dlogits):
            self.indptr = _grown(self.indptr)
            self.dlogits = _grown(self.dlogits)
            self.logits = _grown(self.logits)
            self.rewards = _grown(self.rewards)
        if self.nnz + D > len(self.indices):
            self.indices = _grown(self.indices, self.nnz + D)
            self.values = _grown(self.values, self.nnz + D)

    def add(self, entries: int, dlogit: float, logit: float) -> None:
        """The step whose input is the `entries` written at nnz, its dlogit and logit."""
        t, end = self.steps, self.nnz + entries
        self.indptr[t + 1] = end
        self.dlogits[t] = dlogit
        self.logits[t] = logit
        self.steps, self.nnz = t + 1, end

    def set_reward(self, reward: float) -> None:
        self.rewards[self.steps - 1] = reward

    def used_bytes(self) -> int:
        """Bytes of the filled part: the per-step cost, without spare capacity."""
        t, n = self.steps, self.nnz
        return n * (self.indices.itemsize + self.values.itemsize) + t * (
            self.indptr.itemsize + self.dlogits.itemsize + self.logits.itemsize + self.rewards.itemsize
        )


def play_episode(
    env: SeededAtari, weights: Params, episode: EpisodeId, gamma: float, entropy_bonus: float = 0.0
) -> EpisodeResult:
    """Play one match with the policy `weights` and return its policy gradient, and
    what the match says about the policy (Diagnostics).

    After each step the environment hands its new screen and the previous one to
    _input_and_logit, which writes the network's next input straight into the
    record and returns the network's logit for it: one compiled call a step.
    `entropy_bonus` (beta, --entropy-bonus) adds beta * dH/dlogit to every step's
    advantage-weighted signal (docs/ALGORITHM.md section 9); at 0 nothing is added."""
    began = perf_counter()
    env_seed, rng = episode_seeds(episode)
    record = EpisodeRecord()
    uniforms, drawn = rng.random(4096), 0
    W1T, W2 = weights.W1.T, weights.W2
    observed_before = env.observe_seconds

    t0 = perf_counter()
    (indices, values), _ = env.reset(seed=env_seed)  # the first input, with no previous frame, is all zeros
    _, logit = sparse_forward(W1T, W2, indices, values)
    p_up = sigmoid(float(logit))
    entries, repeats, before = 0, 0, None
    t1 = perf_counter()
    reset, stepping = t1 - t0, 0.0
    while True:
        if drawn == len(uniforms):  # the same stream of draws, taken in blocks
            uniforms, drawn = rng.random(len(uniforms)), 0
        up = bool(uniforms[drawn] < p_up)  # a Python bool: comparing numpy's is slow (2 us a step)
        drawn += 1
        repeats += up == before
        before = up
        record.add(entries, (1.0 if up else 0.0) - p_up, logit)  # grad of log p(action) w.r.t. logit
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
    logits = record.logits[:steps]
    advantages = standardise(discounted_returns(rewards, gamma))
    signal = record.dlogits[:steps] * advantages
    if entropy_bonus:
        signal += entropy_bonus * entropy_gradient(logits)
    X = inputs_matrix(record.indices[: record.nnz], record.values[: record.nnz], record.indptr[: steps + 1])
    fired = np.zeros(weights.hidden, dtype=bool)
    grad = backward(weights, X, signal, fired=fired)
    diagnostics = _diagnostics(logits, rewards, repeats, fired, env.frames_per_step())
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
        diagnostics=diagnostics,
    )


def entropy_gradient(logits: np.ndarray) -> np.ndarray:
    """dH/dz of a Bernoulli policy's entropy H = -p ln p - (1-p) ln(1-p), p = sigmoid(z),
    per step, in float64: dH/dp = -z and dp/dz = p (1 - p), so dH/dz = -p (1 - p) z."""
    z = logits.astype(np.float64)
    p = _sigmoids(z)
    return -p * (1 - p) * z


def entropies(logits: np.ndarray) -> np.ndarray:
    """H = -p ln p - (1-p) ln(1-p) in nats per step, from the logits without overflow:
    ln p = -softplus(-z), ln(1-p) = -softplus(z)."""
    z = logits.astype(np.float64)
    p = _sigmoids(z)
    return p * np.logaddexp(0.0, -z) + (1 - p) * np.logaddexp(0.0, z)


def _sigmoids(z: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(z))  # never overflows
    return np.where(z >= 0, 1 / (1 + e), e / (1 + e))


def _diagnostics(
    logits: np.ndarray, rewards: np.ndarray, repeats: int, fired: np.ndarray, frames_per_step: float
) -> Diagnostics:
    """An episode's Diagnostics from its logits, rewards, repeated actions and fired units."""
    points = np.flatnonzero(rewards)
    rally = np.diff(points, prepend=-1)  # steps from the point before (or the match's start) to each point
    lost = rewards[points] < 0
    quick = rally * frames_per_step < QUICK_LOSS_FRAMES
    return Diagnostics(
        steps=len(logits),
        entropy=float(entropies(logits).sum()),
        p_up=float(_sigmoids(logits.astype(np.float64)).sum()),
        repeats=repeats,
        losses=int(lost.sum()),
        quick_losses=int((lost & quick).sum()),
        fired=fired,
    )


def play_match(env, weights: Params, episode: EpisodeId, greedy: bool = False, observer=None) -> MatchResult:
    """Play one match against the built-in player, as play_episode would (the same
    seeds and draws, so the same score) but keeping nothing for a gradient.

    greedy=True takes the likelier action instead of sampling. `observer`, if given,
    is called after every decision with (env, indices, values, p_up, up): what the
    network was shown, what it made of it and what it did (the recorder draws it);
    and once more as the match ends, `up` then the points (for, against): the screen
    of its last point (whose digit Pong draws a frame later).
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
    if observer is not None:
        observer(env, indices, values, forward(weights, indices, values)[1], (points_for, points_against))
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
