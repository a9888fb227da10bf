"""The cluster pool (a leader per node, matches from one queue, exact sums that meet in
a reducer): a local cluster of three nodes of two CPUs each (three raylets on this
machine). Weights are the same to the bit with no Ray, with two workers on one node
and with a worker on each of three nodes; and when a node is lost in the middle of a
batch."""

import contextlib
import time

import numpy as np
import pytest

from conftest import hang_guard, joined_cluster, train_in_process
from pgpong.cluster import nodes_with_cpus
from pgpong.config import TrainConfig
from pgpong.pool import PoolError, WorkerSettings
from pgpong.pool.cluster_pool import ClusterPool
from pgpong.pool.ray_pool import RayPool
from pgpong.rollout import EpisodeId
from pgpong.runlog import DIAGNOSTICS, read_progress

SETTINGS = dict(seed=3, batch_size=33, hidden=16, max_episode_steps=60, checkpoint_every=0)
WORKERS = WorkerSettings("ALE/Pong-v5", SETTINGS["max_episode_steps"], entropy_bonus=TrainConfig().entropy_bonus)
STORE = 100 * 1024**2


def three_nodes():
    return joined_cluster(2, [2, 2], STORE)


@pytest.fixture(scope="module")
def cluster():
    import ray

    c, nodes = three_nodes()
    try:
        yield c, nodes
    finally:
        ray.shutdown()
        c.shutdown()


@pytest.fixture(scope="module")
def three_leaders(cluster):
    """One worker on each of the three nodes, each node with its leader."""
    pool = ClusterPool(WORKERS, 3)
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture(scope="module")
def reference_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("ref") / "run"


@pytest.fixture(scope="module")
def reference(reference_dir):
    return train_in_process(reference_dir, 0, 2, SETTINGS)


def diagnostics(run_dir):
    """progress.csv's diagnostic columns: each match's sums reach the driver in its
    stats (in the queue's reports on a cluster) and are added in match order."""
    return [{name: row[name] for name in DIAGNOSTICS} for row in read_progress(run_dir / "progress.csv")]


def assert_same_state(state, reference):
    np.testing.assert_array_equal(state.weights.W1, reference.weights.W1)
    np.testing.assert_array_equal(state.weights.W2, reference.weights.W2)
    np.testing.assert_array_equal(state.cache.W1, reference.cache.W1)
    assert state.running_reward == reference.running_reward
    assert state.env_steps == reference.env_steps


@pytest.mark.slow
def test_each_leaders_run_is_given_the_report_cadence_of_so_many_leaders():
    """placement.report_seconds: every 0.5 s up to 16 leaders, then less often (checked
    there); here, that a leader's run is told the cadence for the cluster's leaders, and
    whether it is the only one."""

    class Leader:
        class run:  # noqa: N801 (a Ray actor method's shape: leader.run.remote(...))
            @staticmethod
            def remote(*args):
                return args

    pool = ClusterPool.__new__(ClusterPool)  # (its fields that _call reads; no Ray)
    pool._queue, pool._reducer, pool._here = "queue", "reducer", "node"
    for leaders, cadence in [(1, 0.5), (3, 0.5), (16, 0.5), (110, 110 / 32)]:
        pool._leaders = {Leader(): 18 for _ in range(leaders)}
        alone = leaders == 1  # (the only leader takes the trainer's step: test_leader_step.py)
        assert pool._call(next(iter(pool._leaders)), 7) == ("queue", "reducer", 7, "node", cadence, alone)


