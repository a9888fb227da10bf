"""The pool for a cluster of several nodes (or many workers): a leader on each node,
matches pulled from one queue, sums that meet before the driver.

Each node has a leader (an actor with no CPU of its own; one per 32 workers) that
starts the node's workers and plays matches on them (a RayPool, with everything it
does about dead and stuck workers). The leaders take the batch's matches from one
queue (queue.py) as their workers free up, so no worker anywhere idles while a match
is unplayed, and tell the queue now and then which they have finished. Each leader
sums its node's matches exactly (sums.py) as they finish, and when the queue is empty
and its matches are done it hands its node's sum to a reducer (another CPU-less
actor, on the driver's node), which adds the node sums as they come and turns the
total into float32 once. The driver starts each leader once a batch, reads the
queue's reports a few times a batch and receives one array per update: what it does
and receives does not grow with the batch.

A leader that dies (its node lost) costs the matches it had taken: the queue hands
them out again and the other leaders play them, with the same seeds. The sums are
exact, so the weights are the same as without the fault.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pgpong.placement import groups, shares
from pgpong.policy import EpisodeGradient, Params
from pgpong.pool.base import (
    BatchMeasures,
    BatchResult,
    Finished,
    InOrder,
    Limits,
    PoolError,
    WorkerSettings,
    failure_reason,
    ignore_episode,
)
from pgpong.pool.queue import QueueFeed, WorkQueue
from pgpong.pool.ray_pool import RayPool
from pgpong.pool.sums import SUMMING, ExactSum, IntegerGradient, Played
from pgpong.pool.worker import PublishedWeights, WorkerKind, publish, worker_env
from pgpong.rollout import EpisodeId, MatchResult

REPORT_SECONDS = 0.5  # how often a leader tells the queue which matches it has finished
POLL_SECONDS = 0.5  # how often the driver reads the queue's reports (and once all leaders are done)
# A leader hands its workers their matches one Ray call at a time (about 0.5-1 ms each):
# a node with more workers gets several leaders, so that a batch's first matches all
# start within a few milliseconds.
LEADER_WORKERS = 32


@dataclass
class NodeDone:
    """What a node's leader returns when the queue is empty and its matches are done."""

    summed: list[int] = field(default_factory=list)  # the positions its sum brought into the total
    barrier_s: float = 0.0  # its workers' mean idle time at the end
    replaced: int = 0  # workers its pool has replaced since it started
    seconds: dict[str, float] = field(default_factory=dict)  # the leader's own phases


class NodeLeader:
    """Runs on one node with no CPU of its own: that node's rollout workers, and the
    sum of the matches they play."""

    def __init__(self, settings: WorkerSettings, workers: int, kind: WorkerKind, limits: Limits):
        import ray

        self.node_id = ray.get_runtime_context().get_node_id()
        self.pool = RayPool(settings, workers, kind=kind, node_id=self.node_id, limits=limits)

    def ready(self) -> tuple[str, int]:
        """This leader's node and how many of its workers run."""
        return self.node_id, self.pool.num_workers

    def run(
        self, method: str, published: PublishedWeights, queue: Any, reducer: Any, batch: int, node: int, *args: Any
    ) -> NodeDone:
        """Play matches from the queue on this node's workers until it is empty,
        telling it every REPORT_SECONDS which are finished; "play" also sums them and
        hands the sum to the reducer before returning."""
        import ray

        measures = BatchMeasures()
        total: ExactSum | None = None
        summed: list[int] = []
        finished: list[tuple[int, Any]] = []
        last = time.monotonic()
        feed = QueueFeed(queue, batch, node)
        for position, result in self.pool.run(method, published, deque(), *args, measures=measures, feed=feed):
            if isinstance(result, Played):
                total = total or ExactSum(len(result.grad.W2))
                total.add(result.grad)
                summed.append(position)
                result = result.stats
            finished.append((position, result))
            if time.monotonic() - last > REPORT_SECONDS:
                queue.report.remote(batch, node, finished)
                finished, last = [], time.monotonic()
        ray.get(queue.report.remote(batch, node, finished))  # in the queue before the driver hears we are done
        if total is not None:
            measures.add_seconds(SUMMING, total.seconds)
        done = NodeDone(barrier_s=measures.barrier_s or 0.0, replaced=self.pool.replaced, seconds=measures.seconds)
        if total is not None:
            began = time.perf_counter()
            if ray.get(reducer.add.remote(batch, node, ray.put(total.compact()), summed)):
                done.summed = summed
            measures.add_seconds("send the sum", time.perf_counter() - began)
        return done

    def call_all(self, method: str, *args: Any) -> list:
        return self.pool.call_all(method, *args)

    def close(self) -> None:
        self.pool.close()


