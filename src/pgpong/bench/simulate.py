"""`pgpong bench --simulate NODESxCPUS`: the real driver at the size of a big machine
or a cluster, on this one.

A local Ray cluster of NODES nodes (a raylet each, all on this machine) declares
CPUS CPUs per node. Its rollout workers do not emulate: each match lasts as long as
a real match of its length would at the per-core speed measured here (or at the
pace asked: --pace), and returns a real gradient: both taken from a bank of real
matches played first, on this machine, with their real lengths and sparsity. Everything else is real: the driver
and the trainer, Ray's tasks and transfers, the leaders and their node sums, the
checkpoints. One process stands in for up to 32 workers of a node (198 worker
processes would not fit in memory): it holds their CPUs and plays one match per
worker at a time, so the driver receives what it would from that many workers.

Per update it reports the seconds, the shortest time any schedule could take with
those match durations (lower_bound_s), their ratio (efficiency), the driver's CPU
time and the bytes of gradients that reached the driver; updates() gives the same
figures for real workers (bench on this machine or a real cluster).
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pgpong.bench.options import MAX_SLOTS, BenchOptions, Shape
from pgpong.bench.updates import (
    as_trained,
    scratch_trainer,
    update_table,
    updates,
    waiting_lines,
    warm_up_batches,
)
from pgpong.cluster import (
    LOCAL_SYSTEM_CONFIG,
    ClusterError,
    ending_leftovers,
    ensure_local_token,
    new_raylets,
    set_auth_mode,
)
from pgpong.config import ConfigError, TrainConfig
from pgpong.placement import AUTO, cluster_workers, node_workers, per_cpu_for, shares
from pgpong.policy import Params
from pgpong.pool import WorkerSettings, open_pool
from pgpong.pool.base import kept_for_life
from pgpong.pool.ray_pool import RayPool
from pgpong.pool.sums import Played
from pgpong.pool.worker import PublishedWeights, Skipped, WeightsCache, WeightsToCome, WorkerKind, publish
from pgpong.rollout import EpisodeId


class SharedCores:
    """The CPUs a simulating process holds (fewer than its slots at --workers-per-cpu
    above 1), shared equally by its slots' matches in play, as an operating system
    shares a node's cores: each of k matches on c CPUs advances at min(1, c/k) of its
    pace. `done` is the work (seconds at full pace) each match in play has had since
    the first began; a match of `work` seconds ends when `done` passes its start's plus
    `work`."""

    def __init__(self, cores: float, clock: Callable[[], float] = time.perf_counter):
        self.cores, self.clock = cores, clock
        self.done, self.playing = 0.0, 0
        self._at = clock()
        self._changed = threading.Condition()

    def advance(self) -> None:
        """Bring `done` to now, at the rate since the last change (with the lock held)."""
        now = self.clock()
        self.done += (now - self._at) * self.rate()
        self._at = now

    def rate(self) -> float:
        return min(1.0, self.cores / self.playing) if self.playing else 0.0

    def start(self, work: float) -> float:
        """A match of `work` seconds begins: when (in `done`) it ends."""
        self.advance()
        self.playing += 1
        return self.done + work

    def left(self, end: float) -> float:
        """Seconds of the clock until a match ending at `end` does, at today's rate."""
        self.advance()
        return max(0.0, end - self.done) / self.rate()

    def stop(self) -> None:
        self.advance()
        self.playing -= 1

    def play(self, work: float) -> None:
        """Wait while a match of `work` seconds plays on the shared CPUs."""
        with self._changed:
            end = self.start(work)
            self._changed.notify_all()  # the others slow down: they wait again
            try:
                while (wait := self.left(end)) > 0:
                    self._changed.wait(wait)
            finally:
                self.stop()
                self._changed.notify_all()  # the others speed up


