"""Seconds per update, measured the same way for real workers and simulated ones: the
update's seconds, the shortest time any schedule could take with its matches'
durations, their ratio, the driver's CPU time and the gradient bytes it received."""

from __future__ import annotations

import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pgpong.bench import contention
from pgpong.bench.options import BenchOptions
from pgpong.config import TrainConfig
from pgpong.placement import best_whole_matches, first_free, lower_bound, shared_first_free
from pgpong.pool import Pool
from pgpong.pool.ahead import STEPPED_AHEAD
from pgpong.pool.base import WorkerSettings
from pgpong.rundir import open_run
from pgpong.session import open_trainer, worker_settings
from pgpong.trainer import BatchReport, Trainer

Sharing = list[tuple[int, int]]  # (workers, cores) of each node whose workers share its cores
RAY_PAUSE_S = 0.0035  # a worker's pause between two matches (docs/PERFORMANCE.md: 3.2-3.6 ms)


def as_trained(opts: BenchOptions) -> WorkerSettings:
    """The rollout workers' settings that `pgpong train` makes with bench's options
    (the default entropy bonus among them): bench measures what training plays."""
    return worker_settings(TrainConfig(env_id=opts.env_id, max_episode_steps=opts.max_episode_steps))


@contextmanager
def scratch_trainer(pool: Pool, opts: BenchOptions, batch_size: int) -> Iterator[Trainer]:
    """The real trainer (checkpoints included) in a scratch run directory."""
    settings = {
        "env_id": opts.env_id,
        "batch_size": batch_size,
        "seed": opts.seed,
        "max_episode_steps": opts.max_episode_steps,
        "keep_checkpoints": 1,
        "lag": opts.lag,
        "lag_share": opts.lag_share,
    }
    with (
        tempfile.TemporaryDirectory(prefix="pgpong-bench-") as scratch,
        open_trainer(open_run(Path(scratch) / "run", settings), pool, {"bench": True}, tensorboard=False) as trainer,
    ):
        yield trainer  # its checkpoints are closed before the scratch directory goes


def warm_up_batches(lag: int | bool) -> int:
    """Batches played before the timed ones: compiled code, first transfers, worker
    caches; with --lag 1 a second, the first to overlap another (it took 0.43-0.44 s
    at 1x64, batch 60, early, where the ones after it took 0.35-0.39)."""
    return 2 if lag else 1


