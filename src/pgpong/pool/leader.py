"""A node's leader in a cluster pool: an actor with no CPU of its own on each node (one
per 64 of its workers) that starts the node's rollout workers and plays the matches
the queue hands it on them (a RayPool, with everything it does about dead and stuck
workers), sums them exactly by batch, and gives each batch's node sum to the reducer
with its workers' idle time (the sum of all but its last match ahead of it, while that
one plays). Its run goes on from batch to batch: with nothing to do
it waits in the queue for the next batch. The cluster's only leader plays every match
of a batch, and takes the trainer's step on its sum itself (OwnStep), as the reducer
would: the weights go out without the sum's trip there first."""

from __future__ import annotations

import functools
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pgpong.placement import REPORT_SECONDS
from pgpong.policy import EpisodeGradient
from pgpong.pool.base import BatchMeasures, Job, Limits, WorkerSettings, kept_for_life
from pgpong.pool.columns import Finished, by_batch
from pgpong.pool.feed import QueueFeed
from pgpong.pool.queue import COPY_SECONDS
from pgpong.pool.ray_pool import RayPool
from pgpong.pool.reducer import Mirror, NodeShare, StepTaken, WholeBatch
from pgpong.pool.sums import SUMMING, ExactSum, IntegerGradient, Played
from pgpong.pool.worker import Skipped, WorkerKind, publish


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
        self.own_step = OwnStep()
        kept_for_life()

    def ready(self) -> tuple[str, int]:
        """This leader's node and how many of its workers run."""
        return self.node_id, self.pool.num_workers

    def run(
        self,
        queue: Any,
        reducer: Any,
        node: int,
        queue_node: str = "",
        report_s: float = REPORT_SECONDS,
        only_leader: bool = False,
    ) -> NodeDone:
        """Play matches from the queue on this node's workers, of whichever batch it
        hands out, until the queue stops (it waits there for the next batch), telling
        it every `report_s` which are finished (placement.report_seconds). Matches
        played ("play") are summed by batch, and a batch's sum goes to the reducer as
        soon as the node holds no more of that batch's matches; while the node's last
        match of it plays, with none left to come, the sum of the others goes ahead
        (not once it has ended: its result is next in, and one hand-over is quicker;
        nor where the node plays the whole batch: its sum goes once, rounded). The
        cluster's `only_leader` claims the step on each batch it is handed (Reducer.claim),
        and takes it on its sum of the batch if that is the whole and the claim is
        answered by then (else the reducer takes it), before the batch's last stats go
        to the queue: the next batch waits for the weights, not for those."""
        import ray

        measures = BatchMeasures()
        copy = queue_node != self.node_id  # the queue's node reads the queue's copy
        feed = QueueFeed(queue, node, copy_weights=copy, workers=self.pool.num_workers)
        sums: dict[int, tuple[ExactSum, list[int]]] = {}  # batch -> its sum on this node, and of which positions
        ahead: dict[int, Any] = {}  # batch -> the reducer's answer to the sum sent ahead of its last match here
        alone: dict[int, tuple[EpisodeGradient, list[int]]] = {}  # batch -> that last match, once played
        finished: Finished = []  # (batch, position, stats or result) not yet reported
        claims = _claims(feed, reducer, only_leader)  # batch -> the reducer's answer to the claim of its step
        last = time.monotonic()
        ended = lambda batch: self.pool.ended(lambda key: key[0] == batch)  # noqa: E731
        for (batch, position), result in _played(self.pool.run(deque(), feed.job, measures=measures, feed=feed), feed):
            left = feed.done(batch)
            for gone in feed.dropped:  # cancelled: its sums are of no use
                for held in (sums, ahead, alone, claims):
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
            if not left:  # its last match here: the step on the batch (if this leader takes it), its stats, its sum
                part = alone.pop(batch, None) or sums.pop(batch, None)
                sent = self._sendable(part, feed.sizes.get(batch), measures)
                taken = self._step(sent, claims.pop(batch, None), queue, measures)  # (the next batch waits for it)
                finished, last = self._report(queue, node, finished), time.monotonic()  # before the sum completes it
                if part is not None:
                    share = NodeShare(self.pool.num_workers, self.pool.idle_seconds())
                    added = self._hand_over(reducer, batch, node, sent, part[1], measures, share, taken)
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
                part = sums.pop(batch)
                sent = self._sendable(part, None, measures)
                ahead[batch] = self._hand_over(reducer, batch, node, sent, part[1], measures)
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

    def _sendable(
        self, part: tuple[ExactSum | EpisodeGradient, list[int]] | None, size: int | None, measures: BatchMeasures
    ) -> IntegerGradient | EpisodeGradient | WholeBatch | None:
        """What goes to the reducer of the node's sum of a batch (`part`: the sum and its
        matches' positions; or one match's gradient, which goes as it is): a sum of
        every match of the batch (its `size`, as the queue said) rounded to float32, as
        the batch's total; another, its fixed point, compacted."""
        if part is None:
            return None
        began, (total, summed) = time.perf_counter(), part
        if isinstance(total, EpisodeGradient):
            return total
        measures.add_seconds(SUMMING, total.seconds)
        sent = WholeBatch(total.rounded(), total.matches) if len(summed) == size else total.compact()
        measures.add_seconds("send the sum", time.perf_counter() - began)
        return sent

    def _step(self, sent: Any, claim: Any, queue: Any, measures: BatchMeasures) -> StepTaken | None:
        """The trainer's step on the batch's total, `sent` (a WholeBatch), if this leader
        claimed it (`claim`: the reducer's answer), taken here and its weights given to
        the `queue` (OwnStep) before the node's stats and sum leave: the next batch waits
        for them, not for those. This leader's word on it, for the reducer."""
        if claim is None or not isinstance(sent, WholeBatch):
            return None
        began = time.perf_counter()
        taken = self.own_step.take(claim, sent.grad, queue)
        measures.add_seconds("take the step", time.perf_counter() - began)
        return taken

    def _hand_over(
        self,
        reducer: Any,
        batch: int,
        node: int,
        sent: Any,
        summed: list[int],
        measures: BatchMeasures,
        share: NodeShare | None = None,
        taken: StepTaken | None = None,
    ) -> Any:
        """The node's sum of the batch's matches at `summed` (`sent`, _sendable's) to the
        reducer; with `share` (its workers and their idle time) it is the node's last of
        the batch and carries the leader's phases since its last, and `taken`, this
        leader's word on the step it took on it. The reducer's answer, to wait on."""
        import ray

        began = time.perf_counter()
        if share is not None:
            share.seconds, measures.seconds = measures.seconds, {}
        added = reducer.add.remote(batch, node, ray.put(sent), summed, share, taken)
        measures.add_seconds("send the sum", time.perf_counter() - began)
        return added

    def call_all(self, method: str, *args: Any) -> list:
        return self.pool.call_all(method, *args)

    def close(self) -> None:
        self.pool.close()


