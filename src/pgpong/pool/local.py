"""--workers 0: a pool that plays the episodes one after another in this process."""

from __future__ import annotations

from collections.abc import Iterator

from threadpoolctl import threadpool_limits

from pgpong.chunks import chunk_sizes
from pgpong.policy import Params
from pgpong.pool.base import BatchMeasures, Finished, PlayedBatch, WorkerSettings, ignore_episode
from pgpong.pool.sums import SUMMING, ChunkResult, sum_in_chunks
from pgpong.pool.worker import RolloutWorker
from pgpong.rollout import EpisodeId, MatchResult


class LocalPool:
    """Plays the episodes one after another in this process (--workers 0)."""

    num_workers = 0
    replaced = 0

    def __init__(self, settings: WorkerSettings):
        self.worker = RolloutWorker(settings, pin_threads=False)
        self._limit = threadpool_limits(1)  # restored by close()

    def play_batch(
        self, weights: Params, episodes: list[EpisodeId], finished: Finished = ignore_episode
    ) -> PlayedBatch:
        measures = BatchMeasures()  # nothing crosses a process boundary: no bytes in
        played = (self.worker.play(weights, episode) for episode in episodes)
        return PlayedBatch(_timed(sum_in_chunks(played, chunk_sizes(len(episodes)), finished), measures), measures)

    def evaluate(self, weights: Params, matches: list[EpisodeId], greedy: bool = False) -> Iterator[MatchResult]:
        for match in matches:
            yield self.worker.evaluate(weights, match, greedy)

    def nodes(self) -> int:
        return 1

    def close(self) -> None:
        self.worker.env.close()
        self._limit.restore_original_limits()


def _timed(chunks: Iterator[ChunkResult], measures: BatchMeasures) -> Iterator[ChunkResult]:
    """The chunks, with the time spent summing them in this process added to `measures`."""
    for chunk in chunks:
        measures.add_seconds(SUMMING, chunk.sum_s)
        yield chunk
