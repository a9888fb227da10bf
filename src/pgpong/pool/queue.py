"""A cluster's batch queue: the matches of the batch, handed out to whichever node has
free workers, so that no worker anywhere idles while a match of the batch is unplayed.

WorkQueue is a small Ray actor (no CPU of its own, next to the driver). Each node's
leader asks it for as many matches as its node has free workers (twice as many while
the queue holds at least two matches per worker of the cluster, so that a worker
finds its next match waiting), and asks again as its workers free up; QueueFeed is
the leader's side of that conversation. The queue remembers which node took which
matches until the driver has that node's sum, so that a lost node's matches can be
handed out again. Who plays which match does not change the weights: the gradients
are summed exactly (sums.py).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from pgpong.rollout import EpisodeId


class WorkQueue:
    """The matches of the current batch not yet handed out, and who took the others."""

    def __init__(self, workers: int):
        self.workers = workers  # of the whole cluster
        self.batch = -1
        self.episodes: list[EpisodeId] = []
        self.todo: deque[int] = deque()  # positions in the batch
        self.taken: dict[int, list[int]] = {}  # node -> positions it took and has not yet summed
        self.handed = 0  # matches handed out in this batch, those handed out again included

    def reset(self, batch: int, episodes: list[EpisodeId]) -> None:
        """A new batch: every match to be handed out."""
        self.batch, self.episodes = batch, episodes
        self.todo = deque(range(len(episodes)))
        self.taken, self.handed = {}, 0

    def set_workers(self, workers: int) -> None:
        self.workers = workers

    def take(self, batch: int, node: int, free: int) -> tuple[list[tuple[int, EpisodeId]], int]:
        """Up to `free` matches for `node` (twice as many while plenty are left), as
        (position, episode), and how many are left after them."""
        if batch != self.batch:
            return [], 0  # a request from an earlier batch
        wanted = 2 * free if len(self.todo) >= 2 * self.workers else free
        given = [self.todo.popleft() for _ in range(min(wanted, len(self.todo)))]
        self.taken.setdefault(node, []).extend(given)
        self.handed += len(given)
        return [(p, self.episodes[p]) for p in given], len(self.todo)

    def settle(self, node: int) -> None:
        """The driver has `node`'s sum: what it took is played for good."""
        self.taken.pop(node, None)

    def give_back(self, node: int) -> int:
        """`node` is lost: the matches it took go first to whoever asks next."""
        lost = self.taken.pop(node, [])
        self.todo.extendleft(reversed(lost))
        return len(lost)

    def put_back(self, positions: list[int]) -> None:
        """Matches whose sum was lost on its way: to be played again."""
        self.todo.extendleft(reversed(positions))

    def handed_out(self) -> int:
        return self.handed


class QueueFeed:
    """A node leader's side of the queue: asks for matches when the node has free
    workers without one, one request at a time (RayPool.run waits on it)."""

    def __init__(self, queue: Any, batch: int, node: int):
        self.queue, self.batch, self.node = queue, batch, node
        self.remaining = 1  # unknown until the first answer: at least one
        self.exhausted = False
        self._request: Any = None

    def pending(self) -> list:
        return [self._request] if self._request is not None else []

    def ask(self, local: int, free: int) -> None:
        if self._request is None and not self.exhausted and local < free:
            self._request = self.queue.take.remote(self.batch, self.node, free - local)

    def receive(self, ref: Any) -> list | None:
        if ref != self._request:
            return None
        import ray

        self._request = None
        given, self.remaining = ray.get(ref)
        if not given:
            self.exhausted = True
        return given
