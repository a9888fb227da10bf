"""The pool on one node: long-lived Ray actors, one CPU each (Crew), and the batch
played on them (RayPool), each match on the first free worker. The weights are
published once per batch.

A worker that dies (crash, kill, lost node) is replaced and its episode played again
with the same seed, by whichever worker is free first; a replacement gets work only
once it is running, so a lost node never stalls the batch. Given a node id, every
worker is started on that node (a node leader's pool, cluster_pool.py).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Protocol, cast

from pgpong.cluster import cluster_cpus
from pgpong.policy import Params
from pgpong.pool.base import (
    BatchMeasures,
    BatchResult,
    Finished,
    InOrder,
    Job,
    Limits,
    OneBatchAtATime,
    PoolError,
    WorkerSettings,
    failure_reason,
    ignore_episode,
)
from pgpong.pool.handout import LOOKAHEAD, HandOut, Watch
from pgpong.pool.sums import SUMMING, ExactSum, Played
from pgpong.pool.worker import RolloutWorker, Slot, WorkerKind, process_of, publish, worker_env
from pgpong.rollout import EpisodeId, MatchResult


class Crew:
    """The rollout workers of a pool: started (each one, or a process of several),
    counted when running, replaced when they die."""

    def __init__(self, settings: WorkerSettings, size: int, kind: WorkerKind, node_id: str | None, limits: Limits):
        import ray

        self._ray = ray
        self.kind = kind
        self.size = size
        options: dict[str, Any] = {"num_cpus": kind.cpus(kind.per_process), "runtime_env": {"env_vars": worker_env()}}
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
        for start in range(0, size, kind.per_process):  # the last process may stand in for fewer
            self._start_actor(min(kind.per_process, size - start))
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

    def _start_actor(self, slots: int) -> None:
        """A process for `slots` workers (one, unless bench simulates several in one)."""
        kind, actor_class = self.kind, self._actor_class
        if slots != kind.per_process:
            actor_class = actor_class.options(num_cpus=kind.cpus(slots), max_concurrency=slots * LOOKAHEAD + 4)
        actor = actor_class.remote(self._settings, *kind.args)
        workers = [actor] if kind.per_process == 1 else [Slot(actor, i) for i in range(slots)]
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
                self._start_actor(len(workers))
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
        self._start_actor(len(gone))
        self.replaced += len(gone)
        return gone

    def close(self) -> None:
        for process in {process_of(w) for w in self.ready} | {process_of(ws[0]) for ws in self.starting.values()}:
            self._ray.kill(process)
        self.ready, self.starting = [], {}


HANDING_OUT = "hand out matches"  # launching the workers' calls
RECEIVING = "receive results"  # fetching what they return


class Feed(Protocol):
    """Episodes for a run that come from elsewhere as it goes (a cluster's queue)."""

    remaining: int  # episodes still elsewhere, as last heard

    @property
    def playable(self) -> int: ...  # of those, the episodes whose weights are out (not of an announced batch)

    @property
    def exhausted(self) -> bool: ...  # nothing more will come: the run ends once its episodes are done

    def pending(self) -> list: ...  # the requests in flight, to wait on

    def ask(self, local: int, free: int, busy: int, room: int) -> None: ...  # ask for more if `local` ones are too few

    def behind(self, key: Any) -> bool: ...  # the episode waits, and may wait behind a playing one (HandOut)

    def tidy(self, todo: deque) -> None: ...  # drop from `todo` what is no longer wanted

    def receive(self, ref: Any) -> list | None: ...  # what a finished request brought (None: not ours)

    def waits(self, key: Any) -> bool: ...  # the episode's weights are still to come (an announced batch)


class RayPool(OneBatchAtATime):
    """Long-lived Ray actors, one CPU each, playing the batches: each episode to the
    first free worker."""

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
        self._waiting = {}
        self._hand: HandOut | None = None  # the hand-out of the run in progress
        self._running: dict = {}  # the calls in flight of the run in progress
        self.crew = Crew(settings, num_workers or cluster_cpus(), kind or WorkerKind(RolloutWorker), node_id, limits)

    @property
    def num_workers(self) -> int:
        return len(self.crew.ready)

    @property
    def replaced(self) -> int:
        return self.crew.replaced

    def play_batch(
        self, weights: Params, episodes: list[EpisodeId], finished: Finished = ignore_episode
    ) -> BatchResult:
        """Play the batch; its gradients' exact sum, added here as the matches come in."""
        measures = BatchMeasures()
        published, seconds = publish(weights)
        measures.add_seconds("publish weights", seconds)
        replaced, total, in_order = self.replaced, ExactSum(weights.hidden), InOrder(finished)
        job = ("play", published, ())
        for position, played in self.run(deque(enumerate(episodes)), lambda key: job, measures=measures):
            total.add(played.grad)
            in_order.add(position, played.stats)
        grad = total.rounded()
        measures.add_seconds(SUMMING, total.seconds)
        measures.replaced = self.replaced - replaced
        return BatchResult(grad, measures)

    def evaluate(self, weights: Params, matches: list[EpisodeId], greedy: bool = False) -> Iterator[MatchResult]:
        results: dict[int, MatchResult] = {}
        next_out = 0
        job = ("evaluate", publish(weights)[0], (greedy,))
        for position, result in self.run(deque(enumerate(matches)), lambda key: job):
            results[position] = result
            while next_out in results:
                yield results.pop(next_out)
                next_out += 1

    def run(
        self,
        todo: deque,
        job: Callable[[Any], Job],
        measures: BatchMeasures | None = None,
        feed: Feed | None = None,
    ) -> Iterator[tuple[Any, Any]]:
        """For every (key, episode) of `todo`, and of what `feed` brings, call
        RolloutWorker.`method`(published, episode, *args), where (method, published,
        args) = job(key), each on the first free worker; yield (key, result) as each
        finishes. `measures` gets the bytes received and the barrier."""
        ray, crew, stall_s = self._ray, self.crew, self._limits.stall_s
        measures = measures or BatchMeasures()
        hand = HandOut(crew.ready)
        running: dict = {}  # task ref -> (worker, key, episode)
        last_progress = time.monotonic()
        more = lambda: feed is not None and not feed.exhausted  # noqa: E731
        watch = self._watch.new_batch()
        self._hand, self._running = hand, running
        waits = feed.waits if feed is not None else lambda key: False
        while todo or running or more():
            began = time.perf_counter()
            self._hand_out(todo, job, running, hand, feed)
            measures.add_seconds(HANDING_OUT, time.perf_counter() - began)
            for worker in watch.stuck():  # its calls fail now, and go to the dead-worker path below
                ray.kill(process_of(worker), no_restart=True)
                watch.forget(worker)
            waiting = [*running, *crew.starting, *(feed.pending() if feed is not None else ())]
            # The first ready, with every other one ready by now: at a batch's end results
            # come in bursts, and a pass of this loop for each (its requests, hand-out and
            # wait) held the last ones back by about 8 ms at 1x64 (docs/SCALING.md).
            done, rest = ray.wait(waiting, num_returns=1, timeout=1.0)
            if done and rest:
                done += ray.wait(rest, num_returns=len(rest), timeout=0)[0]
            for ref in done:
                if ref not in running:  # a worker that started, or the feed's answer
                    self._arrived(ref, hand, todo, feed)
                    continue
                worker, key, episode = running.pop(ref)
                began = time.perf_counter()
                result = self._result(ref, worker, hand)
                measures.add_seconds(RECEIVING, time.perf_counter() - began)
                if result is None:  # its worker died (or was stuck): played again, with the same seed
                    watch.forget(worker)
                    todo.appendleft((key, episode))
                    continue
                measures.bytes_in += _grad_bytes(result)
                last_progress = time.monotonic()
                playable = feed.playable if feed is not None else 0  # (matches whose weights are out)
                hand.back(worker, idle=not playable and (not todo or all(waits(key) for key, _ in todo)), waits=waits)
                watch.done(worker, busy=hand.busy(worker))
                yield key, result
            if not running and not todo and not more():  # the slowest episode is in: the barrier is over
                measures.barrier_s = hand.idle_seconds() / max(1, len(crew.ready))
            if len(running) <= hand.parked() and all(waits(key) for key, _ in todo):
                last_progress = time.monotonic()  # waiting for the feed or for weights: for the next batch
            if time.monotonic() - last_progress > stall_s:
                raise PoolError(f"no episode finished in {stall_s:.0f} s; giving up")
            if not crew.ready and not crew.starting:
                raise PoolError("no rollout worker is left")

    def _hand_out(
        self, todo: deque, job: Callable[[Any], Job], running: dict, hand: HandOut, feed: Feed | None
    ) -> None:
        """Call the workers of what can go now (each episode to the first free worker,
        or behind a playing one); then ask the feed for more, for the free workers left
        or the room behind the playing ones."""
        if feed is None:
            self._start(hand.out(todo), job, running, lambda key: False)
            return
        feed.tidy(todo)
        self._start(hand.out(todo, feed.playable, feed.waits, feed.behind), job, running, feed.waits)
        feed.ask(len(todo), hand.free(), len(running), hand.room_behind())

    def _start(
        self, handed: Iterator[tuple[Any, Any]], job: Callable[[Any], Job], running: dict, waits: Callable
    ) -> None:
        """Call the worker of each episode handed out (`running` gets the call); it is
        watched from now on, or, waiting for its weights, once they come."""
        for worker, (key, episode) in handed:
            method, published, args = job(key)
            # The episode as a list of numbers, which Ray's msgpack packs itself (a
            # named tuple it pickles: about 15 us of this loop's 100 per call).
            running[getattr(worker, method).remote(published, list(episode), *args)] = (worker, key, episode)
            if not waits(key):
                self._watch.busy(worker)

    def ended(self, which: Callable[[Any], bool]) -> int:
        """How many calls in flight of the run in progress, of the keys `which` takes,
        have ended, their results not yet read (nothing is fetched to know it)."""
        refs = [ref for ref, (_, key, _) in self._running.items() if which(key)]
        return len(self._ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)[0]) if refs else 0

    def idle_seconds(self) -> float:
        """The seconds the workers of the run in progress have been idle, with nothing
        left to hand out, so far (summed over them)."""
        return self._hand.idle_seconds() if self._hand is not None else 0.0

    def _arrived(self, ref: Any, hand: HandOut, todo: deque, feed: Feed | None) -> None:
        """A worker has started (it joins the hand-out), or the feed brought episodes."""
        if ref in self.crew.starting:
            for worker in self.crew.poll_starting(timeout=0):
                hand.join(worker)
        elif feed is not None:
            todo.extend(feed.receive(ref) or ())
            for worker in hand.unpark(feed.waits):  # (if it was an announced batch's weights that came)
                self._watch.busy(worker)

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
    return result.grad.nbytes if isinstance(result, Played) else 0
