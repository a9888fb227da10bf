"""A node leader's side of the cluster's queue (pool/queue.py): when to ask it for
matches and how many, the jobs of the batches it hands out (an announced batch's
weights followed until they come; others copied into this node's store), and which
matches wait for their weights."""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from typing import Any

from pgpong.pool.base import Job
from pgpong.pool.queue import Answer, copied
from pgpong.pool.worker import WeightsToCome


class QueueFeed:
    """A node leader's side of the queue: asks for matches when the node has free
    workers without one, one request at a time (RayPool.run waits on it), and knows
    each batch's job. After an empty answer it asks again only to wait for more: at
    once if the queue said more may come (--lag 1, or a batch announced: the next
    batch may be added any time), else once the node has nothing at all to do (the
    next batch comes after this one is over; those requests, one per match finished
    at the batch's end, were most of the queue's calls). So the leader's run goes on
    until the queue stops. The matches it holds of a batch no longer in play
    (cancelled) are dropped before they start. For an announced batch it asks the
    queue for the weights at once, and follows that call: until it is answered, the
    batch's matches wait (`waits`). Once the queue says they may (`behind`), it asks
    for them for its playing workers too, one behind each, so that their calls go out
    while this batch plays."""

    def __init__(self, queue: Any, node: int, copy_weights: bool = True, workers: int = 0):
        self.queue, self.node, self.copy_weights, self.workers = queue, node, copy_weights, workers
        self.remaining = 1  # unknown until the first answer: at least one
        self._left_of: dict[int, int] = {}  # of those, by batch
        self._announced: set[int] = set()  # the batches whose weights were still to come, as last heard
        self._came: set[int] = set()  # the announced batches in play whose weights came
        self.jobs: dict[int, Job] = {}
        self.sizes: dict[int, int] = {}  # the matches of each batch in `jobs`
        self.held: Counter[int] = Counter()  # matches of each batch received and not yet played (the leader counts)
        self.dropped: set[int] = set()  # batches this node holds matches of that are no longer in play
        self.on_job: Callable[[int, Job], None] | None = None  # told of each batch as its job comes (leader.py)
        self._request: Any = None
        self._to_come: dict[Any, int] = {}  # the calls for announced batches' weights not yet answered -> batch
        self._empty = False  # the last answer was empty
        self._more = False  # the queue's last answer: more may come before the batches in play are over
        self._behind = False  # the queue's last answer: an announced batch's matches may wait behind playing ones
        self._stopped = False

    @property
    def exhausted(self) -> bool:
        return self._stopped and self._request is None

    @property
    def playable(self) -> int:
        """The matches left in the queue, as last heard, but those whose weights are still to come."""
        return sum(left for batch, left in self._left_of.items() if batch not in self._announced)

    def left_of(self, batch: int) -> int:
        """The batch's matches left in the queue, as last heard."""
        return self._left_of.get(batch, 0)

    def pending(self) -> list:
        return [*([self._request] if self._request is not None else []), *self._to_come]

    def waits(self, key: tuple[int, int]) -> bool:
        """Whether the match's weights are still to come (its batch announced, not yet published)."""
        return key[0] in self._to_come.values()

    def behind(self, key: tuple[int, int]) -> bool:
        """Whether the match waits for its weights and may wait behind a playing one:
        they cannot come before the matches in play have ended (the queue said so)."""
        return self._behind and self.waits(key)

    def ask(self, local: int, free: int, busy: int = 0, room: int = 0) -> None:
        """Ask for matches if the node's `free` workers are more than the `local` ones
        it holds (`busy` workers are playing), or, holding none, for an announced
        batch's, one behind each of the `room` playing workers that hold nothing
        behind, while the queue says they may wait there."""
        if self._request is not None or self._stopped:
            return
        behind = 0 if local else room  # (the queue says whether they may wait there)
        announced = any(self._left_of.get(batch) for batch in self._announced)  # (as last heard)
        # Room behind, and more may come: it asks; with none known to play or announced,
        # it waits in the queue for the next batch, whose matches' calls then go out
        # while this batch plays. (Heard to play, it asks once: that may be old news.)
        for_behind = behind and self._behind and (announced or self._more)
        if local >= free and not for_behind:
            return
        wait = (self._empty and not for_behind) or (for_behind and not announced and not self.playable)
        if wait and not self._more and (local or busy):  # nothing more comes: the batch's last matches play here
            return
        known = tuple(self.jobs)
        self._request = self.queue.take.remote(self.node, max(0, free - local), known, self.workers, wait, behind)

    def receive(self, ref: Any) -> list | None:
        """The matches a request brought, as ((batch, position), episode) (none when an
        announced batch's weights came); None if `ref` is not ours."""
        if ref in self._to_come:
            batch = self._to_come.pop(ref)
            self._announced.discard(batch)
            self._came.add(batch)
            return []
        if ref != self._request:
            return None
        import ray

        self._request = None
        answer: Answer = ray.get(ref)
        given, self.remaining, self._more, self._stopped = answer.given, answer.left, answer.more, answer.stopped
        self._behind = answer.behind
        self._came &= set(answer.in_play)
        self._left_of, self._announced = answer.left_of, set(answer.announced) - self._came
        self.jobs.update({batch: self._ready(batch, job) for batch, job in answer.jobs.items()})
        self.sizes.update(answer.sizes)
        self._empty = not given
        self.held.update(batch for batch, _, _ in given)
        # A job (and its weights' reference) is kept while its batch is in play or this node
        # holds a match of it (one playing may have to be played again, its worker lost):
        # up to four batches with --lag-share (a batch's two parts, the next's two)
        for batch in set(self.jobs) - set(answer.in_play) - set(self.held):
            del self.jobs[batch]
            self.sizes.pop(batch, None)
        self.dropped = set(self.held) - set(answer.in_play)
        if self.on_job is not None:
            for batch, job in answer.jobs.items():
                self.on_job(batch, job)
        return [((batch, position), episode) for batch, position, episode in given]

    def _ready(self, batch: int, job: Job) -> Job:
        """The job as this node's workers take it: an announced batch's weights are
        asked of the queue now (its workers wait for the answer), others are copied
        into this node's store."""
        method, published, args = job
        if published is None:
            call = self.queue.weights_for.remote(batch)
            self._to_come[call] = batch
            return method, WeightsToCome(call), args
        return node_copy(job) if self.copy_weights and not published.in_place else job

    def tidy(self, todo: deque) -> None:
        """Drop the matches not yet started of batches no longer in play."""
        if not self.dropped:
            return
        keep = [item for item in todo if item[0][0] not in self.dropped]
        for (batch, _), _ in [item for item in todo if item[0][0] in self.dropped]:
            self.done(batch)
        todo.clear()
        todo.extend(keep)

    def done(self, batch: int) -> int:
        """One match of `batch` is no longer held here; how many still are."""
        self.held[batch] -= 1
        left = self.held[batch]
        if not left:
            del self.held[batch]
        return left

    def job(self, key: tuple[int, int]) -> Job:
        return self.jobs[key[0]]


def node_copy(job: Job) -> Job:
    """The job with its weights copied into this node's object store by this process
    (a leader of the node), which owns the copy: its workers read it there, and Ray's
    books on them are kept by the leader, so the queue, which owns the batch's
    weights, counts one reader per leader (one per 64 workers) rather than one per
    worker (about 20 ms of the queue's CPU per update at 11x18). It costs a 5 MB copy
    per leader and batch. The leaders on the queue's node do not copy: their workers
    read the queue's object, and the queue keeps their books."""
    import ray

    method, published, args = job
    try:
        return method, copied(published), args
    except (ray.exceptions.RayError, OSError):  # (OSError: this node's store is going, with the node)
        return job  # the workers fetch the queue's copy themselves, each failure theirs to handle
