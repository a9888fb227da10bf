"""The pool for a cluster of several nodes (or many workers, or --lag 1): a leader per
node, matches pulled from one queue, sums that meet before the driver.

Each node has a leader (leader.py: an actor with no CPU of its own; one per 64
workers) that starts the node's workers and plays matches on them. The leaders take
the matches from one queue (queue.py) as their workers free up, so no worker
anywhere idles while a match is unplayed, and tell the queue now and then which they
have finished. Each leader sums its node's matches of a batch exactly (sums.py) as
they finish, and once the node holds no more of that batch's matches it hands its
sum to a reducer (another CPU-less actor, on the driver's node), which adds the node
sums as they come and gives the total, once, in float32. The driver adds each batch
to the queue, starts the leaders once (their runs go on from batch to batch), reads
the queue's reports a few times a batch and receives one array per update, whatever
the batch and nodes. The queue publishes the weights (it owns a copy of the driver's
and keeps Ray's books on their readers; the reducer owns its step's); a leader of
another node copies them into its store if they came with the batch, not if later.

The next batch is added to the queue before this one is collected. Without a lag it
is announced, without weights: its matches are handed out as workers free up, and
each worker given one calls for it at once and waits in that call for the weights,
which the reducer (or the only leader) makes from this batch's total on the trainer's step
(ahead.py; the trainer's publish then checks them; else it brings them), so the
batch starts without a trip through the driver, nor a Ray call per match. With --lag
1 it is submitted with its weights (submit, then collect): a worker that finishes
this batch's last match it could get starts one of the next batch at once.

A leader that dies (its node lost) costs the matches it had taken: the queue hands
them out again and the other leaders play them, with the same seeds. The sums are
exact, so the weights are the same as without the fault.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pgpong.cluster import nodes_with_cpus
from pgpong.placement import LEADER_WORKERS, POLL_SECONDS, groups, node_workers, report_seconds, shares
from pgpong.policy import Params
from pgpong.pool.ahead import Ahead
from pgpong.pool.base import (
    BatchMeasures,
    BatchResult,
    Finished,
    InOrder,
    Limits,
    PoolError,
    StepPlan,
    WorkerSettings,
    failure_reason,
    ignore_episode,
)
from pgpong.pool.leader import NodeDone, NodeLeader
from pgpong.pool.queue import Heard, WorkQueue
from pgpong.pool.reducer import Reducer, Total
from pgpong.pool.worker import StoredWeights, WorkerKind, worker_env
from pgpong.rollout import EpisodeId, MatchResult

# ray.wait returns up to about a millisecond before its timeout: a poll that close to due
# is taken then, rather than by waiting again for the rest (about a dozen calls per poll).
WAKE_EARLY_S = 0.002
PUBLISHING = "publish weights"  # the driver's phase of putting a batch and its weights in the queue


@dataclass
class _InPlay:
    """A batch in the queue, as the driver follows it."""

    episodes: list[EpisodeId]
    method: str
    measures: BatchMeasures
    added: float = field(default_factory=time.monotonic)  # when it went into the queue
    heard: list[tuple[int, Any]] = field(default_factory=list)  # (position, stats or result) not yet handed on
    reported: set[int] = field(default_factory=set)


class ClusterPool:
    """A leader per node of the cluster (per 64 of its workers), each with its share of the workers."""

    def __init__(
        self, settings: WorkerSettings, num_workers: int, kind: WorkerKind | None = None, limits: Limits | None = None
    ):
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self._ray = ray
        self._limits = limits = limits or Limits()
        kind = kind or WorkerKind()
        nodes = nodes_with_cpus()
        counts = shares(num_workers, [node_workers(cpus, kind.per_cpu) for _, cpus in nodes])
        leader_class: Any = ray.remote(num_cpus=0, runtime_env={"env_vars": worker_env()})(NodeLeader)
        leaders = [
            leader_class.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(
                settings, group, kind, limits
            )
            for (node, _), count in zip(nodes, counts, strict=True)
            for group in groups(count, LEADER_WORKERS)
        ]
        self._here = ray.get_runtime_context().get_node_id()  # the driver's node, the queue's and the reducer's
        here = NodeAffinitySchedulingStrategy(self._here, soft=False)
        threads = 2 * len(leaders) + 8  # a request and a wait for weights per leader; the driver's and the reducer's
        queue = ray.remote(num_cpus=0)(WorkQueue).options(scheduling_strategy=here, max_concurrency=threads)
        self._queue: Any = queue.remote(num_workers)
        self._reducer: Any = ray.remote(num_cpus=0)(Reducer).options(scheduling_strategy=here).remote()
        self._leaders: dict[Any, int] = {}  # leader -> its running workers
        self._names: dict[Any, int] = {}  # leader -> its number in the queue's books
        self._lost_replaced = 0  # workers that went with a lost leader
        self._batch = 0  # the newest batch's number
        self._in_play: dict[int, _InPlay] = {}  # batches in the queue, oldest first
        self._runs: dict[Any, tuple[Any, int]] = {}  # a leader's run -> (the leader, self._added when it began)
        self._added = 0  # how many times matches were added to the queue (batches, and a lost node's)
        self._announced: dict[int, list[EpisodeId]] = {}  # batches in the queue without their weights yet
        self._recalled: dict[int, list[EpisodeId]] = {}  # announced batches dropped, to be added when published
        self._renamed: dict[int, int] = {}  # a recalled batch's ticket -> its number in the queue
        self._ahead = Ahead()  # the trainer's next step, which the reducer takes ahead of it
        try:
            started = ray.get([leader.ready.remote() for leader in leaders], timeout=limits.start_s)
        except ray.exceptions.RayError as exc:
            for actor in [*leaders, self._queue, self._reducer]:
                ray.kill(actor)
            raise PoolError(f"a node's leader could not start its rollout workers: {failure_reason(exc)}") from None
        self.node_of: dict[Any, str] = {}  # leader -> its node's id
        for number, (leader, (node, running)) in enumerate(zip(leaders, started, strict=True)):
            self._leaders[leader], self._names[leader], self.node_of[leader] = running, number, node
        self._replaced: dict[Any, int] = dict.fromkeys(self._leaders, 0)
        self._tell_queue_the_workers()

    @property
    def num_workers(self) -> int:
        return sum(self._leaders.values())

    @property
    def replaced(self) -> int:
        return sum(self._replaced.values()) + self._lost_replaced

    def nodes(self) -> int:
        return len(set(self.node_of[leader] for leader in self._leaders))

    def play_batch(
        self, weights: Params, episodes: list[EpisodeId], finished: Finished = ignore_episode
    ) -> BatchResult:
        """Play the batch on every node; the exact sum of its gradients, from the reducer."""
        return self.collect([self.submit(weights, episodes)], finished)

    def submit(self, weights: Params, episodes: list[EpisodeId], like: int | None = None) -> int:
        """Add the batch to the queue (after those in play): the leaders start on it as
        their workers free up. `like`: a batch in play whose weights these are (if the
        queue has published them, it reuses them, and no 5 MB goes out again). A ticket
        for collect."""
        like = self._renamed.get(like, like) if like is not None else None
        return self._add("play", weights, episodes, BatchMeasures(), like=like)

    def announce(self, episodes: list[EpisodeId]) -> int:
        """Add the next batch to the queue before its weights exist: its matches are
        handed out as workers free up, and each worker given one waits for the weights
        in its call, so the batch starts when they come (from publish(), or from the
        reducer's step: collect), without a Ray call per match. A ticket for publish
        and collect."""
        # the time it takes is the update's of the oldest batch in play, collected next (with
        # --lag-share the newest is the next batch's first part)
        measures = BatchMeasures()
        playing = next((p for _, p in sorted(self._in_play.items()) if p.method == "play"), None)
        batch = self._add("play", None, episodes, measures)
        if playing is not None:
            playing.measures.add_seconds(PUBLISHING, measures.seconds.pop(PUBLISHING))
        self._announced[batch] = episodes
        return batch

    def publish(self, ticket: int, weights: Params, squares: tuple[float, float] | None = None) -> None:
        """The weights of an announced batch: its matches start (or, if the queue has
        published its own step's, they are checked, by `squares` if given). One recalled
        meanwhile is added again. Ray's errors raise as PoolError."""
        began, recalled = time.perf_counter(), self._recalled.pop(ticket, None)
        limit, to_queue = self._limits.stall_s, recalled is None
        try:
            when = self._ahead.publish(self._queue, ticket, weights, limit, to_queue=to_queue, squares=squares)
            if recalled is not None:
                self._renamed[ticket] = self.submit(weights, recalled)
                return
        except self._ray.exceptions.RayError as exc:  # (the queue and the reducer are on the driver's node)
            raise PoolError(f"batch {ticket}'s weights could not be published: {failure_reason(exc)}") from None
        del self._announced[ticket]
        in_play = self._in_play[ticket]
        in_play.measures.add_seconds(PUBLISHING, time.perf_counter() - began)
        in_play.added = when

    def _recall(self) -> None:
        """Drop the announced batches from the queue, to be added again when published:
        their parked workers return (a lost node's matches given back, or evaluation's,
        must not wait behind them)."""
        ray = self._ray
        for batch, episodes in list(self._announced.items()):
            with contextlib.suppress(ray.exceptions.RayError):
                ray.get([self._queue.drop.remote(batch), self._reducer.forget.remote(batch)], timeout=10)
            del self._announced[batch], self._in_play[batch]
            self._recalled[batch] = episodes

    def collect(
        self, tickets: list[int], finished: Finished = ignore_episode, step: StepPlan | None = None
    ) -> BatchResult:
        """Wait for the batch's matches (its parts' tickets, in episode order: their stats
        to `finished`, in order); the exact sum of its gradients, from the reducer, which
        adds the parts' sums: one array in. With `step`, the reducer takes it (ahead.py)."""
        self._ahead.check()
        parts = [self._renamed.pop(ticket, ticket) for ticket in tickets]
        step = step if step is None or step.ticket in self._announced else None  # (not recalled)
        replaced, result = self.replaced, self._ahead.total(self._queue, self._reducer, parts, step)
        seconds = Counter[str]()  # each part's (its time to publish)
        for part in parts:  # each part's stats until its matches are all in the sum (the last's: the total)
            in_play, in_order = self._in_play[part], InOrder(finished)
            ready = result if part == parts[-1] else self._reducer.complete.remote(part)
            for position, stats in self._follow(part, [ready]):
                in_order.add(position, stats)
            if in_order.next != len(in_play.episodes):  # each match's stats reach the trainer, or the batch fails
                missing = len(in_play.episodes) - in_order.next
                raise PoolError(f"the stats of {missing} match(es) of the batch never arrived")
            self._over(part)
            seconds.update(in_play.measures.seconds)
        measures = in_play.measures
        measures.seconds = dict(seconds)
        began = time.perf_counter()
        total = self._ahead.received(self._ray.get(result, timeout=self._limits.stall_s))
        measures.add_seconds("wait for the reducer", time.perf_counter() - began)
        measures.bytes_in = total.grad.nbytes
        measures.replaced = self.replaced - replaced
        self._account(in_play, total)
        return BatchResult(total.grad, measures)

    def _account(self, in_play: _InPlay, total: Total) -> None:
        """The barrier (a worker's mean idle time at the batch's end: the nodes' own
        account, and the whole update for the workers of nodes that played none of
        it) and the leaders' mean phases."""
        idle = total.idle_s + max(0, self.num_workers - total.workers) * (time.monotonic() - in_play.added)
        in_play.measures.barrier_s = idle / max(1, self.num_workers)
        for phase, seconds in total.node_seconds.items():
            in_play.measures.node_seconds[phase] = seconds / max(1, len(self._names))

    def cancel(self) -> None:
        """Drop the batches in play: nothing more of them is handed out, summed or heard.
        (Matches already started end on their own.)"""
        ray = self._ray
        for batch in list(self._in_play):
            with contextlib.suppress(ray.exceptions.RayError):
                ray.get([self._queue.drop.remote(batch), self._reducer.forget.remote(batch)], timeout=10)
            del self._in_play[batch]
        for held in (self._announced, self._recalled, self._renamed):
            held.clear()
        self._ahead.clear()

    def evaluate(self, weights: Params, matches: list[EpisodeId], greedy: bool = False) -> Iterator[MatchResult]:
        self._recall()
        batch = self._add("evaluate", weights, matches, BatchMeasures(), greedy)
        results: dict[int, MatchResult] = {}
        next_out = 0
        try:
            for position, result in self._follow(batch, []):
                results.setdefault(position, result)
                while next_out in results:
                    yield results.pop(next_out)
                    next_out += 1
        finally:
            self._over(batch)

    def _add(
        self,
        method: str,
        weights: Params | None,
        episodes: list[EpisodeId],
        measures: BatchMeasures,
        *args: Any,
        like: int | None = None,
    ) -> int:
        """Put a batch in the queue, which publishes its weights (None: announced; the
        same as batch `like`'s, published, if it still has them), and, to be summed, in
        the reducer; start the leaders that are not running; its number."""
        ray, stall_s = self._ray, self._limits.stall_s
        self._batch += 1
        if method == "play":  # in the reducer before any leader can have a sum of it
            ray.get(self._reducer.open.remote(self._batch, len(episodes)), timeout=stall_s)
        began = time.perf_counter()
        # The episodes as lists of numbers: Ray's arguments go through msgpack (strict
        # types), which packs those itself but pickles each tuple, named or not, on its own
        # (about 3 us each: 9 ms of the driver's CPU at batch 3,000).
        plain = [list(episode) for episode in episodes]
        if like is None or not ray.get(self._queue.add_like.remote(self._batch, plain, method, like), timeout=stall_s):
            stored = None if weights is None else StoredWeights.of(weights)
            ray.get(self._queue.add.remote(self._batch, plain, method, stored, args), timeout=stall_s)
        measures.add_seconds(PUBLISHING, time.perf_counter() - began)
        self._in_play[self._batch] = _InPlay(episodes, method, measures)
        self._added += 1
        self._start_leaders()
        return self._batch

    def _over(self, batch: int) -> None:
        self._queue.drop.remote(batch)
        self._in_play.pop(batch, None)

    def _follow(self, batch: int, result: list) -> Iterator[tuple[int, Any]]:
        """Yield (position, stats or result) of the batch's matches as the queue's reports
        come, until every match is accounted for ("play": once `result`, the total, is
        ready; "evaluate": once each is reported). A leader's run that ends starts again
        if matches were added since it began; a lost leader's go back to the queue."""
        ray, stall_s = self._ray, self._limits.stall_s
        in_play = self._in_play[batch]
        last_progress, next_poll = time.monotonic(), time.monotonic() + POLL_SECONDS
        summed = False  # for "play": the reducer's answer is ready
        while not summed and not (not result and len(in_play.reported) == len(in_play.episodes)):
            if not self._runs and not result:  # (a round: evaluation's matches only come back with a lost node)
                self._start_leaders()
            done, _ = ray.wait([*result, *self._runs], num_returns=1, timeout=max(0.0, next_poll - time.monotonic()))
            summed = bool(result) and result[0] in done
            ended = [ref for ref in done if ref in self._runs]
            for ref in ended:
                self._ended(ref)
            if time.monotonic() >= next_poll - WAKE_EARLY_S or ended:
                if self._read_reports() or ended:
                    last_progress = time.monotonic()
                next_poll = time.monotonic() + POLL_SECONDS
                yield from self._take_heard(in_play)
            if time.monotonic() - last_progress > stall_s and not summed:
                raise PoolError(f"no match finished in {stall_s:.0f} s; giving up")
        # Every match is in: the last reports were sent before the last sum, so one more
        # read brings them all.
        self._read_reports()
        yield from self._take_heard(in_play)

    @staticmethod
    def _take_heard(in_play: _InPlay) -> Iterator[tuple[int, Any]]:
        heard, in_play.heard = in_play.heard, []
        yield from heard

    def _read_reports(self) -> bool:
        """Read what the nodes reported since the last read, into each batch's heard
        list (the next batch's too); whether there was any."""
        reports, replaced = self._ray.get(self._queue.progress.remote(), timeout=self._limits.stall_s)
        for leader, number in self._names.items():
            self._replaced[leader] = max(self._replaced[leader], replaced.get(number, 0))
        self._heard(reports)
        for batch, _, positions, items in reports:
            in_play = self._in_play.get(batch)
            if in_play is None:
                continue
            for position, item in zip(positions, items, strict=True):
                if position not in in_play.reported:  # (else a match played again after its node was lost)
                    in_play.reported.add(position)
                    in_play.heard.append((position, item))
        return bool(reports)

    def _start_leaders(self) -> None:
        """Start a run on every leader that has none."""
        running = {leader for leader, _ in self._runs.values()}
        for leader, number in self._names.items():
            if leader not in running:
                self._runs[self._call(leader, number)] = (leader, self._added)

    def _ended(self, ref: Any) -> None:
        """A leader's run is over (it waits in the queue for the next batch, so only
        if the queue stopped, or its pool gave up, or the leader was lost). It starts
        again if matches were added since it began; a leader lost on the way is closed
        at the reducer and its other matches go back to the queue."""
        ray = self._ray
        leader, added = self._runs.pop(ref)
        try:
            done: NodeDone = ray.get(ref)
        except ray.exceptions.RayTaskError as exc:
            if not isinstance(exc.cause, OSError):  # the leader itself gave up (workers keep failing)
                raise PoolError(failure_reason(exc)) from None
            self._lost(leader, exc)  # Ray's I/O failed in it ("Broken pipe"): its node's raylet is going
            return
        except ray.exceptions.RayError as exc:  # the leader or its node is lost
            self._lost(leader, exc)
            return
        self._replaced[leader] = done.replaced
        if added < self._added and leader in self._names:
            self._runs[self._call(leader, self._names[leader])] = (leader, self._added)

    def _heard(self, reports: list[Heard]) -> None:
        """The queue's reports: (batch, node number, positions, their stats or results). (A hook for tests.)"""

    def _call(self, leader: Any, number: int) -> Any:
        cadence, alone = report_seconds(len(self._leaders)), len(self._leaders) == 1  # (alone: leader.OwnStep)
        return leader.run.remote(self._queue, self._reducer, number, self._here, cadence, alone)

    def _lost(self, leader: Any, exc: BaseException) -> None:
        """Close a lost leader: its matches not in a sum go back to the queue (those its
        sums brought into the reducer before stay), for the other leaders to play."""
        ray, stall_s = self._ray, self._limits.stall_s
        if leader in self._leaders:
            self._recall()  # (its given-back matches first, to workers not parked behind an announced batch)
            number = self._names.pop(leader)
            keep = ray.get(self._reducer.close.remote(number), timeout=stall_s)
            ray.get(self._queue.give_back.remote(number, keep), timeout=stall_s)
            self._lost_replaced += self._leaders.pop(leader)
            self._replaced.pop(leader, None)
            self._tell_queue_the_workers()
            ray.kill(leader, no_restart=True)
            self._added += 1  # the matches it had: the leaders whose runs are over start again
            self._start_leaders()
        if not self._leaders:
            raise PoolError(f"every node's leader is lost: {failure_reason(exc)}")

    def _tell_queue_the_workers(self) -> None:
        queue: Any = self._queue
        queue.set_workers.remote(self.num_workers)

    def helpers_cpu_seconds(self) -> dict[str, float]:
        """The CPU time so far of the actors next to the driver, the queue and the
        reducer (empty if they do not answer: bench then goes without)."""
        ray = self._ray
        try:
            queue, reducer = ray.get([self._queue.cpu_seconds.remote(), self._reducer.cpu_seconds.remote()], timeout=30)
        except ray.exceptions.RayError:
            return {}
        return {"queue": queue, "reducer": reducer}

    def queue_calls(self) -> dict[str, int]:
        """The nodes' requests and reports to the queue so far (empty if it does not answer)."""
        try:
            return self._ray.get(self._queue.call_counts.remote(), timeout=30)
        except self._ray.exceptions.RayError:
            return {}

    def call_all(self, method: str, *args: Any) -> list:
        """Call a worker method on every running worker of every node; answers in order."""
        calls = [lead.call_all.remote(method, *args) for lead in self._leaders]
        return [answer for node in self._ray.get(calls, timeout=self._limits.stall_s) for answer in node]

    def close(self) -> None:
        """End the leaders (their runs end as the queue stops; a leader still in a run
        a second later is killed, and its workers go with it), the queue and the reducer."""
        ray = self._ray
        with contextlib.suppress(ray.exceptions.RayError):
            ray.get(self._queue.stop.remote(), timeout=10)
            if self._runs:
                ray.wait(list(self._runs), num_returns=len(self._runs), timeout=1.0)
        running = {leader for ref, (leader, _) in self._runs.items() if not ray.wait([ref], timeout=0)[0]}
        for leader in self._leaders:
            if leader not in running:
                with contextlib.suppress(self._ray.exceptions.RayError):
                    self._ray.get(leader.close.remote(), timeout=10)
            self._ray.kill(leader)
        for actor in (self._queue, self._reducer):
            self._ray.kill(actor)
        self._leaders = {}