class OwnStep:
    """The trainer's step on a batch's total, taken by the cluster's only leader, which
    played every match of it and claimed the step (Reducer.claim): its copy of the
    trainer's weights and cache (a Mirror, as the reducer's, to the same bits), and the
    weights the step makes given to the queue for the next batch."""

    def __init__(self) -> None:
        self.mirror = Mirror()

    def take(self, claim: Any, total: EpisodeGradient, queue: Any) -> StepTaken | None:
        """The step the reducer's answer to the claim says, taken on `total`, and the new
        weights published; what this leader then says of it. None if the answer is not
        in yet or gives no step: the reducer takes it then, if any."""
        import ray

        if not ray.wait([claim], timeout=0)[0]:
            return None
        try:
            claimed = ray.get(claim)
            if claimed is None:
                return None
            order, batch = claimed
            start = (
                None
                if order.weights is None or order.cache is None
                else ray.get([order.weights.ref, order.cache.ref], timeout=COPY_SECONDS)
            )
            made = self.mirror.step(total, order, start)
            if made is None:
                return StepTaken(self.mirror.state, None)
            answer = queue.publish_stepped.remote(batch, publish(made[0])[0])
            made[1].measure(made[0])  # (the norms while the weights go out: the next batch waits for them)
            published = ray.get(answer, timeout=COPY_SECONDS)
        except ray.exceptions.RayError:  # (the store full, say): the trainer's publish brings the weights
            self.mirror.state = None
            return StepTaken(None, None)
        return StepTaken(self.mirror.state, made[1].weight_squares if published else None)


def _claims(feed: QueueFeed, reducer: Any, only_leader: bool) -> dict[int, Any]:
    """The only leader's claims of the steps on the batches it plays, each made as the
    batch's first matches come to the node (QueueFeed.on_job): while the batch before
    plays, for the next batch, announced."""
    claims: dict[int, Any] = {}
    if only_leader:
        feed.on_job = functools.partial(_claim, claims, reducer, feed.jobs)
    return claims


def _claim(claims: dict[int, Any], reducer: Any, jobs: dict[int, Job], batch: int, job: Job) -> None:
    """The batch's first matches have come to the node (its `job` with them: QueueFeed):
    the claim of the trainer's step on it (Reducer.claim), unless it is one to evaluate,
    which has no step. Those of batches the node no longer knows (cancelled) are let go."""
    for gone in [known for known in claims if known not in jobs]:
        del claims[gone]
    if job[0] == "play":
        claims[batch] = reducer.claim.remote(batch)


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
