"""The pools that play a batch's episodes: RayPool (actors) and LocalPool (in-process).

Both take the weights and a list of episode ids and yield the results in episode
order, whatever order they finish in, so the sum of gradients is the same for any
number of workers.
"""

from __future__ import annotations

import logging
import os
import resource
import socket
import time
from collections import deque
from typing import Iterator, Protocol

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

from pgpong.envs import DOWN, UP, make_env
from pgpong.policy import Params
from pgpong.rollout import EpisodeId, EpisodeResult, play_episode

# One BLAS/OpenMP thread per worker process: many processes with many threads each
# make the parallel version no faster than the serial one.
ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
# No result at all for this long means something is stuck, not slow: even a
# 108,000-step PongNoFrameskip match takes about a minute.
STALL_SECONDS = 600.0
CONNECT_SECONDS = 5.0


class PoolError(RuntimeError):
    """The pool cannot finish the batch (workers keep dying, nothing progresses)."""


class Pool(Protocol):
    num_workers: int
    replaced: int  # workers replaced after a crash, since the pool started
    last_batch: dict[str, float]  # seconds of the last batch: "publish weights", "barrier"

    def play_batch(self, weights: Params, episodes: list[EpisodeId]) -> Iterator[EpisodeResult]: ...

    def close(self) -> None: ...


class RolloutWorker:
    """Plays episodes with one environment, created once and reset for each episode."""

    def __init__(self, env_id: str, max_episode_steps: int | None, gamma: float, endless: bool = False):
        threadpool_limits(1)
        self.env = make_env(env_id, max_episode_steps, endless)
        self.gamma = gamma

    def play(self, weights: Params, episode: EpisodeId) -> EpisodeResult:
        return play_episode(self.env, weights, episode, self.gamma)

    def random_play(self, seconds: float, seed: int) -> dict[str, float]:
        """The environment alone: random UP/DOWN for `seconds`, each match reset with its
        own seed as training does. Returns steps, matches and seconds (in resets, in all)."""
        rng = np.random.default_rng(seed)
        actions = rng.choice([UP, DOWN], size=4096)
        steps = matches = 0
        reset_s = 0.0
        began = time.perf_counter()
        while time.perf_counter() - began < seconds:
            t = time.perf_counter()
            self.env.reset(seed=int(rng.integers(2**32)))
            reset_s += time.perf_counter() - t
            matches += 1
            done = False
            while not done and time.perf_counter() - began < seconds:
                _, _, terminated, truncated, _ = self.env.step(actions[steps % len(actions)])
                steps += 1
                done = terminated or truncated
        return {"steps": steps, "matches": matches, "seconds": time.perf_counter() - began, "reset_s": reset_s}

    def peak_rss(self) -> int:
        """Peak resident memory of this process so far, in bytes."""
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def ready(self) -> int:
        return os.getpid()

    def blas_threads(self) -> list[int]:
        return [info["num_threads"] for info in threadpool_info()]


class LocalPool:
    """Plays the episodes one after another in this process (--workers 0)."""

    num_workers = 0
    replaced = 0
    last_batch: dict[str, float] = {}

    def __init__(self, env_id: str, max_episode_steps: int | None, gamma: float):
        self._limit = threadpool_limits(1)
        self.worker = RolloutWorker(env_id, max_episode_steps, gamma)

    def play_batch(self, weights: Params, episodes: list[EpisodeId]) -> Iterator[EpisodeResult]:
        for episode in episodes:
            yield self.worker.play(weights, episode)

    def close(self) -> None:
        self.worker.env.close()
        self._limit.restore_original_limits()


