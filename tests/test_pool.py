"""Pools: BLAS threads pinned in workers, results in episode order (and, on pgpong's own
Ray instance, in the task's reply; stopping it leaves no worker behind)."""

import json
import os
import subprocess
import sys
import textwrap
import time
from collections import deque

import numpy as np
import pytest

from conftest import hang_guard
from faults import set_fault
from pgpong.cluster import ClusterError, check_address
from pgpong.policy import Params
from pgpong.pool import WorkerSettings
from pgpong.pool.local import LocalPool
from pgpong.pool.ray_pool import RayPool
from pgpong.pool.sums import Played
from pgpong.pool.worker import RolloutWorker, WorkerKind, publish
from pgpong.rollout import EpisodeId

LOCAL_RAY_PROBE = textwrap.dedent(
    """
    import json
    import numpy as np
    from threadpoolctl import threadpool_info
    from pgpong.cluster import start_ray
    driver = [i["num_threads"] for i in threadpool_info()]
    start_ray(None, num_cpus=2)
    import ray
    from pgpong.pool import WorkerSettings
    from pgpong.pool.ray_pool import RayPool
    pool = RayPool(WorkerSettings("ALE/Pong-v5", 10), 2)
    # 4 MB, like a long episode's gradient (no CPU: the two workers hold both)
    gradient_sized = ray.remote(num_cpus=0)(lambda: np.ones(2**20, dtype=np.float32)).remote()
    ray.get(gradient_sized)
    where = ray.experimental.get_object_locations([gradient_sized])[gradient_sized]
    report = {"driver": driver, "workers": pool.blas_threads(), "result_on_nodes": where["node_ids"]}
    # A line a worker prints, as Ray forwards it to this driver's stdout (a pipe here).
    import io, sys, time
    class Seen(io.TextIOBase):
        def __init__(self, out):
            self.out, self.text = out, ""
        def write(self, text):
            self.text += text
            return self.out.write(text)
    sys.stdout = seen = Seen(sys.stdout)
    ray.get(ray.remote(num_cpus=0)(lambda: print("a line from a worker")).remote())
    deadline = time.monotonic() + 30
    while "a line from a worker" not in seen.text and time.monotonic() < deadline:
        time.sleep(0.05)
    sys.stdout = seen.out
    report["forwarded"] = seen.text
    # A process of this instance that outlives its raylet: a worker's child, its worker
    # stopped (stuck) as the raylet dies, so that the worker cannot end it on its way out.
    # ray.shutdown() alone leaves it for good, its parent init; stop_ray() ends it.
    import os, signal, subprocess, sys, psutil
    from pgpong.cluster import stop_ray
    @ray.remote(num_cpus=0)
    def start_a_straggler():
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True).pid
    straggler = psutil.Process(ray.get(start_a_straggler.remote()))
    raylet = next(p for p in psutil.Process().children() if p.name() == "raylet")
    worker = psutil.Process(straggler.ppid())
    worker.suspend()
    raylet.kill()
    raylet.wait(10)
    report["straggler_lived_past_its_raylet"] = straggler.is_running()
    stop_ray(grace=1)
    report["straggler_left"] = straggler.is_running() and straggler.status() != psutil.STATUS_ZOMBIE
    for process in (straggler, worker):  # (should stop_ray fail to)
        if process.is_running():
            process.kill()
    print(json.dumps(report))
    """
)


@pytest.fixture(scope="module")
def local_ray_report() -> dict:
    """pgpong's own Ray instance, started in a driver whose BLAS may run 4 threads."""
    many = {"OMP_NUM_THREADS": "4", "OPENBLAS_NUM_THREADS": "4", "MKL_NUM_THREADS": "4", "RAY_AUTH_MODE": "token"}
    proc = subprocess.run(
        [sys.executable, "-c", LOCAL_RAY_PROBE],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **many},
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_workers_use_one_blas_thread_whatever_the_driver_environment(local_ray_report):
    assert max(local_ray_report["driver"]) > 1  # the driver runs several BLAS threads...
    assert len(local_ray_report["workers"]) == 2
    for worker in local_ray_report["workers"]:
        assert worker and all(n == 1 for n in worker)  # ...and every worker uses 1


def test_results_come_back_in_the_reply_not_through_the_object_store(local_ray_report):
    # Ray's default keeps anything over 100 KB in the object store (on a node); pgpong's
    # own instance returns results up to 8 MB inline, as a gradient's maximum needs.
    assert local_ray_report["result_on_nodes"] == []


def test_stopping_pgpongs_own_ray_ends_what_outlived_its_raylet(local_ray_report):
    assert local_ray_report["straggler_lived_past_its_raylet"]
    assert not local_ray_report["straggler_left"]


