"""Ray's compiled graphs against plain actor calls, for a leader starting its workers'
matches: how soon the calls reach the workers, and what waiting workers cost.

    python docs/scaling/compiled_graphs.py [WORKERS] [ROUNDS]

A leader actor (no CPU of its own, as pgpong's) starts one 20 ms "match" on each of
WORKERS actors, ROUNDS times: with one actor call each; through one compiled graph it
made itself over all of them (one execute() reaches them all); and through a compiled
graph per worker, as a schedule that hands each free worker its next match would need
(executed from an asyncio leader). Then the workers of a compiled graph wait 5 s for a
call that does not come, and their CPU time is read from /proc. Prints medians of the
rounds after the first three. SCALING.md quotes it."""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import ray
from ray.dag import InputNode, MultiOutputNode

MATCH_S = 0.02


@ray.remote(num_cpus=0)
class Worker:
    def play(self, episode: list[int]) -> tuple[float, int]:
        began = time.time()
        time.sleep(MATCH_S)
        return began, os.getpid()


def timings(began: float, results: list[tuple[float, int]], ended: float) -> tuple[float, float, float]:
    starts = sorted(start for start, _ in results)
    return starts[0] - began, starts[-1] - began, ended - began - MATCH_S


@ray.remote(num_cpus=0)
class Leader:
    def __init__(self, workers: int) -> None:
        self.workers = [Worker.remote() for _ in range(workers)]
        ray.get([w.play.remote([0]) for w in self.workers])

    def plain(self, rounds: int) -> list[tuple[float, float, float]]:
        out = []
        for r in range(rounds):
            began = time.time()
            results = ray.get([w.play.remote([r, i]) for i, w in enumerate(self.workers)])
            out.append(timings(began, results, time.time()))
        return out

    def compiled(self, rounds: int) -> tuple[list[tuple[float, float, float]], float]:
        with InputNode() as episode:
            graph = MultiOutputNode([w.play.bind(episode) for w in self.workers]).experimental_compile()
        try:
            out = []
            for r in range(rounds):
                began = time.time()
                results = ray.get(graph.execute([r, 0]))
                out.append(timings(began, results, time.time()))
            pids = [pid for _, pid in results]
            before = cpu_seconds(pids)
            time.sleep(5)
            idle = (cpu_seconds(pids) - before) / 5
        finally:
            graph.teardown()
        return out, idle


@ray.remote(num_cpus=0)
class AsyncLeader:
    """The same, with a compiled graph per worker."""

    async def per_worker(self, workers: int, rounds: int) -> list[tuple[float, float, float]]:
        actors = [Worker.remote() for _ in range(workers)]
        graphs = []
        for actor in actors:
            with InputNode() as episode:
                graphs.append(actor.play.bind(episode).experimental_compile(enable_asyncio=True))
        try:
            out = []
            for r in range(rounds):
                began = time.time()
                futures = [await graph.execute_async([r, i]) for i, graph in enumerate(graphs)]
                results = await asyncio.gather(*futures)
                out.append(timings(began, results, time.time()))
        finally:
            for graph in graphs:
                graph.teardown()
        return out


def cpu_seconds(pids: list[int]) -> float:
    ticks = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def show(name: str, rounds: list[tuple[float, float, float]]) -> None:
    first, last, over = (statistics.median(column) * 1e3 for column in zip(*rounds[3:], strict=True))
    print(f"{name:>16}: first match starts {first:.2f} ms, last {last:.2f} ms, round's overhead {over:.2f} ms")


def main() -> None:
    workers = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    leader = Leader.remote(workers)
    print(f"{workers} workers, {rounds} rounds of a {MATCH_S * 1e3:.0f} ms match each, on {os.cpu_count()} cores")
    for _ in range(2):
        show("plain calls", ray.get(leader.plain.remote(rounds)))
        rounds_done, idle = ray.get(leader.compiled.remote(rounds))
        show("compiled graph", rounds_done)
        print(f"{'':>19}its {workers} workers, waiting with nothing to do: {idle:.2f} CPU seconds a second")
        show("graph per worker", ray.get(AsyncLeader.remote().per_worker.remote(workers, rounds)))
    ray.shutdown()


if __name__ == "__main__":
    main()
