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

Run `python -m pgpong.scaling` for the tables docs/SCALING.md and the README quote.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pgpong.config import MAX_WORKERS_PER_CPU, ConfigError, TrainConfig, load_config
from pgpong.placement import (
    LEADER_WORKERS,
    POLL_SECONDS,
    REPORT_SECONDS,
    best_whole_matches,
    cluster_workers,
    first_free,
    groups,
    lower_bound,
    node_workers,
    pipelined,
    requests,
    shared_first_free,
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
    calls = asked + leaders * seconds / REPORT_SECONDS + 1 + seconds / POLL_SECONDS
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
    batch: int, nodes: int, cpus: int, c: Constants, lag: int, batches: int = 40, share: float = 0.0
) -> dict[str, float]:
    """Seconds per update in a steady run of `batches` updates (the first quarter
    left out) when batch k may start once update k - 1 - lag is done; lag 0 gives
    predict()'s figure, lag 1 what `--lag 1` gives once the pools overlap batches,
    lag 0 with a `share` what `--lag-share` gives (the batch's first matches may start
    once update k - 2 is). Against one batch's work shared evenly over the workers
    (with batches overlapping, the longest match no longer bounds an update) and its
    best whole-match schedule."""
    rng = np.random.default_rng(0)
    workers = nodes * cpus
    pause = c.ray_s_per_match + (c.queue_s if nodes > 1 else 0.0)
    step = c.overhead_s + c.overhead_s_per_node * (nodes if nodes > 1 else 0)
    drawn = [list(rng.choice(c.lengths, size=batch) / c.steps_per_s_per_core) for _ in range(batches)]
    done = pipelined(drawn, workers, pause, step, lag, share)
    first = batches // 4
    seconds = (done[-1] - done[first - 1]) / (batches - first)
    sizes = leader_sizes([cpus] * nodes)
    asked = statistics.median(requests(d, sizes, c.ray_s_per_match, c.queue_s) for d in drawn)
    driver_ms, queue_ms = cpu_ms(batch, nodes, len(sizes), seconds, c, asked)
    seconds = max(seconds, driver_ms / 1e3, queue_ms / 1e3)
    shared = statistics.median(sum(d) / workers for d in drawn)  # the bound once batches overlap
    best = statistics.median(best_whole_matches(d, workers) for d in drawn)
    return {
        "seconds_per_update": seconds,
        "work_per_worker_s": shared,
        "of_work_per_worker": seconds / shared,
        "best_whole_matches_s": best,
        "of_best_whole_matches": seconds / best,
    }


SCENARIOS = [(1, 1, 64), (10, 1, 64), (60, 1, 64), (300, 11, 18), (3000, 110, 18)]
CORES = {2: (1, 2), 10: (1, 10), 64: (1, 64), 198: (11, 18)}  # cores -> nodes x CPUs of the projection


PROGRESS_COLUMNS = {"batch_episodes", "episode_len_mean", "running_reward", "episodes", "env_steps", "wall_s"}


def learning_curve(path: str) -> list[dict[str, float]]:
    """A run's progress.csv rows as numbers (batch_episodes, episode_len_mean, running_reward, ...)."""
    import csv

    with open(path, newline="") as f:
        rows = []
        try:
            reader = csv.DictReader(f)
            lacking = sorted(PROGRESS_COLUMNS - set(reader.fieldnames or ()))
            if lacking:
                raise ValueError(f"{path} is not a pgpong progress file (no {', '.join(lacking)} column)")
            for row in reader:
                try:
                    rows.append({k: float(v) for k, v in row.items() if k})
                except (TypeError, ValueError):
                    break
        except (csv.Error, UnicodeDecodeError) as exc:
            raise ValueError(f"{path} is not a pgpong progress file ({exc})") from None
    return rows


