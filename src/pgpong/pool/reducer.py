"""The reducer of a cluster pool: an actor on the driver's node, with no CPU of its
own, that adds the nodes' exact sums of each batch in play as they come and gives a
batch's total once every match of it is in. The driver receives that one array,
whatever the batch and the nodes, with what the nodes said of their share: their
workers' idle time at the batch's end, and their leaders' phases. When the trainer
says its next step, the reducer takes it on the total and gives the weights it makes
to the queue for the next batch (ahead.py); or, where the cluster's only leader plays
every match of the batch, it hands the step to that leader, which takes it on the sum
it made (claim)."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pgpong.policy import EpisodeGradient, Params
from pgpong.pool.sums import ExactSum, IntegerGradient, added
from pgpong.pool.worker import StoredWeights, publish
from pgpong.rmsprop import RMSProp


@dataclass
class NodeShare:
    """What a node's leader says with its sum of a batch."""

    workers: int  # the node's workers (of this leader)
    idle_s: float  # their idle seconds so far, with nothing left to hand out (summed over them)
    seconds: dict[str, float] = field(default_factory=dict)  # the leader's phases since its last sum


@dataclass
class WholeBatch:
    """A node's sum of every match of a batch, rounded to float32 where it was made:
    the batch's total, to the bits the reducer would make of it (ExactSum.rounded),
    in half the bytes of its fixed point. A node holds a whole batch where it has the
    cluster's only leader (a node of up to 64 workers), or where the batch was small."""

    grad: EpisodeGradient
    matches: int


@dataclass
class Total:
    """A batch's total, and the nodes' account of it."""

    grad: EpisodeGradient
    idle_s: float  # the workers of the nodes that played it: their idle seconds until the total was complete
    workers: int  # how many workers those nodes have
    node_seconds: dict[str, float]  # the leaders' phases, summed over them


@dataclass
class Summing:
    """A batch in the reducer: how many matches it has, their sum so far, which
    positions each node's sums brought, and the nodes declared lost."""

    matches: int
    total: ExactSum | None = None
    whole: EpisodeGradient | None = None  # a node's sum of every match, rounded where it was made
    counted: dict[int, list[int]] = field(default_factory=dict)
    closed: set[int] = field(default_factory=set)
    shares: list[tuple[float, NodeShare]] = field(default_factory=list)  # (when it came, the node's account)

    def add(self, part: IntegerGradient | EpisodeGradient | WholeBatch) -> None:
        """A node's sum, one match's gradient, or a node's sum of the whole batch: that
        is the total as it came (no 10 MB sum made, filled and read back), and it comes
        alone (rounded, it cannot be added to exactly: anything else of the batch is a bug)."""
        if isinstance(part, WholeBatch):
            if part.matches != self.matches:
                raise ValueError(f"a node's sum of {part.matches} matches came as a whole batch of {self.matches}")
            if self.total is not None or self.whole is not None:
                raise ValueError("a node's sum of the whole batch came beside other parts of it")
            self.whole = part.grad
            return
        if self.whole is not None:
            raise ValueError("a part of a batch came after a node's sum of the whole batch")
        self.total = self.total or ExactSum(len(part.W2))
        self.total.add(part)

    def complete(self) -> bool:
        return self.whole is not None or (self.total is not None and self.total.matches >= self.matches)

    def rounded(self) -> EpisodeGradient:
        """The complete sum, in float32."""
        if self.whole is not None:
            return self.whole
        assert self.total is not None
        return self.total.rounded()


@dataclass(frozen=True)
class StepOrder:
    """A StepPlan (pool/base.py) as the reducer gets it: the weights and cache only when
    its copy is not of the plan's state."""

    state: tuple[str, int]
    learning_rate: float
    decay_rate: float
    max_update_norm: float | None
    weights: StoredWeights | None  # with the cache: the state to start from (None: the reducer's copy is it)
    cache: StoredWeights | None


@dataclass(frozen=True)
class StepTaken:
    """A leader's word, with its sum of a batch it claimed, on the step it took: the state
    its copy holds now (None: unknown), and the new weights' squared norms if the queue
    published them."""

    state: tuple[str, int] | None
    squares: tuple[float, float] | None


@dataclass
class Stepped:
    """The reducer's answer with a step: the batch's total, the state its copy holds
    now (None: unknown, to be sent again), and the new weights' squared norms if the
    queue published them for `batch`."""

    batch: int
    total: Total
    state: tuple[str, int] | None
    squares: tuple[float, float] | None


