"""The pool for a cluster of several nodes (or many workers): a leader on each node,
matches pulled from one queue, sums that meet before the driver.

Each node has a leader (an actor with no CPU of its own) that starts the node's
workers and plays matches on them (a RayPool, with everything it does about dead and
stuck workers). The leaders take the batch's matches from one queue (queue.py) as
their workers free up, so no worker anywhere idles while a match is unplayed. Each
leader sums its node's matches exactly (sums.py) as they finish, and when the queue
is empty and its matches are done it sends a reducer (another CPU-less actor, on the
driver's node) its node's sum; the reducer adds the node sums as they come and turns
the total into float32 once. The driver hears of matches only as a few small reports
per node (their scores and lengths) and receives one array per update, whatever the
batch and the nodes.

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

REPORT_SECONDS = 0.5  # how often a leader tells the driver which matches it has finished
# A leader hands its workers their matches one Ray call at a time (about 0.5-1 ms each):
# a node with more workers gets several leaders, so that a batch's first matches all
# start within a few milliseconds.
LEADER_WORKERS = 32
_ENDED, _LOST = object(), object()  # what ClusterPool._next says instead of a report


@dataclass
class NodeReport:
    """What a node's leader tells the driver: the matches finished since its last
    report (position in the batch, and their stats or results); with its last report,
    where its node's sum is and what it measured."""

    results: list[tuple[int, Any]] = field(default_factory=list)
    done: bool = False  # the queue is empty and this node's matches are done
    summed: list[int] = field(default_factory=list)  # with done: the positions its sum holds
    sum_ref: Any = None  # with done: the node's sum (an IntegerGradient in its object store)
    barrier_s: float = 0.0  # with done: its workers' mean idle time at the end
    replaced: int = 0  # workers its pool has replaced since it started
    seconds: dict[str, float] = field(default_factory=dict)  # with done: the leader's own phases


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

    def run(self, method: str, published: PublishedWeights, queue: Any, batch: int, node: int, *args: Any) -> Iterator:
        """Play matches from the queue on this node's workers until it is empty,
        reporting every REPORT_SECONDS; "play" also sums them, and the last report
        says where the sum is."""
        import ray

        measures = BatchMeasures()
        total: ExactSum | None = None
        summed: list[int] = []
        report, last = NodeReport(), time.monotonic()
        feed = QueueFeed(queue, batch, node)
        for position, result in self.pool.run(method, published, deque(), *args, measures=measures, feed=feed):
            if isinstance(result, Played):
                began = time.perf_counter()
                total = total or ExactSum(len(result.grad.W2))
                total.add(result.grad)
                measures.add_seconds(SUMMING, time.perf_counter() - began)
                summed.append(position)
                result = result.stats
            report.results.append((position, result))
            if time.monotonic() - last > REPORT_SECONDS:
                report.replaced = self.pool.replaced
                yield report
                report, last = NodeReport(), time.monotonic()
        report.done, report.replaced, report.barrier_s = True, self.pool.replaced, measures.barrier_s or 0.0
        if total is not None:
            began = time.perf_counter()
            report.summed, report.sum_ref = summed, ray.put(total.compact())
            measures.add_seconds("send the sum", time.perf_counter() - began)
        report.seconds = measures.seconds
        yield report

    def call_all(self, method: str, *args: Any) -> list:
        return self.pool.call_all(method, *args)

    def close(self) -> None:
        self.pool.close()


class Reducer:
    """On the driver's node, with no CPU of its own: adds the nodes' sums of a batch as
    they come, then gives the total once, in float32."""

    def __init__(self) -> None:
        self.total: ExactSum | None = None

    def add(self, part: IntegerGradient) -> int:
        self.total = self.total or ExactSum(len(part.W2))
        self.total.add(part)
        return part.matches

    def result(self) -> EpisodeGradient:
        assert self.total is not None, "a batch has at least one match"
        total, self.total = self.total, None
        return total.compact().to_float()


