"""The rollout worker: one environment, created once and reset for each episode, that
plays episodes with the weights it is given. In a Ray pool each worker is an actor
(one process, one CPU); --workers 0 keeps one in this process."""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from threadpoolctl import threadpool_info, threadpool_limits

from pgpong.envs import make_env
from pgpong.placement import cpu_share
from pgpong.policy import Params
from pgpong.pool.base import WorkerSettings
from pgpong.pool.sums import Played
from pgpong.rollout import EpisodeId, MatchResult, compile_kernels, play_episode, play_match

# One BLAS/OpenMP thread per worker process: many processes with many threads each
# make the parallel version no faster than the serial one.
ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
FETCH_SECONDS = 600.0  # for a batch's weights from the object store, or for an announced batch's to be published
# A Python file whose worker_hook(stage, episode) every rollout worker calls as it
# starts (stage "start", episode None) and before each episode it plays ("play"):
# how the tests make workers crash, hang or stop at a chosen moment. Variables whose
# names begin with it (its argument: PGPONG_WORKER_HOOK_ARG) reach every worker.
HOOK = "PGPONG_WORKER_HOOK"

Hook = Callable[[str, EpisodeId | None], None]


def worker_env() -> dict[str, str]:
    """The environment variables every rollout worker process is given."""
    return {**ONE_THREAD, **{name: value for name, value in os.environ.items() if name.startswith(HOOK)}}


