"""What a run reports. The trainer hands every batch's start, each finished episode and the batch's row to
a list of outputs (sinks): progress.csv and the console line always, TensorBoard events and a live progress
line where asked. Adding an output touches no training code."""

from __future__ import annotations

import contextlib
import csv
import math
import os
import socket
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Protocol, TextIO

from pgpong.config import ConfigError
from pgpong.console import LiveLine, fitted, terminal_width
from pgpong.files import open_regular

NAN = math.nan


class Totals(Protocol):
    """Where a run stands (TrainingState has these)."""

    batch: int
    episodes: int
    env_steps: int
    wall_s: float
    running_reward: float | None


@dataclass
class BatchRow:
    batch: int  # 1-based number of the batch
    episodes: int  # cumulative
    env_steps: int  # cumulative
    wall_s: float  # since the run began, across resumes
    batch_s: float
    running_reward: float
    score_mean: float
    score_min: float
    score_max: float
    episode_len_mean: float
    steps_per_s: float
    batch_episodes: int  # episodes played in this batch
    workers: int
    workers_replaced: int  # workers replaced after a crash during this batch
    barrier_s: float = 0.0  # mean seconds a worker sat idle waiting for the batch's slowest episode
    # Diagnostics (never used to learn; nan where not measured, e.g. in rows of older runs):
    entropy: float = NAN  # the policy's entropy, nats, mean over the batch's steps (ln 2 = 0.693 at P(UP) 0.5)
    p_up: float = NAN  # P(UP), mean over the batch's steps
    dead_units: float = NAN  # share of hidden units not active (h > 0) on any step of the batch
    w1_norm: float = NAN  # L2 norm of W1 after the batch's update
    w2_norm: float = NAN  # L2 norm of W2 after it
    update_norm: float = NAN  # L2 norm of the update (W1 and W2 together), as made (after any clipping)
    update_clip: float = NAN  # what --max-update-norm multiplied the update by (1: not clipped)
    repeat_share: float = NAN  # share of steps whose action was the step before's
    quick_loss_share: float = NAN  # share of the points lost within 200 emulator frames (never returned)

    @classmethod
    def of_batch(
        cls,
        totals: Totals,
        batch_s: float,
        scores: list[float],
        lengths: list[int],
        workers: int,
        workers_replaced: int,
        barrier_s: float,
        diagnostics: dict[str, float] | None = None,
    ) -> BatchRow:
        """The row of a batch that played episodes with `scores` and `lengths`, after
        which the run stands at `totals`; `diagnostics` gives the columns from
        `entropy` on (those it leaves out stay nan)."""
        return cls(
            batch=totals.batch,
            episodes=totals.episodes,
            env_steps=totals.env_steps,
            wall_s=totals.wall_s,
            batch_s=batch_s,
            running_reward=float(totals.running_reward or 0.0),  # set by the first episode ever
            score_mean=sum(scores) / len(scores),
            score_min=min(scores),
            score_max=max(scores),
            episode_len_mean=sum(lengths) / len(lengths),
            steps_per_s=sum(lengths) / batch_s,
            batch_episodes=len(scores),
            workers=workers,
            workers_replaced=workers_replaced,
            barrier_s=barrier_s,
            **(diagnostics or {}),
        )

    def console_line(self, width: int | None = None) -> str:
        """The line per batch; where a terminal of `width` columns would wrap it, shorter."""
        head, took, speed = f"batch {self.batch:5d}", f"{self.batch_s:5.1f} s", f"{self.steps_per_s:7,.0f} steps/s"
        reward = f"running reward {self.running_reward:7.2f} | score {self.score_mean:6.2f}"
        forms = [[head, f"{self.batch_episodes} episodes in {took}", reward, speed], [head, took, reward, speed]]
        line = next((f for f in map(" | ".join, forms) if width is None or len(f) < width), f"{head} | {reward}")
        return line + (f" | {self.workers_replaced} worker(s) replaced after a crash" if self.workers_replaced else "")


COLUMNS = [f.name for f in fields(BatchRow)]
DIAGNOSTICS = COLUMNS[COLUMNS.index("entropy") :]  # progress.csv's last columns, TensorBoard's diagnostics/
# No run comes near this in any column (1e15 env steps: 30 years at a million a second);
# a value past it, inf or nan where every pgpong writes a number, is damage.
MAX_VALUE = 1e15
COUNTED = ("batch", "episodes", "env_steps", "wall_s")  # never negative, in every progress.csv


def damage(row: dict[str, str]) -> str | None:
    """What is wrong with a complete row of progress.csv in the columns every pgpong has
    written (`column: value`), or None."""
    for name in (*COUNTED, "running_reward"):
        try:
            value = float(row[name])
        except (KeyError, TypeError, ValueError):
            return f"{name}: {row.get(name)!r}"
        if not (abs(value) <= MAX_VALUE and (value >= 0 or name not in COUNTED)):
            return f"{name}: {row[name].strip()}"
    return None