class Reducer:
    """On the driver's node, with no CPU of its own: adds the nodes' sums of a batch as
    they come, then gives the total once, in float32. It knows which matches each
    node's sum brought, and takes nothing more from a node declared lost."""

    def __init__(self) -> None:
        self._start(-1)

    def _start(self, batch: int) -> None:
        self.batch = batch
        self.total: ExactSum | None = None
        self.counted: dict[int, list[int]] = {}
        self.closed: set[int] = set()

    def add(self, batch: int, node: int, part: IntegerGradient, positions: list[int]) -> bool:
        """Add `node`'s sum (of the matches at `positions`); False if the node was
        declared lost meanwhile (its matches are being played again)."""
        if batch != self.batch:
            self._start(batch)
        if node in self.closed:
            return False
        total = self.total = self.total or ExactSum(len(part.W2))
        total.add(part)
        self.counted.setdefault(node, []).extend(positions)
        return True

    def close(self, batch: int, node: int) -> list[int]:
        """`node` is lost: from now on nothing of it is added. The matches its sums brought."""
        if batch != self.batch:
            self._start(batch)
        self.closed.add(node)
        return self.counted.get(node, [])

    def result(self, batch: int) -> EpisodeGradient:
        assert batch == self.batch and self.total is not None, "a batch has at least one match"
        total = self.total
        self._start(-1)
        return total.compact().to_float()


