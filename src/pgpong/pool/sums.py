"""How a batch's gradients are summed: each chunk's (chunks.py) in episode order,
starting from zero, wherever the chunk was played (the driver itself, or the leader
of the node that played it); the driver adds the chunk sums in chunk order. So the
weights are the same to the bit for any number of workers and nodes, after faults
and resumes, and the driver receives one array per chunk instead of one per episode.

A batch of at most 16 episodes is one chunk, summed exactly as a flat sum in
episode order: 0 + S = S to the bit, because a sum that starts at +0 never becomes
-0 (so adding the zeros of an untouched pixel changes nothing either).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from pgpong.frames import D
from pgpong.policy import EpisodeGradient, Params
from pgpong.rollout import EpisodeResult, EpisodeStats

SUMMING = "sum gradients"  # the phase the time spent summing is counted in


@dataclass
class ChunkResult:
    """A chunk's episodes, in order, and their gradients' sum."""

    episodes: list[EpisodeStats]
    grad: EpisodeGradient  # the sum, kept on the pixels the chunk's episodes touched
    sum_s: float = 0.0  # seconds spent summing it, where it was summed

    @property
    def nbytes(self) -> int:
        return self.grad.nbytes


class ChunkSum:
    """Adds up one chunk's gradients, given in episode order."""

    def __init__(self) -> None:
        self.total: Params | None = None
        self.touched: np.ndarray | None = None
        self.episodes: list[EpisodeStats] = []

    def add(self, result: EpisodeResult) -> None:
        grad = result.grad
        if self.total is None:
            self.total = Params(np.zeros((len(grad.W2), D), dtype=grad.W2.dtype, order="F"), np.zeros_like(grad.W2))
            self.touched = np.zeros(D, dtype=bool)
        assert self.touched is not None
        grad.add_to(self.total)
        self.touched[grad.columns] = True
        self.episodes.append(result.stats())

    def result(self, sum_s: float) -> ChunkResult:
        assert self.total is not None and self.touched is not None, "a chunk has at least one episode"
        columns = np.flatnonzero(self.touched).astype(np.int16)
        # (n, H) in C order, transposed: (H, n) in Fortran order, as EpisodeGradient keeps it
        W1_columns = np.ascontiguousarray(self.total.W1.T[columns]).T
        return ChunkResult(self.episodes, EpisodeGradient(columns, W1_columns, self.total.W2), sum_s)


def sum_in_chunks(
    results: Iterable[EpisodeResult],
    sizes: list[int],
    finished: Callable[[EpisodeStats], None] = lambda episode: None,
) -> Iterator[ChunkResult]:
    """Fold episode results, given in episode order, into chunk sums of the given
    sizes; yield each chunk as its last episode comes in, with the seconds spent
    summing it. `finished` hears every episode as it is folded."""
    results = iter(results)
    for size in sizes:
        chunk, summing = ChunkSum(), 0.0
        for result in itertools.islice(results, size):
            began = time.perf_counter()
            chunk.add(result)
            summing += time.perf_counter() - began
            finished(chunk.episodes[-1])
        if len(chunk.episodes) < size:
            raise RuntimeError(f"a chunk of {size} episodes got only {len(chunk.episodes)}")
        began = time.perf_counter()
        done = chunk.result(0.0)
        done.sum_s = summing + time.perf_counter() - began
        yield done