def test_same_weights_without_ray_on_one_node_and_on_three_nodes(tmp_path, three_leaders, reference, reference_dir):
    assert len(nodes_with_cpus()) == 3
    pool = three_leaders
    assert (pool.nodes(), pool.num_workers) == (3, 3)
    state = train_in_process(tmp_path / "three", 3, 2, SETTINGS, pool=pool)
    assert_same_state(state, reference)
    assert diagnostics(tmp_path / "three") == diagnostics(reference_dir)
    assert all(row["entropy"] != "nan" for row in diagnostics(reference_dir))
    assert pool.queue_calls()["stepped ahead"] == 1  # batch 2 played the reducer's step, checked by the trainer's
    # the driver receives one array, the batch's sum: at most a dense gradient
    heard: list = []
    played = pool.play_batch(state.weights, [EpisodeId(3, 2, k) for k in range(SETTINGS["batch_size"])], heard.append)
    assert [stats.episode.episode for stats in heard] == list(range(SETTINGS["batch_size"]))
    assert 0 < played.measures.bytes_in <= 16 * 6400 * 4 + 16 * 4 + 6400 * 2
    assert played.measures.barrier_s is not None and played.measures.replaced == 0

    head = nodes_with_cpus()[0][0]
    one_node = RayPool(WORKERS, 2, node_id=head)
    try:
        assert one_node.nodes() == 1
        assert_same_state(train_in_process(tmp_path / "one", 2, 2, SETTINGS, pool=one_node), reference)
        assert diagnostics(tmp_path / "one") == diagnostics(reference_dir)
    finally:
        one_node.close()


@pytest.mark.slow
def test_lag_1_on_three_nodes_gives_the_bits_of_one_process(tmp_path, three_leaders):
    """--lag 1 overlaps the batches (the next is in the queue while this one's last
    matches play, pool/queue.py): the weights and the previous weights are still those
    of --workers 0."""
    lagged = {**SETTINGS, "lag": 1}
    alone = train_in_process(tmp_path / "alone", 0, 3, lagged)
    spread = train_in_process(tmp_path / "three", 3, 3, lagged, pool=three_leaders)
    assert_same_state(spread, alone)
    np.testing.assert_array_equal(spread.previous.W1, alone.previous.W1)


@pytest.mark.slow
def test_evaluation_on_three_nodes_gives_the_matches_of_one_process(three_leaders):
    from pgpong.evaluate import match_ids
    from pgpong.policy import Params
    from pgpong.pool.local import LocalPool

    weights, matches = Params.initial(16, 1), match_ids(4, 20)  # two units of matches: 16 and 4
    spread = list(three_leaders.evaluate(weights, matches))
    local = LocalPool(WORKERS)
    try:
        alone = list(local.evaluate(weights, matches))
    finally:
        local.close()
    assert [m.episode for m in spread] == matches
    assert [(m.score, m.steps) for m in spread] == [(m.score, m.steps) for m in alone]


@pytest.mark.slow
def test_an_announced_batch_waits_for_its_weights_and_a_cancel_lets_its_workers_go(three_leaders):
    """Its matches are handed out at once, and no worker plays one before the weights
    are published; dropped first, its waiting workers return, and the pool goes on.
    Either way the sums are those of one process."""
    import ray

    from pgpong.policy import Params
    from pgpong.pool.local import LocalPool

    pool, queue = three_leaders, three_leaders._queue
    weights, episodes = Params.initial(16, 2), [EpisodeId(3, 9, k) for k in range(6)]
    local = LocalPool(WORKERS)
    try:
        expected = local.play_batch(weights, episodes).grad.dense()
    finally:
        local.close()

    def announced() -> int:
        handed = ray.get(queue.handed_out.remote())
        ticket = pool.announce(episodes)
        deadline = time.monotonic() + 30
        while ray.get(queue.handed_out.remote()) < handed + 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.5)  # time enough to play a match of 60 steps, had a worker the weights
        reports, _ = ray.get(queue.progress.remote())
        assert ray.get(queue.handed_out.remote()) >= handed + 3 and not [r for r in reports if r[0] == ticket]
        return ticket

    announced()
    pool.cancel()
    with hang_guard(60):
        played = pool.play_batch(weights, episodes)
        ticket = announced()
        pool.publish(ticket, weights)
        published = pool.collect([ticket])
    for summed in (played.grad.dense(), published.grad.dense()):
        np.testing.assert_array_equal(summed.W1, expected.W1)
        np.testing.assert_array_equal(summed.W2, expected.W2)


