"""A cluster's batch queue: the matches of the batch, handed out to whichever node has
free workers, so that no worker anywhere idles while a match of the batch is unplayed;
and what the nodes say they have played, for the driver to read a few times a batch.

WorkQueue is a small Ray actor (no CPU of its own, next to the driver). Each node's
leader asks it for as many matches as its node has free workers (twice as many while
the queue holds at least two matches per worker of the cluster, so that a worker
finds its next match waiting), asks again as its workers free up, and tells it now
and then which matches it has finished (their stats or results); QueueFeed is the
leader's side of that. The queue remembers which node took which matches, so that a
lost node's can be handed out again. Who plays which match does not change the
weights: the gradients are summed exactly (sums.py).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from pgpong.rollout import EpisodeId


class WorkQueue:
    """The matches of the current batch not yet handed out, who took the others, and
    what the nodes reported of them."""

    def __init__(self, workers: int):
        self.workers = workers  # of the whole cluster
        self.batch = -1
        self.episodes: list[EpisodeId] = []
        self.todo: deque[int] = deque()  # positions in the batch
        self.taken: dict[int, list[int]] = {}  # node -> positions it took
        self.reported: list[tuple[int, int, Any]] = []  # (node, position, stats or result), as they came
        self.handed = 0  # matches handed out in this batch, those handed out again included

    def reset(self, batch: int, episodes: list[EpisodeId]) -> None:
        """A new batch: every match to be handed out."""
        self.batch, self.episodes = batch, episodes
        self.todo = deque(range(len(episodes)))
        self.taken, self.reported, self.handed = {}, [], 0

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

    def report(self, batch: int, node: int, finished: list[tuple[int, Any]]) -> None:
        """`node` has finished these matches: (position, stats or result)."""
        if batch == self.batch:
            self.reported.extend((node, position, item) for position, item in finished)

    def progress(self, since: int) -> tuple[list[tuple[int, int, Any]], int]:
        """What the nodes reported after the first `since` reports, and how many there are now."""
        return self.reported[since:], len(self.reported)

    def give_back(self, node: int, keep: list[int] | None = None) -> int:
        """`node` is lost: the matches it took go first to whoever asks next, but those
        in `keep` (already in the batch's sum), or, when `keep` is None, those it
        reported (a match's result is all there is of it)."""
        kept = set(keep) if keep is not None else {p for n, p, _ in self.reported if n == node}
        lost = [p for p in self.taken.pop(node, []) if p not in kept]
        self.todo.extendleft(reversed(lost))
        return len(lost)

    def handed_out(self) -> int:
        return self.handed

    def taken_by(self, node: int) -> int:
        return len(self.taken.get(node, []))


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
