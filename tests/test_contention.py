"""bench's measure of this machine's contention (bench/contention.py): each part's CPU
time and time spent waiting for a CPU, read from Linux's schedstat, for this process
and the Ray processes it started, not another run's."""

import os
import subprocess
import sys
import time

import pytest

from pgpong.bench import contention

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/schedstat"), reason="Linux's schedstat is read")


def test_ray_processes_are_told_apart_by_their_titles():
    assert contention._part("ray::WorkQueue.take") == "queue"
    assert contention._part("ray::Reducer") == "reducer"
    assert contention._part("ray::NodeLeader.run") == "leaders"
    assert contention._part("ray::SimulatedWorkers.play") == "workers"
    assert contention._part("ray::RolloutWorker.play") == contention._part("ray::BenchWorker") == "rollout workers"
    assert contention._part("ray::IDLE") == "ray"
    assert contention._part("/venv/lib/ray/core/src/ray/raylet/raylet --node_id=x") == "ray"
    assert contention._part("/venv/bin/python /venv/lib/python3.11/site-packages/ray/dashboard/agent.py") == "ray"
    assert contention._part("/usr/bin/python train.py") is None


SPIN = """import os, sys
os.sched_setaffinity(0, {int(sys.argv[1])})
print("ready", flush=True)
while True:
    pass
"""


def test_two_threads_on_one_cpu_each_wait_about_half_the_time():
    """Two processes that spin on one CPU (one thread each) are always ready to run:
    between two readings their running and waiting add up to twice the time between,
    and about half of that is waiting; not being Ray's, they are not among the processes."""
    cpu = min(os.sched_getaffinity(0))
    children = [subprocess.Popen([sys.executable, "-c", SPIN, str(cpu)], stdout=subprocess.PIPE) for _ in range(2)]
    try:
        for child in children:
            assert child.stdout is not None and child.stdout.readline() == b"ready\n"
        assert not {p.pid for p in contention.processes()} & {child.pid for child in children}
        spinners = [contention.Process(child.pid, "workers") for child in children]
        began = time.monotonic()
        before = contention.read(spinners)
        time.sleep(0.5)
        after = contention.read(spinners)
        window_ms = 1e3 * (time.monotonic() - began)
    finally:
        for child in children:
            child.kill()
            child.wait()
    part = contention.waited_ms(before, after)["workers"]
    assert part["processes"] == 2
    assert 0.8 * 2 * window_ms < part["cpu_ms"] + part["wait_ms"] < 1.1 * 2 * window_ms
    assert part["wait_ms"] > 0.25 * window_ms
    assert part["code_wait_ms"] == part["wait_ms"]  # their one thread keeps the process's name


def test_threads_count_from_their_first_reading_and_a_part_from_its_processes():
    before = {(1, 1): ("leaders", 100, 50, True), (1, 2): ("leaders", 10, 5, False), (1, 3): ("leaders", 9, 9, True)}
    # thread 3 ended, thread 4 is new; ns running and waiting
    after = {(1, 1): ("leaders", 1_100_100, 2_000_050, True), (1, 2): ("leaders", 1_000_010, 5, False)}
    after[(1, 4)] = ("leaders", 500_000, 1_000_000, True)
    (part,) = contention.waited_ms(before, after).values()
    assert part == pytest.approx({"processes": 1, "cpu_ms": 2.6, "wait_ms": 3.0, "code_wait_ms": 3.0})


def test_the_driver_is_read_and_medians_are_per_part():
    stop = time.monotonic() + 0.05
    while time.monotonic() < stop:
        pass
    (driver, *_) = contention.processes()
    assert driver == contention.Process(os.getpid(), "driver")
    reading = contention.read([driver])
    assert (os.getpid(), os.getpid()) in reading  # its main thread
    part, ran, waited, code = reading[(os.getpid(), os.getpid())]
    assert part == "driver" and ran > 0.05e9 and waited >= 0 and code
    readings = [
        {"driver": {"processes": 1, "code_wait_ms": w}, "queue": {"processes": 1, "code_wait_ms": 5}} for w in (3, 1, 2)
    ]
    assert contention.median_waits(readings) == {
        "driver": {"processes": 1, "code_wait_ms": 2},
        "queue": {"processes": 1, "code_wait_ms": 5},
    }
    assert contention.median_waits([]) is None