class Mirror:
    """The reducer's copy of a trainer's weights and RMSProp cache."""

    def __init__(self) -> None:
        self.state: tuple[str, int] | None = None
        self.weights: Params | None = None
        self.cache: Params | None = None

    def step(
        self, total: EpisodeGradient, order: StepOrder, start: list[Params] | None
    ) -> tuple[Params, RMSProp] | None:
        """The step `order` says, taken on a batch's `total` (from `start`, the order's
        weights and cache, if it brought them): the new weights, and the optimizer whose
        measure() then sums their norms, if the step could be taken and they, the
        gradient and the cache are finite (else the trainer's own step raises). On the
        total's touched columns only: the bits of the trainer's step on it dense."""
        if start is not None:
            self.weights, self.cache = (Params.of(params.W1, params.W2) for params in start)  # (writable)
            self.state = order.state
        if self.state != order.state or self.weights is None or self.cache is None:  # (None: for mypy)
            return None
        self.state = None  # (until the step is good)
        optimizer = RMSProp(order.learning_rate, order.decay_rate, self.cache, order.max_update_norm)
        optimizer.apply(self.weights, total)  # (a gradient not finite makes the cache so)
        if not (optimizer.weights_finite and optimizer.cache_finite):
            return None
        self.state = (order.state[0], order.state[1] + 1)
        return self.weights, optimizer


