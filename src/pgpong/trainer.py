"""The training loop: publish weights, play a batch, sum gradients in episode order,
one RMSProp step, log a row, checkpoint. Plus opening a run directory (new or resumed)."""

from __future__ import annotations

import dataclasses
import shutil
import signal
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from pgpong.checkpoint import (
    CheckpointError,
    TrainingState,
    checkpoint_bytes,
    list_checkpoints,
    load_checkpoint,
    remove_stale_temporaries,
    save_checkpoint,
)
from pgpong.config import ConfigError, TrainConfig, load_config, save_config
from pgpong.policy import Params, RMSProp
from pgpong.rollout import EpisodeId
from pgpong.runlog import BatchRow, RunLog
from pgpong.workers import Pool

RUNNING_DECAY = 0.99  # running reward: r <- 0.99 r + 0.01 score, after every episode


class TrainingDiverged(RuntimeError):
    """The weights, the RMSProp cache or a gradient became NaN or infinite."""


def _check_finite(params: Params, what: str, batch: int, cfg: TrainConfig) -> None:
    # Checked before the batch's row and checkpoint are written: the last good
    # checkpoint stays the newest, and no NaN reaches the disk.
    if not (np.isfinite(params.W1).all() and np.isfinite(params.W2).all()):
        raise TrainingDiverged(
            f"batch {batch}: {what} became NaN or infinite; the likely cause is the learning rate "
            f"({cfg.learning_rate:g}, pgpong's default is 3e-3): nothing of this batch was written"
        )


class RunWriteError(RuntimeError):
    """The run directory could not be written (disk full, permissions, ...)."""


class Trainer:
    def __init__(self, config: TrainConfig, run: Run, pool: Pool, log: RunLog):
        self.config = config
        self.run = run
        self.pool = pool
        self.log = log
        self.state = run.state
        self.state.info = config.to_dict()  # every checkpoint says what made it
        self.optimizer = RMSProp(config.learning_rate, config.decay_rate, self.state.cache)
        self._last_end: float | None = None  # wall time counts the gaps between batches too

    def train(self) -> TrainingState:
        """Train until `iterations` batches are done in all (forever when it is None)."""
        while self.config.iterations is None or self.state.batch < self.config.iterations:
            self.train_batch()
        return self.state

    def train_batch(self) -> BatchReport:
        """One synchronous update: play the batch, sum its gradients, step, log, checkpoint."""
        cfg, state, pool = self.config, self.state, self.pool
        began, clock = time.monotonic(), PhaseClock()
        replaced_before = pool.replaced
        episodes = [EpisodeId(cfg.seed, state.batch, k) for k in range(cfg.batch_size)]
        grad = state.weights.zeros_like()
        scores: list[float] = []
        lengths: list[int] = []
        worker_time: Counter[str] = Counter()
        self.log.begin_batch(state.batch + 1, len(episodes), state.running_reward)
        for result in pool.play_batch(state.weights, episodes):  # in episode order
            with clock("sum gradients"):
                result.grad.add_to(grad)
            scores.append(result.score)
            lengths.append(result.steps)
            worker_time.update(result.timings, record_bytes=result.record_bytes)
            state.running_reward = _running(state.running_reward, result.score)
            self.log.episode(len(scores), sum(lengths), state.running_reward)
        _check_finite(grad, "the batch's summed gradient", state.batch + 1, cfg)
        with clock("rmsprop step"):
            self.optimizer.step(state.weights, grad)
        _check_finite(state.weights, "the weights", state.batch + 1, cfg)
        _check_finite(state.cache, "the RMSProp cache", state.batch + 1, cfg)

        batch_s = time.monotonic() - began
        state.batch += 1
        state.episodes += len(episodes)
        state.env_steps += sum(lengths)
        state.wall_s += batch_s if self._last_end is None else time.monotonic() - self._last_end
        row = BatchRow(
            batch=state.batch,
            episodes=state.episodes,
            env_steps=state.env_steps,
            wall_s=state.wall_s,
            batch_s=batch_s,
            running_reward=float(state.running_reward or 0.0),  # set by the batch's first episode
            score_mean=float(np.mean(scores)),
            score_min=min(scores),
            score_max=max(scores),
            episode_len_mean=float(np.mean(lengths)),
            steps_per_s=sum(lengths) / batch_s,
            batch_episodes=len(episodes),
            workers=pool.num_workers,
            workers_replaced=pool.replaced - replaced_before,
            barrier_s=pool.last_batch.get("barrier", 0.0),
        )
        phases = {**pool.last_batch, **clock.seconds}
        with signals_deferred(), clock("checkpoint write"):  # a row and its checkpoint go together
            try:
                self.log.write(row, phases)
                save_checkpoint(state, self.run.checkpoints, keep=cfg.keep_checkpoints)
            except OSError as exc:
                raise RunWriteError(f"cannot write to the run directory {self.run.directory}: {exc}") from None
        self._last_end = time.monotonic()
        return BatchReport(row, {**pool.last_batch, **clock.seconds}, dict(worker_time))


@dataclasses.dataclass
class BatchReport:
    """A batch's row, plus where its time went (for `pgpong bench`)."""

    row: BatchRow
    phases: dict[str, float]  # driver-side seconds: publish, barrier, sum gradients, ...
    worker_time: dict[str, float]  # summed over the batch's episodes: emulator, forward, ...