@contextlib.contextmanager
def _stepping(seed: int):
    """For the step-ahead tests: weights and an RMSProp cache (seeds `seed` and `seed` + 1),
    three batches of four matches, a cluster pool and a local one to play them apart."""
    from pgpong.policy import Params
    from pgpong.pool.local import LocalPool

    weights, cache = Params.initial(16, seed), Params.initial(16, seed + 1)
    cache = Params.of(cache.W1**2, cache.W2**2)
    episodes = [[EpisodeId(seed, batch, k) for k in range(4)] for batch in range(3)]
    pool, local = ClusterPool(WORKERS, 3), LocalPool(WORKERS)
    try:
        with hang_guard(120):
            yield weights, cache, episodes, pool, local
    finally:
        pool.close()
        local.close()


def test_a_nodes_sum_goes_ahead_of_its_last_match_only_if_it_is_part_of_the_batch():
    """A node's sum goes ahead of its last match of a batch (while that one plays) only
    where, with that match in it, it would not be the batch's whole: a node that plays
    every match sends its sum once, rounded, as the total. Never twice, nor with no sum."""
    from pgpong.pool.feed import QueueFeed
    from pgpong.pool.leader import _may_go_ahead
    from pgpong.pool.sums import ExactSum

    feed = QueueFeed(None, 0)
    sums = {3: (ExactSum(4), [0, 1, 2, 4, 5, 6, 7])}  # 7 matches summed, one plays
    for size, expected in [(8, False), (9, True), (300, True), (None, True)]:
        feed.sizes = {} if size is None else {3: size}  # (None: the queue's answer did not say)
        assert _may_go_ahead(sums, {}, 3, feed) is expected, size
    feed.sizes = {3: 9}
    assert not _may_go_ahead(sums, {3: "sent"}, 3, feed)
    assert not _may_go_ahead(sums, {}, 4, feed)


def test_the_trainers_squares_check_the_reducers_step_without_summing_the_weights_again(monkeypatch):
    """The trainer hands publish() the squared norms its step summed; the driver's side
    compares the reducer's with them, and sums the weights itself only when none came.
    Squares that differ are the bug they always were: the pool is done for."""
    from pgpong.policy import Params
    from pgpong.pool import ahead
    from pgpong.rmsprop import squared_norm

    weights = Params.initial(5, 0, inputs=12)
    mine = (squared_norm(weights.W1), squared_norm(weights.W2))
    summed = []

    def squared_norms(w):
        summed.append(w)
        return mine

    monkeypatch.setattr(ahead, "squared_norms", squared_norms)
    side = ahead.Ahead()
    for batch, given in [(3, mine), (4, None)]:
        side._stepped[batch] = (mine, 12.5)
        assert side.publish(None, batch, weights, 1.0, squares=given) == 12.5
    assert summed == [weights]  # (only for batch 4, which brought none)
    side._stepped[5] = ((mine[0] + 1e-9, mine[1]), 13.0)
    with pytest.raises(PoolError, match="not the trainer's"):
        side.publish(None, 5, weights, 1.0, squares=mine)


@pytest.mark.slow
@pytest.mark.long  # (a pool of its own: 3-4 s, for a path that needs a broken driver's node)
def test_a_queue_lost_as_the_weights_are_published_is_a_pool_error_not_rays(cluster):
    """The trainer waits for the row before it ends a run on a failure to publish the
    next batch's weights, but only the pool's own failures (PoolError): so Ray's, the
    queue on the driver's node lost, come as one, naming the batch and the cause."""
    import ray

    from pgpong.policy import Params

    pool = ClusterPool(WORKERS, 3)
    try:
        with hang_guard(120):
            ticket = pool.announce([EpisodeId(9, 0, 0)])
            ray.kill(pool._queue, no_restart=True)
            with pytest.raises(PoolError, match=f"batch {ticket}'s weights could not be published: .*[Aa]ctor"):
                pool.publish(ticket, Params.initial(16, 9))
    finally:
        pool.close()


