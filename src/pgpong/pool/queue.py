"""A cluster's queue of matches: the matches of the batches in play, handed out to
whichever node has free workers, so that no worker anywhere idles while a match is
unplayed; and what the nodes say they have played, for the driver to read a few
times a batch.

WorkQueue is a small threaded Ray actor (no CPU of its own, next to the driver). The driver
adds a batch to it (with what to do with its matches and the weights to play them
with, which the queue publishes, so that it owns them, not the driver); two batches
are in it: this one and the next, announced without weights (the reducer, or the
only leader, makes them from this batch's total, taking the trainer's step ahead of
it, and the queue publishes them: ahead.py; the leaders' workers wait for them in their calls, so no
Ray call per match as the batch starts), or with --lag 1 added with its weights, to start
while the last matches of this one play. Each node's leader asks it for as
many matches as its node has free workers (twice as many while the queue holds at
least two matches per worker of the cluster, so that a worker finds its next match
waiting; and more while many are left, placement.request_size), the oldest batch's
first, and for an announced batch's, one behind each of its playing workers (their
calls then go out while this batch plays, not at its end); asks again as its
workers free up; and tells it now and then which matches
it has finished (their stats or results). A node with nothing to do (or, with a
batch announced or --lag 1, nothing more it can play) asks and waits: the queue answers
when there is work again, so a leader's run goes on from batch to batch and the
driver does not start it again each time. pool/feed.py is the leader's side of that.
The queue remembers which node took which matches, so that a lost node's can be
handed out again. Who plays which match does not change the weights: the gradients
are summed exactly (sums.py).
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pgpong.placement import request_size
from pgpong.policy import Params
from pgpong.pool.ahead import STEPPED_AHEAD
from pgpong.pool.base import Job
from pgpong.pool.columns import Report
from pgpong.pool.worker import PublishedWeights, StoredWeights, publish
from pgpong.rollout import EpisodeId

Heard = tuple[int, int, list[int], Any]  # (batch, node, positions, their stats or results: columns.Report's)
Given = list[tuple[int, int, EpisodeId]]  # (batch, position, episode)
COPY_SECONDS = 60.0  # the queue's or a leader's wait for a batch's weights, to copy them into its own store object


def _locked(method: Callable) -> Callable:
    """The method, with the queue's lock held (a request that waits lets it go meanwhile)."""

    @functools.wraps(method)
    def locked(self: WorkQueue, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return locked


@dataclass
class Answer:
    """The queue's answer to a node's request."""

    given: Given  # matches for the node, the oldest batch's first
    jobs: dict[int, Job]  # the jobs of their batches the node did not know
    left: int  # matches left in the queue after these
    in_play: tuple[int, ...]  # the batches in play (a node drops the matches it holds of any other)
    more: bool  # more may come before the batches in play are over (a batch announced, --lag 1): ask again, wait
    stopped: bool = False  # the pool is closing: the node's run ends
    left_of: dict[int, int] = field(default_factory=dict)  # the matches left, by batch
    announced: tuple[int, ...] = ()  # the batches in play whose weights are still to come
    behind: bool = False  # an announced batch's may wait behind playing matches (WorkQueue._answer says when)
    sizes: dict[int, int] = field(default_factory=dict)  # the matches of each batch in `jobs`


@dataclass
class QueuedBatch:
    episodes: list[EpisodeId]
    job: Job
    todo: deque[int] = field(default_factory=deque)  # positions not handed out
    taken: dict[int, list[int]] = field(default_factory=dict)  # node -> positions it took
    reported: dict[int, set[int]] = field(default_factory=dict)  # node -> positions it reported


class WorkQueue:
    """The batches in play: their matches not yet handed out, who took the others, and
    what the nodes reported of them since the driver last read it."""

    def __init__(self, workers: int):
        self.workers = workers  # of the whole cluster
        self.batches: dict[int, QueuedBatch] = {}  # in the order they were added
        self.reports: list[Heard] = []
        self.replaced: dict[int, int] = {}  # node -> workers its leader has replaced, as last reported
        self.handed = 0  # matches handed out, those handed out again included
        self.overlapping = False  # a batch was added while another was in play (announced, --lag 1): more may come
        self.lost: set[int] = set()  # nodes given back: a request of theirs still here gets nothing
        self.calls = Counter[str]()  # the nodes' requests and reports (bench counts them per update)
        self.stopped = False
        # One lock for all of it: the actor answers calls on several threads, so that a
        # request may wait (for matches to be added or given back, or the queue to stop)
        # while the others go on. (A threaded actor: an asyncio one cost about 30% more
        # CPU per call at 11x18, twice as much for an empty call; docs/SCALING.md.)
        self._lock = threading.Condition()

    def add(
        self, batch: int, episodes: list[EpisodeId], method: str, weights: StoredWeights | None, args: tuple = ()
    ) -> None:
        """A batch to play: every match to be handed out, after the earlier batches',
        each to be played with `weights` (RolloutWorker.`method`(weights, episode,
        *args)), or, if None, with those published later (publish, publish_stepped: the batch is
        announced: its matches are handed out at once, and the workers given them wait
        for the weights in their calls). The driver sends the weights by reference
        (StoredWeights), and the queue puts a copy in the object store itself, so
        that it owns them: Ray's books on the processes that read them
        (their borrowing, the copies' locations) are kept here rather than in the
        driver, where at 11x18 they took about half of its CPU time per update
        (docs/SCALING.md)."""
        job = (method, None if weights is None else copied(weights), args)  # (the nodes' calls go on meanwhile)
        with self._lock:
            self._put(batch, episodes, job)

    def _put(self, batch: int, episodes: list[EpisodeId], job: Job) -> None:
        self.overlapping = self.overlapping or bool(self.batches)
        episodes = [EpisodeId(*episode) for episode in episodes]  # (sent as lists: ClusterPool._add)
        self.batches[batch] = QueuedBatch(episodes, job, deque(range(len(episodes))))
        self._lock.notify_all()

    @_locked
    def add_like(self, batch: int, episodes: list[EpisodeId], method: str, like: int) -> bool:
        """A batch to play with the weights of batch `like`, an announced batch still in
        play whose weights are published: its workers have them, so those of another
        node read them in place too (--lag-share's next part: no 5 MB from the driver,
        no copy per node). False, and nothing added, if `like` no longer has them."""
        queued = self.batches.get(like)
        if queued is None or queued.job[1] is None:
            return False
        published = dataclasses.replace(queued.job[1], in_place=True)
        self.calls["reused weights"] += 1
        self._put(batch, episodes, (method, published, ()))
        return True

    def publish(self, batch: int, weights: StoredWeights) -> bool | None:
        """The weights of an announced batch: the workers waiting for them start (False:
        it had weights already, and keeps them; None: it is not in the queue)."""
        return self._publish(batch, copied(weights))  # (the copy made while the nodes' calls go on)

    def publish_stepped(self, batch: int, published: PublishedWeights) -> bool | None:
        """The weights the reducer's step made for an announced batch (ahead.py), or the
        only leader's (leader.OwnStep), in the store by it, which owns them: published
        as they are, and counted."""
        return self._publish(batch, published, ahead=True)

    @_locked
    def _publish(self, batch: int, published: PublishedWeights, ahead: bool = False) -> bool | None:
        queued = self.batches.get(batch)
        if queued is None or queued.job[1] is not None:  # (dropped, or published)
            return None if queued is None else False
        queued.job = (queued.job[0], published, queued.job[2])
        self.calls[STEPPED_AHEAD] += ahead
        self._lock.notify_all()
        return True

    @_locked
    def weights_for(self, batch: int) -> PublishedWeights | None:
        """An announced batch's weights, once published: a leader's workers wait for
        this answer (WeightsToCome), and read the published copy, on every node. (A copy
        of its own for each leader of another node, as node_copy makes, was slower
        here: at 11x18, 1.9-2.0 s per update against 1.2.) None if the batch is
        dropped or the queue stops first."""
        while not self.stopped and batch in self.batches and self.batches[batch].job[1] is None:
            self._lock.wait()
        if self.stopped or batch not in self.batches:
            return None
        return self.batches[batch].job[1]

    @_locked
    def drop(self, batch: int) -> None:
        """The batch is over (or cancelled): nothing more of it is handed out or heard."""
        self.batches.pop(batch, None)
        self._lock.notify_all()

    @_locked
    def set_workers(self, workers: int) -> None:
        self.workers = workers

    @_locked
    def take(
        self, node: int, free: int, known: tuple[int, ...] = (), size: int = 0, wait: bool = False, behind: int = 0
    ) -> Answer:
        """Matches for `node` (`size` workers, `free` of them free), the oldest batch's
        first, as (batch, position, episode): one per free worker, or more while many
        are left (placement.request_size), so that a node asks about once per few
        matches then, and once per match at the end, where the balance is; the jobs of their
        batches but those `known` to the node (each job holds a reference to the
        weights, which Ray counts each time one is passed); how many matches are left;
        the batches in play (a node drops the matches it holds of any other); and
        whether more may come before the batches in play are over (the next batch is
        announced, or with --lag 1 added, while this one plays; when the driver adds
        a batch only after the last, a node does not ask again until it has nothing at
        all to do). With `wait`, an empty answer waits until there are matches again
        (or the queue stops): a node with nothing to do waits here for the next batch.
        A lost node's request (its leader gone, the request still here) gets nothing:
        the matches given back for it are for the others. With `behind`, up to that many
        more of an announced batch, for the node's busy workers to hold behind the
        match they play, if they may wait there (Answer.behind). A request for those
        alone (no worker free) that waits does so until the queue changes: it waits for
        the next batch to be announced, and must not keep the node from asking again
        when something else comes."""
        self.calls["take"] += 1
        answer = self._answer(node, free, known, size, behind)
        changes = 0
        while wait and not answer.given and not answer.stopped and (free or not changes):
            self._lock.wait()
            answer, changes = self._answer(node, free, known, size, behind), changes + 1
        if not answer.given:
            self.calls["empty take"] += 1
        return answer

    def _answer(self, node: int, free: int, known: tuple[int, ...], size: int, behind: int = 0) -> Answer:
        if node in self.lost:
            return Answer([], {}, 0, (), False, stopped=True)
        left = sum(len(queued.todo) for queued in self.batches.values())
        playable = sum(len(queued.todo) for queued in self.batches.values() if queued.job[1] is not None)
        # Sized by the matches that can play now: an announced batch's, waiting for
        # their weights, do not make this batch's last ones plentiful (its end is
        # balanced); they go to free workers. With none left that can play, the
        # announced ones size it (the leader parks one on each free worker and keeps
        # the rest for workers that free up). With none free, it asks only for matches
        # to hold behind.
        wanted = max(request_size(free, playable or left, size, self.workers), min(free, left)) if free else 0
        # An announced batch's matches may wait behind the node's playing ones when this
        # answer brings every match that can play, each to a free worker (a worker
        # waiting for the announced weights takes no other match, and those weights come
        # from the step on the batches in play before, whose matches all play first), and
        # no batch plays another's weights (--lag-share's first part). It gets one for
        # each free worker and one behind each playing one it asks for: none to keep for
        # later (they would wait behind the next batch's matches).
        may_wait = playable <= min(free, wanted) and all(
            not queued.job[1].in_place for queued in self.batches.values() if queued.job[1]
        )
        behind = behind if may_wait else 0
        given: Given = []
        for batch, queued in self.batches.items():
            if behind and queued.job[1] is None:
                wanted = max(len(given), free) + behind
            while queued.todo and len(given) < wanted:
                given.append(self._give(node, batch, queued))
        self.handed += len(given)
        batches = {batch for batch, _, _ in given} - set(known)
        jobs = {batch: self.batches[batch].job for batch in batches}
        sizes = {batch: len(self.batches[batch].episodes) for batch in batches}
        left_of = {batch: len(queued.todo) for batch, queued in self.batches.items() if queued.todo}
        announced = tuple(batch for batch, queued in self.batches.items() if queued.job[1] is None)
        in_play = tuple(self.batches)
        return Answer(
            given, jobs, left - len(given), in_play, self.overlapping, self.stopped, left_of, announced, may_wait, sizes
        )

    @staticmethod
    def _give(node: int, batch: int, queued: QueuedBatch) -> tuple[int, int, EpisodeId]:
        """The batch's next match, taken by `node`."""
        position = queued.todo.popleft()
        queued.taken.setdefault(node, []).append(position)
        return batch, position, queued.episodes[position]

    @_locked
    def stop(self) -> None:
        """The pool is closing: requests waiting (and any later) get an empty answer that ends the node's run."""
        self.stopped = True
        self._lock.notify_all()

    @_locked
    def report(self, node: int, finished: list[Report], replaced: int = 0) -> None:
        """`node` has finished these matches, per batch (batch, positions, their stats
        in columns or their results), and its leader has replaced `replaced` workers
        since it started. The stats pass through as they came, never made into objects here."""
        self.calls["report"] += 1
        self.replaced[node] = replaced
        for batch, positions, items in finished:
            if batch in self.batches:
                self.batches[batch].reported.setdefault(node, set()).update(positions)
                self.reports.append((batch, node, positions, items))

    @_locked
    def progress(self) -> tuple[list[Heard], dict[int, int]]:
        """What the nodes reported since the last call (the driver is the one reader),
        and the workers each node's leader has replaced."""
        reports, self.reports = self.reports, []
        return reports, self.replaced

    @_locked
    def give_back(self, node: int, keep: dict[int, list[int]] | None = None) -> int:
        """`node` is lost: the matches it took go first to whoever asks next, but, for
        each batch, those in `keep` (already in the batch's sum), or, for a batch not
        in `keep` (evaluated: a match's result is all there is of it), those it reported."""
        lost_count = 0
        self.lost.add(node)
        for batch, queued in self.batches.items():
            reported = queued.reported.pop(node, set())
            kept = set(keep[batch]) if keep is not None and batch in keep else reported
            lost = [p for p in queued.taken.pop(node, []) if p not in kept]
            queued.todo.extendleft(reversed(lost))
            lost_count += len(lost)
        self._lock.notify_all()
        return lost_count

    @_locked
    def cpu_seconds(self) -> float:
        """This process's CPU time so far (bench follows the queue's share of an update)."""
        return time.process_time()

    @_locked
    def call_counts(self) -> dict[str, int]:
        """So far: the nodes' requests ("take") and reports ("report"), the batches added
        with another's weights ("reused weights") or the reducer's step's ("stepped ahead")."""
        return dict(self.calls)

    @_locked
    def handed_out(self) -> int:
        return self.handed

    @_locked
    def in_play(self) -> list[int]:
        return list(self.batches)

    @_locked
    def taken_by(self, node: int, batch: int) -> int:
        queued = self.batches.get(batch)
        return len(queued.taken.get(node, [])) if queued is not None else 0


def copied(weights: StoredWeights | PublishedWeights) -> PublishedWeights:
    """Weights in the store, published again by this process, which owns the copy
    (the queue, of the driver's; a leader, of the queue's)."""
    import ray

    fetched: Params = ray.get(weights.ref, timeout=COPY_SECONDS)
    return publish(fetched)[0]
