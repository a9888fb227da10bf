"""The cluster's queue of matches (pool/queue.py) as a plain object: how many matches a
node's request brings (one per free worker, more while many are left), when a node's
leader asks again after an empty answer (to wait for more: at once with a lag, once
the node has nothing at all to do without), and that a waiting request is answered
when the next batch comes or the queue stops."""

import threading
import time
from collections import deque
from typing import Any

import numpy as np
import pytest

from pgpong.policy import Params
from pgpong.pool.feed import QueueFeed
from pgpong.pool.queue import Answer, WorkQueue
from pgpong.pool.worker import StoredWeights
from pgpong.rollout import EpisodeId

pytestmark = pytest.mark.usefixtures("ray_instance")  # the queue puts the weights in Ray's store


def stored(weights: Params) -> StoredWeights:
    """The weights as the driver sends them: in the store, by reference."""
    import ray

    return StoredWeights(ray.put(weights))


def episodes(batch: int, count: int) -> list[EpisodeId]:
    return [EpisodeId(7, batch, k) for k in range(count)]


class Waiting(threading.Thread):
    """A request that may wait, on a thread of its own (as on one of the actor's)."""

    def __init__(self, queue, **request):
        super().__init__(daemon=True)
        self.queue, self.request = queue, request
        self.answer: Answer = Answer([], {}, 0, (), False)  # until the request is answered
        self.start()
        time.sleep(0.05)

    def run(self):
        self.answer = self.queue.take(wait=True, **self.request)


def test_a_request_brings_a_share_of_what_is_left_then_one_match_per_free_worker():
    queue = WorkQueue(workers=198)  # 11 nodes of 18
    queue.add(1, episodes(1, 300), "play", stored(Params.initial(8, 0)))
    first = queue.take(node=0, free=18, size=18)
    assert len(first.given) == 18 and first.left == 282  # a free worker each (fewer than 2 per worker are left)
    assert first.sizes == {1: 300}  # with the job: a leader that sums all 300 knows its sum is the total
    sizes, left = [], first.left
    while left:
        answer = queue.take(node=1, free=1, size=18)
        sizes.append(len(answer.given))
        left = answer.left
    assert sizes[0] == 7  # a quarter of the node's share of 282: ceil(282 * 18 / (4 * 198))
    assert sizes == sorted(sizes, reverse=True) and sizes[-20:] == [1] * 20  # the end: one per request
    assert sum(sizes) == 282 and len(sizes) < 282 / 2.5
    handed = [p for p in queue.batches[1].taken[0]] + [p for p in queue.batches[1].taken[1]]
    assert sorted(handed) == list(range(300))  # each match once
    assert queue.call_counts() == {"take": 1 + len(sizes)}


def test_more_may_come_only_once_a_batch_was_added_while_another_was_in_play():
    queue = WorkQueue(workers=8)
    queue.add(1, episodes(1, 3), "play", stored(Params.initial(8, 0)))
    assert (queue.take(node=0, free=4, size=4)).more is False  # no lag: the next batch comes after
    queue.drop(1)
    queue.add(2, episodes(2, 3), "play", stored(Params.initial(8, 0)))
    queue.add(3, episodes(3, 3), "play", stored(Params.initial(8, 0)))  # --lag 1: submitted while 2 plays
    assert (queue.take(node=0, free=4, size=4)).more is True


def test_a_waiting_request_is_answered_by_the_next_batch_and_by_a_stop():
    queue = WorkQueue(workers=4)
    assert queue.take(node=0, free=4, size=4).given == []  # without waiting: an empty answer
    waiting = Waiting(queue, node=0, free=4, size=4)
    assert waiting.is_alive()  # nothing to hand out: it waits
    queue.add(1, episodes(1, 3), "play", stored(Params.initial(8, 0)))
    waiting.join(5)
    assert [position for _, position, _ in waiting.answer.given] == [0, 1, 2] and not waiting.answer.stopped
    waiting = Waiting(queue, node=1, free=2, size=2)
    assert waiting.is_alive()
    queue.give_back(0, keep={1: [0]})  # node 0 is lost: the matches it had not summed go to node 1
    waiting.join(5)
    assert [position for _, position, _ in waiting.answer.given] == [1, 2]
    waiting = Waiting(queue, node=1, free=2, size=2)
    queue.stop()
    waiting.join(5)
    assert waiting.answer.given == [] and waiting.answer.stopped
    assert queue.call_counts() == {"take": 4, "empty take": 2}


