"""The trainer's RMSProp step taken ahead of it, where a batch's total is made: a
cluster's reducer takes it on the batch's total and gives the weights it makes to the
queue for the next batch, which then starts without a trip through the driver and
back (the driver's wait, its step, its 5 MB to the queue: about 30 ms an update here),
nor the total's through the queue (pool/reducer.py: Mirror). Where the cluster has one
leader, which plays every match, that leader claims the step from the reducer and
takes it on its own sum, with a copy of its own (pool/leader.py: OwnStep); the state
the driver follows is then the leader's copy's.

The trainer says, as it collects a batch, what its step will be (StepPlan: the
settings, the weights and cache it holds, the announced batch to play the result).
The reducer keeps a copy of those weights and cache, takes the step with the same
code on the same numbers, so to the same bits, and the queue publishes the result.
The trainer then takes its own step as before, and its publish only checks that the
published weights are the ones it made (by their squared norms, as its step summed
them). The copy is sent along with a plan whenever the reducer's is not the trainer's
state (a run's first batch, a resume, another trainer, a step that failed). Where the
reducer cannot take the step (its copy is not there, the step is not finite, the batch
was recalled, anything failed on the way), it says so and the trainer's publish brings
the weights."""

from __future__ import annotations

import time
from typing import Any

from pgpong.policy import Params
from pgpong.pool.base import PoolError, StepPlan
from pgpong.pool.reducer import StepOrder, Stepped, Total
from pgpong.pool.worker import StoredWeights
from pgpong.rmsprop import squared_norms

STEPPED_AHEAD = "stepped ahead"  # the queue's count of the batches it published with the reducer's step


class Ahead:
    """The driver's side (a cluster pool's): the trainer's next step and the batch to
    play its weights, the state the reducer's copy holds, the batches it stepped."""

    def __init__(self) -> None:
        self._mirrored: tuple[str, int] | None = None
        self._stepped: dict[int, tuple[tuple[float, float], float]] = {}  # batch -> its weights' squares, when
        self._wrong: str | None = None

    def total(self, queue: Any, reducer: Any, parts: list[int], plan: StepPlan | None) -> Any:
        """The reducer's total of the batch played as `parts` (a reference to it), or,
        with `plan`, its answer with the step taken and given to the queue (Stepped)."""
        if plan is None:
            return reducer.result.remote(parts)
        sent, self._mirrored = self._mirrored, None  # (unknown until answered)
        state = (plan.owner, plan.steps)
        weights, cache = (
            (None, None) if sent == state else (StoredWeights.of(plan.weights), StoredWeights.of(plan.cache))
        )
        settings = (plan.learning_rate, plan.decay_rate, plan.max_update_norm)
        order = StepOrder(state, *settings, weights, cache)
        return reducer.step_ahead.remote(queue, parts, order, plan.ticket)

    def received(self, answer: Total | Stepped) -> Total:
        if isinstance(answer, Total):
            return answer
        self._mirrored = answer.state
        if answer.squares is not None:  # the queue has published the next batch's weights, the reducer's step's
            self._stepped[answer.batch] = (answer.squares, time.monotonic())
        return answer.total

    def publish(
        self,
        queue: Any,
        batch: int,
        weights: Params,
        timeout: float,
        to_queue: bool = True,
        squares: tuple[float, float] | None = None,
    ) -> float:
        """When the announced `batch`'s weights went out: the reducer's step's, which
        must be these, the trainer's (else raises, and the pool is done for: check()),
        compared by their squared norms (`squares`, if the trainer has them: summing
        them again took 1.5 ms of the driver's CPU as the next batch started), or
        these, published now (unless not `to_queue`: the batch was recalled)."""
        import ray

        self.check()
        if batch in self._stepped:
            expected, when = self._stepped.pop(batch)
            if (squares or squared_norms(weights)) != expected:
                self._wrong = f"the weights the reducer stepped to for batch {batch} are not the trainer's (a bug)"
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
