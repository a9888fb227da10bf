"""A multi-node Ray cluster on this machine (head + one worker node): training through
--address, a node lost mid-batch without losing the batch, and its workers replaced
when a node with room joins."""

import threading
import time
from contextlib import contextmanager

import numpy as np
import pytest

from conftest import hang_guard, joined_cluster, run_pgpong, train_in_process
from faults import set_fault
from pgpong.config import TrainConfig
from pgpong.pool import WorkerSettings
from pgpong.pool.ray_pool import RayPool
from pgpong.runlog import read_progress

SETTINGS = dict(seed=5, batch_size=4, hidden=16, max_episode_steps=500)
BONUS = TrainConfig().entropy_bonus  # a pool made here plays the default's maths, as the run's config says
STORE = 150 * 1024**2


def wait_until(condition, seconds=60.0):
    """Poll `condition` every 5 ms until it holds or `seconds` pass; whether it held."""
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.005)
    return bool(condition())


@contextmanager
def in_background(target):
    """Run `target` in a thread for the block; it is joined at the block's end, however it ends."""
    thread = threading.Thread(target=target)
    thread.start()
    try:
        yield thread
    finally:
        thread.join()


@pytest.fixture
def cluster():
    import ray

    c, [worker_node] = joined_cluster(1, [1], STORE)
    try:
        yield c, worker_node
    finally:
        ray.shutdown()
        c.shutdown()


@pytest.mark.slow
@pytest.mark.long
def test_lost_node_mid_batch_then_a_node_with_room_identical_weights_throughout(tmp_path, cluster, monkeypatch):
    import ray

    c, worker_node = cluster
    assert len([n for n in ray.nodes() if n["Alive"]]) == 2
    started = tmp_path / "batch-2-started"
    set_fault(monkeypatch, f"mark:1:{started}")  # a worker marks its first episode of batch 2
    pool = RayPool(WorkerSettings("ALE/Pong-v5", SETTINGS["max_episode_steps"], entropy_bonus=BONUS), 2)
    assert pool.num_workers == 2
    run_dir = tmp_path / "run"
    removed = []

    def remove_worker_node_mid_batch():
        wait_until(started.exists)  # an event, not a delay
        c.remove_node(worker_node, allow_graceful=False)
        removed.append(time.monotonic())

    try:
        with in_background(remove_worker_node_mid_batch):
            state = train_in_process(run_dir, 2, 3, SETTINGS, pool=pool)
            survivors = pool.num_workers
        assert removed
        assert pool.replaced >= 1 and survivors == 1  # the replacement waits for a CPU that is gone
        reference = train_in_process(tmp_path / "reference", 0, 3, SETTINGS)
        assert_same_state(state, reference)

        # A node with room joins: the waiting replacement starts there, and the run
        # (resumed from its directory) goes on with 2 workers on 2 nodes.
        c.add_node(num_cpus=1, object_store_memory=STORE)
        with hang_guard(90):
            while pool.num_workers < 2:
                pool.crew.poll_starting(timeout=1.0)  # what play_batch does between episodes
        assert pool.nodes() == 2
        state = train_in_process(run_dir, 2, 5, SETTINGS, pool=pool)
    finally:
        pool.close()
    assert [r["workers"] for r in read_progress(run_dir / "progress.csv")][-2:] == ["2", "2"]
    assert_same_state(state, train_in_process(tmp_path / "reference", 0, 5, SETTINGS))


@pytest.mark.long
@pytest.mark.parametrize("lag", [{"lag": 1}, {"lag_share": 0.5}], ids=["lag1", "share0.5"])
def test_a_node_lost_with_two_batches_in_play_changes_no_weight(tmp_path, cluster, monkeypatch, lag):
    """--lag 1 (or --lag-share 0.5: each batch in two parts) on three nodes: a node goes
    when the third batch has started, while the second may still be playing; the
    matches it held of either batch are played again elsewhere, and the weights are
    those of --workers 0 with the same lag."""
    import ray

    from pgpong.pool.cluster_pool import ClusterPool

    c, worker_node = cluster
    c.add_node(num_cpus=1, object_store_memory=STORE)
    c.wait_for_nodes()
    lagged = {**SETTINGS, "batch_size": 6, **lag}
    started = tmp_path / "batch-3-started"
    set_fault(monkeypatch, f"mark:2:{started}")
    pool = ClusterPool(WorkerSettings("ALE/Pong-v5", SETTINGS["max_episode_steps"], entropy_bonus=BONUS), 3)
    assert pool.nodes() == 3

    def remove_a_node_when_batch_3_starts():
        wait_until(started.exists)
        c.remove_node(worker_node, allow_graceful=False)

    try:
        with in_background(remove_a_node_when_batch_3_starts), hang_guard(180):
            state = train_in_process(tmp_path / "run", 3, 5, lagged, pool=pool)
        assert started.exists() and len([n for n in ray.nodes() if n["Alive"]]) == 2
        assert pool.nodes() == 2 and pool.num_workers == 2 and pool.replaced == 1
    finally:
        pool.close()
    reference = train_in_process(tmp_path / "reference", 0, 5, lagged)
    assert_same_state(state, reference)
    np.testing.assert_array_equal(state.previous.W1, reference.previous.W1)