class PhaseClock:
    """Adds up the seconds spent in named phases."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        began = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - began


def _running(running: float | None, score: float) -> float:
    return score if running is None else RUNNING_DECAY * running + (1 - RUNNING_DECAY) * score


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT/SIGTERM until the block is done, then deliver them."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    previous = {
        s: signal.signal(s, lambda signum, _frame: pending.append(signum)) for s in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if pending:
            signal.raise_signal(pending[0])


# ---- the run directory -----------------------------------------------------------


@dataclasses.dataclass
class Run:
    """A run directory and the state training continues from."""

    directory: Path
    config: TrainConfig
    state: TrainingState
    resumed: bool = False  # the directory already held this run
    resumed_from: Path | None = None  # the checkpoint it continues from (None: from the start)
    skipped: list[str] = dataclasses.field(default_factory=list)  # damaged checkpoints passed over

    @property
    def config_path(self) -> Path:
        return self.directory / "config.json"

    @property
    def progress_path(self) -> Path:
        return self.directory / "progress.csv"

    @property
    def checkpoints(self) -> Path:
        return self.directory / "checkpoints"


def default_run_dir(config: TrainConfig, root: Path = Path("runs")) -> Path:
    env = config.env_id.replace("/", "-")
    return root / f"{env}__{config.seed}__{time.strftime('%Y%m%d-%H%M%S')}"


def open_run(directory: Path, given: dict, resume_from: Path | None = None) -> Run:
    """Plan a new run or a resumed one, reading but writing nothing.

    `given` holds the settings the user gave. Resuming keeps the saved learning
    settings: giving a different one is refused.
    """
    if directory.exists() and not directory.is_dir():
        raise ConfigError(f"run directory {directory} exists and is not a directory")
    config_file = directory / "config.json"
    if not config_file.exists():
        if resume_from is not None:
            raise ConfigError(f"--resume-from needs an existing run: {directory} has no config.json")
        if directory.exists() and any(directory.iterdir()):
            raise ConfigError(f"run directory {directory} is not empty and holds no pgpong run (no config.json)")
        config = TrainConfig(**given).validate()
        state = TrainingState(weights=Params.initial(config.hidden, config.seed), cache=None)  # type: ignore[arg-type]
        state.cache = state.weights.zeros_like()
        return Run(directory, config, state)

    saved = load_config(config_file)
    config = dataclasses.replace(saved, **given).validate()
    changed = saved.learning_differences(config)
    if changed:
        what = ", ".join(f"--{n.replace('_', '-')} {getattr(saved, n)} -> {getattr(config, n)}" for n in changed)
        raise ConfigError(
            f"run {directory} was made with other settings ({what}); a resumed run must keep them: "
            "drop those flags, or start a new run with another --run-dir"
        )
    run = Run(directory, config, state=None, resumed=True)  # type: ignore[arg-type]
    run.state, run.resumed_from, run.skipped = _resume_state(run, resume_from)
    return run


def _resume_state(run: Run, resume_from: Path | None) -> tuple[TrainingState, Path | None, list[str]]:
    if resume_from is not None:
        state = load_checkpoint(resume_from)
        _check_fits(run.config, state, resume_from)
        return state, resume_from, []
    skipped: list[str] = []
    for path in reversed(list_checkpoints(run.checkpoints)):
        try:
            state = load_checkpoint(path)
            _check_fits(run.config, state, path)
            return state, path, skipped
        except CheckpointError as exc:
            skipped.append(str(exc))
    # A run directory with no usable checkpoint starts again from the initial weights.
    weights = Params.initial(run.config.hidden, run.config.seed)
    return TrainingState(weights=weights, cache=weights.zeros_like()), None, skipped


def _check_fits(config: TrainConfig, state: TrainingState, path: Path) -> None:
    """A checkpoint belongs to a run made with the same learning settings."""
    if state.weights.hidden != config.hidden:
        raise CheckpointError(f"{path}: hidden size {state.weights.hidden}, the run uses {config.hidden}")
    recorded = {k: v for k, v in state.info.items() if k in config.to_dict()}
    try:
        theirs = dataclasses.replace(config, **recorded)
    except TypeError:
        raise CheckpointError(f"{path}: its recorded settings are unreadable") from None
    changed = config.learning_differences(theirs)
    if changed:
        what = ", ".join(
            f"--{n.replace('_', '-')} {getattr(theirs, n)} (this run: {getattr(config, n)})" for n in changed
        )
        raise CheckpointError(f"{path}: made with other learning settings ({what}); it belongs to another run")


def check_run_dir_writable(run: Run) -> None:
    """Refuse, before anything is written, a run directory that cannot take the run."""
    existing = run.directory
    while not existing.exists():
        existing = existing.parent
    try:
        if not existing.is_dir():
            raise OSError(f"{existing} is not a directory")
        with tempfile.TemporaryFile(dir=existing):  # as root, permission bits say nothing
            pass
    except OSError as exc:
        raise ConfigError(f"cannot write the run directory {run.directory}: {exc}") from None
    needed = (run.config.keep_checkpoints + 1) * checkpoint_bytes(run.config.hidden) + 2**20
    free = shutil.disk_usage(existing).free
    if free < needed:
        raise ConfigError(
            f"not enough free space for the run directory {run.directory}: "
            f"{free / 2**20:.1f} MB free, its checkpoints need about {needed / 2**20:.1f} MB"
        )


def create_run_files(run: Run, extra: dict) -> None:
    """Write what the run needs before its first batch (config.json, trimmed progress)."""
    try:
        run.directory.mkdir(parents=True, exist_ok=True)
        save_config(run.config, run.config_path, extra)
        remove_stale_temporaries(run.checkpoints)
    except OSError as exc:
        raise RunWriteError(f"cannot write to the run directory {run.directory}: {exc}") from None
    if run.progress_path.exists():
        RunLog(run.progress_path).trim(run.state.batch)
