"""The policy network (two layers, no biases), its gradient, and RMSProp.

    h = relu(W1 x),  p = sigmoid(W2 . h) = P(action UP)

W1 has shape (H, D) as in docs/ALGORITHM.md section 3, but is stored in Fortran (column-major) order so
that the column of one pixel is contiguous: with a sparse input x the forward pass
only reads the columns of its few non-zero pixels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numba
import numpy as np
import scipy.sparse as sp

from pgpong.frames import D

DTYPE = np.float32
BACKWARD_STEPS = 2048  # steps per chunk of the backward pass: about 5 MB of scratch
# Stream of the initial weights; episode seeds are [seed, batch, episode] with
# batch < 2**32 - 1, so the two never meet.
INIT_STREAM = 2**32 - 1


@dataclass
class Params:
    """A pair (W1, W2): the weights, a gradient, or an RMSProp cache."""

    W1: np.ndarray  # (H, D), Fortran order
    W2: np.ndarray  # (H,)

    @classmethod
    def initial(cls, hidden: int, seed: int, inputs: int = D, w2_scale: float = 1.0) -> Params:
        """Xavier initialisation: W1 ~ N(0,1)/sqrt(D), W2 ~ N(0,1)/sqrt(H), W2 then
        times `w2_scale` (--w2-init-scale; at 1 the draws are untouched)."""
        rng = np.random.default_rng(np.random.SeedSequence([seed, INIT_STREAM]))
        W1 = rng.standard_normal((hidden, inputs)) / np.sqrt(inputs)
        W2 = rng.standard_normal(hidden) / np.sqrt(hidden)
        if w2_scale != 1:
            W2 = W2 * w2_scale  # in float64, before the cast: the same draws, only smaller
        return cls.of(W1, W2)

    @classmethod
    def of(cls, W1: np.ndarray, W2: np.ndarray, dtype: type = DTYPE) -> Params:
        """Own, writable copies in the layout pgpong computes with."""
        return cls(np.array(W1, dtype=dtype, order="F"), np.array(W2, dtype=dtype))

    def zeros_like(self) -> Params:
        return Params(np.zeros_like(self.W1, order="F"), np.zeros_like(self.W2))

    @property
    def hidden(self) -> int:
        return self.W2.shape[0]

    @property
    def nbytes(self) -> int:
        return self.W1.nbytes + self.W2.nbytes


def forward(weights: Params, indices: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, float]:
    """Hidden activations and P(UP) for one sparse input (indices, values)."""
    h, logit = sparse_forward(weights.W1.T, weights.W2, indices, values)
    return h, sigmoid(float(logit))


@numba.njit(cache=True, nogil=True)
def sparse_forward(W1T, W2, indices, values):
    """h = relu(W1 x) and W2 . h for a sparse x, in one compiled call: it reads the
    W1 column (a contiguous row of W1T) of each non-zero pixel and nothing else."""
    h = np.zeros(W2.shape[0], dtype=W2.dtype)
    for k in range(indices.shape[0]):
        column, value = W1T[indices[k]], W2.dtype.type(values[k])
        for j in range(h.shape[0]):
            h[j] += value * column[j]
    logit = W2.dtype.type(0)
    for j in range(h.shape[0]):
        h[j] = max(h[j], 0)
        logit += h[j] * W2[j]
    return h, logit


def compile_kernels() -> None:
    """Compile the forward and backward passes (or load them from numba's cache) for
    writable weights and for read-only ones, as Ray's object store gives them, so
    the first episode does not pay for it."""
    for tiny in tiny_weights():
        forward(tiny, np.zeros(0, dtype=np.intp), np.zeros(0, dtype=np.int8))
        one_step = inputs_matrix(np.zeros(1, dtype=np.int16), np.ones(1, dtype=np.int8), np.array([0, 1]))
        backward(tiny, one_step, np.ones(1, dtype=DTYPE))


def tiny_weights() -> tuple[Params, Params]:
    """Two-unit weights, writable and read-only (as Ray's object store gives them):
    what the compiled kernels are warmed up with."""
    writable, read_only = Params.of(np.zeros((2, D)), np.zeros(2)), Params.of(np.zeros((2, D)), np.zeros(2))
    read_only.W1.flags.writeable = read_only.W2.flags.writeable = False
    return writable, read_only


def inputs_matrix(indices: np.ndarray, values: np.ndarray, indptr: np.ndarray, inputs: int = D) -> sp.csr_matrix:
    """The inputs of an episode as a sparse (T, D) matrix: row t holds x_t."""
    steps = len(indptr) - 1
    return sp.csr_matrix((values.astype(DTYPE), indices, indptr), shape=(steps, inputs))


@dataclass
class EpisodeGradient:
    """An episode's gradient. Only the columns of W1 for pixels that changed at least
    once can be non-zero (about 1,000 of 6,400 in a match), so only those are kept:
    a sixth of the bytes to send back to the driver."""

    columns: np.ndarray  # sorted pixel indices
    W1_columns: np.ndarray  # (H, len(columns)): dW1[:, columns]
    W2: np.ndarray  # (H,)

    def add_to(self, total: Params) -> None:
        total.W1[:, self.columns] += self.W1_columns
        total.W2 += self.W2

    def dense(self, inputs: int = D) -> Params:
        full = Params(np.zeros((len(self.W2), inputs), dtype=self.W2.dtype, order="F"), np.zeros_like(self.W2))
        self.add_to(full)
        return full

    @property
    def nbytes(self) -> int:
        return self.columns.nbytes + self.W1_columns.nbytes + self.W2.nbytes


def backward(
    weights: Params, X: sp.csr_matrix, dlogits: np.ndarray, fired: np.ndarray | None = None
) -> EpisodeGradient:
    """Gradient of sum_t dlogit_t * logit_t w.r.t. the weights, for inputs X (T, D).

    dlogits are the advantage-weighted (y_t - p_t) of docs/ALGORITHM.md section 4. The hidden
    activations are recomputed from the sparse inputs (cheaper than keeping 200
    floats for every step), only the pixels the episode touched take part, and the
    steps are taken BACKWARD_STEPS at a time, so the memory it needs does not grow
    with the episode's length. The two sparse products are compiled and add up
    their terms in the order scipy.sparse does (x @ W1c, then x.T @ dh), and W2's
    is added step by step, so the gradient is the same to the bit as the plain
    scipy version's, on any CPU.

    `fired`, if given (H booleans), is set where a hidden unit was active (h > 0) on
    some step: a diagnostic read off the activations the pass computes anyway.
    """
    dlogits = dlogits.astype(weights.W1.dtype, copy=False)
    columns, compact = _touched(X.indices, X.shape[1])
    W1c = weights.W1.T.take(columns, axis=0)  # (n, H): the touched pixels' weights
    dW1c = np.zeros_like(W1c)  # (n, H), transposed at the end
    dW2 = np.zeros_like(weights.W2)
    for start in range(0, X.shape[0], BACKWARD_STEPS):
        stop = min(start + BACKWARD_STEPS, X.shape[0])
        g = dlogits[start:stop]
        hs = _hidden(X.indptr, compact, X.data, W1c, start, stop)  # (t, H)
        if fired is not None:
            fired |= (hs > 0).any(axis=0)
        _add_output_gradient(hs, g, dW2)
        dW1c += _input_gradient(X.indptr, compact, X.data, hs, g, weights.W2, start, len(columns))
    return EpisodeGradient(columns, dW1c.T, dW2)  # (H, n), Fortran order as a transposed view


@numba.njit(cache=True, nogil=True)
def _hidden(indptr, indices, data, W1c, start, stop):
    """relu(x @ W1c) for steps start..stop of an episode's CSR inputs (column indices
    into W1c's rows), each step's terms added in its entries' order, as scipy does."""
    hs = np.zeros((stop - start, W1c.shape[1]), dtype=W1c.dtype)
    for t in range(start, stop):
        h = hs[t - start]
        for entry in range(indptr[t], indptr[t + 1]):
            value, row = data[entry], W1c[indices[entry]]
            for j in range(h.shape[0]):
                h[j] += value * row[j]
        for j in range(h.shape[0]):
            if h[j] < 0:
                h[j] = 0
    return hs


@numba.njit(cache=True, nogil=True)
def _add_output_gradient(hs, g, dW2):
    """dW2 += hs.T @ g, each unit's terms added step by step in float32: the same bits
    on every CPU. (As a BLAS product its sums came in an order of OpenBLAS's kernel,
    which it picks by CPU: another on AMD Zen than on an Intel Xeon, so a match's
    gradient, and a run's weights, depended on the machine: docs/ALGORITHM.md.)"""
    for t in range(hs.shape[0]):
        h, g_t = hs[t], g[t]
        for j in range(dW2.shape[0]):
            dW2[j] += h[j] * g_t


@numba.njit(cache=True, nogil=True)
def _input_gradient(indptr, indices, data, hs, g, W2, start, columns):
    """x.T @ dh with dh = outer(g, W2) where the unit was active, zero elsewhere: per
    touched pixel, the terms added step by step, as scipy's CSC product does.

    A step's dh is made once, with zeros for inactive units (a NaN activation counts
    as active, as scipy's mask lets it through); adding value * 0 to a sum changes
    no bit of it (a sum that starts at +0 never becomes -0), so the inner loop has
    no branch and runs in vector instructions."""
    out = np.zeros((columns, W2.shape[0]), dtype=W2.dtype)
    dh = np.empty_like(W2)
    zero = W2.dtype.type(0)
    for t in range(start, start + hs.shape[0]):
        h, g_t = hs[t - start], g[t - start]
        for j in range(W2.shape[0]):
            dh[j] = zero if h[j] <= 0 else g_t * W2[j]
        for entry in range(indptr[t], indptr[t + 1]):
            value, row = data[entry], out[indices[entry]]
            for j in range(W2.shape[0]):
                row[j] += value * dh[j]
    return out


def _touched(indices: np.ndarray, inputs: int) -> tuple[np.ndarray, np.ndarray]:
    """The sorted pixels that occur in `indices`, and each index's position among them:
    np.unique(indices, return_inverse=True), by marking instead of sorting."""
    seen = np.zeros(inputs, dtype=bool)
    seen[indices] = True
    columns = np.flatnonzero(seen).astype(indices.dtype)
    position = np.empty(inputs, dtype=indices.dtype)
    position[columns] = np.arange(len(columns), dtype=indices.dtype)
    return columns, position[indices]


class RMSProp:
    """cache <- decay*cache + (1-decay)*g^2;  W <- W + lr * g / (sqrt(cache) + eps).

    Gradient *ascent*: the update adds the gradient of the expected reward. With
    `max_update_norm` (--max-update-norm), the update of W1 and W2 together is scaled
    down to that L2 norm when it is longer; the cache is unchanged by it. After a
    step, `last_update_norm` and `last_clip` say how long the update was and what it
    was multiplied by (diagnostics), `weight_squares` the new weights' squared norms,
    and `weights_finite` and `cache_finite` whether they hold no NaN or infinity.

    Each float32 operation is numpy's, in numpy's order, so the bits are those of the
    plain numpy lines (tests/test_policy.py keeps them as the reference); the work is
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
        self.weight_squares = (squared_norm(weights.W1), squared_norm(weights.W2))

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


def sigmoid(z: float) -> float:
    """1 / (1 + exp(-z)), in two branches so that exp never overflows."""
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)
