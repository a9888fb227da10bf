"""The pool for a cluster of several nodes: a leader on each node, chunks handed to nodes.

The driver does not talk to every rollout worker: each node has a leader (an actor
with no CPU of its own) that starts the node's workers, plays the episodes of the
chunks it is given on them (a RayPool, with everything it does about dead workers),
and sums each chunk in episode order (sums.py). The driver hands each node a share
of the batch's chunks in proportion to its workers (chunks.assign_units), receives
one array per chunk as the chunks finish (Ray streams them from the leader), adds
them in chunk order, and hears of each episode only with its chunk. So what the
driver receives and does per update grows with the chunks (batch / 16), not with
the episodes or the workers.

A leader that dies (its node lost) costs the chunks it had not yet sent: they are
played again, with the same seeds, by the other leaders, so the weights are the
same as without the fault.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pgpong.chunks import assign_units, chunk_sizes, shares, split
from pgpong.policy import Params
from pgpong.pool.base import (
    BatchMeasures,
    Finished,
    Limits,
    PlayedBatch,
    PoolError,
    WorkerSettings,
    failure_reason,
    ignore_episode,
)
from pgpong.pool.ray_pool import RayPool
from pgpong.pool.sums import ChunkResult, sum_in_chunks
from pgpong.pool.worker import PublishedWeights, WorkerKind, publish, worker_env
from pgpong.rollout import EpisodeId, MatchResult


@dataclass
class NodeChunk:
    """A chunk's sum as a node's leader sends it, with what its pool says so far."""

    chunk: ChunkResult
    barrier_s: float  # the node's barrier in this batch (final with the node's last chunk)
    replaced: int  # workers the node's pool has replaced since it started


_ENDED, _LOST = object(), object()  # what ClusterPool._next says instead of a result


class NodeLeader:
    """Runs on one node with no CPU of its own: that node's rollout workers, and the
    sums of the chunks they play."""

    def __init__(self, settings: WorkerSettings, workers: int, kind: WorkerKind, limits: Limits):
        import ray

        self.node_id = ray.get_runtime_context().get_node_id()
        self.pool = RayPool(settings, workers, kind=kind, node_id=self.node_id, limits=limits)

    def ready(self) -> tuple[str, int]:
        """This leader's node and how many of its workers run."""
        return self.node_id, self.pool.num_workers

    def play(self, published: PublishedWeights, chunks: list[list[EpisodeId]]) -> Iterator[Any]:
        """Play the chunks' episodes on this node's workers, all at once; yield each
        chunk's sum as it completes, in the order given, as a reference into this
        node's object store: the driver reads it from its own node's store, where
        Ray's object manager (not the driver) copies it, instead of receiving it in
        a reply (about half the driver's CPU per chunk, measured)."""
        import ray

        measures = BatchMeasures()
        episodes = [episode for chunk in chunks for episode in chunk]
        played = self.pool.run_batch("play", published, episodes, measures=measures)
        for chunk in sum_in_chunks(played, [len(chunk) for chunk in chunks]):
            yield ray.put(NodeChunk(chunk, measures.barrier_s or 0.0, self.pool.replaced))

    def evaluate(self, published: PublishedWeights, units: list[list[EpisodeId]], greedy: bool) -> Iterator[list]:
        """Play the matches of each unit; yield each unit's results as it completes."""
        matches = [match for unit in units for match in unit]
        results = self.pool.run_batch("evaluate", published, matches, greedy)
        for unit in units:
            yield [next(results) for _ in unit]

    def call_all(self, method: str, *args: Any) -> list:
        return self.pool.call_all(method, *args)

    def close(self) -> None:
        self.pool.close()


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
                settings, count, kind, limits
            )
            for (node, _), count in zip(nodes, counts, strict=True)
            if count
        ]
        self._leaders: dict[Any, int] = {}  # leader -> its running workers
        self._lost_replaced = 0  # workers that went with a lost leader
        try:
            started = ray.get([leader.ready.remote() for leader in leaders], timeout=limits.start_s)
        except ray.exceptions.RayError as exc:
            for leader in leaders:
                ray.kill(leader)
            raise PoolError(f"a node's leader could not start its rollout workers: {failure_reason(exc)}") from None
        for leader, (_, running) in zip(leaders, started, strict=True):
            self._leaders[leader] = running
        self._replaced: dict[Any, int] = dict.fromkeys(self._leaders, 0)

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
    ) -> PlayedBatch:
        measures = BatchMeasures()
        published, seconds = publish(weights)
        measures.add_seconds("publish weights", seconds)

        def chunks() -> Iterator[ChunkResult]:
            replaced = self.replaced
            for chunk in self._run("play", published, split(episodes, chunk_sizes(len(episodes))), measures=measures):
                measures.bytes_in += chunk.nbytes
                measures.replaced = self.replaced - replaced
                for result in chunk.episodes:
                    finished(result)
                yield chunk

        return PlayedBatch(chunks(), measures)

    def evaluate(self, weights: Params, matches: list[EpisodeId], greedy: bool = False) -> Iterator[MatchResult]:
        units = split(matches, chunk_sizes(len(matches)))
        for unit in self._run("evaluate", publish(weights)[0], units, greedy):
            yield from unit

    def _run(
        self,
        method: str,
        published: PublishedWeights,
        units: list[list[EpisodeId]],
        *args: Any,
        measures: BatchMeasures | None = None,
    ) -> Iterator:
        """Hand the units to the leaders in proportion to their workers, call
        NodeLeader.`method` on each leader's units (a stream: one result per unit),
        and yield the results in unit order. The units of a leader that dies go to
        the others. `measures` gets the batch's barrier."""
        stall_s = self._limits.stall_s
        streams: dict[Any, tuple[Any, list[int]]] = {}  # stream -> (leader, positions not yet received)

        def hand_out(positions: list[int]) -> None:
            for leader, mine in self._assign(positions).items():
                streams[self._call(leader, method, published, [units[p] for p in mine], *args)] = (leader, mine)

        hand_out(list(range(len(units))))
        received: dict[int, Any] = {}
        ends: dict[Any, tuple[float, float]] = {}  # leader -> when its last unit came in, its barrier
        next_out, last_progress = 0, time.monotonic()
        while next_out < len(units):
            ready, _ = self._ray.wait(list(streams), num_returns=1, timeout=1.0)
            for stream in ready:
                leader, positions = streams[stream]
                result = self._next(stream, leader)
                if result is _ENDED or result is _LOST:
                    del streams[stream]
                    if result is _LOST:  # its units not yet received go to the other leaders
                        hand_out(positions)
                    continue
                if isinstance(result, NodeChunk):
                    self._replaced[leader] = result.replaced
                    if len(positions) == 1:  # the leader's last
                        ends[leader] = (time.perf_counter(), result.barrier_s)
                    result = result.chunk
                received[positions.pop(0)] = result
                last_progress = time.monotonic()
            while next_out in received:
                yield received.pop(next_out)
                next_out += 1
            if time.monotonic() - last_progress > stall_s:
                raise PoolError(f"no chunk finished in {stall_s:.0f} s; giving up")
        if measures is not None:
            end = time.perf_counter()
            idle = sum(self._leaders.get(lead, 0) * (barrier + end - t) for lead, (t, barrier) in ends.items())
            measures.barrier_s = idle / max(1, self.num_workers)

    def _next(self, stream: Any, leader: Any) -> Any:
        """The stream's next result (fetched from the leader's node when it is a
        reference), _ENDED when the stream has ended, _LOST when its leader is lost."""
        ray = self._ray
        try:
            result = ray.get(next(stream))
            if isinstance(result, ray.ObjectRef):  # a chunk sum in the leader's object store
                result = ray.get(result, timeout=self._limits.stall_s)
            return result
        except StopIteration:
            return _ENDED
        except ray.exceptions.RayTaskError as exc:  # the leader itself gave up (workers keep failing)
            raise PoolError(failure_reason(exc)) from None
        except ray.exceptions.RayError as exc:  # the leader or its node is lost
            self._lost(leader, exc)
            return _LOST

    def _assign(self, positions: list[int]) -> dict[Any, list[int]]:
        """The units at `positions` handed to the leaders (assign_units)."""
        if not self._leaders:
            raise PoolError("every node's leader is lost: no rollout worker is left")
        leaders = list(self._leaders)
        given = assign_units(len(positions), [self._leaders[lead] for lead in leaders])
        return {lead: [positions[i] for i in mine] for lead, mine in zip(leaders, given, strict=True) if mine}

    def _lost(self, leader: Any, exc: BaseException) -> None:
        if leader in self._leaders:
            self._lost_replaced += self._leaders.pop(leader)
            self._replaced.pop(leader, None)
            self._ray.kill(leader, no_restart=True)
        if not self._leaders:
            raise PoolError(f"every node's leader is lost: {failure_reason(exc)}")

    def _call(self, leader: Any, method: str, *args: Any) -> Any:
        """NodeLeader.`method`(*args) on `leader`, its results as a stream."""
        return getattr(leader, method).options(num_returns="streaming").remote(*args)

    def call_all(self, method: str, *args: Any) -> list:
        """Call a worker method on every running worker of every node; answers in order."""
        answers = self._ray.get(
            [lead.call_all.remote(method, *args) for lead in self._leaders], timeout=self._limits.stall_s
        )
        return [answer for node in answers for answer in node]

    def close(self) -> None:
        for leader in self._leaders:
            with contextlib.suppress(self._ray.exceptions.RayError):
                self._ray.get(leader.close.remote(), timeout=10)
            self._ray.kill(leader)
        self._leaders = {}


def nodes_with_cpus() -> list[tuple[str, int]]:
    """(node id, CPUs) of the cluster's live nodes that have CPUs, head first."""
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) >= 1]
    nodes.sort(key=lambda n: not n.get("Resources", {}).get("node:__internal_head__"))
    return [(n["NodeID"], int(n["Resources"]["CPU"])) for n in nodes]
