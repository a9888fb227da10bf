"""The policy network (two layers, no biases) and its gradient (RMSProp is in rmsprop.py).

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


def sigmoid(z: float) -> float:
    """1 / (1 + exp(-z)), in two branches so that exp never overflows."""
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)
