"""A trained policy as a player of your own loop: it takes Gymnasium's raw RGB frames
of Pong, one at a time, and answers with an action, keeping the previous frame itself
(the network sees the difference of two frames, docs/ALGORITHM.md section 2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pgpong.config import ConfigError
from pgpong.envs import DOWN, UP
from pgpong.evaluate import load_policy
from pgpong.frames import SCREEN, D, preprocess, sparse_difference
from pgpong.policy import Params, forward

FRAME_SHAPE = (*SCREEN, 3)  # Gymnasium's Pong observation: 210x160 RGB


class Agent:
    """A policy network that plays Pong from raw frames.

    Load one with `Agent.load()` (the agent shipped with pgpong, a run directory, a
    checkpoint or any .npz with W1 and W2), then in any loop over a Gymnasium Pong
    environment (`ALE/Pong-v5`, `Pong-v0`, `PongNoFrameskip-v4`)::

        frame, _ = env.reset(seed=0)
        agent.reset()                 # a new match: forget the previous frame
        while True:
            frame, reward, terminated, truncated, _ = env.step(agent.act(frame))
            if terminated or truncated:
                break

    `act` returns 2 (UP) or 3 (DOWN), the two actions pgpong plays. Actions are drawn
    with the network's probability of UP, as in training, from the agent's own
    generator (`seed`), or with `greedy=True` the likelier one is taken. After each
    `act`, `p_up` holds the probability the network gave to UP.
    """

    UP = UP
    DOWN = DOWN

    def __init__(
        self,
        weights: Params,
        *,
        seed: int | np.random.Generator | None = None,
        greedy: bool = False,
        source: str = "weights given in Python",
        env_id: str | None = None,
    ):
        self.weights = _checked(weights)
        self.greedy = bool(greedy)
        self.source = source  # where the weights came from, as `pgpong play` names it
        self.env_id = env_id  # the environment they were trained on, when known
        self.p_up: float | None = None  # P(UP) at the last act()
        self._rng = np.random.default_rng(seed)
        self._previous: np.ndarray | None = None

    @classmethod
    def load(
        cls,
        path: str | Path | None = None,
        *,
        seed: int | np.random.Generator | None = None,
        greedy: bool = False,
    ) -> Agent:
        """The agent shipped with pgpong (path=None), a run directory's newest good
        checkpoint, a checkpoint file, or any .npz holding W1 (H, 6400) and W2 (H,).
        Raises CheckpointError (a PgpongError) for a file it cannot use."""
        policy = load_policy(None if path is None else Path(path))
        return cls(policy.weights, seed=seed, greedy=greedy, source=policy.source, env_id=policy.env_id)

    @classmethod
    def from_weights(
        cls, W1: Any, W2: Any, *, seed: int | np.random.Generator | None = None, greedy: bool = False
    ) -> Agent:
        """An agent of the weights W1 (H, 6400) and W2 (H,), as arrays."""
        W1, W2 = np.asarray(W1), np.asarray(W2)
        if W1.ndim != 2 or W1.shape[1] != D or W2.shape != (W1.shape[0],):
            raise ConfigError(f"W1 must have shape (H, {D}) and W2 shape (H,), got {W1.shape} and {W2.shape}")
        return cls(Params.of(W1, W2), seed=seed, greedy=greedy)

    def reset(self, seed: int | np.random.Generator | None = None) -> None:
        """Start a new match: the next frame is its first, whose input is all zeros.
        A seed starts the action draws again from it."""
        self._previous = None
        self.p_up = None
        if seed is not None:
            self._rng = np.random.default_rng(seed)

    def act(self, frame: Any) -> int:
        """The action for this frame (a 210x160x3 uint8 RGB array, as Gymnasium gives
        it): 2 (UP) or 3 (DOWN)."""
        frame = np.asarray(frame)
        if frame.shape != FRAME_SHAPE or frame.dtype != np.uint8:
            raise ConfigError(
                f"Agent.act takes a {FRAME_SHAPE[0]}x{FRAME_SHAPE[1]}x3 uint8 RGB frame (Gymnasium's Pong "
                f"observation), got shape {frame.shape} of {frame.dtype}"
            )
        mask = preprocess(frame)
        if self._previous is None:  # a match's first frame: no difference yet
            indices, values = np.zeros(0, dtype=np.int16), np.zeros(0, dtype=np.int8)
        else:
            indices, values = sparse_difference(mask, self._previous)
        self._previous = mask
        _, self.p_up = forward(self.weights, indices, values)
        up = self.p_up > 0.5 if self.greedy else self._rng.random() < self.p_up
        return UP if up else DOWN

    @property
    def hidden(self) -> int:
        """Hidden units of the network."""
        return self.weights.hidden

    def __repr__(self) -> str:
        how = "greedy" if self.greedy else "sampled"
        return f"Agent({self.source}, {self.hidden} hidden units, {how} actions)"


def _checked(weights: Params) -> Params:
    if not isinstance(weights, Params):
        raise ConfigError(
            f"Agent takes the weights as pgpong Params (or use Agent.from_weights), got {type(weights).__name__}"
        )
    if weights.W1.shape != (weights.hidden, D):
        raise ConfigError(f"W1 must have shape (H, {D}), got {weights.W1.shape}")
    return weights
