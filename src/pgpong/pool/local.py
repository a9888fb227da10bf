"""--workers 0: a pool that plays the episodes one after another in this process."""

from __future__ import annotations

from collections.abc import Iterator

from threadpoolctl import threadpool_limits

from pgpong.policy import Params
from pgpong.pool.base import BatchMeasures, BatchResult, Finished, OneBatchAtATime, WorkerSettings, ignore_episode
from pgpong.pool.sums import SUMMING, ExactSum, Played
from pgpong.pool.worker import RolloutWorker
from pgpong.rollout import EpisodeId, MatchResult


class LocalPool(OneBatchAtATime):
    """Plays the episodes one after another in this process (--workers 0)."""

    num_workers = 0
    replaced = 0

    def __init__(self, settings: WorkerSettings):
        self.worker = RolloutWorker(settings, pin_threads=False)
        self._waiting = {}
        self._limit = threadpool_limits(1)  # restored by close()

    def play_batch(
        self, weights: Params, episodes: list[EpisodeId], finished: Finished = ignore_episode
    ) -> BatchResult:
        measures = BatchMeasures()  # nothing crosses a process boundary: no bytes in, no barrier
        total = ExactSum(weights.hidden)
        for episode in episodes:
            played = self.worker.play(weights, episode)
            assert isinstance(played, Played)  # (Skipped only for weights still to come)
            total.add(played.grad)
            finished(played.stats)
        grad = total.rounded()
        measures.add_seconds(SUMMING, total.seconds)
        return BatchResult(grad, measures)

    def evaluate(self, weights: Params, matches: list[EpisodeId], greedy: bool = False) -> Iterator[MatchResult]:
        for match in matches:
            yield self.worker.evaluate(weights, match, greedy)

    def nodes(self) -> int:
        return 1

    def close(self) -> None:
        self.worker.env.close()
        self._limit.restore_original_limits()
