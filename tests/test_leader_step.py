"""The trainer's step taken by a cluster's only leader (pool/leader.py, OwnStep), on a
real Ray instance of one node: the leader plays every match of a batch, claims the
step on it from the reducer, takes it on its own sum, and the announced batch plays
the weights it makes: the trainer's, to the bit, checked when the trainer publishes
its own; a leader's step that is not the trainer's is caught there."""

import numpy as np
import pytest

from conftest import hang_guard
from pgpong.config import TrainConfig
from pgpong.policy import Params
from pgpong.pool import PoolError, StepPlan, WorkerSettings
from pgpong.pool.cluster_pool import ClusterPool
from pgpong.pool.local import LocalPool
from pgpong.rmsprop import RMSProp
from pgpong.rollout import EpisodeId

# Matches of up to 1,000 steps (about 0.2 s): the claim is answered long before a batch ends.
WORKERS = WorkerSettings("ALE/Pong-v5", 1000, entropy_bonus=TrainConfig().entropy_bonus)


@pytest.mark.slow
def test_the_only_leader_takes_the_trainers_step_and_the_trainer_checks_its_weights(ray_instance):
    """Each batch is claimed as its first matches come; here the trainer's step is known
    by then, so the leader takes every step: the trainer's, to the bit, which its own
    publish checks. Its copy then holds the trainer's state, so the next orders bring
    no weights; a step that is not the trainer's (a plan with another learning rate) is
    caught as the trainer publishes. (The bits against a local pool are checked last:
    played here in between, they would keep the trainer's order from coming in time.)"""
    weights, cache = Params.initial(16, 11), Params.initial(16, 12)
    cache = Params.of(cache.W1**2, cache.W2**2)
    episodes = [[EpisodeId(11, batch, k) for k in range(2)] for batch in range(3)]  # a match on each worker
    pool, local = ClusterPool(WORKERS, 2), LocalPool(WORKERS)
    try:
        with hang_guard(120):
            assert len(pool._leaders) == 1
            mine, my_cache = Params.of(weights.W1, weights.W2), Params.of(cache.W1, cache.W2)
            tickets, played, played_with = [pool.submit(weights, episodes[0])], [], []
            for batch, rate in [(1, 0.01), (2, 0.01), (3, 0.02)]:  # (the trainer's rate is 0.01)
                tickets.append(pool.announce(episodes[batch % 3]))
                plan = StepPlan(tickets[-1], "a test", 6 + batch, rate, 0.9, None, mine, my_cache)
                played_with.append(Params.of(mine.W1, mine.W2))
                played.append(pool.collect([tickets[-2]], step=plan))
                RMSProp(0.01, 0.9, my_cache).step(mine, played[-1].grad)
                if batch < 3:
                    pool.publish(tickets[-1], mine)  # checked against the leader's, by their squared norms
            with pytest.raises(PoolError, match="not the trainer's"):
                pool.publish(tickets[-1], mine)
            assert ray_instance.get(pool._reducer.stepped_by_leaders.remote()) == 3
            assert pool.queue_calls()["stepped ahead"] == 3
            for batch in range(3):  # each batch played the weights the trainer's step made
                alone = local.play_batch(played_with[batch], episodes[batch])
                np.testing.assert_array_equal(played[batch].grad.dense().W1, alone.grad.dense().W1)
                np.testing.assert_array_equal(played[batch].grad.W2, alone.grad.W2)
    finally:
        pool.close()
        local.close()