def load_hook() -> Hook | None:
    """The worker hook $PGPONG_WORKER_HOOK names, or None."""
    path = os.environ.get(HOOK)
    if not path:
        return None
    spec = importlib.util.spec_from_file_location("pgpong_worker_hook", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"{HOOK}={path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.worker_hook


@dataclass(frozen=True)
class StoredWeights:
    """A batch's weights as the driver sends them to a cluster's queue: put in the
    store by the driver, by reference, for the queue to publish a copy of its own (it
    owns the driver's weights: pool/queue.py; the reducer, its step's). Cheaper and sooner than the 5 MB as a
    call's argument, which Ray serializes into the call and the queue then copies:
    13 ms a call against 18 on this machine, idle (docs/SCALING.md)."""

    ref: Any

    @classmethod
    def of(cls, weights: Params) -> StoredWeights:
        """The weights put in this process's object store."""
        import ray

        return cls(ray.put(weights))


@dataclass(frozen=True)
class PublishedWeights:
    """A batch's weights in Ray's object store, by reference. Ray fetches an object
    for a task only when its reference is a top-level argument; inside this wrapper
    the reference reaches the worker as it is, and the worker fetches the weights
    once a batch instead of once an episode (each fetch asks the raylet: about
    0.6 ms of a worker's pause between two episodes)."""

    ref: Any
    # the weights of an announced batch still in play, played again by another
    # (--lag-share: the next batch's first part): the workers have them already, so a
    # leader of another node makes no copy of them (pool/feed.py node_copy)
    in_place: bool = False


@dataclass(frozen=True)
class WeightsToCome:
    """A batch's weights before they are made (the batch announced, its
    matches handed out ahead): `ref` is a node leader's call to the queue that answers
    once they are published, with their PublishedWeights, or with None if the batch
    was dropped. A worker given a match of it starts the call at
    once and waits there, so the batch starts without a Ray call per match."""

    ref: Any


class Skipped:
    """What a worker returns for a match of a batch dropped before its weights came."""


def publish(weights: Params) -> tuple[PublishedWeights, float]:
    """The batch's weights in the object store, once (each worker fetches them once),
    and how long that took."""
    import ray

    began = time.perf_counter()
    published = PublishedWeights(ray.put(weights))
    return published, time.perf_counter() - began


class WeightsCache:
    """A worker's copies of the newest published weights: called with the weights or
    their reference, it returns the weights, fetched from the object store only
    when the reference is new. It keeps the two newest: on a cluster a worker may
    play matches of two batches by turns (with --lag 1, or a match handed back by a
    lost node while the next batch is announced; pool/queue.py)."""

    KEPT = 2

    def __init__(self) -> None:
        self._weights = _Newest(self.KEPT)  # by their PublishedWeights' reference
        self._answers = _Newest(self.KEPT)  # the leaders' answers, by their WeightsToCome's reference

    def __call__(self, weights: Params | PublishedWeights | WeightsToCome) -> Params | None:
        """The weights (None: they never came, their batch was dropped)."""
        if isinstance(weights, Params):
            return weights
        if isinstance(weights, WeightsToCome):
            resolved = self.resolve(weights)
            return None if resolved is None else self(resolved)
        return self._weights(weights.ref)

    def resolve(self, weights: WeightsToCome) -> PublishedWeights | None:
        """What the leader's call answers, once it does (the batch's weights are
        published): asked once a batch, like the weights."""
        return self._answers(weights.ref)


class _Newest:
    """Objects fetched from Ray's store by reference, the `kept` newest of them kept."""

    def __init__(self, kept: int):
        self.kept = kept
        self._items: list[tuple[Any, Any]] = []  # (reference, object), the newest last

    def __call__(self, ref: Any) -> Any:
        for known, value in self._items:
            if known == ref:
                return value
        import ray

        value = ray.get(ref, timeout=FETCH_SECONDS)
        self._items = [*self._items[1 - self.kept :], (ref, value)]
        return value


class RolloutWorker:
    """Plays episodes with one environment, created once and reset for each episode."""

    def __init__(self, settings: WorkerSettings, pin_threads: bool = True):
        self._hook = load_hook()
        if self._hook:
            self._hook("start", None)
        self.settings = settings
        self.env = self._make_env()
        self._weights = WeightsCache()
        compile_kernels()
        if pin_threads:  # after the imports above, which may load BLAS libraries of their own
            threadpool_limits(1)

    def _make_env(self) -> Any:
        return make_env(self.settings.env_id, self.settings.max_episode_steps)

    def play(
        self, weights: Params | PublishedWeights | WeightsToCome, episode: EpisodeId | list[int]
    ) -> Played | Skipped:
        """Play the match; its stats and its gradient, to be summed exactly (sums.py).
        (A pool sends the episode as a list of numbers: RayPool.run.)"""
        episode = EpisodeId(*episode)
        if self._hook:
            self._hook("play", episode)
        settings, params = self.settings, self._weights(weights)
        if params is None:
            return Skipped()
        result = play_episode(self.env, params, episode, settings.gamma, settings.entropy_bonus)
        return Played(result.stats(), result.grad)

    def evaluate(self, weights: Params | PublishedWeights, match: EpisodeId | list[int], greedy: bool) -> MatchResult:
        params = self._weights(weights)
        assert params is not None  # (evaluation's weights are always given)
        return play_match(self.env, params, EpisodeId(*match), greedy)

    def pid(self) -> int:
        """This worker's process id; answering it also says the worker has started."""
        return os.getpid()

    def node_id(self) -> str:
        """The Ray node this worker runs on."""
        import ray

        return ray.get_runtime_context().get_node_id()

    def blas_threads(self) -> list[int]:
        return [info["num_threads"] for info in threadpool_info()]


@dataclass(frozen=True)
class WorkerKind:
    """How rollout workers are made: one Ray actor (one process, one CPU) per worker,
    or, for bench's simulation of a big cluster, one process standing in for
    `per_process` workers (it holds that many CPUs, and its methods take the slot).
    With `per_cpu` above 1 (--workers-per-cpu) each worker holds 1 / per_cpu of a CPU,
    and a node's matches share its cores."""

    worker_class: type = RolloutWorker
    per_process: int = 1
    args: tuple = ()  # passed to worker_class after the WorkerSettings
    per_cpu: float = 1.0

    def cpus(self, workers: int) -> float:
        """What a process of `workers` of them asks Ray for."""
        return workers if self.per_cpu <= 1 else round(workers * cpu_share(self.per_cpu), 4)


@dataclass(frozen=True)
class Slot:
    """One of the workers a shared process stands in for: calls go to the process's
    method with `index` as its last argument."""

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
        return self.method.remote(*args, self.index)  # (by position: a keyword costs Ray more per call)


def process_of(worker: Any) -> Any:
    """The Ray actor a worker lives in."""
    return worker.actor if isinstance(worker, Slot) else worker