class Output(Protocol):
    """A sink for what a run reports."""

    def begin_batch(self, batch: int, episodes: int, running_reward: float | None) -> None: ...

    def episode(self, finished: int, steps: int, running_reward: float | None) -> None: ...

    def end_batch(self, row: BatchRow, phases: dict[str, float]) -> None: ...

    def close(self) -> None: ...


class _Quiet:
    """An output that ignores every event; outputs override the ones they use."""

    def begin_batch(self, batch: int, episodes: int, running_reward: float | None) -> None:
        pass

    def episode(self, finished: int, steps: int, running_reward: float | None) -> None:
        pass

    def end_batch(self, row: BatchRow, phases: dict[str, float]) -> None:
        pass

    def close(self) -> None:
        pass


class ProgressCsv(_Quiet):
    """progress.csv: a row per batch as it ends (synced before each checkpoint: trainer.py)."""

    def __init__(self, path: Path):
        self.path = path

    def trim(self, last_batch: int) -> None:
        """Keep only rows up to `last_batch`: a run resumed from a checkpoint replays the
        rest. A last row cut short by a crash goes too."""
        rows = [r for r in read_progress(self.path) if (b := _batch_of(r)) is not None and b <= last_batch]
        for row in rows:  # kept: a resumed run's curves and projections rest on them
            wrong = damage(row)
            if wrong is not None:
                raise ConfigError(
                    f"{self.path}: batch {row['batch'].strip()}'s row holds {wrong}, not a value a run writes; "
                    "the file is damaged: correct or delete that line, and resume again"
                )
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w", newline="") as f:
            # (a column an older pgpong did not write gets "nan", before rows with every column follow)
            writer = csv.DictWriter(f, COLUMNS, extrasaction="ignore", restval="nan")
            writer.writeheader()
            writer.writerows(rows)
            f.flush()
            os.fsync(f.fileno())  # whole before the rename (the caller syncs the directory)
        os.replace(tmp, self.path)

    def end_batch(self, row: BatchRow, phases: dict[str, float]) -> None:
        new = not self.path.exists()
        with open(self.path, "a", newline="") as f:
            writer = csv.DictWriter(f, COLUMNS, extrasaction="ignore")
            if new:
                writer.writeheader()
            writer.writerow({k: _fmt(v) for k, v in asdict(row).items()})


class ConsoleLines(_Quiet):
    """The plain line per batch, always (a terminal, a pipe or a log file alike)."""

    def __init__(self, out: TextIO):
        self.out = out

    def end_batch(self, row: BatchRow, phases: dict[str, float]) -> None:
        print(row.console_line(terminal_width(self.out)), file=self.out, flush=True)


class TensorBoard(_Quiet):
    """TensorBoard event files in the run directory, env steps as the step, written in
    this thread with tensorboardX's records and protos (SummaryWriter's thread died on
    a full disk, then its queue blocked). A resumed run hides what a killed driver wrote
    past its checkpoint. If the disk refuses a write, the file is given up (raised once)."""

    def __init__(self, directory: Path, resumed_at_step: int | None, settings: dict[str, Any]):
        from tensorboardX.proto.event_pb2 import Event, SessionLog
        from tensorboardX.record_writer import RecordWriter
        from tensorboardX.summary import scalar, text

        self._event, self._scalar = Event, scalar
        # Named as tensorboardX names its files (by the second), then by the nanosecond:
        # a run resumed within the second the last one began would empty that one's file.
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{time.time_ns():020d}"
        self.file: Any = RecordWriter(str(directory / name))  # (its close closes the file even if its flush fails)
        first = Event(file_version="brain.Event:2")
        if resumed_at_step is None:
            table = "\n".join(f"| {k} | {v} |" for k, v in sorted(settings.items()))
            self._write(0, [first, Event(summary=text("settings", f"| setting | value |\n| --- | --- |\n{table}"))])
        else:  # TensorBoard drops the events from this step on that came before it
            self._write(resumed_at_step + 1, [first, Event(session_log=SessionLog(status=SessionLog.START))])

    def end_batch(self, row: BatchRow, phases: dict[str, float]) -> None:
        values = {
            "charts/running_reward": row.running_reward,
            "charts/episodic_return": row.score_mean,
            "charts/episodic_return_min": row.score_min,
            "charts/episodic_return_max": row.score_max,
            "charts/episodic_length": row.episode_len_mean,
            "charts/SPS": row.steps_per_s,
            "charts/episodes": row.episodes,
            "time/batch_s": row.batch_s,
        }
        for name in DIAGNOSTICS:
            if not math.isnan(value := getattr(row, name)):  # nan: not measured (a simulated batch)
                values[f"diagnostics/{name}"] = value
        for name, seconds in sorted(phases.items()):
            values[f"time/{name.replace(' ', '_')}_s"] = seconds
        self._write(row.env_steps, [self._event(summary=self._scalar(tag, v)) for tag, v in values.items()])

    def close(self) -> None:
        if self.file is not None:
            file, self.file = self.file, None
            file.close()

    def _write(self, step: int, events: list[Any]) -> None:
        if self.file is None:  # given up: the disk refused it
            return
        try:
            for event in events:
                event.wall_time, event.step = time.time(), step
                self.file.write(event.SerializeToString())
            self.file.flush()
        except OSError:
            file, self.file = self.file, None
            with contextlib.suppress(OSError):
                file.close()
            raise


