"""A training session: from the settings the user gave to a trained run directory.

It plans the run (new or resumed; every check made before anything is written),
opens the pool, writes the run's files, wires the outputs and trains. cli/train.py calls
it and turns what it raises into messages and exit codes. open_trainer is the one
place a trainer is built: train, study, bench and the tests all use it."""

from __future__ import annotations

import dataclasses
import gc
import io
import shlex
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from pgpong import schedule
from pgpong.checkpoint import TrainingState, list_checkpoints
from pgpong.cluster import ray_running, stop_ray
from pgpong.config import TrainConfig, per_cpu_text
from pgpong.envs import check_env_id
from pgpong.pool import Pool, WorkerSettings, kept_for_life, open_pool
from pgpong.rundir import (
    Run,
    RunLock,
    RunWriteError,
    check_run_dir_writable,
    create_run_files,
    default_run_dir,
    open_run,
)
from pgpong.runlog import LiveProgress, Output, RunLog, TensorBoard
from pgpong.trainer import BatchReport, Trainer


class TrainingSession:
    """Plan with `plan()`, then `train()`; `newest_checkpoint()` says what is saved."""

    def __init__(self, run: Run, address: str | None, note: Callable[[str], None], lock: RunLock | None = None):
        self.run = run
        self.address = address
        self.note = note
        self.lock = lock

    @classmethod
    def plan(
        cls,
        given: dict,
        run_dir: Path | None,
        resume_from: Path | None,
        address: str | None,
        note: Callable[[str], None],
    ) -> TrainingSession:
        """Read the run directory and check everything, then hold it (RunLock: refused
        if another process trains there); writes nothing else."""
        run_dir = run_dir or default_run_dir(TrainConfig(**given).validate())
        run = open_run(run_dir, given, resume_from)
        check_env_id(run.config.env_id)
        if run.finished:
            return cls(run, address, note)
        check_run_dir_writable(run)
        if run.config.workers == 0 and address is not None:
            note(f"--workers 0 plays in this process, without Ray: the Ray address {address} is not used")
            address = None
        if run.config.workers == 0 and run.config.workers_per_cpu != 1:
            per_cpu = per_cpu_text(run.config.workers_per_cpu)
            note(f"--workers 0 plays in this process: --workers-per-cpu {per_cpu} is not used")
        lock = RunLock(run_dir)
        try:  # read again under the lock: a run that just ended there may have written more
            run = open_run(run_dir, given, resume_from)
        except BaseException:
            lock.release()
            raise
        return cls(run, address, note, lock)

    @property
    def directory(self) -> Path:
        return self.run.directory

    def train(
        self,
        out: TextIO | None = sys.stdout,
        connected: Callable[[], object] = lambda: None,
        stop: Callable[[TrainingState], object] = lambda state: False,
        each: Callable[[BatchReport], object] = lambda report: None,
    ) -> None:
        """Open the pool (then call `connected`), write the run's files and train
        until --iterations or `stop` (Trainer.train's, as `each`); the lines go to
        `out` (none when None). The pool is closed however it ends, and Ray too when
        this session started it (a Ray instance the caller had started stays up)."""
        run, config = self.run, self.run.config
        pool: Pool | None = None
        ray_was_up = ray_running()
        try:
            pool = open_pool(
                worker_settings(config),
                config.workers,
                self.address,
                note=self.note,
                overlap=config.lagged,
                per_cpu=config.workers_per_cpu,
                matches=config.batch_size,
            )
            connected()
            if config.workers and pool.num_workers != config.workers:  # config.json records what runs
                run.config = config = dataclasses.replace(config, workers=pool.num_workers)
            with open_trainer(run, pool, run_info(self.address), out=out, live=True) as trainer:
                for message in run.skipped:
                    trainer.log.say(f"pgpong: skipped a bad checkpoint: {message}")
                trainer.log.say(
                    f"pgpong: {start_line(run)} in {run.directory}: {config.env_id}, "
                    f"{schedule.batch_settings(config, run.resumed, run.state.episodes, run.state.batch)}"
                    f"{candidate_settings(config)}, on {where(pool)}"
                )
                warning = None if run.state.batch else schedule.first_step_warning(config)
                if warning:
                    trainer.log.say(warning)
                trainer.train(stop, each)
                trainer.log.say(f"pgpong: done after {run.state.batch} batches; run in {run.directory}")
        finally:
            if pool is not None:
                pool.close()
            if not ray_was_up:
                stop_ray()
            if self.lock is not None:
                self.lock.release()

    def started(self) -> bool:
        """Whether the run directory holds this run (its config.json was written)."""
        return self.run.config_path.exists()

    def newest_checkpoint(self) -> str:
        found = list_checkpoints(self.run.checkpoint_dir)
        return f"The newest checkpoint is {found[-1]}" if found else "No checkpoint was written yet"