def test_what_a_worker_prints_reaches_a_pipe_without_colour_codes(local_ray_report):
    # (a notebook or a log file is not a terminal: Ray's cyan "(pid=...)" prefix would be noise there)
    line = next(line for line in local_ray_report["forwarded"].splitlines() if "a line from a worker" in line)
    assert line.startswith("(") and "pid=" in line
    assert "\x1b" not in local_ray_report["forwarded"]


def test_local_pool_pins_one_thread_and_restores():
    from threadpoolctl import threadpool_info, threadpool_limits

    def threads() -> dict[str, int]:
        return {info["filepath"]: info["num_threads"] for info in threadpool_info()}

    with threadpool_limits(3):  # whatever this machine's default, the driver now runs 3
        before = threads()
        assert before and set(before.values()) == {3}
        pool = LocalPool(WorkerSettings("ALE/Pong-v5", 10))
        try:
            assert set(threads().values()) == {1}  # also libraries loaded since (scipy's BLAS)
        finally:
            pool.close()
        after = threads()
        assert {lib: after[lib] for lib in before} == before  # close() gave the driver its threads back


class PidWorker(RolloutWorker):
    """Notes in each result which process played it."""

    def play(self, weights, episode):
        result = super().play(weights, episode)
        assert isinstance(result, Played)
        result.stats.timings["pid"] = os.getpid()
        return result


def test_ray_pool_gives_each_match_to_the_first_free_worker(ray_instance, monkeypatch):
    weights = Params.initial(16, 0)
    # Episode 0 takes 2 s longer than the others (about 0.05 s each): it comes in last
    # but for the one queued behind it.
    set_fault(monkeypatch, "slow:0")
    episodes = [EpisodeId(0, 0, k) for k in range(8)]
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # PidWorker, for Ray's workers
    pool = RayPool(WorkerSettings("ALE/Pong-v5", 120), 2, kind=WorkerKind(PidWorker))
    try:
        with hang_guard(120):  # on a busy machine the second worker may still be starting
            while pool.num_workers < 2:
                pool.crew.poll_starting(timeout=1.0)
        job = ("play", publish(weights)[0], ())
        arrived, ended = [], []
        with hang_guard(120):
            for position, result in pool.run(deque(enumerate(episodes)), lambda key: job):
                arrived.append((position, result))
                if len(arrived) in (1, 6):  # the slow one plays on; then, all in but 2, it ends unread
                    ended.append(pool.ended(lambda key: key == 0))
                if len(arrived) == 6:
                    while not pool.ended(lambda key: key == 0):
                        time.sleep(0.01)
                    ended.append(pool.ended(lambda key: key in (0, 1, 3, 4, 5, 6, 7)))
    finally:
        pool.close()
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    assert [position for position, _ in arrived][-2:] == [0, 2]  # as they finish: the slow one, then its queue
    assert ended == [0, 0, 1]  # (the calls in flight that ended, not yet read: the others were read)
    results = dict(arrived)
    # Each worker took one episode and, with 6 left for 2 workers, held the next in its
    # queue: episode 2 waited behind the slow one. The rest, handed out as workers
    # came free, all went to the other worker: none were queued behind the slow one.
    played_by = [results[k].stats.timings["pid"] for k in range(8)]
    assert played_by[2] == played_by[0] != played_by[1]
    assert played_by[1] == played_by[3] == played_by[4] == played_by[5] == played_by[6] == played_by[7]
    local = LocalPool(WorkerSettings("ALE/Pong-v5", 120))
    expected = [local.worker.play(weights, episode) for episode in episodes]
    local.close()
    for k, b in enumerate(expected):
        assert isinstance(b, Played)
        np.testing.assert_array_equal(results[k].grad.W1_columns, b.grad.W1_columns)
        np.testing.assert_array_equal(results[k].grad.columns, b.grad.columns)


def played_here(weights: Params, episodes: list[EpisodeId]):
    """The batch played in this process (--workers 0): the sum every pool must give."""
    local = LocalPool(WorkerSettings("ALE/Pong-v5", 80))
    try:
        return local.play_batch(weights, episodes)
    finally:
        local.close()


def test_play_batch_hears_the_matches_in_episode_order_and_sums_them_as_this_process_does(ray_instance):
    weights, episodes = Params.initial(16, 1), [EpisodeId(1, 0, k) for k in range(6)]
    pool = RayPool(WorkerSettings("ALE/Pong-v5", 80), 2)
    heard: list = []
    try:
        played = pool.play_batch(weights, episodes, heard.append)
    finally:
        pool.close()
    alone = played_here(weights, episodes)
    assert [stats.episode for stats in heard] == episodes
    np.testing.assert_array_equal(played.grad.dense().W1, alone.grad.dense().W1)
    np.testing.assert_array_equal(played.grad.W2, alone.grad.W2)
    assert played.measures.bytes_in > 0 and played.measures.barrier_s is not None
    assert alone.measures.bytes_in == 0 and alone.measures.barrier_s is None


