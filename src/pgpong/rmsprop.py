"""RMSProp, the step of gradient ascent pgpong takes on a batch's summed gradient, and
the squared norms of its update and weights, summed as numpy sums them.

    cache <- decay*cache + (1-decay)*g^2;  W <- W + lr * g / (sqrt(cache) + eps)
"""

from __future__ import annotations

import math

import numba
import numpy as np

from pgpong.policy import EpisodeGradient, Params


class RMSProp:
    """cache <- decay*cache + (1-decay)*g^2;  W <- W + lr * g / (sqrt(cache) + eps).

    Gradient *ascent*: the update adds the gradient of the expected reward. With
    `max_update_norm` (--max-update-norm), the update of W1 and W2 together is scaled
    down to that L2 norm when it is longer; the cache is unchanged by it. After a
    step, `last_update_norm` and `last_clip` say how long the update was and what it
    was multiplied by (diagnostics), `weight_squares` the new weights' squared norms,
    and `weights_finite` and `cache_finite` whether they hold no NaN or infinity.

    Each float32 operation is numpy's, in numpy's order, so the bits are those of the
    plain numpy lines (tests/test_rmsprop.py keeps them as the reference); the work is
    one pass over the arrays (numba) instead of about ten, two with clipping, and the
    norms are summed as numpy sums (`squared_norm`). The gradient may come dense or as
    W1's touched columns (an EpisodeGradient: the others are zero, to the same bits).
    A step is apply(), which moves the weights and cache, then measure(), which sums
    the norms: a cluster's reducer publishes the weights between the two.
    """

    eps = 1e-5

    def __init__(self, learning_rate: float, decay_rate: float, cache: Params, max_update_norm: float | None = None):
        self.learning_rate = learning_rate
        self.decay_rate = decay_rate
        self.cache = cache
        self.max_update_norm = max_update_norm
        self.last_clip = 1.0  # what the last update was multiplied by (1: not clipped)
        self.last_update_norm = 0.0  # the last update's L2 norm, as added (clipped: its norm before times last_clip)
        self.weight_squares = (0.0, 0.0)  # squared L2 norms of W1 and W2 after the last step
        self.weights_finite = self.cache_finite = True  # after the last step
        self._updates: list[np.ndarray] = []  # the last apply()'s updates, until measure()

    def step(self, weights: Params, grad: Params | EpisodeGradient) -> None:
        self.apply(weights, grad)
        self.measure(weights)

    def apply(self, weights: Params, grad: Params | EpisodeGradient) -> None:
        """The weights and the cache moved by the step on `grad`, and whether they stay
        finite; the norms wait for measure() (with clipping, the update's is needed
        first, and is summed here)."""
        clipping = bool(self.max_update_norm)  # (0 or None: no clipping)
        self._updates, self.cache_finite, self.weights_finite = [], True, True
        pairs = zip((weights.W1, weights.W2), (self.cache.W1, self.cache.W2), strict=True)
        parts = list(zip(pairs, _by_columns(grad, weights.W1.shape[1]), strict=True))
        for (w, c), (columns, g) in parts:  # (all checked before anything moves)
            if w.shape != c.shape or _columns_of(g).shape != (len(_columns_of(w)), len(columns)):
                raise ValueError("RMSProp needs weights, gradient and cache of one shape")
        for (w, c), (columns, g) in parts:
            kind = g.dtype.type
            update = np.empty_like(w, dtype=g.dtype)  # (w's layout: its norm is summed in w's memory order)
            finite = _rmsprop_columns(
                _columns_of(w),
                _columns_of(c),
                _columns_of(update),
                columns,
                _columns_of(g),
                kind(self.decay_rate),
                kind(1 - self.decay_rate),
                kind(self.learning_rate),
                kind(self.eps),
                not clipping,
            )
            self.cache_finite &= bool(finite[0])
            self.weights_finite &= bool(finite[1])
            self._updates.append(update)
        self.last_clip = 1.0
        if clipping:
            norm = self._update_norm()
            limit = float(self.max_update_norm or 0)
            self.last_clip = limit / norm if norm > limit else 1.0
            self.last_update_norm = norm * self.last_clip
            for w, update in zip((weights.W1, weights.W2), self._updates, strict=True):  # W += update x the clip
                self.weights_finite &= _add_columns(_columns_of(w), _columns_of(update), w.dtype.type(self.last_clip))

    def measure(self, weights: Params) -> None:
        """The last step's update norm (unless apply() needed it to clip) and the
        weights' squared norms."""
        if not self.max_update_norm:
            self.last_update_norm = self._update_norm()
        self._updates = []
        self.weight_squares = squared_norms(weights)

    def _update_norm(self) -> float:
        squares = 0.0
        for update in self._updates:
            squares += squared_norm(update)  # (a Python sum from 0, as before)
        return math.sqrt(squares)


