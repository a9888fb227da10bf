"""The cluster's queue of matches (pool/queue.py) as a plain object: how many matches a
node's request brings (one per free worker, more while many are left), and when a
node's leader asks again after an empty answer (only while more may come)."""

from collections import deque

import pytest

from pgpong.policy import Params
from pgpong.pool.queue import QueueFeed, WorkQueue
from pgpong.rollout import EpisodeId

pytestmark = pytest.mark.usefixtures("ray_instance")  # the queue puts the weights in Ray's store


def episodes(batch: int, count: int) -> list[EpisodeId]:
    return [EpisodeId(7, batch, k) for k in range(count)]


def test_a_request_brings_a_share_of_what_is_left_then_one_match_per_free_worker():
    queue = WorkQueue(workers=198)  # 11 nodes of 18
    queue.add(1, episodes(1, 300), "play", Params.initial(8, 0))
    first, _, left, _, _ = queue.take(node=0, free=18, size=18)
    assert len(first) == 18 and left == 282  # a free worker each (fewer than 2 per worker are left)
    sizes = []
    while left:
        given, _, left, _, _ = queue.take(node=1, free=1, size=18)
        sizes.append(len(given))
    assert sizes[0] == 7  # a quarter of the node's share of 282: ceil(282 * 18 / (4 * 198))
    assert sizes == sorted(sizes, reverse=True) and sizes[-20:] == [1] * 20  # the end: one per request
    assert sum(sizes) == 282 and len(sizes) < 282 / 2.5
    handed = [p for p in queue.batches[1].taken[0]] + [p for p in queue.batches[1].taken[1]]
    assert sorted(handed) == list(range(300))  # each match once
    assert queue.call_counts() == {"take": 1 + len(sizes)}


def test_more_may_come_only_once_a_batch_was_added_while_another_was_in_play():
    queue = WorkQueue(workers=4)
    queue.add(1, episodes(1, 3), "play", Params.initial(8, 0))
    *_, more = queue.take(node=0, free=4, size=4)
    assert more is False  # without a lag the next batch comes only after this one is over
    queue.drop(1)
    queue.add(2, episodes(2, 3), "play", Params.initial(8, 0))
    queue.add(3, episodes(3, 3), "play", Params.initial(8, 0))  # --lag 1: submitted while 2 plays
    *_, more = queue.take(node=0, free=4, size=4)
    assert more is True


class FakeQueue:
    """Answers a leader's requests with what a test sets, through Ray's store."""

    def __init__(self):
        self.answers: deque = deque()
        self.requests = 0
        self.take = self

    def remote(self, node, free, known, size):
        import ray

        self.requests += 1
        return ray.put(self.answers.popleft())


@pytest.mark.parametrize("more", [False, True])
def test_a_leader_asks_again_after_an_empty_answer_only_if_more_may_come(more):
    queue = FakeQueue()
    feed = QueueFeed(queue, node=0, copy_weights=False, workers=2)
    job = ("play", None, ())
    queue.answers.append(([(1, 0, EpisodeId(7, 1, 0)), (1, 1, EpisodeId(7, 1, 1))], {1: job}, 0, (1,), more))
    feed.ask(local=0, free=2)
    assert len(feed.receive(feed.pending()[0]) or []) == 2
    queue.answers.append(([], {}, 0, (1,), more))
    feed.ask(local=0, free=1)  # a worker is free while the other plays: nothing left
    assert feed.receive(feed.pending()[0]) == [] and feed.exhausted
    feed.done(1)  # a match of the node finished: with a lag the next batch may be in the queue by now
    queue.answers.append(([], {}, 0, (1,), more))
    feed.ask(local=0, free=2)
    assert queue.requests == (3 if more else 2)
    assert feed.exhausted is (not more)
