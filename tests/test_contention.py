"""bench's measure of this machine's contention (bench/contention.py): each part's CPU
time and time spent waiting for a CPU, read from Linux's schedstat, for this process
and the Ray processes it started, not another run's."""

import os
import subprocess
import sys
import time

import pytest

from pgpong.bench import contention

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="Linux's /proc is read")


def test_ray_processes_are_told_apart_by_their_titles():
    assert contention._part("ray::WorkQueue.take") == "queue"
    assert contention._part("ray::Reducer") == "reducer"
    assert contention._part("ray::NodeLeader.run") == "leaders"
    assert contention._part("ray::SimulatedWorkers.play") == "workers"
    assert contention._part("ray::RolloutWorker.play") == "rollout workers"
    assert contention._part("ray::IDLE") == "ray"
    assert contention._part("/venv/lib/ray/core/src/ray/raylet/raylet --node_id=x") == "ray"
    assert contention._part("/usr/bin/python train.py") is None


def test_a_busy_thread_waits_for_a_cpu_that_another_holds():
    """Two threads that spin (in a child process: the GIL would take turns otherwise)
    on one CPU: each runs about half the time and waits the other half."""
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("needs sched_setaffinity")
    spin = "import os, time\nos.sched_setaffinity(0, {0})\nend = time.time() + 1.0\nwhile time.time() < end: pass\n"
    children = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2)]
    try:
        running = contention.processes()
        pids = {process.pid for process in running}
        assert os.getpid() in pids and not pids & {child.pid for child in children}  # not Ray's: left out
        spinners = [contention.Process(child.pid, "driver") for child in children]
        time.sleep(0.2)
        before = contention.waits(spinners)
        time.sleep(0.6)
        after = contention.waits(spinners)
    finally:
        for child in children:
            child.wait()
    (part,) = contention.waited_ms(before, after).values()
    # 0.6 s of two spinners on one CPU, always ready to run: 1.2 s of running and
    # waiting between them, about half of it waiting; all of it in their code's thread
    assert 1000 < part["cpu_ms"] + part["wait_ms"] < 1400 and 300 < part["wait_ms"] < 900
    assert part["code_wait_ms"] == part["wait_ms"]


def test_the_driver_is_always_read_and_medians_are_per_part():
    stop = time.monotonic() + 0.05
    while time.monotonic() < stop:
        pass
    (driver, *_) = contention.processes()
    assert driver == contention.Process(os.getpid(), "driver")
    times = contention.waits([driver])["driver"]
    assert times.cpu > 0.05 and 0 <= times.code_wait <= times.wait
    readings = [{"driver": {"code_wait_ms": w}, "queue": {"code_wait_ms": 5}} for w in (3, 1, 2)]
    assert contention.median_waits(readings) == {"driver": 2, "queue": 5}
    assert contention.median_waits([]) is None