def start_line(run: Run) -> str:
    skipped = f"skipped {len(run.skipped)} bad checkpoint(s); " if run.skipped else ""
    if run.resumed_from:
        return f"{skipped}resuming from batch {run.state.batch} ({run.resumed_from})"
    if run.skipped:
        return f"{skipped}no usable checkpoint left, starting again from the initial weights"
    return "resuming from the start (no checkpoint yet)" if run.resumed else "new run"


def candidate_settings(config: TrainConfig) -> str:
    """'; entropy bonus 0.01; W2 initialised x0.1; updates clipped to norm 5' for the
    candidate settings that change 2016's maths (docs/ALGORITHM.md section 9); ''
    when none does."""
    parts = []
    if config.entropy_bonus:
        parts.append(f"entropy bonus {config.entropy_bonus:g}")
    if config.w2_init_scale != 1:
        parts.append(f"W2 initialised x{config.w2_init_scale:g}")
    if config.max_update_norm:
        parts.append(f"updates clipped to norm {config.max_update_norm:g}")
    if config.lag:
        parts.append(f"batches played {config.lag} update behind (--lag)")
    if config.lag_share:
        parts.append(f"the first {config.lag_share:g} of each batch played 1 update behind (--lag-share)")
    return "".join(f"; {part}" for part in parts)


def worker_settings(config: TrainConfig) -> WorkerSettings:
    """What the run's rollout workers are built from."""
    return WorkerSettings(config.env_id, config.max_episode_steps, config.gamma, config.entropy_bonus)


@contextmanager
def open_trainer(
    run: Run,
    pool: Pool,
    made_by: dict[str, Any],
    out: TextIO | None = None,
    live: bool = False,
    tensorboard: bool = True,
) -> Iterator[Trainer]:
    """The trainer of `run` on `pool`, its run directory's files written first
    (config.json, with `made_by` saying how the run was made; progress.csv trimmed to
    the checkpoint it continues from). Its outputs: progress.csv, a line per batch on
    `out` (none when None), the live line there when `live` (on a terminal), and
    TensorBoard's event files when `tensorboard`. However the block ends, the last
    checkpoint and its row reach the disk and the outputs are closed."""
    create_run_files(run, made_by)
    outputs: list[Output] = [LiveProgress(out)] if live and out is not None else []
    log = RunLog(run.progress_path, outputs=outputs, out=out if out is not None else io.StringIO())
    try:
        if tensorboard:
            try:
                board = TensorBoard(run.directory, run.state.env_steps if run.resumed else None, run.config.to_dict())
            except OSError as exc:
                raise RunWriteError.of(run.directory, exc) from None
            log.outputs.append(board)
        trainer = Trainer(run, pool, log)
        try:
            with kept_out_of_full_collections():
                yield trainer
        finally:
            trainer.close()
    finally:
        try:
            log.close()
        except OSError as exc:  # (a full disk: TensorBoard's last events)
            raise RunWriteError.of(run.directory, exc) from None


@contextmanager
def kept_out_of_full_collections() -> Iterator[None]:
    """What is alive now (the modules, Ray's and numba's state, the pool, the trainer)
    lives for the run: it is kept out of Python's full garbage collections, which then
    look at new objects only. In the driver a full collection looked at about 144,000
    objects (44-51 ms); Ray asks every process for one whenever a node's object store
    fills (at most every 10 s), which at 11x18 late in training was half the driver's
    CPU per update (docs/SCALING.md). Garbage of before is collected first, not kept;
    at the end everything goes back to the collector, unless the process had kept
    objects out of it itself before (gc.freeze is not nested)."""
    outer = gc.get_freeze_count() > 0
    kept_for_life()
    try:
        yield
    finally:
        if not outer:
            gc.unfreeze()


def where(pool: Pool) -> str:
    if not pool.num_workers:
        return "this process (no Ray)"
    return f"{pool.num_workers} Ray worker(s) on {pool.nodes()} node(s)"


def run_info(address: str | None) -> dict:
    """What config.json records beside the settings: when, the command, where, versions."""
    from importlib.metadata import version

    versions: dict[str, str | None] = {}
    for package in ("pgpong", "numpy", "scipy", "gymnasium", "ale-py", "ray"):
        try:
            versions[package] = version(package)
        except Exception:
            versions[package] = None
    return {
        "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join(shlex.quote(a) for a in sys.argv),
        "ray_address": address or "local",
        "versions": versions,
    }