@pytest.mark.slow
def test_the_reducer_steps_ahead_of_the_trainer_and_the_trainer_checks_its_weights(cluster):
    """Collected with the trainer's next step, a batch's total gets that step in the
    reducer, and the announced batch plays the weights it makes as soon as the total
    is in: those of the trainer's own step, to the bit. Weights that differ from the
    trainer's (here: the plan said another learning rate) are caught when the trainer
    publishes its own, and the pool refuses to go on."""
    from pgpong.policy import Params
    from pgpong.pool import StepPlan
    from pgpong.rmsprop import RMSProp

    with _stepping(4) as (weights, cache, episodes, pool, local):
        first = pool.submit(weights, episodes[0])
        second = pool.announce(episodes[1])
        played = pool.collect([first], step=StepPlan(second, "a test", 7, 0.01, 0.9, None, weights, cache))
        np.testing.assert_array_equal(played.grad.dense().W1, local.play_batch(weights, episodes[0]).grad.dense().W1)
        mine, my_cache = Params.of(weights.W1, weights.W2), Params.of(cache.W1, cache.W2)
        RMSProp(0.01, 0.9, my_cache).step(mine, played.grad)
        assert not np.array_equal(mine.W1, weights.W1)
        pool.publish(second, mine)  # the reducer's are these: only checked
        assert pool.queue_calls()["stepped ahead"] == 1
        third = pool.announce(episodes[2])
        wrong = StepPlan(third, "a test", 8, 0.02, 0.9, None, mine, my_cache)  # (the trainer will use 0.01)
        played = pool.collect([second], step=wrong)
        np.testing.assert_array_equal(played.grad.dense().W1, local.play_batch(mine, episodes[1]).grad.dense().W1)
        RMSProp(0.01, 0.9, my_cache).step(mine, played.grad)
        with pytest.raises(PoolError, match="not the trainer's"):
            pool.publish(third, mine)
        with pytest.raises(PoolError, match="not the trainer's"):  # (nor does a batch play after that)
            pool.collect([third])


@pytest.mark.long  # the reducer's step ahead stays in make test
def test_a_step_the_reducer_cannot_take_is_left_to_the_trainer(cluster):
    """A step that is not finite (here the plan's learning rate is NaN) is not
    published: the announced batch waits for the trainer's own weights, plays them,
    and the queue counts no step but the trainer's. The reducer's copy is then unknown,
    so the next plan brings the weights and cache again, and its step is taken."""
    from pgpong.policy import Params
    from pgpong.pool import StepPlan
    from pgpong.rmsprop import RMSProp

    with _stepping(6) as (weights, cache, episodes, pool, local):
        first = pool.submit(weights, episodes[0])
        second = pool.announce(episodes[1])
        pool.collect([first], step=StepPlan(second, "a test", 0, float("nan"), 0.9, None, weights, cache))
        mine = Params.of(weights.W1 * 0.5, weights.W2)  # the trainer's, whatever its own step made
        pool.publish(second, mine)
        assert pool.queue_calls().get("stepped ahead", 0) == 0
        third = pool.announce(episodes[2])
        played = pool.collect([second], step=StepPlan(third, "a test", 1, 0.01, 0.9, None, mine, cache))
        np.testing.assert_array_equal(played.grad.dense().W1, local.play_batch(mine, episodes[1]).grad.dense().W1)
        stepped, my_cache = Params.of(mine.W1, mine.W2), Params.of(cache.W1, cache.W2)
        RMSProp(0.01, 0.9, my_cache).step(stepped, played.grad)
        pool.publish(third, stepped)  # checked against the reducer's
        assert pool.queue_calls()["stepped ahead"] == 1
        played = pool.collect([third])
        np.testing.assert_array_equal(played.grad.dense().W1, local.play_batch(stepped, episodes[2]).grad.dense().W1)


class BrokenPipePool(ClusterPool):
    """One leader's run fails as a leader's does when its node's raylet goes (an OSError
    out of Ray's I/O, "Broken pipe") as batch 2 is added, before it takes any match of it."""

    def __init__(self):
        self.broken: int | None = None
        super().__init__(WORKERS, 3)

    def _add(self, method, weights, episodes, measures, *args, like=None):
        import ray

        @ray.remote(num_cpus=0)
        def broken_pipe():
            raise OSError("Broken pipe")

        for run, (leader, added) in list(self._runs.items()):
            if self._batch == 1 and self.broken is None and self.node_of[leader] != self._here:
                self.broken = self._names[leader]
                ray.kill(leader, no_restart=True)  # as with its node, its workers go with it
                del self._runs[run]
                self._runs[broken_pipe.remote()] = (leader, added)
        return super()._add(method, weights, episodes, measures, *args, like=like)


