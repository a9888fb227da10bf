"""--lag 1: each batch plays the weights from before the last update. Which weights
each batch plays, the same bits for any worker count and across a resume, the
checkpoint that carries the previous weights, and a lag of 0 that is today's run."""

import numpy as np
import pytest

from conftest import train_in_process
from pgpong.checkpoint import CheckpointError, list_checkpoints, load_checkpoint, save_checkpoint
from pgpong.config import ConfigError
from pgpong.policy import Params

SETTINGS = dict(seed=4, batch_size=3, hidden=16, max_episode_steps=80, checkpoint_every=0)


class Recording:
    """A pool that records the weights each batch is played with."""

    def __init__(self, pool):
        self.pool, self.played = pool, []

    def __getattr__(self, name):
        return getattr(self.pool, name)

    def publish(self, ticket, weights, squares=None):  # no lag: batches are announced ahead, published as they play
        self.played.append(Params.of(weights.W1, weights.W2))
        return self.pool.publish(ticket, weights, squares)

    def submit(self, weights, episodes, like=None):  # --lag 1: batches are submitted ahead, in batch order
        self.played.append(Params.of(weights.W1, weights.W2))
        return self.pool.submit(weights, episodes, like)


def recorded_run(tmp_path, lag, iterations=4):
    from pgpong.pool.local import LocalPool
    from pgpong.rundir import open_run
    from pgpong.session import open_trainer, worker_settings

    run = open_run(tmp_path / f"lag{lag}", {**SETTINGS, "lag": lag, "iterations": iterations, "workers": 0})
    pool = Recording(LocalPool(worker_settings(run.config)))
    after = []  # the weights after each update
    with open_trainer(run, pool, {}, tensorboard=False) as trainer:
        trainer.train(each=lambda report: after.append(Params.of(run.state.weights.W1, run.state.weights.W2)))
    pool.close()
    return pool.played, after, run.state


def same(a, b):
    return np.array_equal(a.W1, b.W1) and np.array_equal(a.W2, b.W2)


def test_a_batch_plays_the_weights_from_before_the_last_update(tmp_path):
    played, after, state = recorded_run(tmp_path, lag=1)
    initial = Params.initial(SETTINGS["hidden"], SETTINGS["seed"])
    assert same(played[0], initial) and same(played[1], initial)  # batch 1: before update 0 is the start
    for k in range(2, 4):
        assert same(played[k], after[k - 2]) and not same(played[k], after[k - 1])
    assert same(state.previous, after[-2])
    plain, plain_after, plain_state = recorded_run(tmp_path, lag=0)
    assert all(same(plain[k], plain_after[k - 1]) for k in range(1, 4)) and plain_state.previous is None
    assert same(plain_after[0], after[0]) and not same(plain_after[1], after[1])  # it changes the run from update 2


def test_a_lagged_run_resumes_to_the_bits_of_one_go_and_its_checkpoints_carry_the_previous_weights(tmp_path):
    one_go = train_in_process(tmp_path / "one", 0, 4, {**SETTINGS, "lag": 1})
    train_in_process(tmp_path / "split", 0, 2, {**SETTINGS, "lag": 1})
    saved = load_checkpoint(list_checkpoints(tmp_path / "split" / "checkpoints")[-1])
    assert saved.batch == 2 and saved.previous is not None and saved.info["lag"] == 1
    resumed = train_in_process(tmp_path / "split", 0, 4, {**SETTINGS, "lag": 1})
    assert same(resumed.weights, one_go.weights) and same(resumed.previous, one_go.previous)
    assert np.array_equal(resumed.cache.W1, one_go.cache.W1)
    with pytest.raises(ConfigError, match="--lag 1 -> 0"):  # a lag is part of the run
        train_in_process(tmp_path / "split", 0, 5, {**SETTINGS, "lag": 0})


