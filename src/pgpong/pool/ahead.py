"""The trainer's RMSProp step taken ahead of it, where a batch's total arrives: a
cluster's queue takes it on the reducer's total and publishes the weights it makes
for the next batch, which then starts without a trip through the driver and back
(the driver's wait, its step, its 5 MB to the queue: about 30 ms an update here).

The trainer says, as it announces the next batch, what its step will be (StepPlan:
the settings, and the weights and cache it holds). The queue keeps a copy of those
(Mirror), takes the step with the same code on the same numbers, so to the same
bits, and publishes the result. The trainer then takes its own step as before, and
its publish only checks that the queue's weights are the ones it made (their
squared norms, which both steps sum). The copy is sent along with a plan whenever
the queue's is not the trainer's state (a run's first batch, a resume, a step that
failed)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from pgpong.policy import EpisodeGradient, Params, RMSProp, squared_norm
from pgpong.pool.base import PoolError, StepPlan
from pgpong.pool.reducer import Total
from pgpong.pool.worker import StoredWeights


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
    published them."""

    total: Total
    state: tuple[str, int] | None
    squares: tuple[float, float] | None


class Mirror:
    """The queue's copy of a trainer's weights and RMSProp cache."""

    def __init__(self) -> None:
        self.state: tuple[str, int] | None = None
        self.weights: Params | None = None
        self.cache: Params | None = None

    def step(self, total: EpisodeGradient, order: StepOrder) -> tuple[Params, tuple[float, float]] | None:
        """The step `order` says, taken on a batch's `total`: the new weights and their
        squared norms, if it could be taken and they, the gradient and the cache are
        finite (else the trainer's own step raises)."""
        import ray

        if order.weights is not None and order.cache is not None:
            fetched: list[Params] = ray.get([order.weights.ref, order.cache.ref])
            self.weights, self.cache = (_own(params) for params in fetched)
            self.state = order.state
        if self.state != order.state or self.weights is None or self.cache is None:
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
        self._step: tuple[int, StepPlan] | None = None
        self._stepping = 0  # that batch, while the queue waits for the total to take the step
        self._mirrored: tuple[str, int] | None = None
        self._stepped: dict[int, tuple[float, float]] = {}  # batch -> its weights' squared norms

    def plan(self, batch: int, step: StepPlan | None) -> None:
        """The announced `batch` plays the weights of `step`, taken on the total of the
        batch collected next (None: publish() brings them)."""
        self._step = None if step is None else (batch, step)

    def total(self, queue: Any, reducer: Any, parts: list[int]) -> Any:
        """The reducer's total of the batch played as `parts` (a reference to it), or
        the queue's answer with it, once the queue has taken the step ahead (Stepped)."""
        if self._step is None:
            return reducer.result.remote(parts)
        (batch, plan), self._step, sent, self._mirrored = self._step, None, self._mirrored, None
        self._stepping, state = batch, (plan.owner, plan.steps)
        weights, cache = (
            (None, None) if sent == state else (StoredWeights.of(plan.weights), StoredWeights.of(plan.cache))
        )
        settings = (plan.learning_rate, plan.decay_rate, plan.max_update_norm)
        order = StepOrder(state, plan.weights.W1.shape[1], *settings, weights, cache)
        return queue.step_ahead.remote(reducer, parts, order, batch)

    def received(self, answer: Total | Stepped) -> Total:
        if isinstance(answer, Total):
            return answer
        self._mirrored = answer.state
        if answer.squares is not None:  # the queue has published the next batch's weights
            self._stepped[self._stepping] = answer.squares
        return answer.total

    def published(self, batch: int, weights: Params) -> bool:
        """Whether the queue has published `batch`'s weights, which must be these (the
        trainer's own step's): else raises, now and at every later call."""
        if batch not in self._stepped:
            return False
        if squares(weights) != self._stepped[batch]:
            raise PoolError(f"the weights the queue stepped to for batch {batch} are not the trainer's (a bug)")
        del self._stepped[batch]
        return True

    def clear(self) -> None:
        self._step, self._stepped = None, {}


def squares(weights: Params) -> tuple[float, float]:
    """The weights' squared norms, as RMSProp.step sums them."""
    return squared_norm(weights.W1), squared_norm(weights.W2)


def _own(params: Params) -> Params:
    """Writable copies, each array in its own dtype and layout (from the store they are read-only)."""
    return Params(np.array(params.W1, order="K"), np.array(params.W2, order="K"))