class RayPool:
    """Long-lived Ray actors, one CPU each. The weights are published once per batch."""

    def __init__(
        self, env_id: str, max_episode_steps: int | None, gamma: float, num_workers: int | None = None
    ):
        import ray

        self._ray = ray
        self._actor_class = ray.remote(num_cpus=1, runtime_env={"env_vars": ONE_THREAD})(RolloutWorker)
        self._args = (env_id, max_episode_steps, gamma)
        self.num_workers = num_workers or cluster_cpus()
        self.replaced = 0
        self.last_batch: dict[str, float] = {}
        self._actors = [self._start_actor() for _ in range(self.num_workers)]
        self._wait_ready(self._actors)

    def _start_actor(self):
        return self._actor_class.remote(*self._args)

    def _wait_ready(self, actors) -> None:
        for actor in actors:
            try:
                self._ray.get(actor.ready.remote(), timeout=STALL_SECONDS)
            except self._ray.exceptions.RayActorError as exc:
                raise PoolError(f"a rollout worker could not start: {_reason(exc)}") from None
            except self._ray.exceptions.GetTimeoutError:
                raise PoolError(
                    f"no rollout worker started within {STALL_SECONDS:.0f} s (too few CPUs free in the cluster?)"
                ) from None

    def play_batch(self, weights: Params, episodes: list[EpisodeId]) -> Iterator[EpisodeResult]:
        ray = self._ray
        began = time.perf_counter()
        weights_ref = ray.put(weights)  # published once; every task reads it from the object store
        self.last_batch = {"publish weights": time.perf_counter() - began}
        todo = deque(range(len(episodes)))
        idle = deque(self._actors)
        idle_since: dict = {}  # actor -> when it ran out of work in this batch
        running: dict = {}  # object ref -> (actor, position in episodes)
        finished: dict[int, EpisodeResult] = {}
        next_out, failures, last_progress = 0, 0, time.monotonic()
        while next_out < len(episodes):
            while idle and todo:
                actor, position = idle.popleft(), todo.popleft()
                running[actor.play.remote(weights_ref, episodes[position])] = (actor, position)
            ready, _ = ray.wait(list(running), num_returns=1, timeout=1.0)
            for ref in ready:
                actor, position = running.pop(ref)
                try:
                    finished[position] = ray.get(ref)
                except ray.exceptions.RayActorError as exc:
                    failures += 1
                    if failures > 2 * self.num_workers + 2:
                        raise PoolError(f"rollout workers keep dying: {_reason(exc)}") from None
                    todo.appendleft(position)  # played again, same seed
                    actor = self._replace(actor)
                else:
                    failures = 0
                    last_progress = time.monotonic()
                idle.append(actor)
                if not todo:
                    idle_since.setdefault(actor, time.perf_counter())
            if not running:  # the slowest episode is in: the barrier is over
                end = time.perf_counter()
                waited = sum(end - t for t in idle_since.values())
                self.last_batch["barrier"] = waited / max(1, self.num_workers)
            while next_out in finished:
                yield finished.pop(next_out)
                next_out += 1
            if time.monotonic() - last_progress > STALL_SECONDS:
                raise PoolError(f"no episode finished in {STALL_SECONDS:.0f} s; giving up")

    def _replace(self, dead):
        self._ray.kill(dead, no_restart=True)
        fresh = self._start_actor()
        self._actors[self._actors.index(dead)] = fresh
        self.replaced += 1
        return fresh

    def blas_threads(self) -> list[list[int]]:
        return self.call_all("blas_threads")

    def call_all(self, method: str, *args) -> list:
        """Call a RolloutWorker method on every worker at once; their answers in order."""
        return self._ray.get([getattr(actor, method).remote(*args) for actor in self._actors])

    def close(self) -> None:
        for actor in self._actors:
            self._ray.kill(actor)
        self._actors = []


def _reason(exc: BaseException) -> str:
    """The first meaningful line of a Ray error, for a one-line message."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


# ---- starting or joining Ray -------------------------------------------------------


class ClusterError(RuntimeError):
    """Ray could not be started or the cluster could not be reached."""


def check_address(address: str, timeout: float = CONNECT_SECONDS) -> None:
    """Fail fast on an unreachable cluster: ray.init would retry for minutes."""
    if address in ("auto", "local"):
        return
    host_port = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = host_port.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ClusterError(f"cluster address {address!r} is not HOST:PORT (e.g. 192.168.1.10:6379)")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as exc:
        raise ClusterError(
            f"cannot reach a Ray cluster at {address} ({exc.strerror or exc}); "
            "is `ray start --head` running there and the port open?"
        ) from None


def start_ray(address: str | None, num_cpus: int | None = None) -> None:
    """Join the cluster at `address`, or start a local Ray instance when it is None."""
    # Ray reads these when it is imported, so they are set first.
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if address is None:
        # Our own local instance: keep Ray's token authentication, chosen explicitly.
        os.environ.setdefault("RAY_AUTH_MODE", "token")
    else:
        check_address(address)
    import ray
    try:
        ray.init(
            address=address,
            num_cpus=num_cpus if address is None else None,
            include_dashboard=False,
            logging_level=logging.WARNING,
            log_to_driver=True,
        )
    except ConnectionError as exc:
        raise ClusterError(f"cannot connect to the Ray cluster at {address}: {_reason(exc)}") from None
    except Exception as exc:  # Ray raises many kinds; all mean the same to the user here
        text = str(exc)
        if "authentication token" in text.lower():
            raise ClusterError(
                "the Ray cluster requires an authentication token and none was found: "
                "copy the head node's ~/.ray/auth_token here or set RAY_AUTH_TOKEN"
            ) from None
        raise ClusterError(f"could not start Ray: {_reason(exc)}") from None


def cluster_cpus() -> int:
    import ray

    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def stop_ray() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()
