"""The reducer of a cluster pool: an actor on the driver's node, with no CPU of its
own, that adds the nodes' exact sums of each batch in play as they come and gives a
batch's total once every match of it is in. The driver receives that one array,
whatever the batch and the nodes."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from pgpong.policy import EpisodeGradient
from pgpong.pool.sums import ExactSum, IntegerGradient


@dataclass
class Summing:
    """A batch in the reducer: how many matches it has, their sum so far, which
    positions each node's sums brought, and the nodes declared lost."""

    matches: int
    total: ExactSum | None = None
    counted: dict[int, list[int]] = field(default_factory=dict)
    closed: set[int] = field(default_factory=set)

    def complete(self) -> bool:
        return self.total is not None and self.total.matches >= self.matches


class Reducer:
    """On the driver's node, with no CPU of its own: adds the nodes' sums of each batch
    in play as they come, and gives a batch's total once every match is in it, in
    float32. It knows which matches each node's sums brought, and takes nothing more
    from a node declared lost. An asyncio actor: result() waits while add() goes on."""

    def __init__(self) -> None:
        self.batches: dict[int, Summing] = {}
        self._news = asyncio.Condition()

    async def open(self, batch: int, matches: int) -> None:
        self.batches[batch] = Summing(matches)

    async def add(self, batch: int, node: int, part: IntegerGradient, positions: list[int]) -> bool:
        """Add `node`'s sum (of the matches at `positions`); False if the batch is over
        or the node was declared lost meanwhile (its matches are being played again)."""
        summing = self.batches.get(batch)
        if summing is None or node in summing.closed:
            return False
        summing.total = summing.total or ExactSum(len(part.W2))
        summing.total.add(part)
        summing.counted.setdefault(node, []).extend(positions)
        if summing.complete():
            async with self._news:
                self._news.notify_all()
        return True

    async def cpu_seconds(self) -> float:
        """This process's CPU time so far (bench follows the reducer's share of an update)."""
        return time.process_time()

    async def close(self, node: int) -> dict[int, list[int]]:
        """`node` is lost: from now on nothing of it is added. For each batch, the
        positions its sums brought (they stay in the sum)."""
        for summing in self.batches.values():
            summing.closed.add(node)
        return {batch: summing.counted.get(node, []) for batch, summing in self.batches.items()}

    async def result(self, batch: int) -> EpisodeGradient:
        """The batch's sum, once every match of it is in (then the batch is over here)."""
        async with self._news:
            await self._news.wait_for(lambda: batch not in self.batches or self.batches[batch].complete())
        if batch not in self.batches:
            raise KeyError(f"batch {batch} was cancelled")
        total = self.batches.pop(batch).total
        assert total is not None
        return total.compact().to_float()

    async def forget(self, batch: int) -> None:
        """The batch is cancelled: a result() waiting for it raises."""
        self.batches.pop(batch, None)
        async with self._news:
            self._news.notify_all()