class ClusterPool:
    """A leader per node of the cluster, each with its node's share of the workers."""

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
        return len(self._leaders)

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
        began = time.perf_counter()
        part = self._ray.get(self._reducer.result.remote(), timeout=self._limits.stall_s)
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
        is accounted for: for "play", once its node's sum is in the reducer; yield
        (position, stats or result) as the reports come. A lost leader's matches go
        back to the queue, and leaders start again while some are unaccounted for."""
        ray, stall_s = self._ray, self._limits.stall_s
        self._batch += 1
        ray.get(self._queue.reset.remote(self._batch, episodes), timeout=stall_s)
        streams: dict[Any, Any] = {}  # stream -> leader
        adds: dict[Any, list[int]] = {}  # the reducer's add -> the positions it holds
        accounted: set[int] = set()
        ends: dict[Any, tuple[float, float]] = {}  # leader -> when its last report came, its barrier
        last_progress = time.monotonic()
        while len(accounted) < len(episodes):
            if not streams and not adds:  # a round: every leader plays from the queue
                for leader, number in self._names.items():
                    streams[self._call(leader, method, published, self._queue, self._batch, number, *args)] = leader
            ready, _ = ray.wait([*streams, *adds], num_returns=1, timeout=1.0)
            for ref in ready:
                if ref in adds:
                    accounted.update(self._added(ref, adds.pop(ref)))
                    continue
                leader = streams[ref]
                report = self._next(ref, leader)
                if report is _ENDED or report is _LOST:
                    del streams[ref]
                    continue
                last_progress = time.monotonic()
                self._replaced[leader] = report.replaced
                yield from report.results
                if method == "evaluate":  # a match's result is all there is of it
                    accounted.update(position for position, _ in report.results)
                if report.done:
                    ends[leader] = (time.perf_counter(), report.barrier_s)
                    self._finished(leader, report, adds, measures)
            if time.monotonic() - last_progress > stall_s:
                raise PoolError(f"no match finished in {stall_s:.0f} s; giving up")
        end = time.perf_counter()
        idle = sum(self._leaders.get(lead, 0) * (barrier + end - t) for lead, (t, barrier) in ends.items())
        measures.barrier_s = idle / max(1, self.num_workers)

    def _finished(self, leader: Any, report: NodeReport, adds: dict[Any, list[int]], measures: BatchMeasures) -> None:
        """A leader's last report of the round: what it took is settled, its sum goes to
        the reducer, its phases to the batch's measures."""
        self._queue.settle.remote(self._names[leader])
        if report.sum_ref is not None:
            adds[self._reducer.add.remote(report.sum_ref)] = report.summed
        for phase, seconds in report.seconds.items():
            measures.node_seconds[phase] = measures.node_seconds.get(phase, 0.0) + seconds / len(self._names)

    def _added(self, ref: Any, positions: list[int]) -> list[int]:
        """The positions a node's sum added to the total, or none if the sum was lost
        on its way (its node gone): then they go back to the queue, to be played again."""
        try:
            self._ray.get(ref)
            return positions
        except self._ray.exceptions.RayError:
            self._queue.put_back.remote(positions)
            return []

    def _next(self, stream: Any, leader: Any) -> Any:
        """The stream's next report, _ENDED when the stream has ended, _LOST when its
        leader is lost (its matches go back to the queue)."""
        ray = self._ray
        try:
            return ray.get(next(stream))
        except StopIteration:
            return _ENDED
        except ray.exceptions.RayTaskError as exc:  # the leader itself gave up (workers keep failing)
            raise PoolError(failure_reason(exc)) from None
        except ray.exceptions.RayError as exc:  # the leader or its node is lost
            self._lost(leader, exc)
            return _LOST

    def _call(self, leader: Any, method: str, *args: Any) -> Any:
        """NodeLeader.run(`method`, *args) on `leader`, its reports as a stream."""
        return leader.run.options(num_returns="streaming").remote(method, *args)

    def _lost(self, leader: Any, exc: BaseException) -> None:
        if leader in self._leaders:
            self._lost_replaced += self._leaders.pop(leader)
            self._replaced.pop(leader, None)
            self._ray.get(self._queue.give_back.remote(self._names.pop(leader)), timeout=self._limits.stall_s)
            self._tell_queue_the_workers()
            self._ray.kill(leader, no_restart=True)
        if not self._leaders:
            raise PoolError(f"every node's leader is lost: {failure_reason(exc)}")

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
