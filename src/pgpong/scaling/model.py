"""A model of pgpong's seconds per update for any batch, workers and nodes, with its
constants measured on this project's machine (docs/SCALING.md says how).

    seconds per update = play + overhead
      play      the makespan of the batch's matches under pgpong's own rule: each match,
                in episode order, to the first free worker anywhere (on several nodes,
                through the queue: a worker that frees up waits for its node's request);
                a match lasts its steps at the per-core speed, plus Ray's pause between
                two matches of a worker
      overhead  what an update adds beyond its matches, measured on one node (bench
                --simulate 1x64 --pace 2600 on this 2-core machine, where its processes
                wait for each other: an upper bound): starting the matches, the last
                sums (the node's, then the reducer's on several nodes), the RMSProp step
    driver CPU  a fixed part (receiving the sum, RMSProp, the row), a part per second
                of the update (reading the queue's reports once a second), and a part
                per match (its stats, in order); none per node since the leaders' runs
                go on from batch to batch
    queue CPU   the queue actor's (it hands out the matches, takes the nodes' reports
                and owns the weights): a fixed part, a part per call (the leaders'
                requests, simulated, their reports, the driver's reads) and a small
                part per match
    bytes into the driver  one float32 sum on the pixels the batch touched
    and an update takes at least the driver's CPU time, and the queue's

`python -m pgpong.scaling` prints its tables (scaling/__main__.py); docs/SCALING.md and the
README quote them.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np

from pgpong.placement import (
    LEADER_WORKERS,
    POLL_SECONDS,
    best_whole_matches,
    cluster_workers,
    first_free,
    groups,
    lower_bound,
    node_workers,
    pipelined,
    report_seconds,
    requests,
    shared_first_free,
    shared_pipelined,
    shares,
)

# Match lengths (env steps) of 24 real ALE/Pong-v5 matches each, the banks `pgpong bench
# --simulate` plays (docs/scaling/contention/a/, 2026-11-25; the same matches since 2026-11-24):
# a new policy (seed 0), losing 0-21 as training starts (`--bank-policy new`), and the
# shipped agent, winning late in training (`--bank-policy shipped`).
# fmt: off
EARLY = (
    884, 1161, 1105, 885, 1042, 1103, 824, 980, 1006, 1102, 947, 1101,
    944, 1076, 764, 764, 1006, 825, 983, 947, 1009, 947, 947, 1127,
)
LATE = (
    3853, 4465, 3516, 4331, 2843, 3857, 3988, 6124, 5912, 5282, 4085, 6244,
    3025, 5696, 3812, 3568, 4843, 6102, 4353, 4649, 3413, 3844, 2804, 4331,
)
# fmt: on
LENGTHS = {"early": EARLY, "late": LATE}


@dataclass(frozen=True)
class Constants:
    """Measured on this project's machine (2 cores, AMD EPYC); docs/SCALING.md."""

    lengths: tuple[int, ...]  # match lengths to draw from
    steps_per_s_per_core: float  # training, every core busy: the banks' pace on 2026-11-23/24 (2,531-2,735 in six runs)
    overhead_s: float  # an update beyond its matches on one node (--simulate 1x64 --batch-size 60 --pace 2600) ...
    overhead_s_per_node: float  # ... plus this per node (the reducer adds the nodes' sums as they come)
    driver_fixed_ms: float  # driver CPU per update whatever the batch, nodes and seconds ...
    driver_ms_per_second: float  # ... plus this per second of the update (1x64: the same matches, 4 times as long)
    driver_ms_per_match: float  # ... plus this per match (its stats, in order: 1x64, batch 3,000 of 100 steps)
    driver_ms_per_node: float  # ... plus this per node (11x18 against 1x198, batch 300: none left to see)
    queue_fixed_ms: float  # the queue actor's CPU per update (publishing the weights the reducer made) ...
    queue_ms_per_call: float  # ... plus this per call: the nodes' requests and reports, the driver's reads
    sum_bytes: float  # the batch's sum, float32 on the pixels it touched, into the driver
    ray_s_per_match: float = 0.0035  # a worker's pause between two matches (pgpong bench: 3.2-3.6 ms)
    queue_s: float = 0.002  # on several nodes, a freed worker's wait for its node's request to the queue
    queue_ms_per_match: float = 0.0012  # the queue's per match: handing it out, its stats passed on (1x64, batch 3,000)


PHASES = {
    "early": Constants(EARLY, 2_600, 0.015, 0.002, 7, 2.5, 0.005, 0.0, 1, 1.0, 2.34 * 2**20),
    "late": Constants(LATE, 2_600, 0.025, 0.003, 9, 2.5, 0.005, 0.0, 1, 1.0, 4.25 * 2**20),
}


def cpu_ms(batch: int, nodes: int, leaders: int, seconds: float, c: Constants, asked: float) -> tuple[float, float]:
    """The driver's and the queue's CPU milliseconds in an update of `seconds` whose
    matches the nodes' `leaders` asked the queue for in `asked` requests."""
    driver = c.driver_fixed_ms + c.driver_ms_per_second * seconds
    driver += c.driver_ms_per_match * batch + c.driver_ms_per_node * nodes
    calls = asked + leaders * seconds / report_seconds(leaders) + 1 + seconds / POLL_SECONDS
    return driver, c.queue_fixed_ms + c.queue_ms_per_call * calls + c.queue_ms_per_match * batch


