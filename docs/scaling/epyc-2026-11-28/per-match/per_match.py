"""A node leader's cost per match, timed alone (docs/SCALING.md, "The stats with the
sum"): `python per_match.py` with pgpong importable (PYTHONPATH=src) runs one process
as a leader would, calling an actor that returns a real match of a bank, waiting for
it, fetching it and adding it in fixed point, 800 matches a round, three rounds of
each way; `python per_match.py store` the same with Ray's default, the result through
the object store. It prints the caller's CPU and wall time per match."""

import sys
import time

import ray

from pgpong.bench.simulate import play_bank
from pgpong.cluster import LOCAL_SYSTEM_CONFIG
from pgpong.policy import Params
from pgpong.pool.base import WorkerSettings
from pgpong.pool.sums import ExactSum
from pgpong.pool.worker import publish

STORE = sys.argv[1:] == ["store"]
ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", _system_config={} if STORE else LOCAL_SYSTEM_CONFIG)
played = play_bank(WorkerSettings(), Params.initial(200, 0), 2, 0, 2).matches[0]
print(f"a match of {len(played.grad.columns)} pixels, {played.grad.W1_columns.nbytes / 1e6:.2f} MB of gradient")


@ray.remote(num_cpus=1)
class Echo:
    def __init__(self, match):
        self.match = match

    def play(self, published, episode):
        return self.match

    def small(self, published, episode):
        return 1

    def stream(self, n):
        for _ in range(n):
            yield self.match


echo, published, N = Echo.remote(played), publish(Params.initial(200, 0))[0], 800


def tasks(fetch_local=True):
    total = ExactSum(200)
    for _ in range(N):
        ref = echo.play.remote(published, [0, 1, 2])
        ray.wait([ref], num_returns=1, fetch_local=fetch_local)
        total.add(ray.get(ref).grad)


def stream():
    total = ExactSum(200)
    for ref in echo.stream.options(num_returns="streaming").remote(N):
        total.add(ray.get(ref).grad)


def small():
    for _ in range(N):
        ray.get(echo.small.remote(published, [0, 1, 2]))


ways = {
    "a task per match": tasks,
    "the same, fetch_local=False": lambda: tasks(False),
    "one streaming call": stream,
    "a call with a small answer": small,
}
for way in ways.values():  # warm-up
    way()
for _ in range(3):
    for name, way in ways.items():
        cpu, wall = time.process_time(), time.perf_counter()
        way()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        print(f"{name:28s} the caller's CPU {1e3 * cpu / N:.3f} ms, wall {1e3 * wall / N:.3f} ms")
