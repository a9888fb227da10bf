"""A run directory's policy: a new run or a resumed one (which checkpoint, which
settings may change), the checks made before anything is written, and the files a
run needs before its first batch (config.json and its history, trimmed progress)."""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import fcntl
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

from pgpong.checkpoint import (
    CheckpointError,
    TrainingState,
    checkpoint_bytes,
    fsync_dir,
    list_checkpoints,
    load_checkpoint,
    remove_stale_temporaries,
)
from pgpong.config import BEFORE_THEY_EXISTED, ConfigError, TrainConfig, load_config, save_config
from pgpong.errors import PgpongError
from pgpong.policy import Params
from pgpong.runlog import RunLog, last_recorded_batch, read_progress


class RunWriteError(PgpongError, RuntimeError):
    """The run directory could not be written (disk full, permissions, ...)."""

    @classmethod
    def of(cls, directory: Path, error: OSError) -> RunWriteError:
        return cls(f"cannot write to the run directory {directory}: {error}")


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
    def finished(self) -> bool:
        """A resumed run that already has its --iterations batches."""
        iterations = self.config.iterations
        return self.resumed and iterations is not None and self.state.batch >= iterations

    @property
    def config_path(self) -> Path:
        return self.directory / "config.json"

    @property
    def progress_path(self) -> Path:
        return self.directory / "progress.csv"

    @property
    def checkpoint_dir(self) -> Path:
        return self.directory / "checkpoints"


def default_run_dir(config: TrainConfig, root: Path = Path("runs")) -> Path:
    env = config.env_id.replace("/", "-")
    return root / f"{env}__{config.seed}__{time.strftime('%Y%m%d-%H%M%S')}"


def open_run(directory: Path, given: dict, resume_from: Path | None = None) -> Run:
    """Plan a new run or a resumed one, reading but writing nothing.

    `given` holds the settings the user gave. Resuming keeps the saved learning
    settings: giving a different one is refused.
    """
    try:
        return _open_run(directory, given, resume_from)
    except OSError as exc:  # (a folder the user may not read, say)
        raise ConfigError(f"cannot read the run directory {directory}: {exc.strerror or exc}") from None


def _open_run(directory: Path, given: dict, resume_from: Path | None) -> Run:
    if directory.exists() and not directory.is_dir():
        raise ConfigError(f"run directory {directory} exists and is not a directory")
    config_file = directory / "config.json"
    if not config_file.exists():
        if resume_from is not None:
            raise ConfigError(f"--resume-from needs an existing run: {directory} has no config.json")
        if directory.exists() and any(p.name != LOCK_NAME for p in directory.iterdir()):
            raise ConfigError(f"run directory {directory} is not empty and holds no pgpong run (no config.json)")
        config = TrainConfig(**given).validate()
        weights = Params.initial(config.hidden, config.seed, w2_scale=config.w2_init_scale)
        state = TrainingState(weights=weights, cache=weights.zeros_like())
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
    _check_progress(run.progress_path)
    run.state, run.resumed_from, run.skipped = _resume_state(run, resume_from)
    return run


def _check_progress(path: Path) -> None:
    """A resumed run reads its progress.csv (and trims it): refuse one it cannot read."""
    try:
        read_progress(path)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(
            f"{path}: cannot be read ({why}); move it aside to resume the run without its rows so far"
        ) from None


def _resume_state(run: Run, resume_from: Path | None) -> tuple[TrainingState, Path | None, list[str]]:
    if resume_from is not None:
        state = load_checkpoint(resume_from)
        _check_fits(run.config, state, resume_from)
        return state, resume_from, []
    skipped: list[str] = []
    found = list_checkpoints(run.checkpoint_dir)
    recorded = last_recorded_batch(run.progress_path)
    for path in reversed(found):
        try:
            state = load_checkpoint(path)
            _check_fits(run.config, state, path)
        except CheckpointError as exc:
            skipped.append(str(exc))
            continue
        if state.batch == recorded + 1:
            # Stopped after this checkpoint was written (in the background) and before its
            # progress.csv row was: resume from an older one, or from the start, and play
            # the batches since again (the same weights come out), so that progress.csv
            # keeps a row for every batch.
            continue
        return state, path, skipped
    # A run directory with no usable checkpoint starts again from the initial weights.
    weights = Params.initial(run.config.hidden, run.config.seed, w2_scale=run.config.w2_init_scale)
    return TrainingState(weights=weights, cache=weights.zeros_like()), None, skipped


def _check_fits(config: TrainConfig, state: TrainingState, path: Path) -> None:
    """A checkpoint belongs to a run made with the same learning settings."""
    if state.weights.hidden != config.hidden:
        raise CheckpointError(f"{path}: hidden size {state.weights.hidden}, the run uses {config.hidden}")
    recorded = {k: v for k, v in state.info.items() if k in config.to_dict()}
    if recorded:
        recorded = {**BEFORE_THEY_EXISTED, **recorded}
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
    if config.lagged and state.batch > 0 and state.previous is None:
        raise CheckpointError(
            f"{path}: no weights from before its last update, which a run with --lag 1 plays (or --lag-share)"
        )
    if not config.lagged and state.previous is not None:
        raise CheckpointError(
            f"{path}: made by a run with --lag 1 or --lag-share (it holds the weights from before an update)"
        )


def check_run_dir_writable(run: Run) -> None:
    """Refuse, before anything is written, a run directory that cannot take the run."""
    existing = run.directory
    while not existing.exists():
        existing = existing.parent
    try:
        for folder in (existing, run.checkpoint_dir) if run.checkpoint_dir.exists() else (existing,):
            if not folder.is_dir():
                raise OSError(f"{folder} is not a directory")
            with tempfile.TemporaryFile(dir=folder):  # as root, permission bits say nothing
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
        remove_stale_temporaries(run.checkpoint_dir)
        if run.progress_path.exists():
            RunLog(run.progress_path).trim(run.state.batch)
            fsync_dir(run.directory)
    except OSError as exc:
        raise RunWriteError.of(run.directory, exc) from None


LOCK_NAME = ".lock"


class RunBusy(ConfigError):
    """Another live process holds the run directory."""


class RunLock:
    """One writer per run directory: an exclusive lock (flock) on DIR/.lock, which the
    kernel lets go when the holder exits however it ends (kill -9 too), so a lock is
    never stale. The file says who holds it, for the message a second writer gets.
    A directory this lock made, and that holds nothing else when it is let go (the
    run never began), is removed again."""

    def __init__(self, directory: Path):
        self.directory = directory
        self._made = [d for d in (directory, *directory.parents) if not d.exists()]  # deepest first
        try:
            directory.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise ConfigError(f"cannot write the run directory {directory}: {exc}") from None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(self._fd, 200, 0).decode(errors="replace").strip() or "another process"
            os.close(self._fd)
            raise RunBusy(
                f"run directory {directory} is in use by {holder}: wait for that run to end, or give another --run-dir"
            ) from None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"pid {os.getpid()} on host {socket.gethostname()}\n".encode(), 0)

    def release(self) -> None:
        if self._fd < 0:
            return
        if self._made and [p.name for p in self.directory.iterdir()] == [LOCK_NAME]:
            (self.directory / LOCK_NAME).unlink(missing_ok=True)
            for made in self._made:  # and the parents it had to make, while empty
                with contextlib.suppress(OSError):
                    made.rmdir()
        os.close(self._fd)  # lets the lock go
        self._fd = -1

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
