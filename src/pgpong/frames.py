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


class FrameDiffer:
    """The same preprocessing and difference, reusing buffers: the per-step hot path.

    Masks are kept as booleans, whose non-zeros numpy finds many times faster than
    those of int8 arrays. Returns the same (indices, values) as sparse_difference,
    with indices as intp (numpy's native index type, the fastest for gathers).
    """

    def __init__(self) -> None:
        self._red = np.empty((SIDE, SIDE), dtype=np.uint8)
        self._not_bg = np.empty((SIDE, SIDE), dtype=bool)
        self._masks = [np.zeros(D, dtype=bool), np.zeros(D, dtype=bool)]
        self._changed = np.empty(D, dtype=bool)

    def reset(self, frame: np.ndarray) -> None:
        """Start an episode: the next difference is taken against this frame."""
        self._mask(frame, self._masks[0])

    def difference(self, frame: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mask `frame`, then return its sparse difference to the previous one."""
        previous, current = self._masks
        self._mask(frame, current)
        np.not_equal(current, previous, out=self._changed)
        indices = self._changed.nonzero()[0]
        values = current.view(np.int8)[indices] * 2 - 1  # 1 where a pixel appeared, -1 where it left
        self._masks.reverse()
        return indices, values

    def _mask(self, frame: np.ndarray, out: np.ndarray) -> None:
        np.copyto(self._red, frame[35:195:2, ::2, 0])
        flat = out.reshape(SIDE, SIDE)
        np.not_equal(self._red, BACKGROUND_RED[0], out=flat)
        np.not_equal(self._red, BACKGROUND_RED[1], out=self._not_bg)
        np.logical_and(flat, self._not_bg, out=flat)


def dense_difference(current: np.ndarray, previous: np.ndarray) -> np.ndarray:
    """The plain float form of the same difference (reference for tests and tools)."""
    return current.astype(np.float32) - previous.astype(np.float32)


def to_dense(indices: np.ndarray, values: np.ndarray, size: int = D) -> np.ndarray:
    dense = np.zeros(size, dtype=np.float32)
    dense[indices] = values
    return dense
