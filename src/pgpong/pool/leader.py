"""A node's leader in a cluster pool: an actor with no CPU of its own on each node (one
per 64 of its workers) that starts the node's rollout workers and plays the matches
the queue hands it on them (a RayPool, with everything it does about dead and stuck
workers), sums them exactly by batch, and gives each batch's node sum to the reducer
with its workers' idle time (the sum of all but its last match ahead of it, while that
one plays). Its run goes on from batch to batch: with nothing to do
it waits in the queue for the next batch."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pgpong.placement import REPORT_SECONDS
from pgpong.policy import EpisodeGradient
from pgpong.pool.base import BatchMeasures, Limits, WorkerSettings, kept_for_life
from pgpong.pool.columns import Finished, by_batch
from pgpong.pool.feed import QueueFeed
from pgpong.pool.ray_pool import RayPool
from pgpong.pool.reducer import NodeShare, WholeBatch
from pgpong.pool.sums import SUMMING, ExactSum, IntegerGradient, Played
from pgpong.pool.worker import Skipped, WorkerKind


@dataclass
class NodeDone:
    """What a node's leader returns when its run is over (the queue stopped) and its matches are done."""

    replaced: int = 0  # workers its pool has replaced since it started


class NodeLeader:
    """Runs on one node with no CPU of its own: that node's rollout workers, and the
    sums of the matches they play."""

    def __init__(self, settings: WorkerSettings, workers: int, kind: WorkerKind, limits: Limits):
        import ray

        self.node_id = ray.get_runtime_context().get_node_id()
        self.pool = RayPool(settings, workers, kind=kind, node_id=self.node_id, limits=limits)
        kept_for_life()

    def ready(self) -> tuple[str, int]:
        """This leader's node and how many of its workers run."""
        return self.node_id, self.pool.num_workers

    def run(
        self, queue: Any, reducer: Any, node: int, queue_node: str = "", report_s: float = REPORT_SECONDS
    ) -> NodeDone:
        """Play matches from the queue on this node's workers, of whichever batch it
        hands out, until the queue stops (it waits there for the next batch), telling
        it every `report_s` which are finished (placement.report_seconds). Matches
        played ("play") are summed by batch, and a batch's sum goes to the reducer as
        soon as the node holds no more of that batch's matches; while the node's last
        match of it plays, with none left to come, the sum of the others goes ahead
        (not once it has ended: its result is next in, and one hand-over is quicker;
        nor where the node plays the whole batch: its sum goes once, rounded)."""
        import ray

        measures = BatchMeasures()
        copy = queue_node != self.node_id  # the queue's node reads the queue's copy
        feed = QueueFeed(queue, node, copy_weights=copy, workers=self.pool.num_workers)
        sums: dict[int, tuple[ExactSum, list[int]]] = {}  # batch -> its sum on this node, and of which positions
        ahead: dict[int, Any] = {}  # batch -> the reducer's answer to the sum sent ahead of its last match here
        alone: dict[int, tuple[EpisodeGradient, list[int]]] = {}  # batch -> that last match, once played
        finished: Finished = []  # (batch, position, stats or result) not yet reported
        last = time.monotonic()
        ended = lambda batch: self.pool.ended(lambda key: key[0] == batch)  # noqa: E731
        for (batch, position), result in _played(self.pool.run(deque(), feed.job, measures=measures, feed=feed), feed):
            left = feed.done(batch)
            for gone in feed.dropped:  # cancelled: its sums are of no use
                for held in (sums, ahead, alone):
                    held.pop(gone, None)
            if isinstance(result, Played):
                if batch in ahead and batch not in sums and not left:  # no sum to add it to: it goes as it is
                    alone[batch] = (result.grad, [position])
                elif batch not in feed.dropped:  # (a dropped batch is not summed; nor is it in `ahead`)
                    if batch not in sums:  # (a 10 MB array: made once a batch, not once a match)
                        sums[batch] = (ExactSum(len(result.grad.W2)), [])
                    total, summed = sums[batch]
                    total.add(result.grad)
                    summed.append(position)
                result = result.stats
            finished.append((batch, position, result))
            if not left:  # its last match here: the batch's stats, then its sum, leave now
                finished, last = self._report(queue, node, finished), time.monotonic()  # before the sum completes it
                part = alone.pop(batch, None) or sums.pop(batch, None)
                if part is not None:
                    share = NodeShare(self.pool.num_workers, self.pool.idle_seconds())
                    added = self._hand_over(
                        reducer, batch, node, part[0], part[1], measures, share, feed.sizes.get(batch)
                    )
                    began = time.perf_counter()
                    ray.get([*([ahead.pop(batch)] if batch in ahead else []), added])
                    measures.add_seconds("send the sum", time.perf_counter() - began)
            elif left == 1 and not feed.left_of(batch) and _may_go_ahead(sums, ahead, batch, feed) and not ended(batch):
                # One match of the batch still plays here and no more will come: what is
                # summed goes ahead, so that the last hand-over carries one match, not the
                # node's sum (its transfer and its addition were most of an update's end).
                # Not if that match has ended already, its result next in: at a batch's end
                # results come in bursts, and a sum ahead then added a hand-over and a
                # report (about 4 ms each) to the update's end (docs/SCALING.md).
                # Their stats first: were the node lost, the matches in its sums would not
                # be played again, and the driver must have heard of them.
                finished, last = self._report(queue, node, finished), time.monotonic()
                ahead[batch] = self._hand_over(reducer, batch, node, *sums.pop(batch), measures, None, None)
            elif time.monotonic() - last > report_s:
                queue.report.remote(node, by_batch(finished), self.pool.replaced)
                finished, last = [], time.monotonic()
        self._report(queue, node, finished)  # in the queue before the run is over
        return NodeDone(replaced=self.pool.replaced)

    def _report(self, queue: Any, node: int, finished: Finished) -> Finished:
        """Tell the queue of the finished matches, and wait until it has them; nothing is left to report."""
        import ray

        ray.get(queue.report.remote(node, by_batch(finished), self.pool.replaced))
        return []

    def _hand_over(
        self,
        reducer: Any,
        batch: int,
        node: int,
        part: ExactSum | EpisodeGradient,
        summed: list[int],
        measures: BatchMeasures,
        share: NodeShare | None,
        size: int | None,
    ) -> Any:
        """The node's sum of the batch's matches at `summed` (or the one match's
        gradient) to the reducer; with `share` (its workers and their idle time) it is
        the node's last of the batch and carries the leader's phases since its last.
        A sum of every match of the batch (its `size`, as the queue said) goes rounded
        to float32: it is the batch's total.
        The reducer's answer, to wait on."""
        import ray

        began = time.perf_counter()
        sent: IntegerGradient | EpisodeGradient | WholeBatch
        if isinstance(part, EpisodeGradient):
            sent = part
        elif len(summed) == size:  # (the node played every match of the batch)
            sent = WholeBatch(part.rounded(), part.matches)
        else:
            sent = part.compact()
        if isinstance(part, ExactSum):
            measures.add_seconds(SUMMING, part.seconds)
        if share is not None:
            share.seconds, measures.seconds = measures.seconds, {}
        added = reducer.add.remote(batch, node, ray.put(sent), summed, share)
        measures.add_seconds("send the sum", time.perf_counter() - began)
        return added

    def call_all(self, method: str, *args: Any) -> list:
        return self.pool.call_all(method, *args)

    def close(self) -> None:
        self.pool.close()


def _may_go_ahead(
    sums: dict[int, tuple[ExactSum, list[int]]], ahead: dict[int, Any], batch: int, feed: QueueFeed
) -> bool:
    """Whether the node's sum of the batch may go ahead of its last match here: there is
    one, none went yet, and with that match in it, it would not be the whole batch. A
    node that plays every match of a batch sends its sum once, rounded (WholeBatch: half
    the bytes of a sum ahead, and nothing for the reducer to add); sent ahead, that sum
    held back the last match's result whenever it ended meanwhile: 5-39 ms at 1x64
    (docs/SCALING.md)."""
    return batch in sums and batch not in ahead and len(sums[batch][1]) + 1 != feed.sizes.get(batch)


def _played(results: Iterator[tuple[Any, Any]], feed: QueueFeed) -> Iterator[tuple[Any, Any]]:
    """The matches played: one that was not (its batch, announced, was dropped before
    its weights came: Skipped) is only no longer held."""
    for key, result in results:
        if isinstance(result, Skipped):
            feed.done(key[0])
        else:
            yield key, result