def test_a_lost_nodes_request_still_waiting_gets_nothing_of_what_was_given_back_for_it():
    """A leader lost while its request waits in the queue (Ray does not end a call when
    its caller dies): the matches given back must go to the others, not to it."""
    queue = WorkQueue(workers=4)
    queue.add(1, episodes(1, 4), "play", stored(Params.initial(8, 0)))
    assert len(queue.take(node=0, free=2, size=2).given) == 2 and len(queue.take(node=1, free=2, size=2).given) == 2
    stale = Waiting(queue, node=0, free=2, size=2)  # node 0's request, waiting, as its node goes
    assert stale.is_alive()
    assert queue.give_back(0) == 2
    stale.join(5)
    assert stale.answer.given == [] and stale.answer.stopped
    assert [position for _, position, _ in queue.take(node=1, free=2, size=2).given] == [0, 1]


def test_a_request_for_matches_to_wait_behind_alone_waits_for_the_next_batch_or_any_other_change():
    """With no worker free, a waiting request for an announced batch's matches to hold
    behind is answered by the next batch's announcement, or empty by any other change
    (here a batch given with weights: the node may have workers free by then)."""
    queue = WorkQueue(workers=4)
    queue.add(1, episodes(1, 2), "play", stored(Params.initial(8, 0)))
    assert len(queue.take(node=0, free=4, size=4).given) == 2  # every match plays: the node's workers wait behind
    waiting = Waiting(queue, node=0, free=0, size=4, behind=2)
    assert waiting.is_alive()
    queue.add(2, episodes(2, 2), "play", None)  # announced
    waiting.join(5)
    assert [(b, p) for b, p, _ in waiting.answer.given] == [(2, 0), (2, 1)] and waiting.answer.behind
    waiting = Waiting(queue, node=1, free=0, size=4, behind=2)
    assert waiting.is_alive()
    queue.drop(1)  # (any change)
    waiting.join(5)
    assert not waiting.is_alive() and waiting.answer.given == [] and not waiting.answer.stopped


class FakeQueue:
    """Answers a leader's requests with what a test sets, through Ray's store, and
    remembers whether each was to wait."""

    def __init__(self):
        self.answers: deque = deque()
        self.waits: list[bool] = []
        self.asked: list[tuple[int, bool, int]] = []  # (free, wait, behind) of each request
        self.take = self
        self.weights_for: Any = None  # (a test that needs it sets it)

    def remote(self, node, free, known, size, wait, behind=0):
        import ray

        self.waits.append(wait)
        self.asked.append((free, wait, behind))
        return ray.put(self.answers.popleft())


@pytest.mark.parametrize("more", [False, True])
def test_after_an_empty_answer_a_leader_asks_to_wait_at_once_with_a_lag_and_when_idle_without(more):
    queue = FakeQueue()
    feed = QueueFeed(queue, node=0, copy_weights=False, workers=2)
    job = ("play", "published weights", ())
    queue.answers.append(Answer([(1, 0, EpisodeId(7, 1, 0)), (1, 1, EpisodeId(7, 1, 1))], {1: job}, 0, (1,), more))
    feed.ask(local=0, free=2, busy=0)
    assert len(feed.receive(feed.pending()[0]) or []) == 2
    queue.answers.append(Answer([], {}, 0, (1,), more))
    feed.ask(local=0, free=1, busy=1)  # a worker is free while the other plays: nothing left
    assert feed.receive(feed.pending()[0]) == [] and not feed.exhausted
    feed.done(1)
    queue.answers.append(Answer([], {}, 0, (1,), more, stopped=True))
    feed.ask(local=0, free=1, busy=1)  # with a lag the next batch may come any time: it asks, to wait
    assert queue.waits == ([False, False, True] if more else [False, False])
    feed.done(1)
    feed.ask(local=0, free=2, busy=0)  # the node has nothing to do: without a lag it asks now, to wait
    assert queue.waits == [False, False, True]
    assert feed.receive(feed.pending()[0]) == [] and feed.exhausted  # the queue stopped: the run ends