def test_workers_per_cpu_share_a_node_and_sum_as_this_process_does(ray_instance):
    """--workers-per-cpu 2 on this 2-CPU instance with a batch of 3: 3 workers (not 4: a
    worker for each match), each holding half a CPU, the batch in play at once; the
    same exact sum."""
    from pgpong.pool import open_pool

    weights, episodes = Params.initial(16, 1), [EpisodeId(2, 0, k) for k in range(3)]
    pool = open_pool(WorkerSettings("ALE/Pong-v5", 80), None, None, per_cpu=2.0, matches=3)
    try:
        assert isinstance(pool, RayPool) and pool.num_workers == 3
        left, deadline = 2 - 3 * 0.5, time.monotonic() + 30  # (the cluster's view may lag the node's)
        while ray_instance.available_resources().get("CPU", 0) != pytest.approx(left) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ray_instance.available_resources().get("CPU", 0) == pytest.approx(left)
        played = pool.play_batch(weights, episodes)
    finally:
        pool.close()
    alone = played_here(weights, episodes)
    np.testing.assert_array_equal(played.grad.dense().W1, alone.grad.dense().W1)
    np.testing.assert_array_equal(played.grad.W2, alone.grad.W2)


@pytest.mark.long  # auto's choice is test_placement's; sharing a node's CPUs on Ray stays in make test
def test_workers_per_cpu_auto_gives_each_match_a_worker_if_four_a_cpu_or_fewer_do(ray_instance):
    """auto on this 2-CPU instance: a batch of 4, 2 a CPU (a worker each); of 2 (it fits)
    and of 10 (5 a CPU would be too many), 1 a CPU; each says so. The sum is the same."""
    from pgpong.pool import open_pool

    settings, weights = WorkerSettings("ALE/Pong-v5", 80), Params.initial(16, 1)  # (as played_here)
    said: list[str] = []
    for matches, workers in ((4, 4), (2, 2), (10, 2)):
        pool = open_pool(settings, None, None, note=said.append, per_cpu="auto", matches=matches)
        try:
            assert pool.num_workers == workers
            if matches == 4:
                episodes = [EpisodeId(3, 0, k) for k in range(4)]
                played, alone = pool.play_batch(weights, episodes), played_here(weights, episodes)
                np.testing.assert_array_equal(played.grad.dense().W1, alone.grad.dense().W1)
        finally:
            pool.close()
    pool = open_pool(settings, 3, None, note=said.append, per_cpu="auto", matches=4)  # fewer asked: said so
    pool.close()
    assert said == [
        "--workers-per-cpu auto: 2 a CPU, a worker for each of the batch's 4 matches",
        "--workers-per-cpu auto: 1 a CPU (the batch of 2 fits the 2 CPUs)",
        "--workers-per-cpu auto: 1 a CPU (a worker for each of the batch's 10 matches would be more than 4 a CPU "
        "on 2 CPUs)",
        "--workers-per-cpu auto: 2 a CPU, a worker for each of the batch's 4 matches; 3 run (--workers)",
    ]


@pytest.mark.parametrize(
    "address", ["nonsense", "host:", ":123", "127.0.0.1:1", "a..b:6379", "localhost:\u00b2", "x" * 64 + ":6379"]
)
def test_check_address_refuses(address):
    with pytest.raises(ClusterError):
        check_address(address, timeout=2)


def test_a_host_that_cannot_be_a_name_is_named_and_real_ones_pass():
    from pgpong.cluster import parse_address

    for bad in ("a..b:6379", "x" * 64 + ".lab:6379", ".:6379", "a:b:6379", "a/b:6379"):
        with pytest.raises(ClusterError, match="is not a host name or IP address"):
            parse_address(bad)
    for unbalanced in ("[::1", "[::1:6379", "::1]:6379", "[]:6379"):  # '[::1' was host ':' port 1
        with pytest.raises(ClusterError, match="is not HOST:PORT"):
            parse_address(unbalanced)
    for good, host in (("[::1]:6379", "::1"), ("head_node:6379", "head_node"), ("head.lab.:1", "head.lab."),
                       ("b\u00fccher.de:6379", "b\u00fccher.de"), ("x" * 63 + ":2", "x" * 63)):  # fmt: skip
        assert parse_address(good)[0] == host
