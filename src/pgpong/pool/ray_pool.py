"""The pool on one node: long-lived Ray actors, one CPU each (Crew), and the batch
played on them (RayPool). The weights are published once per batch.

A worker that dies (crash, kill, lost node) is replaced and its episode played again
with the same seed, by whichever worker is free first; a replacement gets work only
once it is running, so a lost node never stalls the batch. Given a node id, every
worker is started on that node (a node leader's pool, cluster_pool.py).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from typing import Any, cast

from pgpong.chunks import chunk_sizes
from pgpong.cluster import cluster_cpus
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
from pgpong.pool.handout import LOOKAHEAD, HandOut, Watch
from pgpong.pool.sums import SUMMING, sum_in_chunks
from pgpong.pool.worker import PublishedWeights, RolloutWorker, Slot, WorkerKind, process_of, publish, worker_env
from pgpong.rollout import EpisodeId, MatchResult


class Crew:
    """The rollout workers of a pool: started (each one, or a process of several),
    counted when running, replaced when they die."""

    def __init__(self, settings: WorkerSettings, size: int, kind: WorkerKind, node_id: str | None, limits: Limits):
        import ray

        self._ray = ray
        self.kind = kind
        self.size = size
        options: dict[str, Any] = {"num_cpus": kind.per_process, "runtime_env": {"env_vars": worker_env()}}
        if kind.per_process > 1:  # its slots' calls run side by side, each in a thread
            options["max_concurrency"] = kind.per_process * LOOKAHEAD + 4
        if node_id is not None:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id, soft=False)
        self._actor_class: Any = ray.remote(**options)(kind.worker_class)
        self._settings = settings
        self.replaced = 0
        self._failures = 0  # deaths since the last episode that finished
        self.ready: list = []  # running workers
        self.starting: dict = {}  # pid() ref -> the workers of a process still starting
        for _ in range(-(-size // kind.per_process)):
            self._start_actor()
        # Wait for every worker, but once one runs, only a little longer for the rest:
        # those that cannot be placed yet join the batches when they start.
        deadline = time.monotonic() + limits.start_s
        while self.starting and (not self.ready or time.monotonic() < deadline):
            if not self.ready and time.monotonic() > deadline:
                raise PoolError(
                    f"no rollout worker started within {limits.start_s:.0f} s (no CPU free in the cluster?)"
                )
            self.poll_starting(timeout=0.5)
            if self.ready:
                deadline = min(deadline, time.monotonic() + limits.start_grace_s)

    def _start_actor(self) -> None:
        kind = self.kind
        actor = self._actor_class.remote(self._settings, *kind.args)
        workers = [actor] if kind.per_process == 1 else [Slot(actor, i) for i in range(kind.per_process)]
        self.starting[cast(Any, workers[0]).pid.remote()] = workers

    def poll_starting(self, timeout: float) -> list:
        """Move workers whose start has finished into the ready list (or count the
        failure); the workers that became ready."""
        done, _ = self._ray.wait(list(self.starting), num_returns=len(self.starting), timeout=timeout)
        started = []
        for ref in done:
            workers = self.starting.pop(ref)
            try:
                self._ray.get(ref)
            except self._ray.exceptions.RayError as exc:
                self.failed(exc, "a rollout worker could not start")
                self._start_actor()
            else:
                self.ready.extend(workers)
                started.extend(workers)
        return started

    def failed(self, exc: BaseException, what: str) -> None:
        self._failures += 1
        if self._failures > max(3, 2 * self.size):
            raise PoolError(f"{what}, {self._failures} times in a row: {failure_reason(exc)}") from None

    def succeeded(self) -> None:
        self._failures = 0

    def replace(self, dead: Any) -> list:
        """Replace the process of a dead worker; the workers that went with it."""
        process = process_of(dead)
        gone = [worker for worker in self.ready if process_of(worker) == process] or [dead]
        self.ready = [worker for worker in self.ready if process_of(worker) != process]
        self._ray.kill(process, no_restart=True)
        self._start_actor()
        self.replaced += len(gone)
        return gone

    def close(self) -> None:
        for process in {process_of(w) for w in self.ready} | {process_of(ws[0]) for ws in self.starting.values()}:
            self._ray.kill(process)
        self.ready, self.starting = [], {}


class RayPool:
    """Long-lived Ray actors, one CPU each, playing the batches: each episode to the
    first free worker, results in episode order."""

    def __init__(
        self,
        settings: WorkerSettings,
        num_workers: int | None = None,
        kind: WorkerKind | None = None,
        node_id: str | None = None,
        limits: Limits | None = None,
    ):
        import ray

        self._ray = ray
        self._limits = limits = limits or Limits()
        self._watch = Watch(limits.stuck_floor_s, limits.stuck_multiple)
        self.crew = Crew(settings, num_workers or cluster_cpus(), kind or WorkerKind(RolloutWorker), node_id, limits)

    @property
    def num_workers(self) -> int:
        return len(self.crew.ready)

    @property
    def replaced(self) -> int:
        return self.crew.replaced

    def play_batch(
        self, weights: Params, episodes: list[EpisodeId], finished: Finished = ignore_episode
    ) -> PlayedBatch:
        measures = BatchMeasures()
        published, seconds = publish(weights)
        measures.add_seconds("publish weights", seconds)

        def chunks() -> Iterator:
            replaced = self.replaced
            played = self.run_batch("play", published, episodes, measures=measures)
            for chunk in sum_in_chunks(played, chunk_sizes(len(episodes)), finished):
                measures.add_seconds(SUMMING, chunk.sum_s)
                measures.replaced = self.replaced - replaced
                yield chunk

        return PlayedBatch(chunks(), measures)

    def evaluate(self, weights: Params, matches: list[EpisodeId], greedy: bool = False) -> Iterator[MatchResult]:
        return self.run_batch("evaluate", publish(weights)[0], matches, greedy)

    def run_batch(
        self,
        method: str,
        published: PublishedWeights,
        episodes: list[EpisodeId],
        *args: Any,
        measures: BatchMeasures | None = None,
    ) -> Iterator:
        """Call RolloutWorker.`method`(published, episode, *args) for every episode;
        yield the results in episode order. `measures` gets the bytes received and
        the barrier."""
        ray, crew, stall_s = self._ray, self.crew, self._limits.stall_s
        measures = measures or BatchMeasures()
        todo = deque(range(len(episodes)))
        hand = HandOut(crew.ready)
        running: dict = {}  # task ref -> (worker, position in episodes)
        finished: dict[int, Any] = {}
        next_out, last_progress = 0, time.monotonic()

        watch = self._watch.new_batch()
        while next_out < len(episodes):
            for worker, position in hand.out(todo):
                running[getattr(worker, method).remote(published, episodes[position], *args)] = (worker, position)
                watch.busy(worker)
            for worker in watch.stuck():  # its calls fail now, and go to the dead-worker path below
                ray.kill(process_of(worker), no_restart=True)
                watch.forget(worker)
            done, _ = ray.wait([*running, *crew.starting], num_returns=1, timeout=1.0)
            for ref in done:
                if ref in crew.starting:
                    for worker in crew.poll_starting(timeout=0):
                        hand.join(worker)
                    continue
                worker, position = running.pop(ref)
                result = self._result(ref, worker, hand)
                if result is None:  # its worker died (or was stuck): played again, with the same seed
                    watch.forget(worker)
                    todo.appendleft(position)
                    continue
                finished[position] = result
                measures.bytes_in += _grad_bytes(result)
                last_progress = time.monotonic()
                hand.back(worker, idle=not todo)
                watch.done(worker, busy=hand.held.get(worker, 0) > 0)
            if not running and not todo:  # the slowest episode is in: the barrier is over
                measures.barrier_s = hand.idle_seconds() / max(1, len(crew.ready))
            while next_out in finished:
                yield finished.pop(next_out)
                next_out += 1
            if time.monotonic() - last_progress > stall_s:
                raise PoolError(f"no episode finished in {stall_s:.0f} s; giving up")
            if not crew.ready and not crew.starting:
                raise PoolError("no rollout worker is left")

    def _result(self, ref: Any, worker: Any, hand: HandOut) -> Any:
        """The task's result, or None if its worker died (replaced here, once per death)."""
        try:
            result = self._ray.get(ref)
        except self._ray.exceptions.RayError as exc:
            if worker in hand.held:  # its queued episode fails too: one death, one replacement
                for gone in self.crew.replace(worker):
                    hand.leave(gone)
                self.crew.failed(exc, "rollout workers keep failing")
            return None
        self.crew.succeeded()
        return result

    def nodes(self) -> int:
        """How many Ray nodes the running workers are spread over."""
        return len(set(self.call_all("node_id")))

    def blas_threads(self) -> list[list[int]]:
        return self.call_all("blas_threads")

    def call_all(self, method: str, *args: Any) -> list:
        """Call a RolloutWorker method on every running worker at once; answers in order."""
        calls = [getattr(worker, method).remote(*args) for worker in self.crew.ready]
        return self._ray.get(calls, timeout=self._limits.stall_s)

    def close(self) -> None:
        self.crew.close()


def _grad_bytes(result: Any) -> int:
    grad = getattr(result, "grad", None)
    return grad.nbytes if grad is not None else 0