def updates(
    trainer: Trainer, pool: Pool, count: int, status: Callable[[str], None], sharing: Sharing | None = None
) -> dict[str, Any]:
    """Time `count` updates of the trainer after a warm-up: seconds, the lower bound
    of any schedule, efficiency, the driver's CPU and the bytes it received, each
    the median over the updates (with --lag 1, seconds per update are their mean);
    without a lag, also each part's CPU and its wait for one on this machine
    (bench/contention.py). `sharing`: the (workers, cores) of each node where workers
    share cores (--workers-per-cpu): the bounds are then the cores' and pgpong's
    schedule the shared one."""
    lagged = trainer.config.lagged  # (--lag 1 or --lag-share: batches overlap)
    # Every thread's times, to see what waited for a CPU (the processes found once,
    # after the warm-up); not with --lag 1. The reading takes the driver about 15 us
    # a thread (15-25 ms at 1x64, more at 11x18), so bench reads just before the
    # trainer publishes the next batch's weights (as soon as its step is checked) and
    # leaves its CPU out of the driver's. Its time is left out of the update only if
    # it held that batch back: not when a cluster's reducer took the step and the queue
    # published them already (pool/ahead.py), for then the batch plays while bench
    # reads. With --lag 1 a batch always plays, and bench reads (no threads' times
    # then) between two calls of the trainer.
    for _ in range(warm_up_batches(lagged)):
        wall_s = trainer.train_batch().row.wall_s
    running = contention.processes() if not lagged else []
    points: list[_Point] = []
    quiet = not lagged and callable(getattr(pool, "publish", None))
    stepped_before = queue_calls(pool).get(STEPPED_AHEAD, 0)  # the batches the queue published from the reducer's step
    with _reading_before_publishing(pool if quiet else None, lambda: points.append(_Point.read(pool, running))):
        if quiet:  # one batch more: the reading before its step's weights go out begins the first update
            wall_s = trainer.train_batch().row.wall_s
        if not points:
            points.append(_Point.read(pool, running))
        rows = []
        for k in range(count):
            status(f"update {k + 1}/{count}")
            report = trainer.train_batch()
            read_now = not quiet or len(points) == k + 1  # (no weights went out in the call: read after it)
            if read_now:
                points.append(_Point.read(pool, running))
            before, point = points[k], points[k + 1]
            # An update runs from one reading to the next, less the reading if it held the
            # batch back: without a lag, from the moment a batch's weights go out to that
            # of the next's; with --lag 1 (where batches overlap) from one row to the next.
            cycle_s, wall_s = report.row.wall_s - wall_s, report.row.wall_s
            prior = points[k - 1].calls.get(STEPPED_AHEAD, 0) if k else stepped_before
            began = before.at if before.calls.get(STEPPED_AHEAD, 0) > prior else before.done_at  # (weights out first)
            seconds = point.at - began if not read_now else cycle_s
            row = _update_row(report, point.cpu_end - before.cpu_start, pool.num_workers, seconds, lagged, sharing)
            for name, used in point.helpers.items():  # the queue's and the reducer's share of it
                if name in before.helpers:
                    row[f"{name}_cpu_ms"] = 1e3 * (used - before.helpers[name])
            for name, calls in point.calls.items():  # the nodes' requests and reports to the queue during the update
                row[f"queue_{name.replace(' ', '_')}_calls"] = calls - before.calls.get(name, 0)
            if running:
                row["processes"] = contention.waited_ms(before.threads, point.threads)
            row["driver_threads_ms"] = {
                name: 1e3 * (point.own_end[name] - before.own_start.get(name, 0.0)) for name in point.own_end
            }
            if point.busy is not None and before.busy is not None:  # how much of the machine's CPUs everything used
                row["machine_busy"] = (point.busy - before.busy) / ((os.cpu_count() or 1) * (point.at - before.at))
            rows.append(row)
    median = lambda key: statistics.median(r[key] for r in rows)  # noqa: E731
    if lagged:  # overlapping updates make up for each other (a long, then a short): their mean is the pace
        seconds = statistics.fmean(r["seconds"] for r in rows)
        times = {
            "seconds": seconds,
            "efficiency": median("lower_bound_s") / seconds,
            "of_best_whole_matches": seconds / median("best_whole_matches_s"),
            "of_work_per_worker": seconds / median("work_per_worker_s"),
            "overhead_s": None,  # (batches overlap: there is no schedule of one batch to compare with)
        }
    else:
        keys = ("seconds", "efficiency", "of_best_whole_matches", "of_work_per_worker", "overhead_s")
        times = {key: median(key) for key in keys}
    return {
        "batch_size": trainer.config.batch_size,
        "workers": pool.num_workers,
        "nodes": pool.nodes(),
        "seconds_per_update": times["seconds"],
        "lower_bound_s": median("lower_bound_s"),
        "efficiency": times["efficiency"],
        "best_whole_matches_s": median("best_whole_matches_s"),
        "of_best_whole_matches": times["of_best_whole_matches"],
        "work_per_worker_s": median("work_per_worker_s"),
        "of_work_per_worker": times["of_work_per_worker"],
        "overhead_s": times["overhead_s"],
        "driver_cpu_ms": median("driver_cpu_ms"),
        "queue_cpu_ms": median("queue_cpu_ms") if all("queue_cpu_ms" in r for r in rows) else None,
        "reducer_cpu_ms": median("reducer_cpu_ms") if all("reducer_cpu_ms" in r for r in rows) else None,
        "queue_take_calls": median("queue_take_calls") if all("queue_take_calls" in r for r in rows) else None,
        "queue_report_calls": median("queue_report_calls") if all("queue_report_calls" in r for r in rows) else None,
        "bytes_into_driver": median("bytes_into_driver"),
        "barrier_s": median("barrier_s"),
        "machine_busy": median("machine_busy") if all("machine_busy" in r for r in rows) else None,
        "waiting_for_cpu": contention.median_waits([r["processes"] for r in rows if "processes" in r]),
        "episode_len_mean": median("episode_len_mean"),
        "updates": rows,
    }