class LiveProgress(_Quiet):
    """While a batch runs: episodes finished, env steps per second so far, elapsed time
    and the running reward, on one line that updates in place (terminals only)."""

    def __init__(self, out: TextIO):
        self.line = LiveLine(self._text, out)
        self.batch = self.size = self.finished = self.steps = 0
        self.running: float | None = None
        self.began = time.monotonic()
        self.tag = ""  # a standing remark at the line's end (pace.LIVE_TAG)

    def begin_batch(self, batch: int, episodes: int, running_reward: float | None) -> None:
        self.batch, self.size, self.finished, self.steps = batch, episodes, 0, 0
        self.running, self.began = running_reward, time.monotonic()
        self.line.start()

    def episode(self, finished: int, steps: int, running_reward: float | None) -> None:
        self.finished, self.steps, self.running = finished, steps, running_reward
        self.line.refresh()

    def end_batch(self, row: BatchRow, phases: dict[str, float]) -> None:
        self.line.stop()  # before the batch's permanent line is printed

    def close(self) -> None:
        self.line.stop()

    def _text(self) -> str:
        elapsed = time.monotonic() - self.began
        running = "-" if self.running is None else f"{self.running:.2f}"
        speed = f"{self.steps / max(elapsed, 1e-9):,.0f}" if self.steps else "-"  # (counted as matches end)
        return (
            f"batch {self.batch:5d} | {self.finished}/{self.size} episodes | "
            f"{speed} steps/s | {elapsed:5.1f} s | running reward {running}{self.tag}"
        )


class RunLog:
    """The outputs of a run, in order: the live line (stopped first), progress.csv, the
    console line, then any others."""

    def __init__(self, path: Path, out: TextIO = sys.stdout, outputs: list[Output] | None = None):
        self.path = path
        self.out = out
        self.csv = ProgressCsv(path)
        extra = list(outputs or [])
        live = [o for o in extra if isinstance(o, LiveProgress)]
        self.outputs: list[Output] = [*live, self.csv, ConsoleLines(out), *(o for o in extra if o not in live)]

    def trim(self, last_batch: int) -> None:
        self.csv.trim(last_batch)

    def begin_batch(self, batch: int, episodes: int, running_reward: float | None) -> None:
        for output in self.outputs:
            output.begin_batch(batch, episodes, running_reward)

    def episode(self, finished: int, steps: int, running_reward: float | None) -> None:
        for output in self.outputs:
            output.episode(finished, steps, running_reward)

    def show(self, row: BatchRow, phases: dict[str, float] | None = None) -> None:
        """Every output but progress.csv: the row as soon as its batch is done."""
        for output in self.outputs:
            if output is not self.csv:
                output.end_batch(row, phases or {})

    def record(self, row: BatchRow, phases: dict[str, float] | None = None) -> None:
        """progress.csv. Checkpoints come on a cadence, written in the background, so
        rows may run ahead of the newest one: a resumed run drops those rows and plays
        their batches again, to the same weights."""
        self.csv.end_batch(row, phases or {})

    def say(self, message: str) -> None:
        print(fitted(message, self.out), file=self.out, flush=True)

    def note(self, message: str, tag: str) -> None:
        """Say `message` once, and keep `tag` on the live line from now on."""
        self.say(message)
        for output in self.outputs:
            if isinstance(output, LiveProgress):
                output.tag = tag

    def close(self) -> None:
        for output in self.outputs:  # (TensorBoard, whose close may fail on a full disk, is last)
            output.close()


def read_rows(path: Path) -> list[BatchRow]:
    """progress.csv's complete rows as BatchRows (a column an older pgpong did not write takes its default)."""
    kinds = {f.name: int if f.type == "int" else float for f in fields(BatchRow)}
    return [
        BatchRow(**{name: kinds[name](value) for name, value in row.items() if name in kinds})  # type: ignore[arg-type]
        for row in read_progress(path)
        if _batch_of(row) is not None
    ]


def read_progress(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with open_regular(path) as f:  # (a pipe or a folder: OSError)
        return list(csv.DictReader(f))


def last_recorded_batch(path: Path) -> int:
    """The batch number of progress.csv's last complete row (0 if none)."""
    try:
        numbers = [b for row in read_progress(path) if (b := _batch_of(row)) is not None]
    except (OSError, csv.Error, UnicodeDecodeError):
        return 0
    return max(numbers, default=0)


def _batch_of(row: dict[str, str]) -> int | None:
    """The batch number of a complete row; None for a row cut short or unreadable."""
    if any(value is None or value == "" for value in row.values()):
        return None
    try:
        return int(row["batch"])
    except (TypeError, ValueError, KeyError):
        return None


def _fmt(value: object) -> object:
    return f"{value:.6g}" if isinstance(value, float) else value
