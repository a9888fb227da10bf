"""Running a study on Ray Tune: each trial is a Tune trial that trains one pgpong run
directory with the same Trainer as `pgpong train`, until its stop.

Tune schedules the trials on the Ray instance's CPUs (one per trial, or a
placement group of --workers-per-trial CPUs), retries a trial whose process died,
and reports each batch to the driver. The record is pgpong's own run directories:
a finished trial is recognised from its progress.csv, an unfinished one resumes
from its newest checkpoint, so the same command continues a study that was
stopped or killed, whatever became of Tune's own files."""

from __future__ import annotations

import dataclasses
import logging
import os
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from pgpong.config import ConfigError
from pgpong.errors import PgpongError
from pgpong.rundir import RunBusy, RunLock
from pgpong.study.plan import Stops, Study, Trial
from pgpong.study.report import curve

LOCK_PATIENCE_S = 30.0  # a trial of a study killed a moment ago may still be ending
RETRIES = 2  # Tune starts a trial whose process died again, this many times
STATUS_EVERY_S = 60.0  # off a terminal, a line on the study as a whole this often


class StudyError(PgpongError, RuntimeError):
    """Trials failed; the message says which."""


@dataclasses.dataclass
class Totals:
    """Where a trial stands, from its progress.csv (or a result Tune reported)."""

    batch: int = 0
    matches: int = 0
    env_steps: int = 0
    wall_s: float = 0.0
    running_reward: float | None = None

    @classmethod
    def of_run(cls, directory: Path) -> Totals:
        rows = curve(directory)
        if not rows:
            return cls()
        last = rows[-1]
        return cls(
            int(last["batch"]),
            int(last["episodes"]),
            int(last["env_steps"]),
            last["wall_s"],
            last["running_reward"],
        )

    def done(self, stops: Stops, settings: dict[str, Any]) -> str | None:
        iterations = settings.get("iterations")
        if iterations is not None and self.batch >= iterations:
            return f"{self.batch} batches (--iterations)"
        return stops.reached(self.running_reward, self.env_steps, self.matches, self.wall_s)

    def line(self) -> str:
        reward = "-" if self.running_reward is None else f"{self.running_reward:+.2f}"
        return (
            f"running reward {reward} after {self.matches:,} matches, {self.env_steps / 1e6:.2f}M env steps, "
            f"{self.wall_s / 60:.1f} min"
        )


def train_trial(config: dict[str, Any]) -> None:
    """A Tune trial: train one run directory until its stop, reporting every batch."""
    from pgpong.pool.local import LocalPool
    from pgpong.pool.ray_pool import RayPool
    from pgpong.rundir import check_run_dir_writable, open_run
    from pgpong.session import open_trainer, run_info, worker_settings

    spec = config["trial"]
    directory, stops, given = Path(spec["directory"]), Stops(**spec["stops"]), spec["settings"]
    lock = _hold(directory)
    pool: Any = None
    try:
        run = open_run(directory, given)
        check_run_dir_writable(run)
        cfg = run.config
        pool = LocalPool(worker_settings(cfg)) if not cfg.workers else RayPool(worker_settings(cfg), cfg.workers)
        made_by = {**run_info(None), "study": spec["study"], "command": spec["command"]}  # the study's command
        with open(os.devnull, "w") as quiet, open_trainer(run, pool, made_by, quiet) as trainer:
            trainer.train(
                stop=lambda s: stops.reached(s.running_reward, s.env_steps, s.episodes, s.wall_s),
                each=lambda report: _report(report.row),
            )
    finally:
        if pool is not None:
            pool.close()
        lock.release()


def _report(row: Any) -> None:
    from ray import tune

    tune.report(
        {
            "batch": row.batch,
            "matches": row.episodes,
            "env_steps": row.env_steps,
            "wall_s": row.wall_s,
            "running_reward": row.running_reward,
        }
    )


def _hold(directory: Path) -> RunLock:
    deadline = time.monotonic() + LOCK_PATIENCE_S
    while True:
        try:
            return RunLock(directory)
        except RunBusy:
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)


