"""A simulating process's cost per match, timed without pgpong's pool around it
(docs/SCALING.md, "The stats with the sum"): `python simulating_process.py` with
pgpong importable (PYTHONPATH=src). Two actors of 32 slots each, as bench's 1x64
has, play batches of 60 sleeping matches of 0.15-0.24 s started together and
return a real match of the bank each (0.56 MB, in the task's reply: pgpong's Ray
settings); the caller waits for all 60. Threads (as bench's SimulatedWorkers) or
an asyncio actor. Prints the actors' CPU per match and how long after the last
match's planned end the caller had every result (the median of 25 batches)."""

import asyncio
import random
import statistics
import time

import ray

from pgpong.bench.simulate import play_bank
from pgpong.cluster import LOCAL_SYSTEM_CONFIG
from pgpong.policy import Params
from pgpong.pool.base import WorkerSettings

ray.init(num_cpus=4, include_dashboard=False, logging_level="ERROR", _system_config=LOCAL_SYSTEM_CONFIG)
played = play_bank(WorkerSettings(), Params.initial(200, 0), 2, 0, 2).matches[0]


class Threaded:
    def __init__(self, match):
        self.match = match

    def play(self, start, seconds, slot):
        time.sleep(max(0.0, start + seconds - time.time()))
        return self.match

    def cpu(self):
        return time.process_time()


class Async:
    def __init__(self, match):
        self.match = match

    async def play(self, start, seconds, slot):
        await asyncio.sleep(max(0.0, start + seconds - time.time()))
        return self.match

    async def cpu(self):
        return time.process_time()


def run(cls, batches=25):
    actors = [ray.remote(num_cpus=1)(cls).options(max_concurrency=32 * 2 + 4).remote(played) for _ in range(2)]
    before = sum(ray.get([actor.cpu.remote() for actor in actors]))
    rng, late = random.Random(0), []
    for _ in range(batches):
        start = time.time() + 0.02
        seconds = [rng.uniform(0.15, 0.24) for _ in range(60)]
        ray.get([actors[i % 2].play.remote(start, s, i // 2) for i, s in enumerate(seconds)])
        late.append(time.time() - (start + max(seconds)))
    cpu = sum(ray.get([actor.cpu.remote() for actor in actors])) - before
    for actor in actors:
        ray.kill(actor)
    return 1e3 * cpu / (60 * batches), 1e3 * statistics.median(late)


for _ in range(3):
    for cls in (Threaded, Async):
        cpu, late = run(cls)
        print(f"{cls.__name__:9s} the actors' CPU per match {cpu:.2f} ms; every result here {late:.1f} ms after the last end")