class Parts(Recording):
    """A pool that records each part of a batch put in it: its episodes, and the
    weights it plays (submitted with them, or published later)."""

    def __init__(self, pool):
        super().__init__(pool)
        self.parts = {}  # ticket -> [episodes, weights]
        self.likes = []  # (ticket, the ticket of the part in play said to play its weights)

    def submit(self, weights, episodes, like=None):
        ticket = self.pool.submit(weights, episodes, like)
        self.parts[ticket] = [list(episodes), Params.of(weights.W1, weights.W2)]
        if like is not None:
            self.likes.append((ticket, like))
        return ticket

    def announce(self, episodes):
        ticket = self.pool.announce(episodes)
        self.parts[ticket] = [list(episodes), None]
        return ticket

    def publish(self, ticket, weights, squares=None):
        self.parts[ticket][1] = Params.of(weights.W1, weights.W2)
        return self.pool.publish(ticket, weights, squares)


SHARED = {**SETTINGS, "batch_size": 5, "lag_share": 0.4}  # the first 2 of each batch's 5 matches


def test_a_lag_share_plays_a_batch_s_first_matches_with_the_weights_from_before_the_last_update(tmp_path):
    from pgpong.pool.local import LocalPool
    from pgpong.rundir import open_run
    from pgpong.session import open_trainer, worker_settings

    run = open_run(tmp_path / "shared", {**SHARED, "iterations": 4, "workers": 0})
    pool = Parts(LocalPool(worker_settings(run.config)))
    after = []
    with open_trainer(run, pool, {}, tensorboard=False) as trainer:
        trainer.train(each=lambda report: after.append(Params.of(run.state.weights.W1, run.state.weights.W2)))
    pool.close()
    initial = Params.initial(SETTINGS["hidden"], SETTINGS["seed"])
    by_batch: dict[int, list] = {}
    for episodes, weights in pool.parts.values():
        by_batch.setdefault(episodes[0].batch, []).append((episodes, weights))
    for batch, parts in by_batch.items():
        (first, stale), (rest, fresh) = sorted(parts, key=lambda part: part[0][0].episode)
        assert [e.episode for e in first] == [0, 1] and [e.episode for e in rest] == [2, 3, 4]
        assert same(stale, initial if batch < 2 else after[batch - 2])  # one update behind
        assert same(fresh, initial if batch < 1 else after[batch - 1])  # the newest
    assert sorted(by_batch) == [0, 1, 2, 3] and same(run.state.previous, after[-2])
    # a batch's first part plays the weights of the part before it (the batch before's
    # rest), and says so, so that a cluster's pool sends them once
    assert len(pool.likes) == 3
    for ticket, like in pool.likes:
        assert (
            pool.parts[like][0][0].batch == pool.parts[ticket][0][0].batch - 1 and pool.parts[like][0][0].episode == 2
        )
        assert same(pool.parts[ticket][1], pool.parts[like][1])


def test_a_lag_share_steps_on_the_sum_of_its_two_parts(tmp_path):
    """The update after batch 2, made again by hand: its first 2 matches played with the
    weights from before update 1, the other 3 with those after it, the two sums added,
    one RMSProp step."""
    from pgpong.pool.local import LocalPool
    from pgpong.rmsprop import RMSProp
    from pgpong.rollout import EpisodeId
    from pgpong.session import worker_settings

    one = train_in_process(tmp_path / "one", 0, 1, SHARED)
    two = train_in_process(tmp_path / "two", 0, 2, SHARED)
    from pgpong.rundir import open_run

    config = open_run(tmp_path / "one", {}).config
    pool = LocalPool(worker_settings(config))
    try:
        episodes = [EpisodeId(SETTINGS["seed"], 1, k) for k in range(5)]
        stale = pool.play_batch(one.previous, episodes[:2])
        fresh = pool.play_batch(one.weights, episodes[2:])
    finally:
        pool.close()
    weights, cache = Params.of(one.weights.W1, one.weights.W2), Params.of(one.cache.W1, one.cache.W2)
    RMSProp(config.learning_rate, config.decay_rate, cache, config.max_update_norm).step(
        weights,
        Params(stale.grad.dense().W1 + fresh.grad.dense().W1, stale.grad.W2 + fresh.grad.W2),  # (float32)
    )
    assert same(weights, two.weights) and same(two.previous, one.weights)
    # not the same as either lag: all five with one set of weights gives other bits; a
    # share of all of the batch is --lag 1
    others = {
        lag: train_in_process(tmp_path / f"lag{lag}", 0, 2, {**SHARED, "lag_share": 0, "lag": lag}) for lag in (0, 1)
    }
    assert not same(others[0].weights, two.weights) and not same(others[1].weights, two.weights)
    assert same(train_in_process(tmp_path / "all", 0, 2, {**SHARED, "lag_share": 1.0}).weights, others[1].weights)


