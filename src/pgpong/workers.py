"""The pools that play a batch's episodes: RayPool (actors) and LocalPool (in-process).

Both take the weights and a list of episode ids and yield the results in episode
order, whatever order they finish in, so the sum of gradients is the same for any
number of workers.
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
from pgpong.rollout import EpisodeId, EpisodeResult, MatchResult, compile_kernels, play_episode, play_match

# One BLAS/OpenMP thread per worker process: many processes with many threads each
# make the parallel version no faster than the serial one.
ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
# No result at all for this long means something is stuck, not slow: even a
# 108,000-step PongNoFrameskip match takes about a minute.
STALL_SECONDS = 600.0
START_SECONDS = 120.0
START_GRACE_SECONDS = 15.0  # how long the other workers may lag the first one at start
LOOKAHEAD = 2  # episodes a worker may hold at once: the one it plays and the next
# Tests set this to make workers fail on purpose; nothing else reads it.
TEST_FAULT = "_PGPONG_TEST_FAULT"


@dataclass(frozen=True)
class WorkerSettings:
    """What every rollout worker is built from: the game and how episodes are scored."""

    env_id: str = "ALE/Pong-v5"
    max_episode_steps: int | None = None  # None: full matches
    gamma: float = 0.99


class PoolError(RuntimeError):
    """The pool cannot finish the batch (workers keep dying, nothing progresses)."""


class Pool(Protocol):
    @property
    def num_workers(self) -> int: ...  # workers running (0: this process, no Ray)

    replaced: int  # workers replaced after a crash, since the pool started
    last_batch_seconds: dict[str, float]  # where the last batch's time went: "publish weights", "barrier"

    def nodes(self) -> int: ...

    def play_batch(self, weights: Params, episodes: list[EpisodeId]) -> Iterator[EpisodeResult]: ...

    def evaluate(self, weights: Params, matches: list[EpisodeId], greedy: bool = False) -> Iterator[MatchResult]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class PublishedWeights:
    """A batch's weights in Ray's object store, by reference. Ray fetches an object
    for a task only when its reference is a top-level argument; inside this wrapper
    the reference reaches the worker as it is, and the worker fetches the weights
    once a batch instead of once an episode (each fetch asks the raylet: about
    0.6 ms of a worker's pause between two episodes)."""

    ref: Any


class RolloutWorker:
    """Plays episodes with one environment, created once and reset for each episode."""

    def __init__(self, settings: WorkerSettings, pin_threads: bool = True):
        _test_fault("start")
        self.settings = settings
        self.env = self._make_env()
        self._published: tuple[Any, Params] | None = None  # the newest reference, and its weights
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

    def _weights(self, weights: Params | PublishedWeights) -> Params:
        """The weights themselves: fetched from the object store when they are new."""
        if isinstance(weights, Params):
            return weights
        if self._published is None or self._published[0] != weights.ref:
            import ray

            self._published = (weights.ref, ray.get(weights.ref, timeout=STALL_SECONDS))
        return self._published[1]

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
    'slow:K' (episode K of every batch takes 2 s longer), 'hang' (episodes never end)."""
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


class LocalPool:
    """Plays the episodes one after another in this process (--workers 0)."""

    num_workers = 0
    replaced = 0
    last_batch_seconds: dict[str, float] = {}

    def __init__(self, settings: WorkerSettings):
        self.worker = RolloutWorker(settings, pin_threads=False)
        self._limit = threadpool_limits(1)  # restored by close()

    def play_batch(self, weights: Params, episodes: list[EpisodeId]) -> Iterator[EpisodeResult]:
        for episode in episodes:
            yield self.worker.play(weights, episode)

    def evaluate(self, weights: Params, matches: list[EpisodeId], greedy: bool = False) -> Iterator[MatchResult]:
        for match in matches:
            yield self.worker.evaluate(weights, match, greedy)

    def nodes(self) -> int:
        return 1

    def close(self) -> None:
        self.worker.env.close()
        self._limit.restore_original_limits()


class RayPool:
    """Long-lived Ray actors, one CPU each. The weights are published once per batch.

    A worker that dies (crash, kill, lost node) is replaced and its episode played
    again with the same seed, by whichever worker is free first; a replacement gets
    work only once it is running, so a lost node never stalls the batch.
    """

    def __init__(
        self,
        settings: WorkerSettings,
        num_workers: int | None = None,
        start_timeout: float = START_SECONDS,
        worker_class: type[RolloutWorker] = RolloutWorker,
    ):
        import ray

        self._ray = ray
        env_vars = {**ONE_THREAD, **{k: v for k, v in os.environ.items() if k == TEST_FAULT}}
        self._actor_class = ray.remote(num_cpus=1, runtime_env={"env_vars": env_vars})(worker_class)
        self._settings = settings
        self.size = num_workers or cluster_cpus()
        self.replaced = 0
        self.last_batch_seconds: dict[str, float] = {}
        self._failures = 0  # deaths since the last episode that finished
        self._ready: list = []  # running actors
        self._starting: dict = {}  # pid() ref -> actor still starting
        for _ in range(self.size):
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
        actor = self._actor_class.remote(self._settings)
        self._starting[cast(Any, actor).pid.remote()] = actor

    def _poll_starting(self, timeout: float) -> None:
        """Move actors whose start has finished into the ready list (or count the failure)."""
        done, _ = self._ray.wait(list(self._starting), num_returns=len(self._starting), timeout=timeout)
        for ref in done:
            actor = self._starting.pop(ref)
            try:
                self._ray.get(ref)
            except self._ray.exceptions.RayError as exc:
                self._failed(exc, "a rollout worker could not start")
                self._start_actor()
            else:
                self._ready.append(actor)

    def _failed(self, exc: BaseException, what: str) -> None:
        self._failures += 1
        if self._failures > max(3, 2 * self.size):
            raise PoolError(f"{what}, {self._failures} times in a row: {_reason(exc)}") from None

    def play_batch(self, weights: Params, episodes: list[EpisodeId]) -> Iterator[EpisodeResult]:
        return self._run_batch("play", weights, episodes)

    def evaluate(self, weights: Params, matches: list[EpisodeId], greedy: bool = False) -> Iterator[MatchResult]:
        return self._run_batch("evaluate", weights, matches, greedy)

    def _run_batch(self, method: str, weights: Params, episodes: list[EpisodeId], *args) -> Iterator:
        """Call RolloutWorker.`method`(the published weights, episode, *args) for every episode; yield in order."""
        ray = self._ray
        began = time.perf_counter()
        published = PublishedWeights(ray.put(weights))  # once; each worker fetches it once
        self.last_batch_seconds = {"publish weights": time.perf_counter() - began}
        todo = deque(range(len(episodes)))
        idle_since: dict = {}  # actor -> when it ran out of work in this batch
        running: dict = {}  # task ref -> (actor, position in episodes)
        finished: dict[int, EpisodeResult] = {}
        next_out, last_progress = 0, time.monotonic()

        def start(actor, position: int):  # the task that plays episodes[position] on `actor`
            return getattr(actor, method).remote(published, episodes[position], *args)

        while next_out < len(episodes):
            for actor in self._hand_out(todo, running, start):
                idle_since.pop(actor, None)
            done, _ = ray.wait([*running, *self._starting], num_returns=1, timeout=1.0)
            for ref in done:
                if ref in self._starting:
                    self._poll_starting(timeout=0)
                    continue
                actor, position = running.pop(ref)
                result = self._result(ref, actor)
                if result is None:  # its worker died: played again, with the same seed
                    todo.appendleft(position)
                    continue
                finished[position] = result
                last_progress = time.monotonic()
                if not todo and all(a is not actor for a, _ in running.values()):
                    idle_since.setdefault(actor, time.perf_counter())
            if not running and not todo:  # the slowest episode is in: the barrier is over
                end = time.perf_counter()
                idle = sum(end - t for t in idle_since.values())
                self.last_batch_seconds["barrier"] = idle / max(1, len(self._ready))
            while next_out in finished:
                yield finished.pop(next_out)
                next_out += 1
            if time.monotonic() - last_progress > STALL_SECONDS:
                raise PoolError(f"no episode finished in {STALL_SECONDS:.0f} s; giving up")
            if not self._ready and not self._starting:
                raise PoolError("no rollout worker is left")

    def _result(self, ref, actor) -> Any:
        """The task's result, or None if its worker died (replaced here, once per death)."""
        try:
            result = self._ray.get(ref)
        except self._ray.exceptions.RayError as exc:
            if actor in self._ready:  # its queued episode fails too: one death, one replacement
                self._replace(actor)
                self._failed(exc, "rollout workers keep failing")
            return None
        self._failures = 0
        return result

    def _hand_out(self, todo: deque[int], running: dict, call: Callable[[Any, int], Any]) -> list:
        """Give every free worker an episode from `todo` (`call(actor, position)` starts
        it; `running` maps its task to (actor, position)); the workers that got one.

        While episodes are plentiful, each worker also holds the next one in its queue
        and starts it the moment the first ends, instead of after a round trip to this
        process (about 4 ms); the last ones go only to free workers, so that the
        batch's end stays balanced."""
        given = []
        for depth in range(1, LOOKAHEAD + 1):
            for actor in self._ready:
                held = sum(1 for a, _ in running.values() if a is actor)
                if todo and held < depth and (depth == 1 or len(todo) >= 2 * len(self._ready)):
                    position = todo.popleft()
                    running[call(actor, position)] = (actor, position)
                    given.append(actor)
        return given

    def _replace(self, dead) -> None:
        if dead in self._ready:
            self._ready.remove(dead)
        self._ray.kill(dead, no_restart=True)
        self._start_actor()
        self.replaced += 1

    def nodes(self) -> int:
        """How many Ray nodes the running workers are spread over."""
        return len(set(self.call_all("node_id")))

    def blas_threads(self) -> list[list[int]]:
        return self.call_all("blas_threads")

    def call_all(self, method: str, *args) -> list:
        """Call a RolloutWorker method on every running worker at once; answers in order."""
        return self._ray.get([getattr(actor, method).remote(*args) for actor in self._ready], timeout=STALL_SECONDS)

    def close(self) -> None:
        for actor in [*self._ready, *self._starting.values()]:
            self._ray.kill(actor)
        self._ready, self._starting = [], {}


def _reason(exc: BaseException) -> str:
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
) -> LocalPool | RayPool:
    """The pool for `workers` (0: this process, no Ray; None: one per CPU of the
    cluster, at most `at_most`), joining the cluster at `address` or starting Ray
    locally. More workers than the cluster has CPUs are not waited for: `note` says
    how many run. Close the pool, then call stop_ray()."""
    if workers == 0:
        return LocalPool(settings)
    start_ray(address)
    cpus = cluster_cpus()
    if workers is None:
        workers = cpus if at_most is None else min(at_most, cpus)
    elif workers > cpus:
        note(f"{workers} workers asked, but the Ray cluster has {cpus} CPU(s): running {cpus}")
        workers = cpus
    return RayPool(settings, workers, worker_class=worker_class)