def project(
    rows: list[dict[str, float]], nodes: int, cpus: int, threshold: float = 0.0, lag: int = 0, share: float = 0.0
) -> dict | None:
    """Minutes to reach `threshold` running reward if the run's updates (its own batch
    sizes and mean match lengths, batch by batch) took the model's seconds per update
    on nodes x cpus, with the run's `lag` or lag `share` (batches overlapping,
    predict_lag's steady pace); None if the run never reached it. Match lengths within a batch
    spread as the phase's bank does around the batch's mean."""
    seconds, cache = 0.0, {}
    for row in rows:
        batch, mean_len = int(row["batch_episodes"]), row["episode_len_mean"]
        phase = "early" if row["running_reward"] < -5 else "late"
        key = (batch, round(mean_len, -2), phase)
        if key not in cache:
            c = PHASES[phase]
            bank = np.asarray(c.lengths, dtype=float)
            lengths = tuple(int(x) for x in np.maximum(1, bank / bank.mean() * key[1]))
            shaped = Constants(**{**c.__dict__, "lengths": lengths})
            if lag or share:
                found = predict_lag(batch, nodes, cpus, shaped, lag, share=share)
            else:
                found = predict(batch, nodes, cpus, shaped, 30)
            cache[key] = found["seconds_per_update"]
        seconds += cache[key]
        if row["running_reward"] >= threshold:
            return {"minutes": seconds / 60, "matches": row["episodes"], "env_steps": row["env_steps"]}
    return None


def progress_files(paths: list[str]) -> list[Path]:
    """progress.csv files from what was given: the files, run directories, a directory
    of run directories, or a study's directory (its trials, in the study's order)."""
    found: list[Path] = []
    for given in (Path(p).resolve() for p in paths):
        runs = _runs_in(given)
        if not runs or not all(run.is_file() for run in runs):
            missing = next((run for run in runs if not run.is_file()), given / "progress.csv")
            raise FileNotFoundError(f"no progress file {missing} (give progress.csv files, run or study directories)")
        found += runs
    return found


def _runs_in(given: Path) -> list[Path]:
    if (given / "study.json").exists():
        from pgpong.study.plan import load_study

        study = load_study(given.parent, given.name)
        assert study is not None  # its study.json exists
        # the trials under the directory given, whatever name the study was copied under
        runs = [given / "trials" / t.directory.name / "progress.csv" for t in study.trials()]
        return [run for run in runs if run.is_file()]
    if given.is_dir() and not (given / "progress.csv").exists():  # runs in it, or a study's trials/
        return sorted(given.glob("*/progress.csv")) or sorted(given.glob("trials/*/progress.csv"))
    return [given / "progress.csv" if given.is_dir() else given]


def _name(path: Path) -> str:
    if path.name == "progress.csv":
        return path.parent.name
    return path.name.removesuffix(".csv").removesuffix(".progress")


def _config(path: Path) -> TrainConfig | None:
    """The run's config.json, if it has one that reads (a bare progress file has none)."""
    try:
        return load_config(path.parent / "config.json") if path.name == "progress.csv" else None
    except (ConfigError, OSError):  # (missing, too)
        return None


def _setting(config: TrainConfig | None, batch: int) -> str:
    """How a run is grouped: its batch size, with the learning rate and decay that its
    config records, and its warm-up and lag if on."""
    from pgpong.schedule import ramps

    if config is None:
        return str(batch)
    warmed = ", warm-up" if config.warmup == "on" else ""
    warmed += f", lag {config.lag}" if config.lag else ""
    warmed += f", lag share {config.lag_share:g}" if config.lag_share else ""
    if ramps(config):
        ramp = f"{config.ramp_from} growing to {config.batch_size} over {config.ramp_matches:,} matches"
        return f"{ramp} (the batch rule{warmed})"
    return f"{batch} (lr {config.learning_rate:g}, decay {config.decay_rate:g}{warmed})"


def _spread(values: list[float]) -> str:
    if not values:
        return "-"
    median, low, high = float(np.median(values)), min(values), max(values)
    return f"{median:.1f}" if len(values) == 1 else f"{median:.1f} ({low:.1f}-{high:.1f})"