class Events:
    """What the study shows while it runs: a line per trial event (started, done,
    failed) and, on a terminal, a live table of every trial; off a terminal, a line
    on the whole study every minute instead of the table."""

    def __init__(self, study: Study, trials: list[Trial], out: TextIO):
        self.study, self.out = study, out
        self.by_dir = {str(t.directory.resolve()): t for t in trials}
        self.totals = {t.label: Totals.of_run(t.directory) for t in trials}
        self.state = {t.label: "waiting" for t in trials}
        self._live: Any = None
        self._last_status = time.monotonic()

    def say(self, text: str) -> None:
        if self._live is not None:
            self._live.console.print(text, markup=False, highlight=False, soft_wrap=True)
        else:
            print(text, file=self.out, flush=True)

    def start(self) -> None:
        if self.out.isatty() and os.environ.get("TERM") != "dumb":
            from rich.console import Console
            from rich.live import Live

            console = Console(file=self.out, highlight=False)
            self._live = Live(get_renderable=self.table, console=console, refresh_per_second=2, transient=False)
            self._live.start()

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def trial(self, tune_trial: Any) -> Trial | None:
        return self.by_dir.get(str(tune_trial.config.get("trial", {}).get("directory")))

    def mark(self, trial: Trial, state: str, detail: str = "") -> None:
        self.state[trial.label] = state
        self.say(f"pgpong study: trial {trial.label}: {state}{': ' if detail else ''}{detail}")

    def result(self, trial: Trial, result: dict[str, Any]) -> None:
        self.totals[trial.label] = Totals(
            int(result["batch"]),
            int(result["matches"]),
            int(result["env_steps"]),
            float(result["wall_s"]),
            float(result["running_reward"]),
        )
        if self._live is None and time.monotonic() - self._last_status > STATUS_EVERY_S:
            self._last_status = time.monotonic()
            self.say(f"pgpong study: {self.summary()}")

    def summary(self) -> str:
        counts = {s: list(self.state.values()).count(s) for s in ("running", "done", "waiting", "failed")}
        text = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        best = max(
            ((t.running_reward, label) for label, t in self.totals.items() if t.running_reward is not None),
            default=None,
        )
        if best is not None:
            text += f"; best running reward {best[0]:+.2f} ({best[1]})"
        return text

    def table(self) -> Any:
        from rich.table import Table

        table = Table(title=f"study {self.study.name}: {self.summary()}", title_justify="left")
        for column, justify in (
            ("trial", "left"),
            ("state", "left"),
            ("batches", "right"),
            ("matches", "right"),
            ("env steps", "right"),
            ("minutes", "right"),
            ("running reward", "right"),
        ):
            table.add_column(column, justify=justify)  # type: ignore[arg-type]
        for label, totals in self.totals.items():
            reward = "" if totals.running_reward is None else f"{totals.running_reward:+.2f}"
            table.add_row(
                label,
                self.state[label],
                f"{totals.batch:,}",
                f"{totals.matches:,}",
                f"{totals.env_steps / 1e6:.2f}M" if totals.env_steps >= 1e5 else f"{totals.env_steps / 1e3:.1f}k",
                f"{totals.wall_s / 60:.1f}",
                reward,
            )
        return table


def _callback(events: Events, stops: Stops) -> Any:
    from ray import tune

    class Callback(tune.Callback):
        def __reduce__(self):  # Tune saves its callbacks; this one lives only in this process
            return (tune.Callback, ())

        def on_trial_start(self, iteration, trials, trial, **info):
            found = events.trial(trial)
            if found is not None:
                before = Totals.of_run(found.directory)
                detail = f"resuming at batch {before.batch:,}" if before.batch else "new run"
                events.mark(found, "running", f"{detail} in {found.directory}")

        def on_trial_result(self, iteration, trials, trial, result, **info):
            found = events.trial(trial)
            if found is not None and "batch" in result:
                events.result(found, result)

        def on_trial_complete(self, iteration, trials, trial, **info):
            found = events.trial(trial)
            if found is not None:
                totals = Totals.of_run(found.directory)
                why = totals.done(stops, found.settings) or "stopped"
                events.totals[found.label] = totals
                events.mark(found, "done", f"{why}; {totals.line()}")

        def on_trial_error(self, iteration, trials, trial, **info):
            found = events.trial(trial)
            if found is not None:
                events.mark(found, "failed", _error_line(trial))

    return Callback()


