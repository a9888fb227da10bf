"""The training loop: publish weights, play a batch, add its chunk sums in order,
one RMSProp step, log a row, checkpoint. The run directory it trains in is opened
by rundir.py."""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np

from pgpong import schedule
from pgpong.checkpoint import TrainingState, save_checkpoint
from pgpong.errors import PgpongError
from pgpong.policy import Params, RMSProp
from pgpong.pool import Pool
from pgpong.rollout import EpisodeId, EpisodeStats
from pgpong.rundir import Run, RunWriteError
from pgpong.runlog import BatchRow, RunLog

RUNNING_DECAY = 0.99  # running reward: r <- 0.99 r + 0.01 score, after every episode


class TrainingDiverged(PgpongError, RuntimeError):
    """The weights, the RMSProp cache or a gradient became NaN or infinite."""


def _check_finite(params: Params, what: str, batch: int, step: str, batch_size: int) -> None:
    # Checked before the batch's row and checkpoint are written: the last good
    # checkpoint stays the newest, and no NaN reaches the disk.
    if not (np.isfinite(params.W1).all() and np.isfinite(params.W2).all()):
        raise TrainingDiverged(
            f"batch {batch}: {what} became NaN or infinite; the likely cause is the learning rate "
            f"({step}; {schedule.divergence_advice(batch_size)}): nothing of this batch was written"
        )


class Trainer:
    def __init__(self, run: Run, pool: Pool, log: RunLog):
        self.config = config = run.config
        self.run = run
        self.pool = pool
        self.log = log
        self.state = run.state
        self.state.info = config.to_dict()  # every checkpoint says what made it
        self.optimizer = RMSProp(config.learning_rate, config.decay_rate, self.state.cache)
        self.checkpoints = CheckpointWriter(run, config.keep_checkpoints)
        self._last_end: float | None = None  # wall time counts the gaps between batches too

    def train(
        self,
        stop: Callable[[TrainingState], object] = lambda state: False,
        each: Callable[[BatchReport], object] = lambda report: None,
    ) -> TrainingState:
        """Train until `iterations` batches are done in all (forever when it is None)
        or `stop(state)` holds (checked before every batch); `each` sees every batch."""
        try:
            while (self.config.iterations is None or self.state.batch < self.config.iterations) and not stop(
                self.state
            ):
                each(self.train_batch())
        finally:  # however it ends (Ctrl-C too), the newest row and its checkpoint reach the disk
            self.checkpoints.close()
        return self.state

    def train_batch(self) -> BatchReport:
        """One synchronous update: play the batch, sum its gradients, step, log, checkpoint."""
        cfg, state, pool = self.config, self.state, self.pool
        began, clock = time.monotonic(), PhaseClock()
        batch_size, learning_rate, self.optimizer.decay_rate = schedule.update_settings(cfg, state.episodes)
        warmup = schedule.warmup_factor(cfg, state.batch)  # 1 with --warmup off
        self.optimizer.learning_rate = learning_rate * warmup
        episodes = [EpisodeId(cfg.seed, state.batch, k) for k in range(batch_size)]
        grad = state.weights.zeros_like()
        scores: list[float] = []
        lengths: list[int] = []
        durations: list[float] = []
        worker_time: Counter[str] = Counter()
        self.log.begin_batch(state.batch + 1, len(episodes), state.running_reward)

        def finished(result: EpisodeStats) -> None:  # every episode, in episode order
            durations.append(result.seconds)
            scores.append(result.score)
            lengths.append(result.steps)
            worker_time.update(result.timings, record_bytes=result.record_bytes)
            state.running_reward = _running(state.running_reward, result.score)
            self.log.episode(len(scores), sum(lengths), state.running_reward)

        played = pool.play_batch(state.weights, episodes, finished)
        for chunk in played:  # chunk sums, in chunk order (pool/sums.py)
            with clock("sum gradients"):
                chunk.grad.add_to(grad)
        measured = played.measures
        with clock("checkpoint write"):  # the previous batch's, written while this one played:
            self.checkpoints.wait()  # done before the step below changes the arrays it reads
        step = schedule.step_description(cfg, learning_rate, self.optimizer.decay_rate, warmup)
        checked = (state.batch + 1, step, batch_size)
        _check_finite(grad, "the batch's summed gradient", *checked)
        with clock("rmsprop step"):
            self.optimizer.step(state.weights, grad)
        _check_finite(state.weights, "the weights", *checked)
        _check_finite(state.cache, "the RMSProp cache", *checked)

        batch_s = time.monotonic() - began
        state.batch += 1
        state.episodes += len(episodes)
        state.env_steps += sum(lengths)
        state.wall_s += batch_s if self._last_end is None else time.monotonic() - self._last_end
        row = BatchRow.of_batch(
            state,
            batch_s,
            scores,
            lengths,
            workers=pool.num_workers,
            workers_replaced=measured.replaced,
            barrier_s=measured.barrier_s or 0.0,
        )
        phases = dict(measured.phases())  # the pool's own (publish, its summing, the barrier), the driver's below
        for name, seconds in clock.seconds.items():
            phases[name] = phases.get(name, 0.0) + seconds
        self.log.show(row, phases)
        # On disk while the next batch plays; its progress.csv row follows it there.
        self.checkpoints.write(state, then=lambda: self.log.record(row, phases))
        self._last_end = time.monotonic()
        return BatchReport(row, phases, dict(worker_time), durations, measured.bytes_in)