def learning_table(paths: list[str], threshold: float = 0.0) -> str:
    """Minutes to `threshold` per run: measured on this machine (the run's own wall
    time, with its own workers) and projected for 2, 10, 64 and 198 cores; then per
    batch size the median (min-max) over its runs, and the batch that is fastest on
    each number of cores."""
    head = "| run | batch | matches | env steps | measured (workers) | " + " | ".join(
        f"{cores} cores ({n}x{c}, projected)" for cores, (n, c) in CORES.items()
    )
    lines = [head + " |", "| --- | ---: | ---: | ---: | ---: |" + " ---: |" * len(CORES)]
    by_setting: dict[str, dict[str, list]] = {}
    for path in progress_files(paths):
        rows = learning_curve(str(path))
        if not rows:
            lines.append(f"| {_name(path)} | | no batch finished yet | | |" + " |" * len(CORES))
            continue
        batch, config = int(rows[0]["batch_episodes"]), _config(path)
        shown = f"{batch}-{int(rows[-1]['batch_episodes'])}" if rows[-1]["batch_episodes"] != batch else str(batch)
        setting = _setting(config, batch)
        runs = by_setting.setdefault(setting, {"runs": [], "reached": [], **{str(n): [] for n in CORES}})
        runs["runs"].append(_name(path))
        reached = next((r for r in rows if r["running_reward"] >= threshold), None)
        if reached is None:
            last = rows[-1]
            lines.append(
                f"| {_name(path)} | {shown} | not reached: {last['running_reward']:+.1f} after "
                f"{last['episodes']:,.0f} | {last['env_steps'] / 1e6:.1f}M | |" + " |" * len(CORES)
            )
            continue
        runs["reached"].append(_name(path))
        workers = int(rows[0].get("workers", 0))
        cells = [f"{reached['wall_s'] / 60:.1f} ({workers or 'one process'})"]
        for cores, (nodes, cpus) in CORES.items():
            found = project(rows, nodes, cpus, threshold, *((config.lag, config.lag_share) if config else (0, 0.0)))
            assert found is not None
            runs[str(cores)].append(found["minutes"])
            cells.append(f"{found['minutes']:.1f}")
        lines.append(
            f"| {_name(path)} | {shown} | {reached['episodes']:,.0f} | "
            f"{reached['env_steps'] / 1e6:.1f}M | " + " | ".join(cells) + " |"
        )
    lines += [
        "",
        f"Minutes to running reward {threshold:+g} by batch size (and the lr and decay its config.json records): "
        "median (min-max) over the runs that reached it.",
        "",
        "| batch | runs reached | " + " | ".join(f"{cores} cores" for cores in CORES) + " |",
        "| ---: | ---: |" + " ---: |" * len(CORES),
    ]
    for setting, runs in sorted(by_setting.items(), key=lambda item: (int(item[0].split()[0]), item[0])):
        cells = [_spread(runs[str(cores)]) for cores in CORES]
        lines.append(f"| {setting} | {len(runs['reached'])}/{len(runs['runs'])} | " + " | ".join(cells) + " |")
    best = []
    for cores in CORES:
        medians = {b: float(np.median(r[str(cores)])) for b, r in by_setting.items() if r[str(cores)]}
        if medians:
            fastest = min(medians, key=lambda b: medians[b])
            best.append(f"{cores} cores: batch {fastest}: {medians[fastest]:.1f} min")
    if best:
        lines += ["", "Fastest median: " + "; ".join(best) + "."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m pgpong.scaling", description=__doc__.split("\n\n")[0])
    parser.add_argument("--phase", choices=sorted(PHASES), default="early", help="early or late in training")
    parser.add_argument(
        "--learning",
        nargs="+",
        metavar="RUN",
        help="instead: minutes to running reward --threshold of these runs (progress.csv files, run directories, "
        "a directory of them, or a study's directory), measured and projected by cores",
    )
    parser.add_argument("--threshold", type=float, default=0.0, help="with --learning (default: 0)")
    parser.add_argument(
        "--lag",
        type=int,
        choices=(1, 2),
        help="instead: seconds per update when batch k may start once update k - 1 - LAG is done "
        "(--lag 1 overlaps batches so)",
    )
    parser.add_argument(
        "--workers-per-cpu", type=float, default=1.0, metavar="N", help="the table at N workers a CPU, as train's flag"
    )
    parser.add_argument(
        "--lag-share",
        type=float,
        metavar="S",
        help="instead: seconds per update when the first S of batch k's matches may start once update k - 2 "
        "is done, the rest once update k - 1 is (--lag-share S overlaps batches so)",
    )
    args = parser.parse_args()
    per_cpu, error = args.workers_per_cpu, "python -m pgpong.scaling: error: --workers-per-cpu"
    if not 1 <= per_cpu <= MAX_WORKERS_PER_CPU:
        parser.exit(2, f"{error} must be in [1, {MAX_WORKERS_PER_CPU:g}], got {per_cpu:g}\n")
    if per_cpu != 1 and (args.lag or args.lag_share or args.learning):
        parser.exit(2, f"{error} is modelled alone, without --lag, --lag-share or --learning\n")
    if args.learning:
        try:
            print(learning_table(args.learning, args.threshold), end="")
        except (OSError, ValueError) as exc:  # a missing or broken file (ConfigError is a ValueError)
            parser.exit(2, f"python -m pgpong.scaling: error: {exc}\n")
        return
    c = PHASES[args.phase]
    if args.lag_share is not None and not 0 < args.lag_share <= 1:
        parser.exit(2, f"python -m pgpong.scaling: error: --lag-share must be in (0, 1], got {args.lag_share:g}\n")
    if args.lag or args.lag_share:
        print(lag_table(c, args.lag or 0, args.lag_share or 0.0), end="")
        return
    print(
        "| batch | nodes x CPUs | seconds per update | lower bound | best whole-match schedule | pgpong's schedule"
        " | efficiency | of the best | driver CPU | queue CPU | into the driver |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for batch, nodes, cpus in SCENARIOS:
        p = predict(batch, nodes, cpus, c, per_cpu=args.workers_per_cpu)
        shown = f" ({p['workers']:,.0f} workers)" if args.workers_per_cpu != 1 else ""
        print(
            f"| {batch:,} | {nodes}x{cpus}{shown} | {p['seconds_per_update']:.2f} s | {p['lower_bound_s']:.2f} s"
            f" | {p['best_whole_matches_s']:.2f} s | {p['pgpong_schedule_s']:.2f} s | {p['efficiency']:.2f}"
            f" | {p['of_best_whole_matches']:.2f} | {p['driver_cpu_ms']:,.0f} ms | {p['queue_cpu_ms']:,.0f} ms"
            f" | {p['bytes_into_driver'] / 2**20:,.1f} MB |"
        )


def lag_table(c: Constants, lag: int, share: float = 0.0) -> str:
    """The model's seconds per update without a lag and with `lag` (or a lag `share`),
    as a Markdown table."""
    name = f"lag {lag}" if lag else f"lag share {share:g}"
    lines = [
        f"| batch | nodes x CPUs | lag 0 | {name} | {name} over the best whole-match schedule"
        f" | {name} over the work per worker |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for batch, nodes, cpus in SCENARIOS:
        now = predict_lag(batch, nodes, cpus, c, 0)
        lagged = predict_lag(batch, nodes, cpus, c, lag, share=share)
        lines.append(
            f"| {batch:,} | {nodes}x{cpus} | {now['seconds_per_update']:.2f} s | {lagged['seconds_per_update']:.2f} s"
            f" | {lagged['of_best_whole_matches']:.2f} | {lagged['of_work_per_worker']:.2f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
