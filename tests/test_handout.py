"""Which worker gets the next episode (pool/handout.py): a worker whose episode waits
for its weights (an announced batch) is parked: idle until they come, and given
nothing behind that episode meanwhile."""

import time
from collections import deque

from pgpong.pool.handout import HandOut


def test_workers_hold_a_second_episode_while_many_are_left():
    hand = HandOut(["a", "b"])
    given = list(hand.out(deque((k, "episode") for k in range(8))))
    assert [(worker, key) for worker, (key, _) in given] == [("a", 0), ("b", 1), ("a", 2), ("b", 3)]
    assert hand.held == {"a": 2, "b": 2}


def test_a_parked_worker_gets_nothing_behind_its_waiting_episode_and_is_idle_until_its_weights_come():
    hand = HandOut(["a", "b"])
    waiting = {10, 11}  # the keys of an announced batch's episodes
    waits = lambda key: key in waiting  # noqa: E731
    given = list(hand.out(deque([(10, "x"), (0, "y"), (1, "z"), (2, "w")]), elsewhere=10, waits=waits))
    assert given == [("a", (10, "x")), ("b", (0, "y")), ("b", (1, "z"))]  # nothing behind a's waiting one
    time.sleep(0.02)
    assert 0.02 <= hand.idle_seconds() < 1  # a waits: idle
    assert hand.unpark(waits) == [] and hand.parked() == 1  # still waiting
    assert hand.idle_seconds() >= 0.02
    waiting.clear()  # its weights came
    assert hand.unpark(waits) == ["a"] and hand.parked() == 0  # (the pool watches it from now on)
    assert hand.idle_seconds() == 0
    assert list(hand.out(deque([(3, "v")]), elsewhere=10, waits=waits)) == [("a", (3, "v"))]  # now it may hold one more
    hand.back("a", idle=False)
    assert hand.held == {"a": 1, "b": 2} and hand.idle_seconds() == 0


def test_a_parked_worker_that_finishes_before_its_unpark_is_heard_is_not_left_idle():
    hand = HandOut(["a"])
    list(hand.out(deque([(10, "x")]), waits=lambda key: True))
    hand.back("a", idle=False)  # it played (its weights came), before the leader heard that they had
    assert hand.idle_seconds() == 0 and hand.held == {"a": 0}
