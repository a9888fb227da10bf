"""Discounted returns that restart at every point, and their standardisation."""

from __future__ import annotations

import numpy as np


def discounted_returns(rewards: np.ndarray, gamma: float) -> np.ndarray:
    """R_t = r_t + gamma * R_{t+1}, with the running sum reset to 0 at every point.

    In Pong a non-zero reward ends a rally, so credit never flows across points.
    """
    returns = np.zeros(len(rewards), dtype=np.float64)
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        if rewards[t] != 0:
            running = 0.0
        running = running * gamma + float(rewards[t])
        returns[t] = running
    return returns


def standardise(returns: np.ndarray) -> np.ndarray:
    """Subtract the mean, divide by the standard deviation.

    An episode whose returns are all equal (e.g. cut before any point was scored)
    has no signal: it gives zeros rather than dividing by zero.
    """
    centred = returns - returns.mean() if len(returns) else returns
    std = centred.std() if len(returns) else 0.0
    return centred / std if std > 0 else np.zeros_like(centred)