@pytest.mark.slow
@pytest.mark.long
def test_a_leader_failing_on_a_broken_pipe_is_lost_not_the_run(tmp_path, reference, cluster):
    """Such a leader is a lost node: its matches are played elsewhere, and the weights
    are those of --workers 0 (before, the run ended with "OSError: Broken pipe")."""
    pool = BrokenPipePool()
    try:
        with hang_guard(120):
            state = train_in_process(tmp_path / "broken", 3, 2, SETTINGS, pool=pool)
        assert pool.broken is not None and (pool.nodes(), pool.num_workers, pool.replaced) == (2, 2, 1)
    finally:
        pool.close()
    assert_same_state(state, reference)


class NodeLosingPool(ClusterPool):
    """Removes a worker node as soon as its leader holds matches: of batch 1 while
    batch 2 is announced (the other workers may wait for batch 2's weights, which
    wait for the lost matches: batch 2 is recalled, and added again when published),
    or of batch 2 as it is published (they start). Those matches, and the node's
    sums, are lost with it."""

    def __init__(self, cluster, nodes, workers, when):
        self.cluster, self.worker_nodes, self.when, self.removed = cluster, nodes, when, None
        self.recalled: list[int] = []
        super().__init__(WORKERS, workers)

    def _recall(self):
        self.recalled += list(self._announced)
        super()._recall()

    def announce(self, episodes):
        batch = super().announce(episodes)
        if self.when == "announced" and batch == 2:
            self._lose_a_node(1)
        return batch

    def publish(self, ticket, weights, squares=None):
        super().publish(ticket, weights, squares)
        if self.when == "published" and ticket == 2:
            self._lose_a_node(2)

    def _lose_a_node(self, batch):
        import ray

        for leader, number in list(self._names.items()):
            lost = [n for n in self.worker_nodes if n.node_id == self.node_of[leader]]
            if self.removed is None and lost:
                deadline = time.monotonic() + 30
                taken_by = self._queue.taken_by
                while not (taken := ray.get(taken_by.remote(number, batch))) and time.monotonic() < deadline:
                    time.sleep(0.001)
                self.removed = taken
                self.lost_workers = self._leaders[leader]
                self.cluster.remove_node(lost[0], allow_graceful=False)


@pytest.mark.slow
@pytest.mark.parametrize("when", [pytest.param("announced", marks=pytest.mark.long), "published"])
def test_a_node_lost_mid_batch_costs_its_matches_only_and_changes_no_weight(
    tmp_path, reference, cluster, three_leaders, when
):
    import ray

    three_leaders.close()  # its workers' CPUs are needed below
    c, nodes = cluster  # the last tests of the module: each takes a node away
    nodes = [node for node in nodes if node.node_id in {n for n, _ in nodes_with_cpus()}]
    pool = NodeLosingPool(c, nodes, len(nodes_with_cpus()), when)  # a worker on each node
    try:
        before = (pool.nodes(), pool.num_workers)
        with hang_guard(180):
            state = train_in_process(tmp_path / "lost", pool.num_workers, 2, SETTINGS, pool=pool)
        assert pool.removed  # the node went once it had taken matches...
        handed = ray.get(pool._queue.handed_out.remote())  # in both batches
        assert handed >= 2 * SETTINGS["batch_size"] + pool.removed  # ...and they were played again elsewhere
        assert pool.recalled == ([2] if when == "announced" else [])  # (added again when published)
        lost = pool.lost_workers
        assert (pool.nodes(), pool.num_workers, pool.replaced) == (before[0] - 1, before[1] - lost, lost)
    finally:
        pool.close()
    assert_same_state(state, reference)
