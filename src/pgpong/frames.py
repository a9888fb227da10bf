"""From an RGB frame to the network's input: an 80x80 mask, then a sparse difference.

A difference frame has a few dozen non-zero pixels out of 6400, so it is kept as
(indices, values) instead of 6400 floats: int16 indices, int8 values in {-1, 1}.
"""

from __future__ import annotations

import numpy as np

SIDE = 80
D = SIDE * SIDE  # input size of the policy network
CROP = (slice(35, 195, 2), slice(None, None, 2))  # rows 35..194 and every 2nd row and column
BACKGROUND_RED = (144, 109)


def preprocess(frame: np.ndarray) -> np.ndarray:
    """210x160x3 uint8 RGB frame -> flat int8 mask of 6400 values, 1 = paddle or ball."""
    return is_foreground(frame[CROP][..., 0]).view(np.int8).ravel()


def is_foreground(red: np.ndarray) -> np.ndarray:
    """SPEC's rule on red values: background (144 or 109) -> False, anything else -> True."""
    return (red != BACKGROUND_RED[0]) & (red != BACKGROUND_RED[1])


def sparse_difference(current: np.ndarray, previous: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """current - previous of two masks, as (int16 indices, int8 values) of the non-zeros."""
    diff = current - previous
    indices = np.flatnonzero(diff)
    return indices.astype(np.int16), diff[indices]


class FrameDiffer:
    """The sparse difference of consecutive masks, reusing buffers: the per-step hot path.

    Takes flat int8 masks (pgpong's environment observes them directly, see envs.py;
    `mask` makes one from an RGB frame). Returns the same (indices, values) as
    sparse_difference, with indices as intp, the fastest type for gathers.
    """

    def __init__(self) -> None:
        self._previous = np.zeros(D, dtype=np.int8)
        self._changed = np.empty(D, dtype=bool)

    def reset(self, mask: np.ndarray) -> None:
        """Start an episode: the next difference is taken against this mask."""
        np.copyto(self._previous, mask)

    def difference(self, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        np.not_equal(mask, self._previous, out=self._changed)
        indices = self._changed.nonzero()[0]  # a bool array's non-zeros: far faster than int8's
        values = mask[indices] * 2 - 1  # 1 where a pixel appeared, -1 where it left
        np.copyto(self._previous, mask)
        return indices, values

    @staticmethod
    def mask(frame: np.ndarray) -> np.ndarray:
        return preprocess(frame)


def dense_difference(current: np.ndarray, previous: np.ndarray) -> np.ndarray:
    """The plain float form of the same difference (reference for tests and tools)."""
    return current.astype(np.float32) - previous.astype(np.float32)


def to_dense(indices: np.ndarray, values: np.ndarray, size: int = D) -> np.ndarray:
    dense = np.zeros(size, dtype=np.float32)
    dense[indices] = values
    return dense
