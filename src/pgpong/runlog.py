"""What a run reports: one console line and one progress.csv row per batch."""

from __future__ import annotations

import csv
import os
import sys
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TextIO


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

    def console_line(self) -> str:
        line = (
            f"batch {self.batch:5d} | {self.batch_episodes} episodes in {self.batch_s:5.1f} s"
            f" | running reward {self.running_reward:7.2f} | score {self.score_mean:6.2f}"
            f" | {self.steps_per_s:7,.0f} steps/s"
        )
        if self.workers_replaced:
            line += f" | {self.workers_replaced} worker(s) replaced after a crash"
        return line


COLUMNS = [f.name for f in fields(BatchRow)]


class RunLog:
    """Appends rows to progress.csv (flushed and fsynced per row) and prints a line."""

    def __init__(self, path: Path, out: TextIO = sys.stdout):
        self.path = path
        self.out = out

    def trim(self, last_batch: int) -> None:
        """Keep only rows up to `last_batch`: a run resumed from a checkpoint replays the rest."""
        rows = [r for r in read_progress(self.path) if int(r["batch"]) <= last_batch]
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, COLUMNS, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
        os.replace(tmp, self.path)

    def write(self, row: BatchRow) -> None:
        new = not self.path.exists()
        with open(self.path, "a", newline="") as f:
            writer = csv.DictWriter(f, COLUMNS, extrasaction="ignore")
            if new:
                writer.writeheader()
            writer.writerow({k: _fmt(v) for k, v in asdict(row).items()})
            f.flush()
            os.fsync(f.fileno())
        print(row.console_line(), file=self.out, flush=True)

    def say(self, message: str) -> None:
        print(message, file=self.out, flush=True)


def read_progress(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _fmt(value: object) -> object:
    return f"{value:.6g}" if isinstance(value, float) else value
