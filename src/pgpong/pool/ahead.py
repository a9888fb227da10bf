"""The trainer's RMSProp step taken ahead of it, where a batch's total arrives: a
cluster's queue takes it on the reducer's total and publishes the weights it makes
for the next batch, which then starts without a trip through the driver and back
(the driver's wait, its step, its 5 MB to the queue: about 30 ms an update here).

The trainer says, as it collects a batch, what its step will be (StepPlan: the
settings, the weights and cache it holds, the announced batch to play the result).
The queue keeps a copy of those weights and cache (Mirror), takes the step with the
same code on the same numbers, so to the same bits, and publishes the result. The
trainer then takes its own step as before, and its publish only checks that the
queue's weights are the ones it made (their squared norms, summed again). The copy
is sent along with a plan whenever the queue's is not the trainer's state (a run's
first batch, a resume, another trainer, a step that failed). Where the queue cannot
take the step (its copy is not there, the step is not finite, the batch was recalled,
anything failed on the way), it says so and the trainer's publish brings the weights."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pgpong.policy import EpisodeGradient, Params, RMSProp, squared_norm
from pgpong.pool.base import PoolError, StepPlan
from pgpong.pool.reducer import Total
from pgpong.pool.worker import PublishedWeights, StoredWeights, publish

STEPPED_AHEAD = "stepped ahead"  # the queue's count of the batches it published with its own step


@dataclass(frozen=True)
class StepOrder:
    """A StepPlan as the queue gets it: the weights and cache only when its copy is not
    of the plan's state."""

    state: tuple[str, int]
    inputs: int
    learning_rate: float
    decay_rate: float
    max_update_norm: float | None
    weights: StoredWeights | None  # with the cache: the state to start from (None: the queue's copy is it)
    cache: StoredWeights | None


@dataclass
class Stepped:
    """The queue's answer: the batch's total (the reducer's), the state its copy holds
    now (None: unknown, to be sent again), and the new weights' squared norms if it
    published them for `batch`."""

    batch: int
    total: Total
    state: tuple[str, int] | None
    squares: tuple[float, float] | None


class Mirror:
    """The queue's copy of a trainer's weights and RMSProp cache."""

    def __init__(self) -> None:
        self.state: tuple[str, int] | None = None
        self.weights: Params | None = None
        self.cache: Params | None = None
        self._lock = threading.Lock()  # (one step at a time, apart from the queue's lock: its calls go on)

    def answer(
        self, total: Total, order: StepOrder, batch: int, publish_to: Callable[[PublishedWeights], bool | None]
    ) -> Stepped:
        """The queue's answer to the driver: the batch's `total`, with the step taken on
        it and its weights published for `batch` (`publish_to` says whether it took them)."""
        with self._lock:
            try:
                made = self.step(total.grad, order)
                if made is None or not publish_to(publish(made[0])[0]):
                    return Stepped(batch, total, self.state, None)
            except Exception:  # (the store full, say): the trainer's publish brings the weights
                self.state = None
                return Stepped(batch, total, None, None)
            return Stepped(batch, total, self.state, made[1])

    def step(self, total: EpisodeGradient, order: StepOrder) -> tuple[Params, tuple[float, float]] | None:
        """The step `order` says, taken on a batch's `total`: the new weights and their
        squared norms, if it could be taken and they, the gradient and the cache are
        finite (else the trainer's own step raises)."""
        import ray

        if order.weights is not None and order.cache is not None:
            fetched: list[Params] = ray.get([order.weights.ref, order.cache.ref])
            self.weights, self.cache = (Params.of(params.W1, params.W2) for params in fetched)  # (writable)
            self.state = order.state
        if self.state != order.state or self.weights is None or self.cache is None:  # (None: for mypy)
            return None
        self.state = None  # (until the step is good)
        optimizer = RMSProp(order.learning_rate, order.decay_rate, self.cache, order.max_update_norm)
        optimizer.step(self.weights, total.dense(order.inputs))  # (a gradient not finite makes the cache so)
        if not (optimizer.weights_finite and optimizer.cache_finite):
            return None
        self.state = (order.state[0], order.state[1] + 1)
        return self.weights, optimizer.weight_squares


class Ahead:
    """The driver's side (a cluster pool's): the trainer's next step and the batch to
    play its weights, the state the queue's copy holds, the batches it published."""

    def __init__(self) -> None:
        self._mirrored: tuple[str, int] | None = None
        self._stepped: dict[int, tuple[tuple[float, float], float]] = {}  # batch -> its weights' squares, when
        self._wrong: str | None = None

    def total(self, queue: Any, reducer: Any, parts: list[int], plan: StepPlan | None) -> Any:
        """The reducer's total of the batch played as `parts` (a reference to it), or,
        with `plan`, the queue's answer with it, once it has taken the step (Stepped)."""
        if plan is None:
            return reducer.result.remote(parts)
        sent, self._mirrored = self._mirrored, None  # (unknown until answered)
        state = (plan.owner, plan.steps)
        weights, cache = (
            (None, None) if sent == state else (StoredWeights.of(plan.weights), StoredWeights.of(plan.cache))
        )
        settings = (plan.learning_rate, plan.decay_rate, plan.max_update_norm)
        order = StepOrder(state, plan.weights.W1.shape[1], *settings, weights, cache)
        return queue.step_ahead.remote(reducer, parts, order, plan.ticket)

    def received(self, answer: Total | Stepped) -> Total:
        if isinstance(answer, Total):
            return answer
        self._mirrored = answer.state
        if answer.squares is not None:  # the queue has published the next batch's weights
            self._stepped[answer.batch] = (answer.squares, time.monotonic())
        return answer.total

    def publish(self, queue: Any, batch: int, weights: Params, timeout: float, to_queue: bool = True) -> float:
        """When the announced `batch`'s weights went out: the queue's own step's, which
        must be these, the trainer's (else raises, and the pool is done for: check()),
        or these, published now (unless not `to_queue`: the batch was recalled)."""
        import ray

        self.check()
        if batch in self._stepped:
            expected, when = self._stepped.pop(batch)
            if squares(weights) != expected:
                self._wrong = f"the weights the queue stepped to for batch {batch} are not the trainer's (a bug)"
                self.check()
            return when
        if to_queue and ray.get(queue.publish.remote(batch, StoredWeights.of(weights)), timeout=timeout) is False:
            raise PoolError(f"batch {batch} had its weights already, not the trainer's (a bug in pgpong)")
        return time.monotonic()

    def check(self) -> None:
        if self._wrong is not None:
            raise PoolError(self._wrong)

    def clear(self) -> None:
        self._stepped = {}


def squares(weights: Params) -> tuple[float, float]:
    """The weights' squared norms, as RMSProp.step sums them."""
    return squared_norm(weights.W1), squared_norm(weights.W2)
