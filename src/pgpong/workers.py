"""The pools that play a batch's episodes on one node: RayPool (actors) and LocalPool
(in-process); leaders.py has the pool for several nodes.

A pool takes the weights and a list of episode ids, takes the results in episode
order, whatever order they finish in, and yields the batch's chunk sums (reduce.py),
so the sum of gradients is the same for any number of workers.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, cast

from threadpoolctl import threadpool_info, threadpool_limits

from pgpong.cluster import cluster_cpus, start_ray
from pgpong.envs import make_env
from pgpong.policy import Params
from pgpong.reduce import ChunkResult, chunk_sizes, sum_in_chunks
from pgpong.rollout import (
    EpisodeId,
    EpisodeResult,
    EpisodeStats,
    MatchResult,
    compile_kernels,
    play_episode,
    play_match,
)

# One BLAS/OpenMP thread per worker process: many processes with many threads each
# make the parallel version no faster than the serial one.
ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
# No result at all for this long means something is stuck, not slow: even a
# 108,000-step PongNoFrameskip match takes about a minute.
STALL_SECONDS = 600.0
# A worker that has returned nothing for STUCK_MULTIPLE times the longest episode so
# far (and at least STUCK_FLOOR_SECONDS) is stuck: it is ended, and its episodes are
# played again elsewhere with the same seeds.
STUCK_MULTIPLE = 10.0
STUCK_FLOOR_SECONDS = 60.0
START_SECONDS = 120.0
START_GRACE_SECONDS = 15.0  # how long the other workers may lag the first one at start
# More workers than this on one node also get a leader (leaders.py): the driver then
# hears of chunks, not of every episode.
LEADERS_ABOVE = 16
LOOKAHEAD = 2  # episodes a worker may hold at once: the one it plays and the next
# Tests set this to make workers fail on purpose; nothing else reads it.
TEST_FAULT = "_PGPONG_TEST_FAULT"


@dataclass(frozen=True)
class WorkerSettings:
    """What every rollout worker is built from: the game and how episodes are scored."""

    env_id: str = "ALE/Pong-v5"
    max_episode_steps: int | None = None  # None: full matches
    gamma: float = 0.99


Finished = Callable[[EpisodeStats], None]  # hears each episode of a batch, in episode order


def ignore_episode(episode: EpisodeStats) -> None:
    pass


class PoolError(RuntimeError):
    """The pool cannot finish the batch (workers keep dying, nothing progresses)."""


class Pool(Protocol):
    @property
    def num_workers(self) -> int: ...  # workers running (0: this process, no Ray)

    @property
    def replaced(self) -> int: ...  # workers replaced after a crash, since the pool started

    last_batch_seconds: dict[str, float]  # where the last batch's time went: "publish weights", "barrier"
    last_batch_bytes: int  # gradient bytes the last batch sent into this process

    def nodes(self) -> int: ...

    def play_batch(
        self, weights: Params, episodes: list[EpisodeId], finished: Finished = ignore_episode
    ) -> Iterator[ChunkResult]: ...

    def evaluate(self, weights: Params, matches: list[EpisodeId], greedy: bool = False) -> Iterator[MatchResult]: ...

    def close(self) -> None: ...


class WeightsCache:
    """A worker's copy of the newest published weights: called with the weights or
    their reference, it returns the weights, fetched from the object store only
    when the reference is new."""

    def __init__(self) -> None:
        self._published: tuple[Any, Params] | None = None  # the newest reference, and its weights

    def __call__(self, weights: Params | PublishedWeights) -> Params:
        if isinstance(weights, Params):
            return weights
        if self._published is None or self._published[0] != weights.ref:
            import ray

            self._published = (weights.ref, ray.get(weights.ref, timeout=STALL_SECONDS))
        return self._published[1]


@dataclass(frozen=True)
class PublishedWeights:
    """A batch's weights in Ray's object store, by reference. Ray fetches an object
    for a task only when its reference is a top-level argument; inside this wrapper
    the reference reaches the worker as it is, and the worker fetches the weights
    once a batch instead of once an episode (each fetch asks the raylet: about
    0.6 ms of a worker's pause between two episodes)."""

    ref: Any


def publish(weights: Params) -> tuple[PublishedWeights, dict[str, float]]:
    """The batch's weights in the object store, once (each worker fetches them once),
    and the new batch's phase times, starting with how long that took."""
    import ray

    began = time.perf_counter()
    published = PublishedWeights(ray.put(weights))
    return published, {"publish weights": time.perf_counter() - began}


class RolloutWorker:
    """Plays episodes with one environment, created once and reset for each episode."""

    def __init__(self, settings: WorkerSettings, pin_threads: bool = True):
        _test_fault("start")
        self.settings = settings
        self.env = self._make_env()
        self._weights = WeightsCache()
        compile_kernels()
        if pin_threads:  # after the imports above, which may load BLAS libraries of their own
            threadpool_limits(1)

    def _make_env(self) -> Any:
        return make_env(self.settings.env_id, self.settings.max_episode_steps)

    def play(self, weights: Params | PublishedWeights, episode: EpisodeId) -> EpisodeResult:
        _test_fault("play", episode)
        return play_episode(self.env, self._weights(weights), episode, self.settings.gamma)

    def evaluate(self, weights: Params | PublishedWeights, match: EpisodeId, greedy: bool) -> MatchResult:
        return play_match(self.env, self._weights(weights), match, greedy)

    def pid(self) -> int:
        """This worker's process id; answering it also says the worker has started."""
        return os.getpid()

    def node_id(self) -> str:
        """The Ray node this worker runs on."""
        import ray

        return ray.get_runtime_context().get_node_id()

    def blas_threads(self) -> list[int]:
        return [info["num_threads"] for info in threadpool_info()]


def _test_fault(stage: str, episode: EpisodeId | None = None) -> None:
    """Misbehave on purpose when a test asks: 'start' (the constructor raises),
    'crash:N' (the process kills itself in every episode of batch N and later),
    'slow:K' (episode K of every batch takes 2 s longer), 'hang' (episodes never end),
    'stop:N:FILE' and 'die:N:FILE' (the first worker to play an episode of batch N
    writes its pid to FILE and stops itself with SIGSTOP, like a frozen process, or
    kills itself with SIGKILL), 'mark:N:FILE' (it only writes its pid: the test's
    signal that batch N is being played)."""
    fault = os.environ.get(TEST_FAULT)
    if not fault:
        return
    kind, _, arg = fault.partition(":")
    if kind == "start" and stage == "start":
        raise RuntimeError("test fault: this worker cannot start")
    if stage != "play" or episode is None:
        return
    if kind == "crash" and episode.batch >= int(arg or 0):
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "slow" and episode.episode == int(arg):
        time.sleep(2.0)
    if kind == "hang":
        time.sleep(3600)
    if kind in ("stop", "die", "mark"):
        batch, _, marker = arg.partition(":")
        if episode.batch == int(batch):
            try:
                fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            except FileExistsError:
                return  # another worker froze already
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
            if kind != "mark":
                os.kill(os.getpid(), signal.SIGSTOP if kind == "stop" else signal.SIGKILL)


class LocalPool:
    """Plays the episodes one after another in this process (--workers 0)."""

    num_workers = 0
    replaced = 0
    last_batch_seconds: dict[str, float] = {}
    last_batch_bytes = 0  # nothing crosses a process boundary

    def __init__(self, settings: WorkerSettings):
        self.worker = RolloutWorker(settings, pin_threads=False)
        self._limit = threadpool_limits(1)  # restored by close()

    def play_batch(
        self, weights: Params, episodes: list[EpisodeId], finished: Finished = ignore_episode
    ) -> Iterator[ChunkResult]:
        self.last_batch_seconds = {}
        played = (self.worker.play(weights, episode) for episode in episodes)
        return sum_in_chunks(played, chunk_sizes(len(episodes)), finished, seconds=self.last_batch_seconds)

    def evaluate(self, weights: Params, matches: list[EpisodeId], greedy: bool = False) -> Iterator[MatchResult]:
        for match in matches:
            yield self.worker.evaluate(weights, match, greedy)

    def nodes(self) -> int:
        return 1

    def close(self) -> None:
        self.worker.env.close()
        self._limit.restore_original_limits()


@dataclass(frozen=True)
class WorkerKind:
    """How rollout workers are made: one Ray actor (one process, one CPU) per worker,
    or, for bench's simulation of a big cluster, one process standing in for
    `per_process` workers (it holds that many CPUs, and its methods take the slot)."""

    worker_class: type = RolloutWorker
    per_process: int = 1
    args: tuple = ()  # passed to worker_class after the WorkerSettings


@dataclass(frozen=True)
class Slot:
    """One of the workers a shared process stands in for: calls go to the process's
    method with `slot=index`."""

    actor: Any
    index: int

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        method = getattr(self.actor, name)
        return _SlotMethod(method, self.index)


@dataclass(frozen=True)
class _SlotMethod:
    method: Any
    index: int

    def remote(self, *args: Any) -> Any:
        return self.method.remote(*args, slot=self.index)


def _process(worker: Any) -> Any:
    """The Ray actor a worker lives in."""
    return worker.actor if isinstance(worker, Slot) else worker


class RayPool:
    """Long-lived Ray actors, one CPU each. The weights are published once per batch.

    A worker that dies (crash, kill, lost node) is replaced and its episode played
    again with the same seed, by whichever worker is free first; a replacement gets
    work only once it is running, so a lost node never stalls the batch. Given a
    node id, every worker is started on that node (a node leader's pool, leaders.py).
    """

    def __init__(
        self,
        settings: WorkerSettings,
        num_workers: int | None = None,
        start_timeout: float = START_SECONDS,
        worker_class: type[RolloutWorker] = RolloutWorker,
        kind: WorkerKind | None = None,
        node_id: str | None = None,
        stuck_floor: float = STUCK_FLOOR_SECONDS,
    ):
        import ray

        self._ray = ray
        self._watch = _Watch(stuck_floor, STUCK_MULTIPLE)
        self._kind = kind or WorkerKind(worker_class)
        env_vars = {**ONE_THREAD, **{k: v for k, v in os.environ.items() if k == TEST_FAULT}}
        options: dict[str, Any] = {"num_cpus": self._kind.per_process, "runtime_env": {"env_vars": env_vars}}
        if self._kind.per_process > 1:  # its slots' calls run side by side, each in a thread
            options["max_concurrency"] = self._kind.per_process * LOOKAHEAD + 4
        if node_id is not None:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id, soft=False)
        self._actor_class: Any = ray.remote(**options)(self._kind.worker_class)
        self._settings = settings
        self.size = num_workers or cluster_cpus()
        self.replaced = 0
        self.last_batch_seconds: dict[str, float] = {}
        self.last_batch_bytes = 0
        self._failures = 0  # deaths since the last episode that finished
        self._ready: list = []  # running workers
        self._starting: dict = {}  # pid() ref -> the workers of a process still starting
        for _ in range(-(-self.size // self._kind.per_process)):
            self._start_actor()
        # Wait for every worker, but once one runs, only a little longer for the rest:
        # those that cannot be placed yet join the batches when they start.
        deadline = time.monotonic() + start_timeout
        while self._starting and (not self._ready or time.monotonic() < deadline):
            if not self._ready and time.monotonic() > deadline:
                raise PoolError(f"no rollout worker started within {start_timeout:.0f} s (no CPU free in the cluster?)")
            self._poll_starting(timeout=0.5)
            if self._ready:
                deadline = min(deadline, time.monotonic() + START_GRACE_SECONDS)

    @property
    def num_workers(self) -> int:
        return len(self._ready)

    def _start_actor(self) -> None:
        kind = self._kind
        actor = self._actor_class.remote(self._settings, *kind.args)
        workers = [actor] if kind.per_process == 1 else [Slot(actor, i) for i in range(kind.per_process)]
        self._starting[cast(Any, workers[0]).pid.remote()] = workers

    def _poll_starting(self, timeout: float) -> list:
        """Move workers whose start has finished into the ready list (or count the
        failure); the workers that became ready."""
        done, _ = self._ray.wait(list(self._starting), num_returns=len(self._starting), timeout=timeout)
        started = []
        for ref in done:
            workers = self._starting.pop(ref)
            try:
                self._ray.get(ref)
            except self._ray.exceptions.RayError as exc:
                self._failed(exc, "a rollout worker could not start")
                self._start_actor()
            else:
                self._ready.extend(workers)
                started.extend(workers)
        return started

    def _failed(self, exc: BaseException, what: str) -> None:
        self._failures += 1
        if self._failures > max(3, 2 * self.size):
            raise PoolError(f"{what}, {self._failures} times in a row: {failure_reason(exc)}") from None

    def publish(self, weights: Params) -> PublishedWeights:
        published, self.last_batch_seconds = publish(weights)
        return published

    def play_batch(
        self, weights: Params, episodes: list[EpisodeId], finished: Finished = ignore_episode
    ) -> Iterator[ChunkResult]:
        played = self.run_batch("play", self.publish(weights), episodes)
        return sum_in_chunks(played, chunk_sizes(len(episodes)), finished, seconds=self.last_batch_seconds)

    def evaluate(self, weights: Params, matches: list[EpisodeId], greedy: bool = False) -> Iterator[MatchResult]:
        return self.run_batch("evaluate", self.publish(weights), matches, greedy)

    def run_batch(self, method: str, published: PublishedWeights, episodes: list[EpisodeId], *args) -> Iterator:
        """Call RolloutWorker.`method`(published, episode, *args) for every episode;
        yield the results in episode order."""
        ray = self._ray
        self.last_batch_bytes = 0
        todo = deque(range(len(episodes)))
        hand = _HandOut(self._ready)
        running: dict = {}  # task ref -> (worker, position in episodes)
        finished: dict[int, Any] = {}
        next_out, last_progress = 0, time.monotonic()

        watch = self._watch.new_batch()
        while next_out < len(episodes):
            for worker, position in hand.out(todo):
                running[getattr(worker, method).remote(published, episodes[position], *args)] = (worker, position)
                watch.busy(worker)
            for worker in watch.stuck():  # its calls fail now, and go to the dead-worker path below
                self._ray.kill(_process(worker), no_restart=True)
                watch.forget(worker)
            done, _ = ray.wait([*running, *self._starting], num_returns=1, timeout=1.0)
            for ref in done:
                if ref in self._starting:
                    for worker in self._poll_starting(timeout=0):
                        hand.join(worker)
                    continue
                worker, position = running.pop(ref)
                result = self._result(ref, worker, hand)
                if result is None:  # its worker died (or was stuck): played again, with the same seed
                    watch.forget(worker)
                    todo.appendleft(position)
                    continue
                finished[position] = result
                self.last_batch_bytes += _grad_bytes(result)
                last_progress = time.monotonic()
                hand.back(worker, idle=not todo)
                watch.done(worker, busy=hand.held.get(worker, 0) > 0)
            if not running and not todo:  # the slowest episode is in: the barrier is over
                self.last_batch_seconds["barrier"] = hand.idle_seconds() / max(1, len(self._ready))
            while next_out in finished:
                yield finished.pop(next_out)
                next_out += 1
            if time.monotonic() - last_progress > STALL_SECONDS:
                raise PoolError(f"no episode finished in {STALL_SECONDS:.0f} s; giving up")
            if not self._ready and not self._starting:
                raise PoolError("no rollout worker is left")

    def _result(self, ref, worker, hand: _HandOut) -> Any:
        """The task's result, or None if its worker died (replaced here, once per death)."""
        try:
            result = self._ray.get(ref)
        except self._ray.exceptions.RayError as exc:
            if worker in hand.held:  # its queued episode fails too: one death, one replacement
                for gone in self._replace(worker):
                    hand.leave(gone)
                self._failed(exc, "rollout workers keep failing")
            return None
        self._failures = 0
        return result

    def _replace(self, dead) -> list:
        """Replace the process of a dead worker; the workers that went with it."""
        process = _process(dead)
        gone = [worker for worker in self._ready if _process(worker) == process] or [dead]
        self._ready = [worker for worker in self._ready if _process(worker) != process]
        self._ray.kill(process, no_restart=True)
        self._start_actor()
        self.replaced += len(gone)
        return gone

    def nodes(self) -> int:
        """How many Ray nodes the running workers are spread over."""
        return len(set(self.call_all("node_id")))

    def blas_threads(self) -> list[list[int]]:
        return self.call_all("blas_threads")

    def call_all(self, method: str, *args) -> list:
        """Call a RolloutWorker method on every running worker at once; answers in order."""
        return self._ray.get([getattr(worker, method).remote(*args) for worker in self._ready], timeout=STALL_SECONDS)

    def close(self) -> None:
        for process in {_process(w) for w in self._ready} | {_process(ws[0]) for ws in self._starting.values()}:
            self._ray.kill(process)
        self._ready, self._starting = [], {}


class _Watch:
    """When each busy worker last returned something, and the longest an episode has
    taken (since the pool started): a worker silent for much longer than that is stuck."""

    def __init__(self, floor: float, multiple: float):
        self.floor, self.multiple = floor, multiple
        self.longest = 0.0
        self._since: dict[Any, float] = {}

    def new_batch(self) -> _Watch:
        self._since.clear()
        return self

    def limit(self) -> float:
        return max(self.floor, self.multiple * self.longest)

    def busy(self, worker: Any) -> None:
        self._since.setdefault(worker, time.monotonic())

    def done(self, worker: Any, busy: bool) -> None:
        now = time.monotonic()
        began = self._since.pop(worker, None)
        if began is not None:
            self.longest = max(self.longest, now - began)
        if busy:
            self._since[worker] = now

    def forget(self, worker: Any) -> None:
        self._since.pop(worker, None)

    def stuck(self) -> list:
        now, limit = time.monotonic(), self.limit()
        return [worker for worker, since in self._since.items() if now - since > limit]


class _HandOut:
    """Which worker gets the next episode, in constant time per event.

    Every free worker gets one; while episodes are plentiful (at least two per
    worker left), each also holds the next one in its queue and starts it the moment
    the first ends, instead of after a round trip to this process (about 4 ms); the
    last ones go only to free workers, so that the batch's end stays balanced."""

    def __init__(self, workers: list):
        self.held: dict[Any, int] = dict.fromkeys(workers, 0)  # episodes each worker holds
        self._with = [deque(workers), deque()]  # candidates holding 0 and 1 (checked when taken)
        self._idle_since: dict[Any, float] = {}  # worker -> when it ran out of work in this batch

    def out(self, todo: deque[int]) -> Iterator[tuple[Any, int]]:
        """(worker, position) for every episode handed out now, taken from `todo`."""
        for depth in range(LOOKAHEAD):
            queue = self._with[depth]
            while todo and queue and (depth == 0 or len(todo) >= 2 * len(self.held)):
                worker = queue.popleft()
                if self.held.get(worker) != depth:  # stale: it took or finished one since
                    continue
                self.held[worker] = depth + 1
                if depth + 1 < LOOKAHEAD:
                    self._with[depth + 1].append(worker)
                self._idle_since.pop(worker, None)
                yield worker, todo.popleft()

    def back(self, worker: Any, idle: bool) -> None:
        """`worker` finished an episode; `idle`: nothing is left to hand out."""
        if worker not in self.held:
            return
        self.held[worker] -= 1
        self._with[self.held[worker]].append(worker)
        if idle and not self.held[worker]:
            self._idle_since.setdefault(worker, time.perf_counter())

    def join(self, worker: Any) -> None:
        self.held[worker] = 0
        self._with[0].append(worker)

    def leave(self, worker: Any) -> None:
        self.held.pop(worker, None)
        self._idle_since.pop(worker, None)

    def idle_seconds(self) -> float:
        now = time.perf_counter()
        return sum(now - t for t in self._idle_since.values())


def _grad_bytes(result: Any) -> int:
    grad = getattr(result, "grad", None)
    return grad.nbytes if grad is not None else 0


def failure_reason(exc: BaseException) -> str:
    """One line saying what went wrong: the innermost exception of a Ray error's
    traceback when there is one, else its first line."""
    lines = [_ANSI.sub("", line).strip() for line in str(exc).splitlines()]
    lines = [line for line in lines if line]
    raised = [line for line in lines if _RAISED.match(line)]
    return (raised or lines or [type(exc).__name__])[-1 if raised else 0]


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_RAISED = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)(\(.*\))?: ")


def open_pool(
    settings: WorkerSettings,
    workers: int | None,
    address: str | None,
    at_most: int | None = None,
    note: Callable[[str], None] = lambda text: None,
    worker_class: type[RolloutWorker] = RolloutWorker,
    kind: WorkerKind | None = None,
) -> Pool:
    """The pool for `workers` (0: this process, no Ray; None: one per CPU of the
    cluster, at most `at_most`), joining the cluster at `address` or starting Ray
    locally. On a cluster of several nodes, a leader on each node runs that node's
    workers (leaders.ClusterPool); on one node the driver runs them (RayPool). More
    workers than the cluster has CPUs are not waited for: `note` says how many run.
    Close the pool, then call stop_ray()."""
    if workers == 0:
        return LocalPool(settings)
    start_ray(address)
    cpus = cluster_cpus()
    if workers is None:
        workers = cpus if at_most is None else min(at_most, cpus)
    elif workers > cpus:
        note(f"{workers} workers asked, but the Ray cluster has {cpus} CPU(s): running {cpus}")
        workers = cpus
    kind = kind or WorkerKind(worker_class)
    from pgpong.leaders import ClusterPool, nodes_with_cpus

    if len(nodes_with_cpus()) > 1 or workers > LEADERS_ABOVE:
        return ClusterPool(settings, workers, kind)
    return RayPool(settings, workers, kind=kind)