def test_an_announced_batch_is_handed_out_at_once_and_its_weights_come_when_published():
    """Its matches go out before its weights exist (their job says so: no weights),
    are not counted playable, and a wait for the weights ends when they are published;
    one for a batch dropped first ends with nothing."""
    queue = WorkQueue(workers=8)
    queue.add(1, episodes(1, 3), "play", stored(Params.initial(8, 0)))
    queue.add(2, episodes(2, 5), "play", None)  # announced
    answer = queue.take(node=0, free=4, size=4)
    assert [(b, p) for b, p, _ in answer.given] == [(1, 0), (1, 1), (1, 2), (2, 0)]
    assert answer.jobs[2][1] is None and answer.jobs[1][1] is not None
    assert (answer.left, answer.left_of, answer.announced) == (4, {2: 4}, (2,))
    waiting = Answered(queue.weights_for, 2)
    assert waiting.is_alive()  # no weights yet
    weights = Params.initial(8, 5)
    queue.publish(2, stored(weights))
    waiting.join(5)
    import ray

    got = ray.get(waiting.answer.ref)
    assert np.array_equal(got.W1, weights.W1) and np.array_equal(got.W2, weights.W2)
    assert queue.take(node=0, free=1, size=4).announced == ()  # (the batch's other matches are playable now)
    queue.add(3, episodes(3, 2), "play", None)
    dropped = Answered(queue.weights_for, 3)
    queue.drop(3)
    dropped.join(5)
    assert not dropped.is_alive() and dropped.answer is None


def test_a_request_brings_an_announced_batchs_matches_to_wait_behind_playing_ones_once_none_can_play_elsewhere():
    """Beyond one per free worker, `behind` more of an announced batch, for the node's
    playing workers to hold behind their match, only if the answer brings every match
    that can play, each to a free worker (a worker waiting for the announced weights
    plays nothing else), and no batch in play plays another's weights (--lag-share's
    first part, whose matches those weights do not wait for)."""
    queue = WorkQueue(workers=4)
    queue.add(1, episodes(1, 3), "play", stored(Params.initial(8, 0)))
    queue.add(2, episodes(2, 6), "play", None)  # announced
    early = queue.take(node=0, free=2, size=4, behind=2)  # a match of batch 1 is left: for a free worker
    assert [(b, p) for b, p, _ in early.given] == [(1, 0), (1, 1)] and not early.behind
    answer = queue.take(node=1, free=1, size=4, behind=2)
    assert [(b, p) for b, p, _ in answer.given] == [(1, 2), (2, 0), (2, 1)] and answer.behind
    assert answer.left_of == {2: 4} and queue.taken_by(1, 2) == 2  # (given back with the node's others, were it lost)
    assert queue.add_like(3, episodes(3, 2), "play", like=1)  # a batch played with batch 1's weights
    assert len(queue.take(node=0, free=2, size=4).given) == 2  # (none of it left to play)
    answer = queue.take(node=0, free=0, size=4, behind=2)
    assert answer.given == [] and not answer.behind


class Answered(threading.Thread):
    """A call that may wait, on a thread of its own; its answer once it returns."""

    def __init__(self, call, *args):
        super().__init__(daemon=True)
        self.call, self.args = call, args
        self.answer: Any = "no answer"
        self.start()
        time.sleep(0.05)

    def run(self):
        self.answer = self.call(*self.args)


