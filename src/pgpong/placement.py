"""Where a pool's workers and matches go: pure arithmetic, shared by the pools, bench
and the model of seconds per update (scaling.py)."""

from __future__ import annotations

import heapq


def shares(workers: int, cpus: list[int]) -> list[int]:
    """`workers` spread over nodes with these CPUs: each node's share in proportion
    to its CPUs (largest remainders first), never more than it has."""
    total = sum(cpus)
    workers = min(workers, total)
    exact = [workers * c / total for c in cpus]
    counts = [int(x) for x in exact]
    for i in sorted(range(len(cpus)), key=lambda i: exact[i] - counts[i], reverse=True)[: workers - sum(counts)]:
        counts[i] += 1
    return counts


def groups(workers: int, at_most: int) -> list[int]:
    """`workers` of one node cut into as few groups of at most `at_most` as can be, of
    sizes that differ by one at most: 64 -> [32, 32], 40 -> [20, 20], 18 -> [18]."""
    if workers <= 0:
        return []
    count = -(-workers // at_most)
    return [workers // count + (1 if k < workers % count else 0) for k in range(count)]


def first_free(durations: list[float], workers: int, pause: float = 0.0) -> float:
    """pgpong's schedule: the matches in episode order, each to the first free worker
    (a worker waits `pause` between two matches). When the last one ends."""
    free = [0.0] * workers
    for duration in durations:
        heapq.heappush(free, heapq.heappop(free) + duration + pause)
    return max(free)


def best_whole_matches(durations: list[float], workers: int) -> float:
    """What a clairvoyant schedule of whole matches would take (longest first, each to
    the first free worker): matches cannot be split, so with fewer than two per worker
    it stays above the lower bound."""
    return first_free(sorted(durations, reverse=True), workers)


def lower_bound(durations: list[float], workers: int) -> float:
    """No schedule can be faster: the longest match, or all the work shared evenly."""
    return max(max(durations), sum(durations) / workers)


def pipelined(batches: list[list[float]], workers: int, pause: float, step: float, lag: int) -> list[float]:
    """When each batch's update is done, if batch k may start once update k - 1 - lag
    is (lag 0: after the update before it, as pgpong trains; lag 1: with the weights
    from before the last update, so two batches overlap). The matches go in order,
    batch by batch, each to the first free worker (a worker waits `pause` after each
    match); an update takes `step` after its batch's last match."""
    free = [0.0] * workers
    done: list[float] = []
    for k, durations in enumerate(batches):
        release = done[k - 1 - lag] if k - 1 - lag >= 0 else 0.0
        last = release
        for duration in durations:
            end = max(heapq.heappop(free), release) + duration + pause
            heapq.heappush(free, end)
            last = max(last, end)
        done.append(max(last, done[-1] if done else 0.0) + step)  # the updates come one after another
    return done