class Reducer:
    """On the driver's node, with no CPU of its own: adds the nodes' sums of each batch
    in play as they come, and gives a batch's total once every match is in it, in
    float32. It knows which matches each node's sums brought, and takes nothing more
    from a node declared lost. An asyncio actor: result() waits while add() goes on."""

    def __init__(self) -> None:
        self.batches: dict[int, Summing] = {}
        self.ahead = Counter[int]()  # node -> its sums added so far that were sent ahead of its last of a batch
        self.wholes = Counter[int]()  # node -> the batches it played whole, their sums rounded there
        self.mirror = Mirror()  # the trainer's weights and cache, to step ahead of it
        self.orders: dict[int, tuple[StepOrder, int]] = {}  # batch -> the step on its total, the batch to play it
        self.claimed: dict[int, StepTaken | None] = {}  # batch -> its leader's step, once its sum came
        self.leader_steps = 0  # the steps leaders took and published
        self._news = asyncio.Condition()
        self._stepping = asyncio.Lock()  # (one step at a time)

    async def open(self, batch: int, matches: int) -> None:
        self.batches[batch] = Summing(matches)

    async def add(
        self,
        batch: int,
        node: int,
        part: IntegerGradient | EpisodeGradient | WholeBatch,
        positions: list[int],
        share: NodeShare | None,
        taken: StepTaken | None = None,
    ) -> bool:
        """Add `node`'s sum (of the matches at `positions`: all it played of the batch,
        or those it sent ahead of its last, without `share`; with `taken`, the step its
        leader took on it, claimed); False if the batch is over or the node was declared
        lost meanwhile (its matches are being played again)."""
        summing = self.batches.get(batch)
        if summing is None or node in summing.closed:
            return False
        summing.add(part)
        if taken is not None and batch in self.claimed:
            self.claimed[batch] = taken
            self.leader_steps += taken.squares is not None
        self.ahead[node] += share is None
        self.wholes[node] += isinstance(part, WholeBatch)
        summing.counted.setdefault(node, []).extend(positions)
        if share is not None:
            summing.shares.append((time.monotonic(), share))
        if summing.complete():
            async with self._news:
                self._news.notify_all()
        return True

    async def sent_ahead(self) -> dict[int, int]:
        return dict(self.ahead)

    async def sent_whole(self) -> dict[int, int]:
        return dict(self.wholes)

    async def stepped_by_leaders(self) -> int:
        return self.leader_steps

    async def claim(self, batch: int) -> tuple[StepOrder, int] | None:
        """The trainer's step on `batch`'s total and the batch to play the weights it
        makes, for the cluster's only leader, which plays every match of it, to take on
        its own sum once that is made, then give the weights to the queue and its sum
        here (with StepTaken): the weights go out without the sum's trip here first.
        Asked as the leader is handed the batch, answered once the trainer says its
        step. None if the batch is over first (collected without a step, or cancelled),
        is in two parts (--lag-share), claimed, or summed here in part already: the step
        is then the reducer's (step_ahead). Where the trainer's order brings no weights
        and the reducer's copy is of its state (the reducer took the last step), the
        answer brings that copy."""
        async with self._news:
            await self._news.wait_for(lambda: batch in self.orders or batch not in self.batches)
        summing = self.batches.get(batch)
        if summing is None or batch not in self.orders or batch in self.claimed:
            return None
        if summing.total is not None or summing.whole is not None:
            return None
        self.claimed[batch] = None  # (None until the leader's sum comes with its step)
        order, to_play = self.orders[batch]
        weights, cache = self.mirror.weights, self.mirror.cache
        if order.weights is None and self.mirror.state == order.state and weights is not None and cache is not None:
            # the reducer took the step before: the leader starts from its copy
            order = dataclasses.replace(order, weights=StoredWeights.of(weights), cache=StoredWeights.of(cache))
        return order, to_play

    async def cpu_seconds(self) -> float:
        """This process's CPU time so far (bench follows the reducer's share of an update)."""
        return time.process_time()

    async def close(self, node: int) -> dict[int, list[int]]:
        """`node` is lost: from now on nothing of it is added. For each batch, the
        positions its sums brought (they stay in the sum)."""
        for summing in self.batches.values():
            summing.closed.add(node)
        return {batch: summing.counted.get(node, []) for batch, summing in self.batches.items()}

    async def complete(self, batch: int) -> None:
        """Once every match of the batch is in its sum (which stays here for result()),
        or the batch is over here (summed in a result, or cancelled)."""
        async with self._news:
            await self._news.wait_for(lambda: batch not in self.batches or self.batches[batch].complete())

    async def result(self, parts: list[int]) -> Total:
        """The sum of a batch played as `parts` (its batches here, in episode order: one,
        or two with --lag-share), once every match of each is in; then they are over
        here. Each part's exact sum is rounded to float32 once, and the parts' sums are
        added in float32 in that order, as BatchResult.plus adds them, so one array
        leaves the reducer. The nodes' account: of the last part (which ends the
        batch), a node's workers idle from the moment it sent its sum until the total
        was complete; the leaders' phases of every part."""
        for batch in parts:
            await self.complete(batch)
            if batch not in self.batches:
                raise KeyError(f"batch {batch} was cancelled")
        summings = [self.batches.pop(batch) for batch in parts]
        async with self._news:  # (a claim waiting for one of them: they are over here)
            self._news.notify_all()
        grad = functools.reduce(added, [summing.rounded() for summing in summings])
        now, seconds = time.monotonic(), Counter[str]()
        for summing in summings:
            for _, share in summing.shares:
                seconds.update(share.seconds)
        last = summings[-1].shares
        idle = sum(share.idle_s + share.workers * (now - came) for came, share in last)
        workers = sum(share.workers for _, share in last)
        return Total(grad, idle, workers, dict(seconds))

    async def step_ahead(self, queue: Any, parts: list[int], order: StepOrder, batch: int) -> Stepped:
        """The total of the batch played as `parts` (result()), and the trainer's next
        step taken on it here: the weights it makes go to the queue at once, for the
        announced `batch` (if it still waits for them). Here, not in the queue: the
        total does not travel first, and the queue's calls go on meanwhile. Unless the
        leader that played it whole claimed the step and took it (claim): then its word."""
        if len(parts) == 1:
            self.orders[parts[0]] = (order, batch)
            async with self._news:
                self._news.notify_all()
        try:
            total = await self.result(parts)
            taken = self.claimed.get(parts[0])
        finally:
            self.orders.pop(parts[0], None)
            self.claimed.pop(parts[0], None)
        if taken is None:  # (not claimed, or the leader's word did not come: the step is taken here)
            taken = await self._step(total.grad, order, queue, batch)
        return Stepped(batch, total, taken.state, taken.squares)

    async def _step(self, total: EpisodeGradient, order: StepOrder, queue: Any, batch: int) -> StepTaken:
        """The step `order` says, on the total, by this reducer's copy, its weights given
        to the queue for `batch`; what then holds, as a leader would say it (leader.OwnStep)."""
        async with self._stepping:
            try:
                start = (
                    None
                    if order.weights is None or order.cache is None
                    else [await order.weights.ref, await order.cache.ref]
                )
                made = self.mirror.step(total, order, start)
                if made is not None and await queue.publish_stepped.remote(batch, publish(made[0])[0]):
                    made[1].measure(made[0])  # (the norms once the weights are out: the next batch waits for them)
                    return StepTaken(self.mirror.state, made[1].weight_squares)
                return StepTaken(self.mirror.state, None)
            except Exception:  # (the store full, say): the trainer's publish brings the weights
                self.mirror.state = None
                return StepTaken(None, None)

    async def forget(self, batch: int) -> None:
        """The batch is cancelled: a result() waiting for it raises, a claim() gets None."""
        self.batches.pop(batch, None)
        async with self._news:
            self._news.notify_all()