@dataclass(frozen=True)
class _Point:
    """bench's measures at one point (just before a batch's weights go out, or with
    --lag 1 between two calls of the trainer): what ends the update before (read
    first) and what begins the next (read last), so that bench's own reading is in
    neither's driver CPU; the other processes' counters, read once."""

    cpu_end: float  # the driver's CPU seconds, before the reading
    own_end: dict[str, float]  # the driver's threads' CPU seconds, before the reading
    busy: float | None  # the machine's busy CPU seconds
    at: float  # when (perf_counter)
    helpers: dict[str, float]  # the queue's and the reducer's CPU seconds (cluster pool)
    calls: dict[str, int]  # the nodes' calls to the queue so far (cluster pool)
    threads: contention.Reading  # every thread's times, of the processes followed
    cpu_start: float  # the driver's CPU seconds, after the reading
    own_start: dict[str, float]  # the driver's threads' CPU seconds, after the reading
    done_at: float  # when the reading was done (perf_counter)

    @classmethod
    def read(cls, pool: Pool, running: list[contention.Process]) -> _Point:
        cpu_end, own_end = time.process_time(), thread_cpu_seconds()
        busy, at = machine_busy_seconds(), time.perf_counter()
        helpers, calls = helpers_cpu_seconds(pool), queue_calls(pool)
        threads = contention.read(running) if running else {}
        cpu_start, own_start = time.process_time(), thread_cpu_seconds()
        return cls(cpu_end, own_end, busy, at, helpers, calls, threads, cpu_start, own_start, time.perf_counter())


@contextmanager
def _reading_before_publishing(pool: Any, read: Callable[[], object]) -> Iterator[None]:
    """While in the block, `read()` before each `pool.publish` (none without a pool)."""
    if pool is None:
        yield
        return
    publish, own = pool.publish, vars(pool).get("publish")  # (the instance's own, if it had one)

    def read_then_publish(ticket: int, weights: Any, squares: tuple[float, float] | None = None) -> None:
        read()
        publish(ticket, weights, squares)  # (all of Pool.publish's arguments: the trainer's call must not fail)

    pool.publish = read_then_publish  # (the instance's: the class's method is untouched)
    try:
        yield
    finally:
        if own is None:
            del pool.publish
        else:
            pool.publish = own


def helpers_cpu_seconds(pool: Pool) -> dict[str, float]:
    """The CPU seconds so far of the actors a cluster pool keeps next to the driver
    (queue, reducer); empty for the other pools."""
    measure = getattr(pool, "helpers_cpu_seconds", None)
    return measure() if measure is not None else {}


def queue_calls(pool: Pool) -> dict[str, int]:
    """The nodes' calls to a cluster pool's queue so far, by kind; empty for the other pools."""
    count = getattr(pool, "queue_calls", None)
    return count() if count is not None else {}


def machine_busy_seconds() -> float | None:
    """CPU seconds all of this machine's processes have used since it started
    (Linux: /proc/stat), or None where that cannot be read."""
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def thread_cpu_seconds() -> dict[str, float]:
    """CPU seconds of this process's threads so far, added up by thread name (Linux:
    /proc/self/task, in clock ticks of 10 ms; empty where it cannot be read):
    Python's threads by their names (MainThread, pgpong-checkpoint), the others
    (Ray's, mostly) as "native: " and the names they gave themselves."""
    seconds: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    python_threads = {str(t.native_id): t.name for t in threading.enumerate()}
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return seconds
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/stat") as stat:
                text = stat.read()
        except OSError:  # the thread ended
            continue
        name = python_threads.get(task) or "native: " + text[text.index("(") + 1 : text.rindex(")")]
        user, system = (int(x) for x in text[text.rindex(")") + 2 :].split()[11:13])
        seconds[name] = seconds.get(name, 0.0) + (user + system) / tick
    return seconds


