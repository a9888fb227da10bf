"""The pool for a cluster of several nodes: a leader on each node, chunks handed to nodes.

The driver does not talk to every rollout worker: each node has a leader (an actor
with no CPU of its own) that starts the node's workers, plays the episodes of the
chunks it is given on them (workers.RayPool, with everything it does about dead
workers), and sums each chunk in episode order (reduce.py). The driver hands each
node a share of the batch's chunks in proportion to its workers, receives one
array per chunk as the chunks finish (Ray streams them from the leader), adds them
in chunk order, and hears of each episode only with its chunk. So what the driver
receives and does per update grows with the chunks (batch / 16), not with the
episodes or the workers.

A leader that dies (its node lost) costs the chunks it had not yet sent: they are
played again, with the same seeds, by the other leaders, so the weights are the
same as without the fault.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

from pgpong.policy import Params
from pgpong.reduce import ChunkResult, chunk_sizes, split, sum_in_chunks
from pgpong.rollout import EpisodeId, MatchResult
from pgpong.workers import (
    ONE_THREAD,
    STALL_SECONDS,
    START_SECONDS,
    TEST_FAULT,
    Finished,
    PoolError,
    PublishedWeights,
    RayPool,
    WorkerKind,
    WorkerSettings,
    failure_reason,
    ignore_episode,
    publish,
)


class NodeLeader:
    """Runs on one node with no CPU of its own: that node's rollout workers, and the
    sums of the chunks they play."""

    def __init__(self, settings: WorkerSettings, workers: int, kind: WorkerKind):
        import ray

        self.node_id = ray.get_runtime_context().get_node_id()
        self.pool = RayPool(settings, workers, kind=kind, node_id=self.node_id)

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

        episodes = [episode for chunk in chunks for episode in chunk]
        played = self.pool.run_batch("play", published, episodes)
        for chunk in sum_in_chunks(played, [len(chunk) for chunk in chunks], info=self._info):
            yield ray.put(chunk)

    def evaluate(self, published: PublishedWeights, units: list[list[EpisodeId]], greedy: bool) -> Iterator[list]:
        """Play the matches of each unit; yield each unit's results as it completes."""
        matches = [match for unit in units for match in unit]
        results = self.pool.run_batch("evaluate", published, matches, greedy)
        for unit in units:
            yield [next(results) for _ in unit]

    def _info(self) -> dict[str, float]:
        return {
            "barrier": self.pool.last_batch_seconds.get("barrier", 0.0),
            "replaced": self.pool.replaced,
            "bytes": self.pool.last_batch_bytes,
        }

    def call_all(self, method: str, *args) -> list:
        return self.pool.call_all(method, *args)

    def close(self) -> None:
        self.pool.close()