def _error_line(trial: Any) -> str:
    try:
        text = str(trial.error_file and Path(trial.error_file).read_text())
    except OSError:
        text = ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "its process failed (see Tune's error file)"


def check_resources(study: Study, cpus: int | None = None) -> None:
    """Refuse a trial that needs more CPUs than the cluster has (it would wait
    forever): `cpus` when given (a local instance will have this machine's), else
    the connected cluster's."""
    from pgpong.cluster import cluster_cpus

    need, have = max(1, study.workers_per_trial), cpus or cluster_cpus()
    if need > have:
        raise ConfigError(
            f"--workers-per-trial {study.workers_per_trial} needs {need} CPUs per trial, "
            f"but the Ray cluster has {have}: use at most --workers-per-trial {have}"
        )


def run_study(study: Study, out: TextIO, connect: Callable[[], None]) -> dict[str, str]:
    """Train every trial that is not done yet, on the Ray instance `connect()` joins
    (called only when a trial is left to train, and before study.json is written);
    return each trial's end state ("done" or "failed"). Raises StudyError if any failed."""
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")  # pgpong's run directories are the record
    os.environ.setdefault("TUNE_DISABLE_SIGINT_HANDLER", "1")  # Ctrl-C ends the study at once; trials resume
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    trials = study.trials()
    events = Events(study, trials, out)
    todo = []
    for trial in trials:
        why = Totals.of_run(trial.directory).done(study.stops, trial.settings)
        if why:
            events.state[trial.label] = "done"
            events.say(f"pgpong study: trial {trial.label}: already done ({why})")
        else:
            todo.append(trial)
    if todo:
        connect()
    study.save()
    if todo:
        events.say(
            f"pgpong study: {study.name}: {len(todo)} of {len(trials)} trials to train, "
            f"{max(1, study.workers_per_trial)} CPU(s) each, in {study.directory}"
        )
        events.start()
        try:
            _fit(study, todo, events)
        finally:
            events.stop()
    failed = [label for label, state in events.state.items() if state != "done"]
    if failed:
        raise StudyError(f"{len(failed)} trial(s) did not finish: {', '.join(failed)}")
    return events.state


def _fit(study: Study, todo: list[Trial], events: Events) -> None:
    from ray import tune

    try:
        from ray.tune import FailureConfig, RunConfig, TuneConfig
    except ImportError:  # Ray before 2.41 kept them in ray.train
        from ray.train import FailureConfig, RunConfig  # type: ignore[assignment]
        from ray.tune import TuneConfig

    logging.getLogger("ray.tune").setLevel(logging.ERROR)
    logging.getLogger("ray.train").setLevel(logging.ERROR)
    stops = dataclasses.asdict(study.stops)
    specs = [
        {
            "directory": str(t.directory.resolve()),
            "settings": t.settings,
            "stops": stops,
            "study": study.name,
            "command": shlex.join(sys.argv),  # the study's, for config.json: a trial's own process is Ray's
        }
        for t in todo
    ]
    workers = study.workers_per_trial
    if workers:
        bundles: list[dict[str, float]] = [{"CPU": 0.0}] + [{"CPU": 1.0} for _ in range(workers)]
        resources: Any = tune.PlacementGroupFactory(bundles)
    else:
        resources = {"cpu": 1}
    tuner = tune.Tuner(
        tune.with_resources(train_trial, resources),
        param_space={"trial": tune.grid_search(specs)},
        tune_config=TuneConfig(trial_dirname_creator=lambda trial: f"trial-{trial.trial_id}"),
        run_config=RunConfig(
            name=time.strftime("tune-%Y%m%d-%H%M%S"),
            storage_path=str((study.directory / "tune").resolve()),
            verbose=0,
            callbacks=[_callback(events, study.stops)],
            failure_config=FailureConfig(max_failures=RETRIES),
        ),
    )
    tuner.fit()