def _by_columns(grad: Params | EpisodeGradient, inputs: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """W1's and W2's gradients as (the columns given, their values): an
    EpisodeGradient's touched columns (sorted, each once), or every column."""
    if isinstance(grad, Params):
        return [(np.arange(inputs), grad.W1), (np.zeros(1, np.int64), grad.W2)]
    columns = np.asarray(grad.columns)
    if len(columns) and not (columns[0] >= 0 and columns[-1] < inputs and (np.diff(columns) > 0).all()):
        raise ValueError(f"a gradient's columns must be sorted pixels of {inputs}, each once")
    if grad.W1_columns.shape[1:] != columns.shape:
        raise ValueError("a gradient's W1 columns do not match its pixels")
    return [(columns, np.asfortranarray(grad.W1_columns)), (np.zeros(1, np.int64), grad.W2)]  # (a column a read)


def _columns_of(array: np.ndarray) -> np.ndarray:
    """A 2-D view, whatever the strides (written through): W1 as it is, W2 as one column."""
    return array[:, np.newaxis] if array.ndim == 1 else array


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _rmsprop_columns(w, c, update, columns, g, decay, keep, lr, eps, add):
    """Over (H, D) arrays, column j's gradient g[:, k] where columns[k] == j, else 0:
    c <- c*decay + (g*g)*keep;  update <- g / (sqrt(c) + eps) * lr;  and if `add`,
    w <- w + update, each product and sum rounded to the arrays' precision as numpy
    does; whether c and w stay finite."""
    zeros = np.zeros(w.shape[0], dtype=g.dtype)
    bad_c = bad_w = False
    k = 0
    for j in range(w.shape[1]):
        if k < columns.size and columns[k] == j:
            bad = _rmsprop_column(w[:, j], c[:, j], update[:, j], g[:, k], decay, keep, lr, eps, add)
            k += 1
        else:
            bad = _rmsprop_column(w[:, j], c[:, j], update[:, j], zeros, decay, keep, lr, eps, add)
        bad_c |= bad[0]
        bad_w |= bad[1]
    return not bad_c, not bad_w


@numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _rmsprop_column(w, c, update, g, decay, keep, lr, eps, add):
    """One column of _rmsprop_columns: whether c and w are not finite. (numpy's error
    model: no division check, so the loop runs in vector instructions.)"""
    big = c.dtype.type(np.finfo(c.dtype).max)
    bad_c = bad_w = False
    for h in range(w.size):
        gi = g[h]
        ci = c[h] * decay + gi * gi * keep
        c[h] = ci
        ui = gi / (np.sqrt(ci) + eps) * lr
        update[h] = ui
        bad_c |= not abs(ci) <= big  # (NaN compares false; -inf only from a broken cache)
        if add:
            wi = w[h] + ui
            w[h] = wi
            bad_w |= not abs(wi) <= big
    return bad_c, bad_w


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _add_columns(w, update, clip):
    """Over (H, D) arrays: w <- w + update * clip (a clip of 1 changes no bit of the
    update); whether w stays finite."""
    big = w.dtype.type(np.finfo(w.dtype).max)
    bad = False
    for j in range(w.shape[1]):
        for h in range(w.shape[0]):
            wi = w[h, j] + update[h, j] * clip
            w[h, j] = wi
            bad |= not abs(wi) <= big
    return not bad


def squared_norms(weights: Params) -> tuple[float, float]:
    """W1's and W2's squared norms, as the step sums them (so two sums of the same
    weights compare equal to the bit)."""
    return squared_norm(weights.W1), squared_norm(weights.W2)


def squared_norm(array: np.ndarray) -> float:
    """The sum of squares of an array's entries in float64, added in numpy's pairwise
    order (np.square(a, dtype=float64).sum(), to the bit, without its 10 MB temporary):
    the same for any thread count (a BLAS dot product may not be)."""
    flat = array.ravel(order="K")
    return 0.0 + _pairwise_squares(flat, 0, flat.size)


PAIRWISE_BLOCK = 128  # numpy's pairwise sum: blocks of at most 128 entries, 8 running sums each


@numba.njit(cache=True, nogil=True)
def _pairwise_squares(a, start, n):
    """numpy's pairwise summation (umath's pairwise_sum) of a[start:start+n] squared in
    float64: below 8 entries one running sum; up to a block, 8 interleaved sums added
    as ((0+1)+(2+3))+((4+5)+(6+7)), then the rest; above, two halves split at a
    multiple of 8. (A float32 squared is exact in float64.)"""
    if n < 8:
        total = 0.0
        for i in range(start, start + n):
            x = np.float64(a[i])
            total += x * x
        return total
    if n <= PAIRWISE_BLOCK:
        x0, x1, x2, x3 = (
            np.float64(a[start]),
            np.float64(a[start + 1]),
            np.float64(a[start + 2]),
            np.float64(a[start + 3]),
        )
        x4, x5, x6, x7 = (
            np.float64(a[start + 4]),
            np.float64(a[start + 5]),
            np.float64(a[start + 6]),
            np.float64(a[start + 7]),
        )
        r0, r1, r2, r3, r4, r5, r6, r7 = x0 * x0, x1 * x1, x2 * x2, x3 * x3, x4 * x4, x5 * x5, x6 * x6, x7 * x7
        i, end = start + 8, start + n - n % 8
        while i < end:
            x0, x1, x2, x3 = np.float64(a[i]), np.float64(a[i + 1]), np.float64(a[i + 2]), np.float64(a[i + 3])
            x4, x5, x6, x7 = np.float64(a[i + 4]), np.float64(a[i + 5]), np.float64(a[i + 6]), np.float64(a[i + 7])
            r0, r1, r2, r3 = r0 + x0 * x0, r1 + x1 * x1, r2 + x2 * x2, r3 + x3 * x3
            r4, r5, r6, r7 = r4 + x4 * x4, r5 + x5 * x5, r6 + x6 * x6, r7 + x7 * x7
            i += 8
        total = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        for k in range(end, start + n):
            x = np.float64(a[k])
            total += x * x
        return total
    half = n // 2
    half -= half % 8
    return _pairwise_squares(a, start, half) + _pairwise_squares(a, start + half, n - half)
