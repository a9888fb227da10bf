"""Where a pool's workers go: pure arithmetic, shared by the cluster pool and the
model of seconds per update (scaling.py)."""

from __future__ import annotations


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