class SimulatedWorkers:
    """One process standing in for several rollout workers of a node (its slots).
    A slot plays one match at a time: the bank's match for that episode, as long as
    it would take at `seconds_per_step` (this machine's, or --pace's), with its real
    gradient. At `per_cpu` above 1 (--workers-per-cpu) its matches share `cores` (SharedCores):
    its node's, if it holds all of the node's workers (the operating system shares them
    all, whatever Ray counts), else the CPUs Ray gave it (its slots x 1 / per_cpu, cut)."""

    def __init__(
        self,
        settings: WorkerSettings,
        bank: list[Played],
        seconds_per_step: float,
        per_cpu: float = 1.0,
        cores: float | None = None,
    ):
        self.settings = settings
        self.bank = bank
        self.seconds_per_step = seconds_per_step
        self._cores = SharedCores(cores or _assigned_cpus()) if per_cpu > 1 else None
        self._weights = WeightsCache()
        self._locks: dict[int, threading.Lock] = {}
        self._read: dict[Any, Future] = {}  # what was read once for all the slots, by its reference
        self._ended: dict[int, float] = {}  # slot -> when its last match ended
        self._sleep = time.sleep  # (a test's to replace)
        self._guard = threading.Lock()
        kept_for_life()  # as a leader does (a rollout worker does not: its Pong would never be freed)

    def play(
        self, weights: Params | PublishedWeights | WeightsToCome, episode: EpisodeId | list[int], slot: int = 0
    ) -> Played | Skipped:
        arrived, episode = time.perf_counter(), EpisodeId(*episode)
        ready = None  # when the weights this match waited for were read, for all the slots at once
        if isinstance(weights, WeightsToCome):  # waited for before the slot's lock: the slot's calls may
            come = weights  # start in any order, and the match before this one, of the batch before,
            fetched, ready = self._once(come.ref, lambda: self._weights(come))  # must not wait behind it
            if fetched is None:
                return Skipped()
            weights = fetched
        with self._guard:
            lock = self._locks.setdefault(slot, threading.Lock())
        with lock:  # a worker plays its matches one after another
            began = time.perf_counter()
            if isinstance(weights, PublishedWeights):  # fetched once a batch, as a real worker does
                published = weights
                self._once(published.ref, lambda: self._weights(published))
            if ready is not None:  # the worker this slot stands for starts then, in a process of its own
                began = max(ready, arrived, self._ended.get(slot, 0.0))
            match = self.bank[bank_index(episode, len(self.bank))]
            duration = match.stats.steps * self.seconds_per_step
            if self._cores is not None:
                self._cores.play(max(0.0, duration - (time.perf_counter() - began)))
            else:
                self._sleep(max(0.0, duration - (time.perf_counter() - began)))
            self._ended[slot] = time.perf_counter()
            stats = dataclasses.replace(match.stats, episode=episode, seconds=duration, timings={})
            return Played(stats, match.grad)

    def _once(self, ref: Any, read: Callable[[], Any]) -> tuple[Any, float]:
        """What `read()` gives for `ref`, read by the first slot to ask, and when that
        read ended; the others wait for it and then go on together. Each of the workers
        the slots stand for would read it in its own process at the same time, and
        start its match when it has it: so a slot that waited for the read starts its
        match's clock when the read ended, not when its thread gets a CPU. Read by
        every slot in turn, in one process, the last match of a wave started tens of
        milliseconds after the first on this machine; handed from slot to slot through
        a lock, 6-10 ms after it; woken together, 6-8 ms after it (a wake-up on a busy
        CPU each), which no real node has. (An announced batch's answer and the
        weights it names are one read: between two, the slots woken by the first held
        the second's reader back from the GIL, 5-6 ms.)"""
        with self._guard:
            future, first = self._read.get(ref), ref not in self._read
            if first:
                future = self._read[ref] = Future()
                while len(self._read) > 2 * WeightsCache.KEPT:  # the oldest (an answer and weights a batch)
                    del self._read[next(iter(self._read))]
        assert future is not None  # (for mypy)
        if first:
            try:
                value = read()
                future.set_result((value, time.perf_counter()))
            except BaseException as exc:  # (the slots waiting now get it; a later one reads again)
                with self._guard:
                    self._read.pop(ref, None)
                future.set_exception(exc)
        return future.result()

    def pid(self, slot: int = 0) -> int:
        return os.getpid()

    def node_id(self, slot: int = 0) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()


def _assigned_cpus() -> float:
    import ray

    return float(ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0))


def bank_index(episode: EpisodeId, size: int) -> int:
    """Which banked match stands for an episode: fixed, and spread over the bank."""
    return (episode.batch * 7919 + episode.episode * 104729 + episode.seed) % size


@dataclass
class Bank:
    matches: list[Played]
    seconds_per_step: float  # per core: as measured with every core of this machine playing, or as asked (--pace)
    measured_seconds_per_step: float = 0.0  # as measured (0: as above)

    def summary(self) -> dict[str, Any]:
        steps = [m.stats.steps for m in self.matches]
        return {
            "matches": len(steps),
            "steps_mean": statistics.mean(steps),
            "steps_min": min(steps),
            "steps_max": max(steps),
            "steps": steps,
            "steps_per_s_per_core": 1 / self.seconds_per_step,
            "measured_steps_per_s_per_core": 1 / (self.measured_seconds_per_step or self.seconds_per_step),
            "pace_set": bool(self.measured_seconds_per_step),
            "gradient_mb_mean": statistics.mean(m.grad.nbytes for m in self.matches) / 2**20,
        }


