"""What every pool shares: the settings its workers are built from, its time limits,
what playing a batch returns (the sum of its gradients, and what the batch measured),
the Pool interface and its error."""

from __future__ import annotations

import functools
import gc
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from pgpong.errors import PgpongError
from pgpong.policy import EpisodeGradient, Params
from pgpong.pool.sums import added
from pgpong.rollout import EpisodeId, EpisodeStats, MatchResult


@dataclass(frozen=True)
class WorkerSettings:
    """What every rollout worker is built from: the game, and how episodes are scored
    and turned into gradients."""

    env_id: str = "ALE/Pong-v5"
    max_episode_steps: int | None = None  # None: full matches
    gamma: float = 0.99
    entropy_bonus: float = 0.0  # --entropy-bonus: beta x dH/dlogit added to every step's signal


@dataclass(frozen=True)
class Limits:
    """How long a pool waits before it calls something stuck or gone."""

    # No result at all for this long means something is stuck, not slow: even a
    # 108,000-step PongNoFrameskip match takes about a minute.
    stall_s: float = 600.0
    # A worker that has returned nothing for stuck_multiple times the longest episode
    # so far (and at least stuck_floor_s) is stuck: it is ended, and its episodes are
    # played again elsewhere with the same seeds.
    stuck_multiple: float = 10.0
    stuck_floor_s: float = 60.0
    start_s: float = 120.0  # for the first worker to start
    start_grace_s: float = 15.0  # how long the other workers may lag the first one at start


Finished = Callable[[EpisodeStats], None]  # hears each episode of a batch, in episode order
Job = tuple[str, Any, tuple]  # what to do with a match: a worker method ("play", "evaluate"), the
# weights (published, or not), more arguments


def kept_for_life() -> None:
    """A long-lived actor's start-up state (the modules, Ray's, numba's and its own)
    is kept out of Python's full garbage collections from now on, which then look at
    new objects only. Ray asks every process for a full collection when a node's
    object store fills, every process at once: at 11x18 each leader took 0.4-0.8 s
    of this 2-core machine's time for it every 10 s (docs/SCALING.md)."""
    gc.collect()  # the garbage of the start is collected, not kept
    gc.freeze()


def ignore_episode(episode: EpisodeStats) -> None:
    pass


@dataclass
class BatchMeasures:
    """What playing one batch measured, beside its results."""

    seconds: dict[str, float] = field(default_factory=dict)  # this process's phases: "publish weights", ...
    barrier_s: float | None = None  # a worker's mean idle time while the batch's slowest episodes finished
    # (None: one process played the batch, nobody waited)
    bytes_in: int = 0  # gradient bytes the batch sent into this process
    replaced: int = 0  # workers replaced after a crash during the batch
    node_seconds: dict[str, float] = field(default_factory=dict)  # a node leader's phases (mean over leaders)

    def add_seconds(self, phase: str, seconds: float) -> None:
        self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds

    def phases(self) -> dict[str, float]:
        """The seconds by phase, the barrier among them when there was one."""
        return self.seconds if self.barrier_s is None else {**self.seconds, "barrier": self.barrier_s}


@dataclass
class BatchResult:
    """A batch played: the exact sum of its matches' gradients (pool/sums.py) in
    float32, on the pixels they touched (NaN if a gradient was too large to sum), and
    what playing it measured."""

    grad: EpisodeGradient
    measures: BatchMeasures

    def plus(self, later: BatchResult) -> BatchResult:
        """A batch played in two parts (--lag-share), this one first: the sum of their
        sums (float32, in this order: the same bits for any workers), their measures
        added (the barrier is the later part's, which ends the batch)."""
        a, b = self.measures, later.measures
        seconds = {phase: a.seconds.get(phase, 0.0) + b.seconds.get(phase, 0.0) for phase in {**a.seconds, **b.seconds}}
        measures = BatchMeasures(
            seconds,
            b.barrier_s,
            a.bytes_in + b.bytes_in,
            a.replaced + b.replaced,
            {k: a.node_seconds.get(k, 0.0) + b.node_seconds.get(k, 0.0) for k in {**a.node_seconds, **b.node_seconds}},
        )
        return BatchResult(added(self.grad, later.grad), measures)


class InOrder:
    """Hands `finished` each episode's stats in episode order, whatever order they come in."""

    def __init__(self, finished: Finished):
        self.finished = finished
        self._waiting: dict[int, EpisodeStats] = {}
        self.next = 0

    def add(self, position: int, stats: EpisodeStats) -> None:
        if position < self.next or position in self._waiting:
            return  # a match played again after its node was lost: the same stats
        self._waiting[position] = stats
        while self.next in self._waiting:
            self.finished(self._waiting.pop(self.next))
            self.next += 1


