"""How a batch's gradients are summed: exactly, in integers, so the sum is the same to
the bit in any order and any grouping.

Float addition depends on its order; integer addition does not. Each match's float32
gradient is written in fixed point, every value rounded to the nearest multiple of
2**-36 in an int64 (exact: float32 -> float64 -> times a power of two -> round half to
even), and the integers are summed wherever it suits the pool: in the driver as the
matches come in, on a node as its workers finish, and node sums in whatever order the
nodes finish. (A worker sends its match's gradient in float32, half the bytes of its
fixed point, which is written as the gradient is added, in one compiled pass.) The
batch's sum is then turned back into float32 once. So the weights are the same to
the bit for any number of workers and nodes, whoever played which match and
whenever, after faults, lost nodes and resumes, and the schedule is free to give
each match to whichever worker is free.

Range: a match's values must stay below 2**14 = 16,384 (a new policy's stay below 3,
the shipped agent's below 14), so each is below 2**50 in fixed point and a sum of up
to 8,192 matches (the largest batch) cannot overflow an int64. A match with a larger or
non-finite value marks the sum as too large: the trainer stops the run as it does
for a NaN (the likely cause is the learning rate). Precision: 2**-36 is about
1.5e-11, finer than float32's own rounding for every value above 1.2e-4 (and a
smaller value moves its weight by less than lr x 1e-6).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numba
import numpy as np

from pgpong.frames import D
from pgpong.policy import EpisodeGradient
from pgpong.rollout import EpisodeStats

SCALE_BITS = 36  # values are kept as integer multiples of 2**-36
MAX_VALUE = 2.0**14  # a match's values must stay below this (in absolute value)
MAX_MATCHES = 2**13  # the most matches one sum may hold: 2**13 x 2**50 < 2**63
SUMMING = "sum gradients"  # the phase the time spent summing is counted in
_SCALE = 2.0**SCALE_BITS


@dataclass
class IntegerGradient:
    """A gradient (one match's, or a sum of them) in fixed point, kept on the pixels it
    touches: W1's columns for `columns` as rows of int64, and W2."""

    columns: np.ndarray  # sorted pixel indices (int16)
    W1_rows: np.ndarray  # (len(columns), H) int64: dW1[:, columns].T in units of 2**-36
    W2: np.ndarray  # (H,) int64
    matches: int = 1  # how many matches it sums
    too_large: bool = False  # a value reached MAX_VALUE or was not finite: the sum means nothing

    @classmethod
    def of(cls, grad: EpisodeGradient) -> IntegerGradient:
        """One match's float32 gradient in fixed point."""
        if not in_range(grad):
            hidden = len(grad.W2)
            return cls(np.zeros(0, np.int16), np.zeros((0, hidden), np.int64), np.zeros(hidden, np.int64), 1, True)
        return cls(grad.columns, _fixed(grad.W1_columns.T.astype(np.float64)), _fixed(grad.W2.astype(np.float64)))

    @property
    def nbytes(self) -> int:
        return self.columns.nbytes + self.W1_rows.nbytes + self.W2.nbytes

    def to_float(self, dtype: type = np.float32) -> EpisodeGradient:
        """Back to floats, each integer times 2**-36 rounded as numpy's division and
        cast round it (to float64, exact below 2**53, then to float32); a sum too large
        to be exact gives NaN."""
        _check_rows(self.columns, self.W1_rows.shape, len(self.W2))
        return _in_floats(self.W1_rows, np.arange(len(self.columns)), self.columns, self.W2, self.too_large, dtype)


def _check_rows(columns: np.ndarray, rows: tuple[int, ...], hidden: int) -> None:
    """That a part's rows are one of `hidden` values per pixel of `columns`, each pixel
    an input of the network: the compiled loops below do not check their indices."""
    if rows != (len(columns), hidden) or (len(columns) and not 0 <= columns.min() <= columns.max() < D):
        raise ValueError(f"a gradient's rows {rows} do not fit {len(columns)} pixels of {D} and {hidden} hidden units")


def _fixed(values: np.ndarray) -> np.ndarray:
    return np.rint(values * _SCALE).astype(np.int64)


def _in_floats(
    rows: np.ndarray, which: np.ndarray, columns: np.ndarray, W2: np.ndarray, too_large: bool, dtype: type
) -> EpisodeGradient:
    """The fixed-point rows `rows[which]` (those of pixels `columns`) and W2 as a float
    gradient, each integer times 2**-36 rounded as to_float says; NaN if too large to
    be exact."""
    hidden = len(W2)
    if too_large:
        return EpisodeGradient(np.zeros(0, np.int16), np.zeros((hidden, 0), dtype), np.full(hidden, np.nan, dtype))
    W1: np.ndarray = np.empty((hidden, len(which)), dtype=dtype, order="F")  # (H, n), as EpisodeGradient keeps
    _floats_of_rows(rows, which, W1)
    return EpisodeGradient(columns.astype(np.int16, copy=False), W1, (W2 / _SCALE).astype(dtype))


@numba.njit(cache=True, nogil=True)
def _floats_of_rows(rows: np.ndarray, which: np.ndarray, out: np.ndarray) -> None:
    """out[:, j] = rows[which[j]] x 2**-36 in out's float type, in one pass: each
    integer to float64 (exact below 2**53, else rounded to nearest, as numpy's cast),
    times the power of two (exact), then to out's type (rounded to nearest, ties to
    even, as numpy's astype): the bits of `(rows[which] / 2.0**36).astype(dtype).T`."""
    for j in range(which.shape[0]):
        row = rows[which[j]]
        for i in range(row.shape[0]):
            out[i, j] = np.float64(row[i]) / _SCALE


def in_range(grad: EpisodeGradient) -> bool:
    """Whether every value of a match's gradient is finite and below MAX_VALUE."""
    return _fits(grad.W1_columns) and _fits(grad.W2)  # (each apart: Python's max() would drop a NaN)


def _fits(values: np.ndarray) -> bool:
    """Whether every value is finite and below MAX_VALUE (False for NaN)."""
    return bool(np.abs(values).max(initial=0.0) < MAX_VALUE)


@numba.njit(cache=True, nogil=True)
def _add_rows(total: np.ndarray, columns: np.ndarray, rows: np.ndarray) -> None:
    """total[columns[j]] += rows[j], in one pass (no gathered copy in between)."""
    for j in range(columns.shape[0]):
        into, row = total[columns[j]], rows[j]
        for i in range(row.shape[0]):
            into[i] += row[i]


@numba.njit(cache=True, nogil=True)
def _add_fixed(total: np.ndarray, columns: np.ndarray, W1_columns: np.ndarray) -> bool:
    """total[columns[j]] += W1_columns[:, j] in fixed point, as _fixed writes it: in
    one pass, with no array in between (W1_columns in Fortran order, each column whole);
    whether every value was finite and below MAX_VALUE, checked in the same pass (if
    not, what was added is of no matter: the sum is marked too large, and means nothing)."""
    fits = True
    for j in range(columns.shape[0]):
        row = total[columns[j]]
        for i in range(W1_columns.shape[0]):
            value = float(W1_columns[i, j])  # (float64)
            fits &= abs(value) < MAX_VALUE  # (False for NaN)
            row[i] += np.int64(np.rint(value * _SCALE))
    return fits


class ExactSum:
    """Adds up gradients in fixed point: the same total in any order and grouping."""

    def __init__(self, hidden: int):
        self.W1 = np.zeros((D, hidden), dtype=np.int64)  # row k: pixel k's column of W1
        self.W2 = np.zeros(hidden, dtype=np.int64)
        self.touched = np.zeros(D, dtype=bool)
        self.matches = 0
        self.too_large = False
        self.seconds = 0.0  # spent adding and turning the sum into floats

    def add(self, grad: IntegerGradient | EpisodeGradient) -> None:
        """Add a sum in fixed point, or one match's float32 gradient."""
        began = time.perf_counter()
        self._add(grad)
        self.seconds += time.perf_counter() - began

    def _add(self, grad: IntegerGradient | EpisodeGradient) -> None:
        if isinstance(grad, EpisodeGradient):  # one match's, in float32
            _check_rows(grad.columns, grad.W1_columns.T.shape, len(self.W2))
            W2_fits = _fits(grad.W2)
            if not (_add_fixed(self.W1, grad.columns, grad.W1_columns) and W2_fits):  # (W1's range checked as added)
                self.too_large = True
            else:
                self.W2 += _fixed(grad.W2.astype(np.float64))
                self.touched[grad.columns] = True
            self.matches += 1
        elif grad.too_large:
            self.too_large = True
            self.matches += grad.matches
        else:
            _check_rows(grad.columns, grad.W1_rows.shape, len(self.W2))
            _add_rows(self.W1, grad.columns, grad.W1_rows)
            self.W2 += grad.W2
            self.touched[grad.columns] = True
            self.matches += grad.matches
        if self.matches > MAX_MATCHES:
            raise ValueError(f"an exact sum holds at most {MAX_MATCHES} matches")

    def compact(self) -> IntegerGradient:
        """The sum so far, kept on the pixels it touched (to send it elsewhere)."""
        columns = np.flatnonzero(self.touched)
        return IntegerGradient(columns.astype(np.int16), self.W1[columns], self.W2.copy(), self.matches, self.too_large)

    def rounded(self, dtype: type = np.float32) -> EpisodeGradient:
        """The sum in floats, on the pixels it touched (as compact().to_float() gives
        it, without the copy in between); NaN if it is too large to be exact."""
        began = time.perf_counter()
        columns = np.flatnonzero(self.touched)
        grad = _in_floats(self.W1, columns, columns, self.W2, self.too_large, dtype)
        self.seconds += time.perf_counter() - began
        return grad


def added(first: EpisodeGradient, then: EpisodeGradient) -> EpisodeGradient:
    """Two float32 sums (a batch's two parts, --lag-share) added in float32, on the
    pixels either touched: to the bit what adding them as dense arrays gives (a pixel
    one of them did not touch adds 0)."""
    columns = np.union1d(first.columns, then.columns).astype(np.int16)
    W1 = np.zeros((len(first.W2), len(columns)), dtype=first.W1_columns.dtype, order="F")
    W1[:, np.searchsorted(columns, first.columns)] = first.W1_columns
    W1[:, np.searchsorted(columns, then.columns)] += then.W1_columns
    return EpisodeGradient(columns, W1, first.W2 + then.W2)


@dataclass
class Played:
    """A match as a rollout worker returns it to be summed: what the driver keeps of it
    (its stats) and its float32 gradient (written in fixed point where it is added)."""

    stats: EpisodeStats
    grad: EpisodeGradient