def play_bank(settings: WorkerSettings, weights: Params, matches: int, seed: int, workers: int) -> Bank:
    """Real matches on `workers` real rollout workers of the head node, all at once."""
    import ray

    head = ray.get_runtime_context().get_node_id()
    pool = RayPool(settings, workers, node_id=head)
    try:
        ids = [EpisodeId(seed, 2**31, k) for k in range(matches)]  # a batch number no run reaches
        job = ("play", publish(weights)[0], ())
        played = [result for _, result in pool.run(deque(enumerate(ids)), lambda key: job)]
    finally:
        pool.close()
    # the median match's pace: a worker's first match also pays for its start
    seconds_per_step = statistics.median(m.stats.seconds / m.stats.steps for m in played)
    return Bank(played, seconds_per_step)


def start_cluster(shape: Shape, object_store_mb: int = 150, head_store_mb: int = 1024) -> Any:
    """A local Ray cluster of shape.nodes raylets declaring shape.cpus CPUs each,
    with the settings of the Ray instance pgpong starts; this process joins it. The
    head's object store is the larger: it holds the bank (up to about 100 MB, pinned)
    beside the queue's weights and the nodes' sums coming to the reducer (22 of up to
    5 MB at 11x18 with --lag 1); with 150 MB there it spilled to disk, and an update
    whose sums waited 2-4 s for their restores took 5-8 s rather than 2-3."""
    import logging

    import ray
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    set_auth_mode("token")  # a new local cluster, as Ray's own default since 2.59, chosen explicitly
    ensure_local_token()
    store = object_store_mb * 2**20
    head = {"num_cpus": shape.cpus, "include_dashboard": False, "object_store_memory": head_store_mb * 2**20}
    try:
        cluster = Cluster(initialize_head=True, head_node_args={**head, "_system_config": LOCAL_SYSTEM_CONFIG})
        for _ in range(shape.nodes - 1):
            cluster.add_node(num_cpus=shape.cpus, object_store_memory=store)
        cluster.wait_for_nodes()
    except Exception as exc:  # Ray raises many kinds; all mean the same to the user here
        raise ClusterError(
            f"could not start a local Ray cluster of {shape.nodes} raylet(s): {str(exc).splitlines()[0]}"
        ) from None
    ray.init(address=cluster.address, logging_level=logging.WARNING, log_to_driver=False)  # workers' lines: Ray's logs
    return cluster


def layout(shape: Shape, per_cpu: float, matches: int) -> tuple[int, list[int], int, float | None]:
    """The simulated workers at `per_cpu` a CPU for batches of up to `matches`: how many,
    each node's (as the pool spreads them), how many a process holds (sharing: a node's
    workers in one process if they fit), and the CPUs a process's matches share when it
    holds all its node's workers (its node's; else None: those Ray gave it)."""
    cpus = [shape.cpus] * shape.nodes
    workers = cluster_workers(cpus, per_cpu, matches)
    counts = shares(workers, [node_workers(shape.cpus, per_cpu)] * shape.nodes)
    if per_cpu <= 1:
        return workers, counts, shape.per_process, None
    per_process = min(MAX_SLOTS, max(counts))
    return workers, counts, per_process, float(shape.cpus) if max(counts) <= per_process else None


def simulated_kind(
    settings: WorkerSettings, per_process: int, bank: Bank, per_cpu: float = 1.0, node_cpus: float | None = None
) -> WorkerKind:
    """Processes of `per_process` simulated workers; `node_cpus` when each holds all its
    node's workers, sharing at `per_cpu` above 1 (SimulatedWorkers' cores)."""
    import ray

    bank_ref = ray.put(bank.matches)  # once; each simulating process fetches it once
    return WorkerKind(SimulatedWorkers, per_process, (bank_ref, bank.seconds_per_step, per_cpu, node_cpus))


def bank_policy(opts: BenchOptions) -> tuple[Params, str]:
    """The weights the bank's matches are played with, and what they are."""
    hidden = TrainConfig().hidden  # what bench's trainer sums and steps
    if opts.bank_policy == "new":
        return Params.initial(hidden, opts.seed), f"a new policy (seed {opts.seed})"
    from pgpong.checkpoint import CheckpointError
    from pgpong.evaluate import load_policy

    try:
        policy = load_policy(None if opts.bank_policy == "shipped" else Path(opts.bank_policy))
    except CheckpointError as exc:
        raise CheckpointError(f"--bank-policy: {exc} (give new, shipped, or a checkpoint or run directory)") from None
    if policy.weights.W1.shape[0] != hidden:
        raise ConfigError(
            f"--bank-policy {opts.bank_policy}: its network has {policy.weights.W1.shape[0]} hidden units; "
            f"bench simulates training's default of {hidden}: give a checkpoint of such a run, new or shipped"
        )
    return policy.weights, "the shipped agent" if opts.bank_policy == "shipped" else policy.source