class ClusterPool:
    """A leader per node of the cluster (per 32 of its workers), each with its share of the workers."""

    def __init__(
        self, settings: WorkerSettings, num_workers: int, kind: WorkerKind | None = None, limits: Limits | None = None
    ):
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self._ray = ray
        self._limits = limits = limits or Limits()
        kind = kind or WorkerKind()
        nodes = nodes_with_cpus()
        counts = shares(num_workers, [cpus for _, cpus in nodes])
        leader_class: Any = ray.remote(num_cpus=0, runtime_env={"env_vars": worker_env()})(NodeLeader)
        leaders = [
            leader_class.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(
                settings, group, kind, limits
            )
            for (node, _), count in zip(nodes, counts, strict=True)
            for group in groups(count, LEADER_WORKERS)
        ]
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self._queue: Any = ray.remote(num_cpus=0)(WorkQueue).options(scheduling_strategy=here).remote(num_workers)
        self._reducer: Any = ray.remote(num_cpus=0)(Reducer).options(scheduling_strategy=here).remote()
        self._leaders: dict[Any, int] = {}  # leader -> its running workers
        self._names: dict[Any, int] = {}  # leader -> its number in the queue's books
        self._lost_replaced = 0  # workers that went with a lost leader
        self._batch = 0
        try:
            started = ray.get([leader.ready.remote() for leader in leaders], timeout=limits.start_s)
        except ray.exceptions.RayError as exc:
            for actor in [*leaders, self._queue, self._reducer]:
                ray.kill(actor)
            raise PoolError(f"a node's leader could not start its rollout workers: {failure_reason(exc)}") from None
        self.node_of: dict[Any, str] = {}  # leader -> its node's id
        for number, (leader, (node, running)) in enumerate(zip(leaders, started, strict=True)):
            self._leaders[leader], self._names[leader], self.node_of[leader] = running, number, node
        self._replaced: dict[Any, int] = dict.fromkeys(self._leaders, 0)
        self._tell_queue_the_workers()

    @property
    def num_workers(self) -> int:
        return sum(self._leaders.values())

    @property
    def replaced(self) -> int:
        return sum(self._replaced.values()) + self._lost_replaced

    def nodes(self) -> int:
        return len(set(self.node_of[leader] for leader in self._leaders))

    def play_batch(
        self, weights: Params, episodes: list[EpisodeId], finished: Finished = ignore_episode
    ) -> BatchResult:
        """Play the batch on every node; the exact sum of its gradients, from the reducer."""
        measures = BatchMeasures()
        published, seconds = publish(weights)
        measures.add_seconds("publish weights", seconds)
        replaced, in_order = self.replaced, InOrder(finished)
        for position, stats in self._run("play", published, episodes, measures):
            in_order.add(position, stats)
        if in_order.next != len(episodes):  # each match's stats reach the trainer, or the batch fails
            raise PoolError(f"the stats of {len(episodes) - in_order.next} match(es) of the batch never arrived")
        began = time.perf_counter()
        part = self._ray.get(self._reducer.result.remote(self._batch), timeout=self._limits.stall_s)
        measures.add_seconds("wait for the reducer", time.perf_counter() - began)
        began = time.perf_counter()
        grad = part.dense(weights.W1.shape[1])
        measures.add_seconds(SUMMING, time.perf_counter() - began)
        measures.bytes_in = part.nbytes
        measures.replaced = self.replaced - replaced
        return BatchResult(grad, measures)

    def evaluate(self, weights: Params, matches: list[EpisodeId], greedy: bool = False) -> Iterator[MatchResult]:
        results: dict[int, MatchResult] = {}
        next_out = 0
        for position, result in self._run("evaluate", publish(weights)[0], matches, BatchMeasures(), greedy):
            results.setdefault(position, result)
            while next_out in results:
                yield results.pop(next_out)
                next_out += 1

    def _run(
        self, method: str, published: PublishedWeights, episodes: list[EpisodeId], measures: BatchMeasures, *args: Any
    ) -> Iterator[tuple[int, Any]]:
        """Put the episodes in the queue and have every leader play from it until each
        is accounted for (for "play", once its node's sum is in the reducer); yield
        (position, stats or result) as the queue's reports come. A lost leader's
        matches go back to the queue; leaders start again while some are unaccounted."""
        ray, stall_s = self._ray, self._limits.stall_s
        self._batch += 1
        ray.get(self._queue.reset.remote(self._batch, episodes), timeout=stall_s)
        runs: dict[Any, Any] = {}  # a leader's run -> the leader
        accounted: set[int] = set()
        ends: dict[Any, tuple[float, float]] = {}  # leader -> when its run ended, its barrier
        seen, last_progress, next_poll = 0, time.monotonic(), time.monotonic() + POLL_SECONDS
        while len(accounted) < len(episodes):
            if not runs:  # a round: every leader plays from the queue until it is empty
                for leader, number in self._names.items():
                    runs[self._call(leader, method, published, number, *args)] = leader
            done, _ = ray.wait(list(runs), num_returns=1, timeout=max(0.0, next_poll - time.monotonic()))
            for ref in done:
                leader = runs.pop(ref)
                summed = self._ended(ref, leader, method, ends, measures)
                accounted.update(summed)
            if time.monotonic() >= next_poll or not runs:  # every POLL_SECONDS, and once all runs are over
                items, seen = ray.get(self._queue.progress.remote(seen), timeout=stall_s)
                self._heard(items)
                for _, position, item in items:
                    if method == "evaluate":  # a match's result is all there is of it
                        accounted.add(position)
                    yield position, item
                last_progress = time.monotonic() if items else last_progress
                next_poll = time.monotonic() + POLL_SECONDS
            if time.monotonic() - last_progress > stall_s:
                raise PoolError(f"no match finished in {stall_s:.0f} s; giving up")
        # Every match is in the sum, but the last reports may not have been read yet
        # (the loop polls on a clock, and once every run is over): read them now.
        items, seen = ray.get(self._queue.progress.remote(seen), timeout=stall_s)
        self._heard(items)
        yield from ((position, item) for _, position, item in items)
        end = time.perf_counter()
        idle = sum(self._leaders.get(lead, 0) * (barrier + end - t) for lead, (t, barrier) in ends.items())
        measures.barrier_s = idle / max(1, self.num_workers)

    def _ended(self, ref: Any, leader: Any, method: str, ends: dict, measures: BatchMeasures) -> list[int]:
        """A leader's run is over: the positions its sum brought in. A leader lost on
        the way is closed at the reducer and its other matches go back to the queue."""
        ray = self._ray
        try:
            done: NodeDone = ray.get(ref)
        except ray.exceptions.RayTaskError as exc:  # the leader itself gave up (workers keep failing)
            raise PoolError(failure_reason(exc)) from None
        except ray.exceptions.RayError as exc:  # the leader or its node is lost
            return self._lost(leader, method, exc)  # what its sum brought in before
        ends[leader] = (time.perf_counter(), done.barrier_s)
        self._replaced[leader] = done.replaced
        for phase, seconds in done.seconds.items():
            measures.node_seconds[phase] = measures.node_seconds.get(phase, 0.0) + seconds / len(self._names)
        return done.summed

    def _heard(self, items: list[tuple[int, int, Any]]) -> None:
        """The queue's reports: (node number, position, stats or result). (A hook for tests.)"""

    def _call(self, leader: Any, method: str, published: PublishedWeights, number: int, *args: Any) -> Any:
        return leader.run.remote(method, published, self._queue, self._reducer, self._batch, number, *args)

    def _lost(self, leader: Any, method: str, exc: BaseException) -> list[int]:
        """Close a lost leader: its matches not in the sum go back to the queue; the
        positions its sums brought into the reducer before (they stay)."""
        ray, stall_s = self._ray, self._limits.stall_s
        keep: list[int] | None = None
        if leader in self._leaders:
            number = self._names.pop(leader)
            keep = (
                ray.get(self._reducer.close.remote(self._batch, number), timeout=stall_s) if method == "play" else None
            )
            ray.get(self._queue.give_back.remote(number, keep), timeout=stall_s)
            self._lost_replaced += self._leaders.pop(leader)
            self._replaced.pop(leader, None)
            self._tell_queue_the_workers()
            ray.kill(leader, no_restart=True)
        if not self._leaders:
            raise PoolError(f"every node's leader is lost: {failure_reason(exc)}")
        return keep or []

    def _tell_queue_the_workers(self) -> None:
        queue: Any = self._queue
        queue.set_workers.remote(self.num_workers)

    def call_all(self, method: str, *args: Any) -> list:
        """Call a worker method on every running worker of every node; answers in order."""
        calls = [lead.call_all.remote(method, *args) for lead in self._leaders]
        return [answer for node in self._ray.get(calls, timeout=self._limits.stall_s) for answer in node]

    def close(self) -> None:
        for leader in self._leaders:
            with contextlib.suppress(self._ray.exceptions.RayError):
                self._ray.get(leader.close.remote(), timeout=10)
            self._ray.kill(leader)
        for actor in (self._queue, self._reducer):
            self._ray.kill(actor)
        self._leaders = {}


def nodes_with_cpus() -> list[tuple[str, int]]:
    """(node id, CPUs) of the cluster's live nodes that have CPUs, head first."""
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) >= 1]
    nodes.sort(key=lambda n: not n.get("Resources", {}).get("node:__internal_head__"))
    return [(n["NodeID"], int(n["Resources"]["CPU"])) for n in nodes]