def _update_row(
    report: BatchReport,
    cpu_s: float,
    workers: int,
    seconds: float,
    lagged: bool = False,
    sharing: Sharing | None = None,
) -> dict[str, Any]:
    """One update's figures, in `seconds`: from one batch's weights going out to
    the next's, bench's reading left out (with --lag 1, `lagged`, from the row
    before to this one)."""
    durations = report.durations
    cores = sum(c for _, c in sharing) if sharing else workers  # the bounds: one match a core at most
    lower, best = lower_bound(durations, cores), best_whole_matches(durations, cores)
    work = sum(durations) / max(1, cores)  # with --lag 1 the bound: the longest match may overlap the next batch
    if sharing:
        schedule = shared_first_free(durations, sharing, RAY_PAUSE_S)
    else:
        schedule = first_free(durations, workers, RAY_PAUSE_S)
    return {
        "seconds": seconds,
        "lower_bound_s": lower,
        "efficiency": lower / seconds,
        "best_whole_matches_s": best,  # the best any schedule of whole matches could do
        "of_best_whole_matches": seconds / best,
        "work_per_worker_s": work,
        "of_work_per_worker": seconds / work,
        "schedule_s": schedule,  # pgpong's own rule with these matches: first free worker, Ray's pause between
        # the rest: publishing, sums, the step, and this machine's contention (none to speak of once batches overlap)
        "overhead_s": None if lagged else seconds - schedule,
        "driver_cpu_ms": 1e3 * cpu_s,
        "bytes_into_driver": report.bytes_in,
        "barrier_s": report.row.barrier_s,
        "episode_len_mean": report.row.episode_len_mean,
        "driver_phases_ms": {name: 1e3 * seconds for name, seconds in report.phases.items() if name != "barrier"},
        "node_phases_ms": {name: 1e3 * seconds for name, seconds in report.node_phases.items()},
    }


def update_table(rows: list[dict[str, Any]]) -> list[str]:
    """The seconds-per-update figures as a Markdown table."""
    lines = [
        "| batch | workers | nodes | seconds per update | lower bound | best whole-match schedule | efficiency "
        "| overhead | driver CPU | queue CPU | into the driver |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for u in rows:
        queue = f"{u['queue_cpu_ms']:.0f} ms" if u.get("queue_cpu_ms") is not None else "-"
        overhead = f"{1e3 * u['overhead_s']:.0f} ms" if u["overhead_s"] is not None else "-"
        lines.append(
            f"| {u['batch_size']} | {u['workers']} | {u['nodes']} | {u['seconds_per_update']:.2f} s"
            f" | {u['lower_bound_s']:.2f} s | {u['best_whole_matches_s']:.2f} s | {u['efficiency']:.2f}"
            f" | {overhead} | {u['driver_cpu_ms']:.0f} ms | {queue}"
            f" | {u['bytes_into_driver'] / 2**20:.1f} MB |"
        )
    return lines


def waiting_lines(rows: list[dict[str, Any]]) -> list[str]:
    """How long each part's code threads waited for a CPU of this machine, per batch
    size (medians over the updates; none with --lag 1)."""
    lines = []
    for u in rows:
        waits = u.get("waiting_for_cpu")
        if waits:
            parts = ", ".join(
                f"{part} {w['code_wait_ms']:,.0f}" + (f" ({w['processes']} processes)" if w["processes"] > 1 else "")
                for part, w in waits.items()
            )
            wait = "waiting for a CPU here, ms per update, summed over the threads that run each part's code"
            lines.append(f"Batch {u['batch_size']}: {wait}: {parts}.")
    return ["", *lines] if lines else []
