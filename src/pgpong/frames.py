"""From an RGB frame to the network's input: an 80x80 mask, then a sparse difference.

A difference frame has a few dozen non-zero pixels out of 6400, so it is kept as
(indices, values) instead of 6400 floats: int16 indices, int8 values in {-1, 1}.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numba
import numpy as np

SIDE = 80
D = SIDE * SIDE  # input size of the policy network
CROP = (slice(35, 195, 2), slice(None, None, 2))  # rows 35..194 and every 2nd row and column
BACKGROUND_RED = (144, 109)
SCREEN = (210, 160)  # ALE's screen, rows x columns
_TOP, _ROW_STEP = CROP[0].start, CROP[0].step
_UNKNOWN = 2  # palette table entry of a colour not seen yet


def preprocess(frame: np.ndarray) -> np.ndarray:
    """210x160x3 uint8 RGB frame -> flat int8 mask of 6400 values, 1 = paddle or ball."""
    return is_foreground(frame[CROP][..., 0]).view(np.int8).ravel()


def is_foreground(red: np.ndarray) -> np.ndarray:
    """docs/ALGORITHM.md section 2's rule on red values: background (144 or 109) -> False, anything else -> True."""
    return (red != BACKGROUND_RED[0]) & (red != BACKGROUND_RED[1])


def sparse_difference(current: np.ndarray, previous: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """current - previous of two masks, as (int16 indices, int8 values) of the non-zeros."""
    diff = current - previous
    indices = np.flatnonzero(diff)
    return indices.astype(np.int16), diff[indices]


class PaletteDiffer:
    """docs/ALGORITHM.md section 2's network input computed straight from the emulator's screens
    of palette indices (210x160 uint8, one byte per pixel): the per-step hot path.

    Equal to sparse_difference(preprocess(rgb_t), preprocess(rgb_t-1)), but instead
    of making two 80x80 masks it compares the two screens' kept pixels and looks up
    only the changed ones in a palette index -> foreground table, in one compiled
    call. The table is learned from the RGB screen (`rgb_screen()`, the same frame
    in colour) the first time a colour appears, so it is exact for any palette.

    Fill `incoming` with a screen, then call `start()` (first frame of an episode:
    its input is all zeros) or `difference()`, or `difference_with()` to hand the
    two screens to a compiled function that goes further (the training loop's).
    """

    UNKNOWN = _UNKNOWN

    def __init__(self, rgb_screen: Callable[[], np.ndarray]):
        self._rgb_screen = rgb_screen
        self.foreground = np.full(256, self.UNKNOWN, dtype=np.int8)  # palette index -> 1, 0 or UNKNOWN
        self._screens = np.zeros((2, *SCREEN), dtype=np.uint8)
        self._incoming = 0
        self._indices = np.empty(D, dtype=np.intp)  # scratch for the compiled function
        self._values = np.empty(D, dtype=np.int8)
        # Compile the kernel (or load it from numba's cache) now, not in the first episode.
        palette_difference(self._screens[0], self._screens[1], self.foreground, self._indices, self._values)

    @property
    def incoming(self) -> np.ndarray:
        """The buffer the next screen goes into."""
        return self._screens[self._incoming]

    def start(self) -> tuple[np.ndarray, np.ndarray]:
        """The incoming screen begins an episode: the empty difference."""
        cropped = self.incoming[CROP]
        if (self.foreground[cropped] == self.UNKNOWN).any():
            self._learn(cropped)
        self._incoming ^= 1
        return self._indices[:0].copy(), self._values[:0].copy()

    def difference(self) -> tuple[np.ndarray, np.ndarray]:
        """(intp indices, int8 values) of incoming minus previous mask; incoming becomes previous."""
        found = self.difference_with(palette_difference, self._indices, self._values)
        return self._indices[:found].copy(), self._values[:found].copy()

    def difference_with(self, kernel: Callable, *args) -> Any:
        """kernel(new, old, foreground, *args) on the incoming and the previous screen
        (incoming becomes previous), as palette_difference is called: its result, or
        the first item of it, is the number of entries found, or -1 when a changed
        pixel has a colour the table lacks; the colour is then learnt and the kernel
        called again."""
        new, old = self._screens[self._incoming], self._screens[self._incoming ^ 1]
        self._incoming ^= 1
        result = kernel(new, old, self.foreground, *args)
        if (result[0] if isinstance(result, tuple) else result) < 0:  # a colour never seen before
            self._learn(new[CROP])  # (old colours are all known)
            result = kernel(new, old, self.foreground, *args)
        return result

    def _learn(self, cropped: np.ndarray) -> None:
        """Look up, on the RGB screen, the red value of the palette indices not seen yet."""
        red = self._rgb_screen()[CROP][..., 0]
        for index in np.unique(cropped[self.foreground[cropped] == self.UNKNOWN]):
            self.foreground[index] = is_foreground(red[cropped == index][0])


@numba.njit(cache=True, nogil=True)
def palette_difference(new, old, foreground, indices, values):
    """Write the non-zero entries of mask(new) - mask(old) into indices/values and
    return how many there are, or -1 if a changed pixel has a colour the table lacks.

    Scans eight screen pixels (four kept ones, as CROP keeps every 2nd column) at
    a time as one 64-bit word: in a frame of Pong almost every word is unchanged."""
    new_words, old_words = new.view(np.uint64), old.view(np.uint64)
    found = 0
    for row in range(SIDE):
        screen_row = _TOP + _ROW_STEP * row
        for word in range(SIDE // 4):
            if new_words[screen_row, word] == old_words[screen_row, word]:
                continue
            for kept in range(4):
                column = 4 * word + kept
                now, before = new[screen_row, 2 * column], old[screen_row, 2 * column]
                if now == before:
                    continue
                if foreground[now] == _UNKNOWN:
                    return -1
                change = foreground[now] - foreground[before]
                if change != 0:
                    indices[found] = row * SIDE + column
                    values[found] = change
                    found += 1
    return found