def test_a_leader_asks_for_an_announced_batchs_weights_once_and_its_matches_are_playable_when_they_come():
    """The leader's side: an announced batch's job brings one call for its weights,
    which the leader follows; until it is answered the batch's matches wait and are
    not counted playable, and matches of this batch left in the queue (not the next's)
    say whether more of it may come here."""
    import ray

    queue = FakeQueue()

    @ray.remote
    def weights_for(batch):
        return "published weights"

    queue.weights_for = weights_for
    feed = QueueFeed(queue, node=0, copy_weights=False, workers=2)
    given = [(1, 0, EpisodeId(7, 1, 0)), (2, 0, EpisodeId(7, 2, 0))]
    jobs = {1: ("play", "weights", ()), 2: ("play", None, ())}
    queue.answers.append(Answer(given, jobs, 3, (1, 2), True, left_of={2: 3}, announced=(2,)))
    feed.ask(local=0, free=2)
    assert len(feed.receive(feed.pending()[0]) or []) == 2
    assert feed.waits((2, 0)) and not feed.waits((1, 0))
    assert (feed.playable, feed.left_of(1), feed.left_of(2)) == (0, 0, 3)  # nothing more of batch 1 comes
    [call] = feed.pending()  # the call for batch 2's weights
    assert feed.job((2, 0))[1].ref == call
    ray.get(call)
    assert feed.receive(call) == [] and not feed.waits((2, 0)) and feed.playable == 3


def test_a_leader_holding_nothing_asks_for_announced_matches_behind_its_playing_workers():
    """A request for an announced batch's matches, one behind each playing worker with
    room, once the queue has said they may wait there and that some are left; none
    while it holds matches; with none left, one that waits in the queue for the next."""
    queue = FakeQueue()
    feed = QueueFeed(queue, node=0, copy_weights=False, workers=4)
    job = ("play", "weights", ())
    given = [(1, k, EpisodeId(7, 1, k)) for k in range(4)]
    queue.answers.append(Answer(given, {1: job}, 3, (1, 2), True, left_of={2: 3}, announced=(2,), behind=True))
    feed.ask(local=0, free=4)
    assert len(feed.receive(feed.pending()[0]) or []) == 4
    feed.ask(local=1, free=0, busy=3, room=3)  # it still holds one
    assert feed.pending() == []
    queue.answers.append(Answer([], {}, 0, (1, 2), True, left_of={}, announced=(2,), behind=True))
    feed.ask(local=0, free=0, busy=4, room=4)
    [request] = feed.pending()
    assert queue.asked[-1] == (0, False, 4)  # none free, not to wait, four behind
    assert feed.receive(request) == []  # another node took them
    queue.answers.append(Answer([], {}, 0, (1, 2), True, behind=True))
    feed.ask(local=0, free=0, busy=4, room=4)  # none known: it waits in the queue for the next batch
    assert queue.asked[-1] == (0, True, 4) and len(feed.pending()) == 1


def test_a_node_keeps_a_batch_s_job_while_it_holds_a_match_of_it_however_many_batches_come_after():
    """With --lag-share four batches may be in play at once (a batch's two parts and the
    next's): a node that still plays a match of the oldest keeps its job (to play it
    again should its worker be lost), and lets go of a job once its batch is over and
    it holds no match of it."""
    queue = FakeQueue()
    feed = QueueFeed(queue, node=0, copy_weights=False, workers=1)
    for batch in range(1, 6):
        job = ("play", f"weights {batch}", ())
        in_play = tuple(range(max(1, batch - 3), batch + 1))  # the oldest four at most
        given = [(batch, 0, EpisodeId(7, batch, 0))]
        queue.answers.append(Answer(given, {batch: job}, 0, in_play, True, sizes={batch: batch}))
        feed.ask(local=0, free=1)
        assert len(feed.receive(feed.pending()[0]) or []) == 1
        if batch > 1:
            feed.done(batch)  # its match played; batch 1's still plays
    assert feed.job((1, 0)) == ("play", "weights 1", ())  # batch 1 is no longer in play, but its match is held
    assert sorted(feed.jobs) == [1, 2, 3, 4, 5]
    queue.answers.append(Answer([], {}, 0, (3, 4, 5), True))  # batch 2 is over, none of it held here
    feed.ask(local=0, free=1)
    feed.receive(feed.pending()[0])
    assert sorted(feed.jobs) == [1, 3, 4, 5] and feed.sizes == {1: 1, 3: 3, 4: 4, 5: 5}  # (with their jobs)
    feed.done(1)
    queue.answers.append(Answer([], {}, 0, (4, 5), True))
    feed.ask(local=0, free=1)
    feed.receive(feed.pending()[0])
    assert sorted(feed.jobs) == [4, 5] and feed.sizes == {4: 4, 5: 5}
