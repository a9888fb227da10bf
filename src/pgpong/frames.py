"""From an RGB frame to the network's input: an 80x80 mask, then a sparse difference.

A difference frame has a few dozen non-zero pixels out of 6400, so it is kept as
(indices, values) instead of 6400 floats: int16 indices, int8 values in {-1, 1}.
"""

from __future__ import annotations

import numpy as np

SIDE = 80
D = SIDE * SIDE  # input size of the policy network
BACKGROUND_RED = (144, 109)


def preprocess(frame: np.ndarray) -> np.ndarray:
    """210x160x3 uint8 RGB frame -> flat int8 mask of 6400 values, 1 = paddle or ball."""
    red = frame[35:195:2, ::2, 0]
    mask = (red != BACKGROUND_RED[0]) & (red != BACKGROUND_RED[1])
    return mask.view(np.int8).ravel()


def sparse_difference(current: np.ndarray, previous: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """current - previous of two masks, as (int16 indices, int8 values) of the non-zeros."""
    diff = current - previous
    indices = np.flatnonzero(diff)
    return indices.astype(np.int16), diff[indices]


def dense_difference(current: np.ndarray, previous: np.ndarray) -> np.ndarray:
    """The plain float form of the same difference (reference for tests and tools)."""
    return current.astype(np.float32) - previous.astype(np.float32)


def to_dense(indices: np.ndarray, values: np.ndarray, size: int = D) -> np.ndarray:
    dense = np.zeros(size, dtype=np.float32)
    dense[indices] = values
    return dense
