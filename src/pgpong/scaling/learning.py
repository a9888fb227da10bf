"""The learning projection: minutes to a running reward, measured by a run and projected
by the model (model.py) for 2, 10, 64 and 198 cores, batch by batch with the run's own
batch sizes and match lengths (`python -m pgpong.scaling --learning RUN ...`)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from pgpong.config import ConfigError, TrainConfig, load_config, per_cpu_text
from pgpong.placement import per_cpu_for
from pgpong.runlog import MAX_VALUE
from pgpong.scaling.model import PHASES, Constants, predict, predict_lag

CORES = {2: (1, 2), 10: (1, 10), 64: (1, 64), 198: (11, 18)}  # cores -> nodes x CPUs of the projection

PROGRESS_COLUMNS = {"batch_episodes", "episode_len_mean", "running_reward", "episodes", "env_steps", "wall_s"}


def learning_curve(path: str) -> list[dict[str, float]]:
    """A run's progress.csv rows as numbers (batch_episodes, episode_len_mean, running_reward, ...)."""
    with open(path, newline="") as f:
        rows = []
        try:
            reader = csv.DictReader(f)
            lacking = sorted(PROGRESS_COLUMNS - set(reader.fieldnames or ()))
            if lacking:
                raise ValueError(f"{path} is not a pgpong progress file (no {', '.join(lacking)} column)")
            for line, row in enumerate(reader, start=2):
                try:
                    values = {k: float(v) for k, v in row.items() if k}
                except (TypeError, ValueError):
                    break  # (a last line cut short)
                # NaN fails too; the diagnostics are not checked: an older pgpong's rows hold them as nan
                if not all(abs(values[name]) <= MAX_VALUE for name in PROGRESS_COLUMNS):
                    raise ValueError(
                        f"{path}: line {line} holds a value no run writes (not finite, or beyond 1e15); "
                        "the file is damaged: correct or delete that line"
                    )
                rows.append(values)
        except (csv.Error, UnicodeDecodeError) as exc:
            raise ValueError(f"{path} is not a pgpong progress file ({exc})") from None
    return rows


def project(
    rows: list[dict[str, float]],
    nodes: int,
    cpus: int,
    threshold: float = 0.0,
    lag: int = 0,
    share: float = 0.0,
    per_cpu: float | str = 1.0,
) -> dict | None:
    """Minutes to reach `threshold` running reward if the run's updates (its own batch
    sizes and mean match lengths, batch by batch) took the model's seconds per update
    on nodes x cpus, with the run's `lag` or lag `share` (batches overlapping,
    predict_lag's steady pace), at `per_cpu` workers a CPU (auto: what it picks for
    each batch); None if the run never reached it. Match lengths within a batch spread
    as the phase's bank does around the batch's mean."""
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
            each = per_cpu_for(per_cpu, batch, [cpus] * nodes)
            if lag or share:
                found = predict_lag(batch, nodes, cpus, shaped, lag, share=share, per_cpu=each)
            else:
                found = predict(batch, nodes, cpus, shaped, 30, per_cpu=each)
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
        if given.exists() and not given.is_dir() and not given.is_file():
            raise ValueError(f"{given} is neither a progress.csv file nor a directory (a device or a pipe)")
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


def learning_table(paths: list[str], threshold: float = 0.0, per_cpu: float | str = 1.0) -> str:
    """Minutes to `threshold` per run: measured on this machine (the run's own wall
    time, with its own workers) and projected for 2, 10, 64 and 198 cores (at `per_cpu`
    workers a CPU: runs with a lag are then not projected); then per batch size the
    median (min-max) over its runs, and the batch that is fastest on each number of cores."""
    at = f", --workers-per-cpu {per_cpu_text(per_cpu)}" if per_cpu != 1 else ""
    head = "| run | batch | matches | env steps | measured (workers) | " + " | ".join(
        f"{cores} cores ({n}x{c}, projected{at})" for cores, (n, c) in CORES.items()
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
        lagged = (config.lag, config.lag_share) if config else (0, 0.0)
        for cores, (nodes, cpus) in CORES.items():
            found = project(rows, nodes, cpus, threshold, *lagged, per_cpu=per_cpu)
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