def leader_sizes(counts: list[int]) -> list[int]:
    """The workers of each leader of a cluster whose nodes run these many workers."""
    return [size for count in counts for size in groups(count, LEADER_WORKERS)]


def predict(
    batch: int, nodes: int, cpus: int, c: Constants, samples: int = 200, per_cpu: float = 1.0
) -> dict[str, float]:
    """Medians over `samples` batches whose match lengths are drawn from c.lengths, with
    `per_cpu` workers a CPU (--workers-per-cpu; above 1 a node's matches share its cores);
    the lower bound and the best whole-match schedule are those of one worker a core."""
    rng = np.random.default_rng(0)
    workers, each = nodes * cpus, node_workers(cpus, per_cpu)
    counts = shares(cluster_workers([cpus] * nodes, per_cpu, batch), [each] * nodes)  # as open_pool starts them
    pause = c.ray_s_per_match + (c.queue_s if nodes > 1 else 0.0)
    rows = []
    for _ in range(samples):
        durations = list(rng.choice(c.lengths, size=batch) / c.steps_per_s_per_core)
        if each > cpus:
            play = shared_first_free(durations, [(count, cpus) for count in counts], pause)
        else:
            play = first_free(durations, workers, pause)
        seconds = play + c.overhead_s + c.overhead_s_per_node * (nodes if nodes > 1 else 0)
        lower = lower_bound(durations, workers)
        asked = requests(durations, leader_sizes(counts), c.ray_s_per_match, c.queue_s)
        rows.append((seconds, lower, best_whole_matches(durations, workers), play, asked))
    seconds, lower, best, play, asked = (statistics.median(column) for column in zip(*rows, strict=True))
    driver_ms, queue_ms = cpu_ms(batch, nodes, len(leader_sizes(counts)), seconds, c, asked)
    seconds = max(seconds, driver_ms / 1e3, queue_ms / 1e3)  # neither can do an update's work in less
    return {
        "batch_size": batch,
        "nodes": nodes,
        "workers": sum(counts),
        "seconds_per_update": seconds,
        "lower_bound_s": lower,
        "efficiency": lower / seconds,
        "best_whole_matches_s": best,
        "pgpong_schedule_s": play,
        "of_best_whole_matches": seconds / best,
        "driver_cpu_ms": driver_ms,
        "queue_cpu_ms": queue_ms,
        "bytes_into_driver": c.sum_bytes,
    }


def predict_lag(
    batch: int,
    nodes: int,
    cpus: int,
    c: Constants,
    lag: int,
    batches: int = 40,
    share: float = 0.0,
    per_cpu: float = 1.0,
) -> dict[str, float]:
    """Seconds per update in a steady run of `batches` updates (the first quarter
    left out) when batch k may start once update k - 1 - lag is done; lag 0 gives
    predict()'s figure, lag 1 what `--lag 1` gives once the pools overlap batches,
    lag 0 with a `share` what `--lag-share` gives (the batch's first matches may start
    once update k - 2 is); with `per_cpu` workers a CPU, a node's matches share its
    cores, as in predict(). Against one batch's work shared evenly over the CPUs
    (with batches overlapping, the longest match no longer bounds an update) and its
    best whole-match schedule at one worker a CPU."""
    rng = np.random.default_rng(0)
    workers, each = nodes * cpus, node_workers(cpus, per_cpu)
    counts = shares(cluster_workers([cpus] * nodes, per_cpu, batch), [each] * nodes)  # as open_pool starts them
    pause = c.ray_s_per_match + (c.queue_s if nodes > 1 else 0.0)
    step = c.overhead_s + c.overhead_s_per_node * (nodes if nodes > 1 else 0)
    drawn = [list(rng.choice(c.lengths, size=batch) / c.steps_per_s_per_core) for _ in range(batches)]
    if each > cpus:
        done = shared_pipelined(drawn, [(count, cpus) for count in counts], pause, step, lag, share)
    else:
        done = pipelined(drawn, workers, pause, step, lag, share)
    first = batches // 4
    seconds = (done[-1] - done[first - 1]) / (batches - first)
    sizes = leader_sizes(counts)
    asked = statistics.median(requests(d, sizes, c.ray_s_per_match, c.queue_s) for d in drawn)
    driver_ms, queue_ms = cpu_ms(batch, nodes, len(sizes), seconds, c, asked)
    seconds = max(seconds, driver_ms / 1e3, queue_ms / 1e3)
    shared = statistics.median(sum(d) / workers for d in drawn)  # the bound once batches overlap
    best = statistics.median(best_whole_matches(d, workers) for d in drawn)
    return {
        "workers": sum(counts),
        "seconds_per_update": seconds,
        "work_per_worker_s": shared,
        "of_work_per_worker": seconds / shared,
        "best_whole_matches_s": best,
        "of_best_whole_matches": seconds / best,
    }


SCENARIOS = [(1, 1, 64), (10, 1, 64), (60, 1, 64), (300, 11, 18), (3000, 110, 18)]
