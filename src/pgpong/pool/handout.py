"""The two decisions a Ray pool makes while a batch plays: which worker gets the next
episode (HandOut), and which worker is stuck (Watch)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

LOOKAHEAD = 2  # episodes a worker may hold at once: the one it plays and the next


class Watch:
    """When each busy worker last returned something, and the longest an episode has
    taken (since the pool started): a worker silent for much longer than that is stuck."""

    def __init__(self, floor: float, multiple: float):
        self.floor, self.multiple = floor, multiple
        self.longest = 0.0
        self._since: dict[Any, float] = {}

    def new_batch(self) -> Watch:
        self._since.clear()
        return self

    def limit(self) -> float:
        return max(self.floor, self.multiple * self.longest)

    def busy(self, worker: Any) -> None:
        self._since.setdefault(worker, time.monotonic())

    def done(self, worker: Any, busy: bool) -> None:
        now = time.monotonic()
        began = self._since.pop(worker, None)
        if began is not None:
            self.longest = max(self.longest, now - began)
        if busy:
            self._since[worker] = now

    def forget(self, worker: Any) -> None:
        self._since.pop(worker, None)

    def stuck(self) -> list:
        now, limit = time.monotonic(), self.limit()
        return [worker for worker, since in self._since.items() if now - since > limit]


def plentiful(todo: deque, playable: int, workers: int, waits: Callable[[Any], bool]) -> bool:
    """Whether the next episode may go to a worker behind the one it plays: it can play
    now, and at least two per worker that can are left."""
    return not waits(todo[0][0]) and playable >= 2 * workers


class HandOut:
    """Which worker gets the next episode.

    Every free worker gets one; while episodes are plentiful (at least two per
    worker left), each also holds the next one in its queue and starts it the moment
    the first ends, instead of after a round trip to this process (about 4 ms); the
    last ones go only to free workers, so that the batch's end stays balanced.
    An episode whose weights cannot come before every episode now playing has ended
    (`behind`: the next batch's, announced, when nothing else is left) may also go
    behind a playing one: its call is made while the batch plays, not at its end.

    A worker given an episode whose weights are still to come (an announced batch:
    pool/queue.py) is parked: it waits for them in its call, so it is idle until
    they come, and it gets nothing behind that episode (an episode of an earlier
    batch, handed back by a lost node, would wait for the weights too, which wait for
    that batch)."""

    def __init__(self, workers: list):
        self.held: dict[Any, int] = dict.fromkeys(workers, 0)  # episodes each worker holds
        self._with = [deque(workers), deque()]  # candidates holding 0 and 1 (checked when taken)
        self._idle_since: dict[Any, float] = {}  # worker -> when it ran out of work in this batch
        self._parked: dict[Any, Any] = {}  # worker -> the key of the episode it waits to play
        self._behind: dict[Any, Any] = {}  # worker -> the key of the waiting episode it holds behind the one it plays

    def out(
        self,
        todo: deque,
        elsewhere: int = 0,
        waits: Callable[[Any], bool] = lambda key: False,
        behind: Callable[[Any], bool] = lambda key: False,
    ) -> Iterator[tuple[Any, Any]]:
        """(worker, episode) for every episode handed out now, taken from `todo`;
        `elsewhere` more that can play are still to come (a cluster's queue);
        `waits(key)`: that episode's weights are still to come (it goes to a free
        worker only, and does not count as plentiful), unless `behind(key)`: it may
        wait behind a playing episode."""
        playable = sum(1 for key, _ in todo if not waits(key))
        for depth in range(LOOKAHEAD):
            queue = self._with[depth]
            while todo and queue and (depth == 0 or self._deeper(todo, playable + elsewhere, waits, behind)):
                worker = queue.popleft()
                if self.held.get(worker) != depth or worker in self._parked:  # stale, or parked
                    continue
                self.held[worker] = depth + 1
                item = todo.popleft()
                waiting = waits(item[0])
                playable -= not waiting
                if waiting and depth:  # behind the one it plays: it waits once that one ends (back)
                    self._behind[worker] = item[0]
                elif waiting:
                    self._parked[worker] = item[0]
                    self._idle_since.setdefault(worker, time.perf_counter())
                else:
                    self._idle_since.pop(worker, None)
                if depth + 1 < LOOKAHEAD:
                    self._with[depth + 1].append(worker)
                yield worker, item

    def _deeper(self, todo: deque, playable: int, waits: Callable, behind: Callable) -> bool:
        """Whether the next episode may go behind a playing one: it may wait there, or
        it can play now and they are plentiful."""
        return behind(todo[0][0]) or plentiful(todo, playable, len(self.held), waits)

    def unpark(self, waits: Callable[[Any], bool]) -> list:
        """The parked workers whose weights have come start: they are no longer idle. Those workers."""
        started = [worker for worker, key in self._parked.items() if not waits(key)]
        for worker in started:
            del self._parked[worker]
            self._idle_since.pop(worker, None)
            if self.held.get(worker) == 1:
                self._with[1].append(worker)
        return started

    def parked(self) -> int:
        """How many workers wait for their episode's weights."""
        return len(self._parked)

    def back(self, worker: Any, idle: bool, waits: Callable[[Any], bool] = lambda key: False) -> None:
        """`worker` finished an episode; `idle`: nothing is left to hand out; `waits`
        as for `out` (the episode it held behind may be waiting for its weights)."""
        if worker not in self.held:
            return
        if self._parked.pop(worker, None) is not None:  # (its weights came: it played)
            self._idle_since.pop(worker, None)
        self.held[worker] -= 1
        self._with[self.held[worker]].append(worker)
        key = self._behind.pop(worker, None)
        if key is not None and waits(key):  # the one behind it now waits for its weights: parked
            self._parked[worker] = key
            self._idle_since.setdefault(worker, time.perf_counter())
        if idle and not self.held[worker]:
            self._idle_since.setdefault(worker, time.perf_counter())

    def busy(self, worker: Any) -> bool:
        """Whether `worker` plays an episode (it holds one, and is not parked)."""
        return self.held.get(worker, 0) > 0 and worker not in self._parked

    def room_behind(self) -> int:
        """How many workers play an episode and hold nothing behind it."""
        return sum(1 for worker, held in self.held.items() if held == 1 and worker not in self._parked)

    def free(self) -> int:
        """How many workers hold no episode."""
        return sum(1 for held in self.held.values() if not held)

    def join(self, worker: Any) -> None:
        self.held[worker] = 0
        self._with[0].append(worker)

    def leave(self, worker: Any) -> None:
        self.held.pop(worker, None)
        self._idle_since.pop(worker, None)
        self._parked.pop(worker, None)
        self._behind.pop(worker, None)

    def idle_seconds(self) -> float:
        now = time.perf_counter()
        return sum(now - t for t in self._idle_since.values())
