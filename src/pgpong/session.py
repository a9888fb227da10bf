"""A training session: from the settings the user gave to a trained run directory.

It plans the run (new or resumed; every check made before anything is written),
opens the pool, writes the run's files, wires the outputs and trains. cli/train.py calls
it and turns what it raises into messages and exit codes."""

from __future__ import annotations

import dataclasses
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from pgpong.checkpoint import list_checkpoints
from pgpong.cluster import stop_ray
from pgpong.config import TrainConfig, batch_rule, describe_batch_rule
from pgpong.envs import check_env_id
from pgpong.rundir import Run, RunLock, check_run_dir_writable, create_run_files, default_run_dir, open_run
from pgpong.runlog import LiveProgress, RunLog, TensorBoard
from pgpong.trainer import Trainer
from pgpong.workers import Pool, WorkerSettings, open_pool


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

    def train(self, out: TextIO | None = None, connected: Callable[[], object] = lambda: None) -> None:
        """Open the pool (then call `connected`), write the run's files and train
        until --iterations; the pool and Ray are closed however it ends."""
        out = out or sys.stdout
        run, config = self.run, self.run.config
        pool: Pool | None = None
        log = RunLog(run.progress_path, outputs=[LiveProgress(out)], out=out)
        try:
            settings = WorkerSettings(config.env_id, config.max_episode_steps, config.gamma)
            pool = open_pool(settings, config.workers, self.address, note=self.note)
            connected()
            if config.workers and pool.num_workers != config.workers:  # config.json records what runs
                run.config = config = dataclasses.replace(config, workers=pool.num_workers)
            create_run_files(run, run_info(self.address))
            log.outputs.append(
                TensorBoard(run.directory, run.state.env_steps if run.resumed else None, config.to_dict())
            )
            for message in run.skipped:
                log.say(f"pgpong: skipped a bad checkpoint: {message}")
            log.say(
                f"pgpong: {start_line(run)} in {run.directory}: {config.env_id}, "
                f"{batch_settings(config, run.resumed, run.state.episodes, run.state.batch)}, on {where(pool)}"
            )
            warning = None if run.state.batch else first_step_warning(config)
            if warning:
                log.say(warning)
            Trainer(run, pool, log).train()
            log.say(f"pgpong: done after {run.state.batch} batches; run in {run.directory}")
        finally:
            log.close()
            if pool is not None:
                pool.close()
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


def batch_settings(config: TrainConfig, resumed: bool = False, episodes: int = 0, batches: int = 0) -> str:
    """'batch 10, lr 0.002, ...', or with a ramp 'batch 10 growing to 60 over 1,000
    matches, lr 0.002 to 0.0049, ...', then the warm-up (and where a resumed run is on
    them: `episodes` matches and `batches` updates played)."""
    if not config.ramps:
        return f"batch {config.batch_size}, {optimiser_settings(config, resumed)}{warmup_settings(config, batches)}"
    start, end = config.update_settings(0), config.update_settings(config.ramp_matches)
    return (
        f"batch {config.ramp_from} growing to {config.batch_size} over {config.ramp_matches:,} matches, "
        f"lr {start[1]:g} to {end[1]:g}, RMSProp decay {start[2]:g} to {end[2]:g} (the batch rule at each size)"
        + (f"; now at batch {config.update_settings(episodes)[0]} after {episodes:,} matches" if episodes else "")
        + warmup_settings(config, batches)
    )


def warmup_settings(config: TrainConfig, batches: int = 0) -> str:
    """'; warm-up: lr x sqrt(1 - 0.99^t) at update t (x0.1 at the first, x0.8 at the
    100th)', and where a resumed run is on it; '' with --warmup off."""
    if config.warmup == "off":
        return ""
    if batches:
        factor = config.warmup_factor(batches)
        return "; warm-up done" if factor > 0.995 else f"; warm-up: lr x {factor:.2f} at update {batches + 1:,}"
    decay = "the product of the decays so far" if config.ramps else f"{config.decay_rate:g}^t"
    return (
        f"; warm-up: lr x sqrt(1 - {decay}) at update t "
        f"(x{config.warmup_factor(0):.2g} at the first, x{config.warmup_factor(99):.2g} at the 100th)"
    )


def optimiser_settings(config: TrainConfig, resumed: bool = False) -> str:
    """'lr 0.002, RMSProp decay 0.99 (the batch rule ...)', or the values given (or, on
    resume, recorded) instead."""
    if config.follows_batch_rule():
        return describe_batch_rule(config.batch_size)
    if resumed:
        return f"lr {config.learning_rate:g}, RMSProp decay {config.decay_rate:g} (as the run was made)"
    lr, decay = batch_rule(config.batch_size)
    return (
        f"lr {config.learning_rate:g}, RMSProp decay {config.decay_rate:g} "
        f"(given; the batch rule would use --lr {lr:g} --decay-rate {decay:g})"
    )


FIRST_STEP_WARNING = 0.045  # the batch rule keeps it at 0.02 (lr itself warmed up); 0.073 collapsed a batch of 60


def first_step_warning(config: TrainConfig) -> str | None:
    """A warning when RMSProp's first step is well above the 0.02 per weight the batch
    rule keeps without the warm-up: about lr / sqrt(1 - decay) from a zero cache, and
    lr itself with --warmup on."""
    _, lr, decay = config.update_settings(0)  # with a ramp, its first batch's
    step = lr * config.warmup_factor(0) / max(1e-12, 1 - decay) ** 0.5
    if step <= FIRST_STEP_WARNING:
        return None
    how = "lr, warmed up" if config.warmup == "on" else "lr / sqrt(1 - decay); the batch rule keeps it at 0.02"
    return (
        f"pgpong: warning: the first update will move each weight by about {step:.3g} "
        f'({how}), and 0.073 made a batch of 60 lose every point from then on (README "Learning")'
    )


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
