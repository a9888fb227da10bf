"""Playing a batch: the pools, and open_pool, the factory that picks one.

A pool takes the weights and a list of episode ids and plays them: in this process
(local.py, --workers 0), on Ray actors of one node (ray_pool.py), or through a leader
on each node of a cluster, pulling matches from one queue (cluster_pool.py,
queue.py), where with --lag 1 the next batch's matches start while this one's last
ones play. Whatever the pool, it gives the exact sum of the batch's gradients
(sums.py), the same to the bit for any number of workers and nodes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from pgpong.cluster import cluster_cpus, nodes_with_cpus, start_ray
from pgpong.placement import AUTO, MAX_WORKERS_PER_CPU, cluster_workers, per_cpu_for
from pgpong.pool.base import (
    BatchMeasures,
    BatchResult,
    Finished,
    Limits,
    Pool,
    PoolError,
    StepPlan,
    WorkerSettings,
    failure_reason,
    ignore_episode,
    kept_for_life,
)
from pgpong.pool.local import LocalPool
from pgpong.pool.worker import RolloutWorker, WorkerKind

# More workers than this on one node also get a leader (cluster_pool.py): the driver
# then hears of a few reports per node, not of every episode.
LEADERS_ABOVE = 16

__all__ = [
    "BatchMeasures",
    "BatchResult",
    "Finished",
    "Limits",
    "Pool",
    "PoolError",
    "StepPlan",
    "WorkerSettings",
    "failure_reason",
    "ignore_episode",
    "kept_for_life",
    "open_pool",
]


def open_pool(
    settings: WorkerSettings,
    workers: int | None,
    address: str | None,
    at_most: int | None = None,
    note: Callable[[str], None] = lambda text: None,
    kind: WorkerKind | None = None,
    limits: Limits | None = None,
    overlap: bool = False,
    per_cpu: float | str = 1.0,
    matches: int | None = None,
) -> Pool:
    """The pool for `workers` (0: this process, no Ray; None: one per CPU of the
    cluster, at most `at_most`), joining the cluster at `address` or starting Ray
    locally. On a cluster of several nodes, a leader on each node runs that node's
    workers (ClusterPool); on one node the driver runs them (RayPool). More workers
    than the cluster has CPUs are not waited for: `note` says how many run.
    `overlap` (--lag 1): a pool that plays the next batch while this one's last
    matches finish, on one node too (a ClusterPool). `per_cpu` workers a CPU
    (--workers-per-cpu): above 1, each asks Ray for 1 / per_cpu of a CPU, and a node's
    matches share its cores, and with `matches` (a batch's) no more start than it needs
    (placement.cluster_workers); auto: as many as give each match a worker, if 4 a CPU
    or fewer do, else 1 (`note` says which). Close the pool, then call cluster.stop_ray()."""
    if workers == 0:
        return LocalPool(settings)
    start_ray(address)
    auto, asked = per_cpu == AUTO, workers
    per_cpu = per_cpu_for(per_cpu, matches, [cpus for _, cpus in nodes_with_cpus()])
    kind = dataclasses.replace(kind or WorkerKind(RolloutWorker), per_cpu=per_cpu)
    cpus = (
        cluster_cpus()
        if per_cpu <= 1
        else max(1, cluster_workers([cpus for _, cpus in nodes_with_cpus()], per_cpu, matches))
    )
    if workers is None:
        workers = cpus if at_most is None else min(at_most, cpus)
    elif workers > cpus:
        room = f"room for {cpus} at {per_cpu:g} a CPU" if per_cpu > 1 else f"{cpus} CPU(s)"
        room += f" and batch {matches}" if per_cpu > 1 and matches else ""
        note(f"{workers} workers asked, but the Ray cluster has {room}: running {cpus}")
        workers = cpus
    if auto:
        note(
            auto_note(per_cpu, matches, cluster_cpus())
            + (f"; {workers} run (--workers)" if asked and workers < cpus else "")
        )
    from pgpong.pool.cluster_pool import ClusterPool
    from pgpong.pool.ray_pool import RayPool

    if overlap or len(nodes_with_cpus()) > 1 or workers > LEADERS_ABOVE:
        return ClusterPool(settings, workers, kind, limits)
    return RayPool(settings, workers, kind=kind, limits=limits)


def auto_note(per_cpu: float, matches: int | None, cpus: int) -> str:
    """What --workers-per-cpu auto chose, and why."""
    if per_cpu > 1:
        return f"--workers-per-cpu auto: {per_cpu:.3g} a CPU, a worker for each of the batch's {matches} matches"
    if matches is None or matches <= cpus:
        return f"--workers-per-cpu auto: 1 a CPU (the batch of {matches or 'any size'} fits the {cpus} CPUs)"
    return (
        f"--workers-per-cpu auto: 1 a CPU (a worker for each of the batch's {matches} matches would be more than "
        f"{MAX_WORKERS_PER_CPU:g} a CPU on {cpus} CPUs)"
    )
