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


def test_a_waiting_episode_allowed_behind_goes_behind_a_playing_one_and_parks_its_worker_when_that_ends():
    """The next batch's match, whose weights cannot come before the playing ones end,
    is called while they play: behind a playing episode, one per worker, never behind
    a parked one; once the playing one ends its worker is parked (idle, not watched)."""
    hand = HandOut(["a", "b", "c"])
    waiting = {10, 11, 12, 13}
    waits = lambda key: key in waiting  # noqa: E731
    assert [w for w, _ in hand.out(deque([(0, "x"), (1, "y")]), waits=waits)] == ["a", "b"]
    assert hand.room_behind() == 2 and hand.busy("a") and not hand.busy("c")
    todo = deque((key, "next") for key in (10, 11, 12, 13))
    given = list(hand.out(todo, waits=waits, behind=waits))
    assert [(w, key) for w, (key, _) in given] == [("c", 10), ("a", 11), ("b", 12)]  # c is free: parked at once
    assert list(todo) == [(13, "next")] and hand.room_behind() == 0  # one behind each, none behind c's
    assert hand.held == {"a": 2, "b": 2, "c": 1} and hand.parked() == 1
    hand.back("a", idle=True, waits=waits)  # its match ended: the next one waits for its weights
    assert hand.parked() == 2 and not hand.busy("a") and hand.held["a"] == 1
    assert list(hand.out(deque([(5, "given back")]), waits=waits)) == []  # nothing behind a parked worker
    time.sleep(0.02)
    assert hand.idle_seconds() >= 0.04  # a and c wait
    waiting.clear()  # the weights came
    assert sorted(hand.unpark(waits)) == ["a", "c"] and hand.busy("a")
    hand.back("b", idle=True, waits=waits)  # b's first match ended after the weights came: it plays the next
    assert hand.busy("b") and hand.parked() == 0 and hand.idle_seconds() == 0


def test_without_leave_to_wait_behind_an_announced_match_goes_only_to_a_free_worker():
    hand = HandOut(["a", "b"])
    waits = lambda key: key >= 10  # noqa: E731
    list(hand.out(deque([(0, "x")]), waits=waits))
    given = list(hand.out(deque([(10, "n"), (11, "n")]), waits=waits))
    assert [(w, key) for w, (key, _) in given] == [("b", 10)] and hand.held == {"a": 1, "b": 1}