def two_nodes_of_2_cpus():
    """A cluster of a head without CPUs and two nodes of 2 CPUs, this process joined to it."""
    return joined_cluster(0, [2, 2], STORE)


@pytest.mark.long
def test_a_node_lost_after_it_sent_its_sum_ahead_changes_no_weight(tmp_path, monkeypatch):
    """A node whose last match of a batch still plays sends the sum of its others ahead
    (their stats reported first). Lost then, those matches stay in the batch's sum and
    are not played again (were they, they would be counted twice: the weights would
    differ); the last match is played again elsewhere. The weights are those of
    --workers 0."""
    import ray

    from pgpong.pool.cluster_pool import ClusterPool

    settings = {**SETTINGS, "batch_size": 8, "max_episode_steps": 100}
    reference = train_in_process(tmp_path / "reference", 0, 2, settings)
    c, nodes = two_nodes_of_2_cpus()  # a leader with 2 workers each
    marker = tmp_path / "slow-episode"
    set_fault(monkeypatch, f"slowmark:0:{marker}")  # episode 0 of each batch: its node, then 2 s more
    pool = ClusterPool(WorkerSettings("ALE/Pong-v5", settings["max_episode_steps"], entropy_bonus=BONUS), 4)
    removed: list = []

    def remove_the_slow_episodes_node_once_it_sent_ahead():
        wait_until(marker.exists)
        time.sleep(0.05)
        node_id = marker.read_text()
        number = next(pool._names[leader] for leader, node in pool.node_of.items() if node == node_id)
        # its other matches are done (the queue is empty): their sum has gone ahead
        removed.append(wait_until(lambda: ray.get(pool._reducer.sent_ahead.remote()).get(number, 0) > 0))
        c.remove_node(next(n for n in nodes if n.node_id == node_id), allow_graceful=False)

    try:
        with in_background(remove_the_slow_episodes_node_once_it_sent_ahead) as remover, hang_guard(180):
            state = train_in_process(tmp_path / "run", 4, 2, settings, pool=pool)
        remover.join()
        assert removed == [True] and pool.nodes() == 1 and pool.num_workers == 2
    finally:
        pool.close()
        ray.shutdown()
        c.shutdown()
    assert_same_state(state, reference)


def assert_same_state(state, reference):
    np.testing.assert_array_equal(state.weights.W1, reference.weights.W1)
    np.testing.assert_array_equal(state.weights.W2, reference.weights.W2)
    assert state.running_reward == reference.running_reward


@pytest.mark.slow
def test_train_on_an_existing_cluster_by_address(tmp_path, cluster):
    c, _ = cluster
    proc = run_pgpong(
        "train",
        "--address",
        c.address,
        "--iterations",
        "1",
        "--batch-size",
        "2",
        "--max-episode-steps",
        "200",
        "--hidden",
        "16",
        "--run-dir",
        str(tmp_path / "run"),
    )
    assert proc.returncode == 0, proc.stderr
    assert "on 2 Ray worker(s)" in proc.stdout  # one per CPU of the cluster: head + node


@pytest.mark.long
def test_workers_per_cpu_put_three_on_each_node_of_two_cpus_and_change_no_weight(tmp_path):
    """--workers-per-cpu 1.5 on two nodes of 2 CPUs with a batch of 6: 3 workers a node,
    each holding 0.6666 of a CPU (2/3 cut to Ray's 0.0001), the batch's 6 matches in
    play at once; the weights of --workers 0."""
    import ray

    from pgpong.pool import open_pool
    from pgpong.pool.cluster_pool import ClusterPool

    settings = {**SETTINGS, "batch_size": 6, "max_episode_steps": 100}
    reference = train_in_process(tmp_path / "reference", 0, 2, settings)
    c, _ = two_nodes_of_2_cpus()
    try:
        settings_of_pool = WorkerSettings("ALE/Pong-v5", 100, entropy_bonus=BONUS)
        pool = open_pool(settings_of_pool, None, None, per_cpu=1.5, matches=6)
        try:
            assert isinstance(pool, ClusterPool) and sorted(pool._leaders.values()) == [3, 3]
            left = 4 - 6 * 0.6666  # (the cluster's view of its resources may lag the nodes')
            assert wait_until(lambda: ray.available_resources().get("CPU", 0) == pytest.approx(left), 30)
            with hang_guard(180):
                state = train_in_process(tmp_path / "run", 6, 2, settings, pool=pool)
        finally:
            pool.close()
    finally:
        ray.shutdown()
        c.shutdown()
    assert_same_state(state, reference)