class OneBatchAtATime:
    """submit, announce, publish, collect and cancel for a pool that plays one batch
    after another: a submitted batch waits (with a copy of its weights), an announced
    one for its weights, and either is played when collected."""

    _waiting: dict[int, tuple[Params | None, list[EpisodeId]]]  # set by the pool's __init__
    _tickets = 0

    def play_batch(
        self, weights: Params, episodes: list[EpisodeId], finished: Finished = ignore_episode
    ) -> BatchResult:
        raise NotImplementedError

    def submit(self, weights: Params, episodes: list[EpisodeId], like: int | None = None) -> int:
        self._tickets += 1
        self._waiting[self._tickets] = (Params.of(weights.W1, weights.W2), episodes)
        return self._tickets

    def announce(self, episodes: list[EpisodeId]) -> int:
        self._tickets += 1
        self._waiting[self._tickets] = (None, episodes)
        return self._tickets

    def publish(self, ticket: int, weights: Params, squares: tuple[float, float] | None = None) -> None:
        """The weights an announced batch plays when collected: not copied, so they must
        not change before (the trainer collects it next)."""
        self._waiting[ticket] = (weights, self._waiting[ticket][1])

    def collect(
        self, tickets: list[int], finished: Finished = ignore_episode, step: StepPlan | None = None
    ) -> BatchResult:
        parts = []
        for ticket in tickets:
            weights, episodes = self._waiting.pop(ticket)
            if weights is None:
                raise ValueError(f"batch {ticket} was announced but never published")
            parts.append(self.play_batch(weights, episodes, finished))
        return functools.reduce(BatchResult.plus, parts)

    def cancel(self) -> None:
        self._waiting.clear()


@dataclass(frozen=True)
class StepPlan:
    """The step the trainer will take on the batch it collects: from its `weights` and
    `cache` as they are (after `steps` updates of the trainer `owner`), with these
    settings, for the announced batch `ticket` to play. A pool that can takes it
    itself where the batch's total arrives, so that batch starts at once
    (ClusterPool: pool/ahead.py); the trainer's publish then checks the weights."""

    ticket: int
    owner: str
    steps: int
    learning_rate: float
    decay_rate: float
    max_update_norm: float | None
    weights: Params
    cache: Params


class PoolError(PgpongError, RuntimeError):
    """The pool cannot finish the batch (workers keep dying, nothing progresses)."""


class Pool(Protocol):
    @property
    def num_workers(self) -> int: ...  # workers running (0: this process, no Ray)

    @property
    def replaced(self) -> int: ...  # workers replaced after a crash, since the pool started

    def nodes(self) -> int: ...

    def play_batch(
        self, weights: Params, episodes: list[EpisodeId], finished: Finished = ignore_episode
    ) -> BatchResult: ...

    # --lag 1: the next batch is submitted before this one is collected. A pool that
    # can overlap them starts it at once (ClusterPool); the others play it when it is
    # collected (OneBatchAtATime). The weights are the same either way.
    # `like`: the ticket of a batch in play that plays the same weights (--lag-share: the
    # next batch's first part plays those of this one's rest), which a pool may reuse.
    def submit(self, weights: Params, episodes: list[EpisodeId], like: int | None = None) -> int: ...  # a ticket

    # Without a lag the next batch is announced before this one is collected, and
    # published with the weights this update makes. A pool that can hands its matches
    # out meanwhile (ClusterPool: its workers wait for the weights in their calls).
    def announce(self, episodes: list[EpisodeId]) -> int: ...  # a ticket for publish, then collect

    # `squares`: the weights' squared norms, where the caller has them (RMSProp's
    # weight_squares after the step that made them): a pool that checks weights by
    # them (ClusterPool, against its reducer's step) does not sum them again. What
    # keeps a pool from publishing raises PoolError; anything else is a bug in pgpong.
    def publish(self, ticket: int, weights: Params, squares: tuple[float, float] | None = None) -> None: ...

    # A batch is collected by its parts' tickets, in episode order (two with --lag-share:
    # its first matches submitted, the rest announced); its sum is theirs, added as
    # BatchResult.plus adds them. With `step`, a pool that can takes the trainer's
    # step on the sum itself and publishes the announced batch at once (ClusterPool).
    def collect(
        self, tickets: list[int], finished: Finished = ignore_episode, step: StepPlan | None = None
    ) -> BatchResult: ...

    def cancel(self) -> None: ...  # batches submitted and not collected are dropped

    def evaluate(self, weights: Params, matches: list[EpisodeId], greedy: bool = False) -> Iterator[MatchResult]: ...

    def close(self) -> None: ...


def failure_reason(exc: BaseException) -> str:
    """One line saying what went wrong: the innermost exception of a Ray error's
    traceback when there is one, else its first line."""
    lines = [_ANSI.sub("", line).strip() for line in str(exc).splitlines()]
    lines = [line for line in lines if line]
    raised = [line for line in lines if _RAISED.match(line)]
    return (raised or lines or [type(exc).__name__])[-1 if raised else 0]


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_RAISED = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)(\(.*\))?: ")