def test_a_lag_share_resumes_to_the_bits_of_one_go(tmp_path):
    one_go = train_in_process(tmp_path / "one", 0, 4, SHARED)
    train_in_process(tmp_path / "split", 0, 2, SHARED)
    assert load_checkpoint(list_checkpoints(tmp_path / "split" / "checkpoints")[-1]).previous is not None
    resumed = train_in_process(tmp_path / "split", 0, 4, SHARED)
    assert same(resumed.weights, one_go.weights) and same(resumed.previous, one_go.previous)
    with pytest.raises(ConfigError, match="--lag-share 0.4 -> 0.5"):  # the share is part of the run
        train_in_process(tmp_path / "split", 0, 5, {**SHARED, "lag_share": 0.5})


def test_a_checkpoint_with_half_of_the_previous_weights_is_refused(tmp_path):
    import zipfile

    state = train_in_process(tmp_path / "r", 0, 1, {**SETTINGS, "lag": 1})
    path = save_checkpoint(state, tmp_path / "ckpt")
    assert same(load_checkpoint(path).previous, state.previous)
    broken = tmp_path / "broken.npz"
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(broken, "w") as target:
        for item in source.infolist():
            if item.filename != "previous_W2.npy":
                target.writestr(item, source.read(item))
    with pytest.raises(CheckpointError, match="without the other"):
        load_checkpoint(broken)