class ClusterPool:
    """A leader per node of the cluster, each with its node's share of the workers."""

    def __init__(self, settings: WorkerSettings, num_workers: int, kind: WorkerKind | None = None):
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self._ray = ray
        kind = kind or WorkerKind()
        nodes = nodes_with_cpus()
        shares = _shares(num_workers, [cpus for _, cpus in nodes])
        env_vars = {**ONE_THREAD, **{k: v for k, v in os.environ.items() if k == TEST_FAULT}}
        leader_class: Any = ray.remote(num_cpus=0, runtime_env={"env_vars": env_vars})(NodeLeader)
        leaders = [
            leader_class.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(
                settings, share, kind
            )
            for (node, _), share in zip(nodes, shares, strict=True)
            if share
        ]
        self._leaders: dict[Any, int] = {}  # leader -> its running workers
        self._lost_replaced = 0  # workers that went with a lost leader
        try:
            started = ray.get([leader.ready.remote() for leader in leaders], timeout=START_SECONDS)
        except ray.exceptions.RayError as exc:
            for leader in leaders:
                ray.kill(leader)
            raise PoolError(f"a node's leader could not start its rollout workers: {failure_reason(exc)}") from None
        for leader, (_, running) in zip(leaders, started, strict=True):
            self._leaders[leader] = running
        self._replaced: dict[Any, float] = dict.fromkeys(self._leaders, 0)
        self.last_batch_seconds: dict[str, float] = {}
        self.last_batch_bytes = 0

    @property
    def num_workers(self) -> int:
        return sum(self._leaders.values())

    @property
    def replaced(self) -> int:
        return int(sum(self._replaced.values())) + self._lost_replaced

    def nodes(self) -> int:
        return len(self._leaders)

    def publish(self, weights: Params) -> PublishedWeights:
        published, self.last_batch_seconds = publish(weights)
        return published

    def play_batch(
        self, weights: Params, episodes: list[EpisodeId], finished: Finished = ignore_episode
    ) -> Iterator[ChunkResult]:
        self.last_batch_bytes = 0
        for chunk in self._run("play", self.publish(weights), split(episodes, chunk_sizes(len(episodes)))):
            self.last_batch_bytes += chunk.nbytes
            for result in chunk.episodes:
                finished(result)
            yield chunk

    def evaluate(self, weights: Params, matches: list[EpisodeId], greedy: bool = False) -> Iterator[MatchResult]:
        units = split(matches, chunk_sizes(len(matches)))
        for unit in self._run("evaluate", self.publish(weights), units, greedy):
            yield from unit

    def _run(self, method: str, published: PublishedWeights, units: list[list[EpisodeId]], *args) -> Iterator:
        """Hand the units to the leaders in proportion to their workers, call
        NodeLeader.`method` on each leader's units (a stream: one result per unit),
        and yield the results in unit order. The units of a leader that dies go to
        the others."""
        ray = self._ray
        streams: dict[Any, tuple[Any, list[int]]] = {}  # stream -> (leader, positions not yet received)
        for leader, positions in self._assign(list(range(len(units)))).items():
            streams[self._call(leader, method, published, [units[p] for p in positions], *args)] = (leader, positions)
        received: dict[int, Any] = {}
        done_at: dict[Any, float] = {}  # leader -> when its last unit came in
        barrier: dict[Any, float] = {}
        next_out, last_progress = 0, time.monotonic()
        while next_out < len(units):
            ready, _ = ray.wait(list(streams), num_returns=1, timeout=1.0)
            for stream in ready:
                leader, positions = streams[stream]
                try:
                    result = ray.get(next(stream))
                    if isinstance(result, ray.ObjectRef):  # a chunk sum in the leader's object store
                        result = ray.get(result, timeout=STALL_SECONDS)
                except StopIteration:
                    del streams[stream]
                    continue
                except ray.exceptions.RayTaskError as exc:  # the leader itself gave up (workers keep failing)
                    raise PoolError(failure_reason(exc)) from None
                except ray.exceptions.RayError as exc:  # the leader or its node is lost
                    del streams[stream]
                    self._lost(leader, exc)
                    for other, mine in self._assign(positions).items():
                        streams[self._call(other, method, published, [units[p] for p in mine], *args)] = (other, mine)
                    continue
                received[positions.pop(0)] = result
                last_progress = time.monotonic()
                if isinstance(result, ChunkResult) and not positions:
                    done_at[leader] = time.perf_counter()
                    barrier[leader] = result.info.get("barrier", 0.0)
                    self._replaced[leader] = result.info.get("replaced", 0.0)
            while next_out in received:
                yield received.pop(next_out)
                next_out += 1
            if time.monotonic() - last_progress > STALL_SECONDS:
                raise PoolError(f"no chunk finished in {STALL_SECONDS:.0f} s; giving up")
        end = time.perf_counter()
        idle = sum(self._leaders.get(lead, 0) * (barrier[lead] + end - t) for lead, t in done_at.items())
        self.last_batch_seconds["barrier"] = idle / max(1, self.num_workers)

    def _assign(self, positions: list[int]) -> dict[Any, list[int]]:
        """The units at `positions` handed to the leaders (assign_units)."""
        if not self._leaders:
            raise PoolError("every node's leader is lost: no rollout worker is left")
        leaders = list(self._leaders)
        shares = assign_units(len(positions), [self._leaders[lead] for lead in leaders])
        return {lead: [positions[i] for i in mine] for lead, mine in zip(leaders, shares, strict=True) if mine}

    def _call(self, leader: Any, method: str, *args) -> Any:
        return getattr(leader, method).options(num_returns="streaming").remote(*args)

    def _lost(self, leader: Any, exc: BaseException) -> None:
        if leader in self._leaders:
            self._lost_replaced += self._leaders.pop(leader)
            self._replaced.pop(leader, None)
            self._ray.kill(leader, no_restart=True)
        if not self._leaders:
            raise PoolError(f"every node's leader is lost: {failure_reason(exc)}")

    def call_all(self, method: str, *args) -> list:
        """Call a worker method on every running worker of every node; answers in order."""
        answers = self._ray.get([lead.call_all.remote(method, *args) for lead in self._leaders], timeout=STALL_SECONDS)
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


def _shares(workers: int, cpus: list[int]) -> list[int]:
    """`workers` spread over nodes with these CPUs: each node's share in proportion
    to its CPUs (largest remainders first), never more than it has."""
    total = sum(cpus)
    workers = min(workers, total)
    exact = [workers * c / total for c in cpus]
    shares = [int(x) for x in exact]
    for i in sorted(range(len(cpus)), key=lambda i: exact[i] - shares[i], reverse=True)[: workers - sum(shares)]:
        shares[i] += 1
    return shares


def assign_units(units: int, workers: list[int]) -> list[list[int]]:
    """Units 0..units-1, in order, each to the leader with the fewest units per
    worker once it has it (the first such leader on a tie): which units each
    leader plays. The scaling model (scaling.py) uses the same rule."""
    given: list[list[int]] = [[] for _ in workers]
    for unit in range(units):
        best = min(range(len(workers)), key=lambda i: (len(given[i]) + 1) / workers[i])
        given[best].append(unit)
    return given