class CheckpointWriter:
    """Writes each batch's checkpoint, then its progress.csv row, in a thread of its
    own while the next batch plays, so the write (checksum, savez, fsync: about
    30 ms) is off the workers' path. One write at a time; wait() returns once both
    are on disk, or raises RunWriteError. The write reads the state's arrays without
    copying them: wait() before changing them.

    A signal (Ctrl-C) never interrupts the write itself, which is in the other thread;
    the trainer waits for it however it stops. Should the process be killed
    mid-write, the checkpoint's rename has not happened and its row was not written:
    the run resumes from the checkpoint before, which has its row. Killed after the
    rename but before the row, the resume passes over that checkpoint too
    (rundir._resume_state) and plays its batch again."""

    def __init__(self, run: Run, keep: int):
        self.run = run
        self.keep = keep
        self._jobs: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name="pgpong-checkpoint", daemon=True)
        self._thread.start()

    def write(self, state: TrainingState, then: Callable[[], None]) -> None:
        if not self._thread.is_alive():
            raise RuntimeError("the checkpoint writer is closed")
        self.wait()
        # The counters change as the next batch plays, so they are copied; the arrays
        # only change in its RMSProp step, which waits for this write first.
        self._jobs.put((dataclasses.replace(state), then))

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            state, then = job
            try:
                save_checkpoint(state, self.run.checkpoint_dir, keep=self.keep)
                then()
            except BaseException as exc:  # handed to the training thread by wait()
                self._error = exc
            finally:
                self._jobs.task_done()
        self._jobs.task_done()

    def wait(self) -> None:
        self._jobs.join()
        error, self._error = self._error, None
        if isinstance(error, OSError):
            raise RunWriteError(f"cannot write to the run directory {self.run.directory}: {error}")
        if error is not None:
            raise error

    def close(self) -> None:
        """Wait for the last write, then let the thread go (once; later calls do nothing)."""
        if not self._thread.is_alive():
            return
        try:
            self.wait()
        finally:
            self._jobs.put(None)
            self._thread.join()


@dataclasses.dataclass
class BatchReport:
    """A batch's row, plus where its time went (for `pgpong bench`)."""

    row: BatchRow
    phases: dict[str, float]  # driver-side seconds: publish, barrier, sum gradients, ...
    worker_time: dict[str, float]  # summed over the batch's episodes: emulator, forward, ...
    durations: list[float]  # each episode's own seconds, in episode order
    bytes_in: int  # gradient bytes the batch sent into the driver


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