@pytest.mark.long  # make test keeps --lag 1's bits on three nodes (test_cluster_pool)
def test_a_lagged_run_has_the_same_bits_on_two_ray_workers_that_overlap_its_batches(tmp_path, ray_instance):
    """On Ray a lagged run's pool plays the next batch while this one's last matches
    finish (a ClusterPool, on one node too); the bits are those of --workers 0, and a
    run stopped with a batch submitted ahead, resumed on the same pool, gives them too."""
    import ray

    from pgpong.pool.cluster_pool import ClusterPool
    from pgpong.rundir import open_run
    from pgpong.session import open_trainer, worker_settings

    class Counting(ClusterPool):  # how many matches the queue had handed out when each batch was collected
        handed: list[int]

        def collect(self, tickets, finished=lambda result: None, step=None):
            played = super().collect(tickets, finished, step)
            self.handed.append(ray.get(self._queue.handed_out.remote()))
            return played

    settings = {**SETTINGS, "lag": 1, "batch_size": 8}
    alone = train_in_process(tmp_path / "alone", 0, 4, settings)
    pool = Counting(worker_settings(open_run(tmp_path / "alone", {}).config), 2)
    pool.handed = []
    try:
        on_ray = train_in_process(tmp_path / "ray", 2, 4, settings, pool=pool)
        assert same(alone.weights, on_ray.weights) and same(alone.previous, on_ray.previous)
        # the next batch was in the queue while this one played: when batch k was in,
        # matches of batch k+1 had been handed out already; none after the last
        assert any(handed > 8 * k for k, handed in enumerate(pool.handed[:3], start=1)), pool.handed
        assert pool.handed[3] == 4 * 8
        # stopped after 2 batches with the third submitted ahead (cancelled), then resumed
        run = open_run(tmp_path / "split", {**settings, "iterations": None, "workers": 2})
        with open_trainer(run, pool, {}, tensorboard=False) as trainer:
            trainer.train(stop=lambda state: state.batch >= 2)
        assert not pool._in_play and ray.get(pool._queue.in_play.remote()) == []  # batch 3 was dropped
        resumed = train_in_process(tmp_path / "split", 2, 4, settings, pool=pool)
        assert same(alone.weights, resumed.weights) and same(alone.previous, resumed.previous)
        # without a lag on the same pool: a node's sum of a batch goes in one part or several
        # (on 2 workers the node may hold none of the batch for a moment: its sum so far
        # goes then), the last part maybe ahead of its last match (where it is not the
        # whole batch: test_cluster_pool), and the bits are those of --workers 0 still
        plain = {**SETTINGS, "batch_size": 8}
        on_ray = train_in_process(tmp_path / "plain-ray", 2, 3, plain, pool=pool)
        assert same(train_in_process(tmp_path / "plain", 0, 3, plain).weights, on_ray.weights)
        # a batch its node's leader played whole (a batch of one: its match is the node's
        # last) comes rounded where it was summed, as the total: the bits of --workers 0
        whole, one = sum(ray.get(pool._reducer.sent_whole.remote()).values()), {**SETTINGS, "batch_size": 1}
        on_ray = train_in_process(tmp_path / "one-ray", 2, 3, one, pool=pool)
        assert same(train_in_process(tmp_path / "one", 0, 3, one).weights, on_ray.weights)
        assert sum(ray.get(pool._reducer.sent_whole.remote()).values()) == whole + 3
        # --lag-share: each batch in two parts, the first submitted while the batch before plays
        shared, pool.handed = {**SHARED, "batch_size": 8}, []  # 3 matches behind, 5 with the newest weights
        base = ray.get(pool._queue.handed_out.remote())
        reused = pool.queue_calls().get("reused weights", 0)
        on_ray = train_in_process(tmp_path / "shared-ray", 2, 4, shared, pool=pool)
        alone = train_in_process(tmp_path / "shared", 0, 4, shared)
        assert same(alone.weights, on_ray.weights) and same(alone.previous, on_ray.previous)
        # when batch k was in (its two parts collected at once), the next batch's first
        # part had been handed out
        ends = [handed - base for handed in pool.handed]
        assert len(pool.handed) == 4 and any(handed > 8 * k for k, handed in enumerate(ends[:3], start=1)), ends
        assert ends[3] == 4 * 8
        # each batch's first part after the first went into the queue with the weights
        # the queue had published for the batch before's rest, not sent again
        assert pool.queue_calls()["reused weights"] - reused == 3
    finally:
        pool.close()


def test_a_checkpoint_that_does_not_fit_the_runs_lag_is_refused_even_without_recorded_settings(tmp_path):
    import dataclasses

    from pgpong.rundir import open_run

    lagged = train_in_process(tmp_path / "r", 0, 2, {**SETTINGS, "lag": 1})
    anonymous = save_checkpoint(dataclasses.replace(lagged, info={}), tmp_path / "anonymous")  # no settings in it
    train_in_process(tmp_path / "plain", 0, 1, SETTINGS)  # runs to resume into
    train_in_process(tmp_path / "lagged", 0, 1, {**SETTINGS, "lag": 1})
    with pytest.raises(CheckpointError, match="made by a run with --lag 1"):
        open_run(tmp_path / "plain", {}, resume_from=anonymous)
    without = save_checkpoint(dataclasses.replace(lagged, info={}, previous=None), tmp_path / "without")
    with pytest.raises(CheckpointError, match="which a run with --lag 1 plays"):
        open_run(tmp_path / "lagged", {}, resume_from=without)
    assert same(open_run(tmp_path / "lagged", {}, resume_from=anonymous).state.previous, lagged.previous)