def simulate(opts: BenchOptions, say: Callable[[str], None], status: Callable[[str], None]) -> dict[str, Any]:
    """Seconds per update of the real driver at opts.simulate's size (see the module's docstring)."""
    import ray

    shape = Shape.parse(str(opts.simulate))
    settings = as_trained(opts)
    weights, source = bank_policy(opts)
    say(f"starting a local Ray cluster of {shape.nodes} node(s) of {shape.cpus} CPUs: {shape.nodes} raylet(s)")
    with new_raylets() as raylets:
        cluster = start_cluster(shape)
    try:
        real = min(os.cpu_count() or 1, shape.cpus)
        say(f"bank: {opts.bank_matches} real matches of {source} on {real} real worker(s), all cores busy")
        bank = play_bank(settings, weights, opts.bank_matches, opts.seed, real)
        if opts.pace is not None:
            bank = Bank(bank.matches, 1 / opts.pace, bank.seconds_per_step)
            here = 1 / bank.measured_seconds_per_step
            say(f"bank: played here at {here:,.0f} env steps/s a core; simulated at {opts.pace:,.0f} (--pace)")
        matches = max(opts.batch_sizes)
        asked = opts.workers_per_cpu
        per_cpu = per_cpu_for(asked, matches, [shape.cpus] * shape.nodes)
        workers, counts, per_process, node_cpus = layout(shape, per_cpu, matches)
        sharing = [(n, shape.cpus) for n in counts] if per_cpu > 1 else None
        processes = sum(-(-n // per_process) for n in counts)
        chosen = f" (--workers-per-cpu {AUTO})" if asked == AUTO else ""
        shared = f", at {per_cpu:.3g} a CPU{chosen}, a node's matches sharing its CPUs" if per_cpu > 1 else chosen
        say(f"simulated workers: {workers} in {processes} process(es), up to {per_process} each{shared}")
        kind = simulated_kind(settings, per_process, bank, per_cpu, node_cpus)
        lagged = bool(opts.lag or opts.lag_share)  # batches overlap
        pool = open_pool(settings, workers, None, kind=kind, overlap=lagged, per_cpu=per_cpu, matches=matches)
        try:
            rows = []
            count = opts.update_batches or 5
            for size in opts.batch_sizes:
                say(f"batch {size}: {warm_up_batches(lagged)} warm-up + {count} updates")
                with scratch_trainer(pool, opts, batch_size=size) as trainer:
                    rows.append(updates(trainer, pool, count, status, sharing))
        finally:
            pool.close()
    finally:
        with ending_leftovers(raylets):
            ray.shutdown()
            cluster.shutdown()
    return {
        "simulated": {
            "shape": str(shape),
            "nodes": shape.nodes,
            "cpus_per_node": shape.cpus,
            "workers": workers,
            "workers_per_cpu": per_cpu,
            "workers_per_cpu_asked": asked,
            "worker_processes": processes,
            "machine_cpus": os.cpu_count(),
            "env_id": opts.env_id,
            "max_episode_steps": opts.max_episode_steps,
            "bank_policy": source,
            "lag": opts.lag,
            "lag_share": opts.lag_share,
        },
        "bank": bank.summary(),
        "updates": rows,
    }


def format_simulation(report: dict[str, Any]) -> str:
    s, b = report["simulated"], report["bank"]
    return "\n".join(
        [
            f"pgpong bench --simulate {s['shape']}: {s['workers']} simulated workers on {s['nodes']} node(s)"
            + (f" ({s['workers_per_cpu']:.3g} a CPU, sharing them)" if s.get("workers_per_cpu", 1) > 1 else "")
            + ", "
            f"in {s['worker_processes']} process(es), on a machine of {s['machine_cpus']} CPU(s)"
            + (", --lag 1: the next batch starts while this one ends" if s.get("lag") else "")
            + (
                f", --lag-share {s['lag_share']:g}: its first matches start while the batch before ends"
                if s.get("lag_share")
                else ""
            ),
            "",
            f"Matches from a bank of {b['matches']} real ones of {s['bank_policy']}: {b['steps_mean']:,.0f} steps "
            f"on average ({b['steps_min']:,}-{b['steps_max']:,}), played at {b['steps_per_s_per_core']:,.0f} "
            f"steps/s per core"
            + (f" (--pace; {b['measured_steps_per_s_per_core']:,.0f} here)" if b.get("pace_set") else "")
            + f"; gradients of {b['gradient_mb_mean']:.2f} MB on average.",
            "",
            *update_table(report["updates"]),
            *waiting_lines(report["updates"]),
            "",
            "Simulated: the emulation (each worker waits as long as its match would take). Real: the driver, Ray, "
            "the queue, the leaders, the transfers, the sums and the checkpoints, all sharing this machine's cores.",
        ]
    )
