"""How a batch's gradients are summed: in fixed chunks of consecutive episodes.

Float sums depend on their order, so the grouping depends on the batch size alone:
episodes 0-15 are chunk 0, 16-31 chunk 1, and so on. Each chunk's gradients are
summed in episode order, starting from zero, wherever the chunk was played (the
driver itself, or the leader of the node that played it); the driver adds the
chunk sums in chunk order. So the weights are the same to the bit for any number
of workers and nodes, after faults and resumes, and the driver receives one array
per chunk instead of one per episode.

A batch of at most CHUNK episodes is one chunk, summed exactly as a flat sum in
episode order: 0 + S = S to the bit, because a sum that starts at +0 never becomes
-0 (so adding the zeros of an untouched pixel changes nothing either).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from pgpong.frames import D
from pgpong.policy import EpisodeGradient, Params
from pgpong.rollout import EpisodeResult, EpisodeStats

CHUNK = 16  # episodes per partial sum: batches up to 16 are one chunk
SUMMING = "sum gradients"  # the phase the time spent summing is counted in


def chunk_sizes(batch_size: int) -> list[int]:
    """The sizes of a batch's chunks, in order: CHUNK each, the last one the rest."""
    full, rest = divmod(batch_size, CHUNK)
    return [CHUNK] * full + ([rest] if rest else [])


def split(items: list, sizes: list[int]) -> list[list]:
    """`items` cut into consecutive pieces of the given sizes."""
    pieces, start = [], 0
    for size in sizes:
        pieces.append(items[start : start + size])
        start += size
    return pieces


@dataclass
class ChunkResult:
    """A chunk's episodes, in order, their gradients' sum, and what the pool that
    played it says about how (a leader's barrier and replaced workers)."""

    episodes: list[EpisodeStats]
    grad: EpisodeGradient  # the sum, kept on the pixels the chunk's episodes touched
    info: dict[str, float] = field(default_factory=dict)  # e.g. a leader's barrier and replaced workers

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

    def result(self, info: dict[str, float] | None = None) -> ChunkResult:
        assert self.total is not None and self.touched is not None, "a chunk has at least one episode"
        columns = np.flatnonzero(self.touched).astype(np.int16)
        # (n, H) in C order, transposed: (H, n) in Fortran order, as EpisodeGradient keeps it
        W1_columns = np.ascontiguousarray(self.total.W1.T[columns]).T
        return ChunkResult(self.episodes, EpisodeGradient(columns, W1_columns, self.total.W2), info or {})


def sum_in_chunks(
    results: Iterable[EpisodeResult],
    sizes: list[int],
    finished: Callable[[EpisodeStats], None] = lambda episode: None,
    info: Callable[[], dict[str, float]] = dict,
    seconds: dict[str, float] | None = None,
) -> Iterator[ChunkResult]:
    """Fold episode results, given in episode order, into chunk sums of the given
    sizes; yield each chunk as its last episode comes in (with `info()` attached).
    `finished` hears every episode as it is folded; the time spent summing is
    added to seconds["sum gradients"]."""
    results = iter(results)
    seconds = {} if seconds is None else seconds
    for size in sizes:
        chunk = ChunkSum()
        for result in itertools.islice(results, size):
            began = time.perf_counter()
            chunk.add(result)
            seconds[SUMMING] = seconds.get(SUMMING, 0.0) + time.perf_counter() - began
            finished(chunk.episodes[-1])
        if len(chunk.episodes) < size:
            raise RuntimeError(f"a chunk of {size} episodes got only {len(chunk.episodes)}")
        began = time.perf_counter()
        done = chunk.result(info())
        seconds[SUMMING] = seconds.get(SUMMING, 0.0) + time.perf_counter() - began
        yield done
