"""The training loop: play a batch (the pool sums its gradients exactly), one RMSProp
step, log a row, and now and then a checkpoint. The run directory it trains in is
opened by rundir.py."""

from __future__ import annotations

import dataclasses
import math
import queue
import secrets
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np

from pgpong import pace, schedule
from pgpong.checkpoint import TrainingState, fsync_dir, fsync_file, save_checkpoint
from pgpong.errors import PgpongError
from pgpong.policy import Params
from pgpong.pool import BatchResult, Finished, Pool, PoolError, StepPlan
from pgpong.rmsprop import RMSProp
from pgpong.rollout import Diagnostics, EpisodeId, EpisodeStats
from pgpong.rundir import Run, RunWriteError
from pgpong.runlog import BatchRow, RunLog

Tickets = tuple[int | None, int | None]  # a batch's two parts in the pool: submitted, announced (None: no such part)
RUNNING_DECAY = 0.99  # running reward: r <- 0.99 r + 0.01 score, after every episode


class TrainingDiverged(PgpongError, RuntimeError):
    """The weights, the RMSProp cache or a gradient became NaN or infinite."""


def _check_finite(finite: bool, what: str, batch: int, step: str, batch_size: int) -> None:
    # Checked before the batch's row and checkpoint are written: the last good
    # checkpoint stays the newest, and no NaN reaches the disk.
    if not finite:
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
        self.optimizer = RMSProp(config.learning_rate, config.decay_rate, self.state.cache, config.max_update_norm)
        self.checkpoints = CheckpointWriter(run, config.keep_checkpoints)
        self._checkpointed = (self.state.batch, time.monotonic())  # the newest checkpoint's batch, and when
        self._last_row: float | None = None  # when the last row was made: wall time counts all between rows
        self._half_done = False  # a batch's update failed between its step and its row: nothing of it is saved
        self._closed = False
        # batch -> the pool's tickets for its two parts and its episodes, put in ahead: the first matches
        # submitted with the weights from before the last update (all with --lag 1, a share with
        # --lag-share, none without), the rest announced, to be published with the weights the update makes
        self._ahead: dict[int, tuple[Tickets, list[EpisodeId]]] = {}
        self._published: set[int] = set()  # announced batches whose weights the step before published
        self._unpublished: PoolError | None = None  # why that failed: raised as the next batch begins
        # Without a lag, the next batch's weights go out as soon as the step is checked;
        # False: as the next call begins (bench's throughput measures run between calls)
        self.publish_early = True
        self._owner = secrets.token_hex(8)  # (which trainer's weights a pool's copy of them is)

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
        finally:  # however it ends (Ctrl-C too), the last finished batch's checkpoint reaches the disk
            self.close()
        return self.state

    def train_batch(self) -> BatchReport:
        """One synchronous update: play the batch and sum its gradients, step, log,
        and checkpoint when --checkpoint-every seconds have passed since the last one."""
        cfg, state, pool = self.config, self.state, self.pool
        began, clock = time.monotonic(), PhaseClock()
        batch_size, learning_rate, self.optimizer.decay_rate = schedule.update_settings(cfg, state.episodes)
        warmup = schedule.warmup_factor(cfg, state.batch)  # 1 with --warmup off
        self.optimizer.learning_rate = learning_rate * warmup
        episodes = [EpisodeId(cfg.seed, state.batch, k) for k in range(batch_size)]
        scores: list[float] = []
        lengths: list[int] = []
        durations: list[float] = []
        worker_time: Counter[str] = Counter(record_bytes=0)
        diagnostics = Diagnostics()
        played_steps = 0
        self.log.begin_batch(state.batch + 1, len(episodes), state.running_reward)

        def finished(result: EpisodeStats) -> None:  # every episode, in episode order
            nonlocal played_steps
            durations.append(result.seconds)
            scores.append(result.score)
            lengths.append(result.steps)
            played_steps += result.steps
            if result.timings:
                worker_time.update(result.timings)
            worker_time["record_bytes"] += result.record_bytes
            if result.diagnostics is not None:
                diagnostics.add(result.diagnostics)
            state.running_reward = _running(state.running_reward, result.score)
            self.log.episode(len(scores), played_steps, state.running_reward)

        playing = state.weights if state.previous is None else state.previous  # lagged: the weights before
        played = self._play(playing, episodes, finished)  # the exact sum of its gradients
        step = schedule.step_description(cfg, learning_rate, self.optimizer.decay_rate, warmup)
        checked = (state.batch + 1, step, batch_size)
        grad = played.grad
        _check_finite(
            bool(np.isfinite(grad.W1_columns).all() and np.isfinite(grad.W2).all()),
            "the batch's summed gradient",
            *checked,
        )
        with signals_held():  # the step, the counters and the row: all of the batch or none of it
            self._half_done = True  # until the step is finite and the row written: nothing of it may be saved
            if cfg.lagged:  # the next batch plays (some of its matches with) the weights from before this update
                state.previous = Params.of(state.weights.W1, state.weights.W2)
            with clock("rmsprop step"):
                self.optimizer.step(state.weights, grad)
            _check_finite(self.optimizer.weights_finite, "the weights", *checked)
            _check_finite(self.optimizer.cache_finite, "the RMSProp cache", *checked)
            self._publish_next()  # its matches start now, while this batch's row and logs are written
            now = time.monotonic()
            batch_s = now - began
            state.batch += 1
            state.episodes += len(episodes)
            state.env_steps += sum(lengths)
            state.wall_s += batch_s if self._last_row is None else now - self._last_row
            self._last_row = now
            measured = played.measures
            row = BatchRow.of_batch(
                state,
                batch_s,
                scores,
                lengths,
                workers=pool.num_workers,
                workers_replaced=measured.replaced,
                barrier_s=measured.barrier_s or 0.0,
                diagnostics=self._diagnostic_columns(diagnostics),
            )
            saving = None
            if time.monotonic() - self._checkpointed[1] >= cfg.checkpoint_every:
                with clock("checkpoint write"):  # a snapshot, written in the background while the next batch plays
                    saving = snapshot(state)
            phases = {**measured.phases(), **clock.seconds}  # the pool's (publish, its summing, barrier), the driver's
            try:  # (TensorBoard's event file too is in the run directory)
                self.log.show(row, phases)
                note = pace.slow_run_note(cfg, state.env_steps - sum(lengths), state.env_steps, state.running_reward)
                if note:
                    self.log.note(note, pace.LIVE_TAG)
                self.log.record(row, phases)
            except OSError as exc:
                raise RunWriteError.of(self.run.directory, exc) from None
            self._half_done = False
            if saving is not None:  # after the row, which the write makes durable first
                self.checkpoint(saving)
        return BatchReport(row, phases, dict(worker_time), durations, measured.bytes_in, measured.node_seconds)

    def _play(self, weights: Params, episodes: list[EpisodeId], finished: Finished) -> BatchResult:
        """Play the batch, and put the next one in the pool first. Without a lag the
        next is announced, to be published with the weights this update makes: a pool
        that can (a cluster's) hands its matches out to the workers that free up
        meanwhile, and they start the moment the weights come. With --lag 1 the next
        batch plays the weights as they are now, before this batch's update, so it is
        submitted with them: a cluster's pool starts it while this batch's last
        matches play. With --lag-share the next batch's first matches are submitted
        so, and the rest announced: the batch is collected in those two parts, and
        its sum is theirs (`weights`: what the first part plays)."""
        cfg, state, pool = self.config, self.state, self.pool
        tickets, put_in = self._ahead.pop(state.batch, (None, episodes))  # put in the pool by the batch before
        if put_in != episodes:  # (the schedule gives each batch's size from the episodes before it alone)
            raise RuntimeError(f"batch {state.batch + 1} was put in the pool ahead with other episodes")
        if tickets is None:  # (the first batch of a run, or of a resume)
            tickets = self._put_in(weights, episodes)
        fresh = tickets[1]  # the announced part
        if self._unpublished is not None:  # (the batch before is saved: now the run ends with it)
            failed, self._unpublished = self._unpublished, None
            raise failed
        if fresh is not None and state.batch not in self._published:
            pool.publish(fresh, state.weights)
        self._published.discard(state.batch)
        following = state.batch + 1
        if cfg.iterations is None or following < cfg.iterations:
            size, _, _ = schedule.update_settings(cfg, state.episodes + len(episodes))
            ahead = [EpisodeId(cfg.seed, following, k) for k in range(size)]
            self._ahead[following] = (self._put_in(state.weights, ahead, like=fresh), ahead)
        parts = [ticket for ticket in tickets if ticket is not None]  # in episode order
        return pool.collect(parts, finished, self._plan(following))

    def _put_in(self, weights: Params, episodes: list[EpisodeId], like: int | None = None) -> Tickets:
        """A batch into the pool: its first matches (all with --lag 1, the --lag-share
        of them, or none) submitted with `weights` (those of the batch in play at
        ticket `like`, if any: the pool may reuse them), the rest announced; their tickets."""
        stale = self.config.stale_matches(len(episodes))
        submitted = self.pool.submit(weights, episodes[:stale], like) if stale else None
        return submitted, self.pool.announce(episodes[stale:]) if stale < len(episodes) else None

    def _plan(self, following: int) -> StepPlan | None:
        """The step this batch's update will take, for the next batch's announced part
        (None if it has none, or its weights must wait for the trainer: bench): a pool
        that can (a cluster's) takes it ahead of the trainer, where the batch's total
        arrives, and publishes that part's weights at once; the trainer's own step
        must give the same ones, which its publish checks (pool/ahead.py)."""
        state, optimizer = self.state, self.optimizer
        announced = self._ahead[following][0][1] if following in self._ahead else None
        if announced is None or not self.publish_early:
            return None
        return StepPlan(
            announced,
            self._owner,
            state.batch,
            optimizer.learning_rate,
            optimizer.decay_rate,
            optimizer.max_update_norm,
            state.weights,
            optimizer.cache,
        )

    def _publish_next(self) -> None:
        """The next batch's announced part (all of it without a lag, none with --lag 1)
        gets the weights this update made, as soon as they are checked, so that its
        matches play while the trainer writes this batch's row and logs (and while whoever
        called it looks at them): none of that is on the workers' path."""
        following = self.state.batch + 1
        if not self.publish_early or following not in self._ahead:
            return
        announced = self._ahead[following][0][1]
        if announced is None:  # (--lag 1: none of the batch waits for these weights)
            return
        try:
            self.pool.publish(announced, self.state.weights, self.optimizer.weight_squares)  # (the step's)
        except PoolError as failed:  # (raised by the next call: this batch is saved first; a bug raises at once)
            self._unpublished = failed
            return
        self._published.add(following)

    def _diagnostic_columns(self, played: Diagnostics) -> dict[str, float]:
        """The row's diagnostics: the batch's episodes' (added in episode order) and
        the norms of the weights and of the update, from the step."""
        columns = {
            "w1_norm": math.sqrt(self.optimizer.weight_squares[0]),  # (summed in the step, as numpy sums)
            "w2_norm": math.sqrt(self.optimizer.weight_squares[1]),
            "update_norm": self.optimizer.last_update_norm,
            "update_clip": self.optimizer.last_clip,
        }
        if played.steps:  # pools that play no real matches (bench's simulation) measure none
            columns["entropy"] = played.entropy / played.steps
            columns["p_up"] = played.p_up / played.steps
            columns["repeat_share"] = played.repeats / played.steps
        if played.fired is not None:
            columns["dead_units"] = 1 - float(played.fired.mean())
        if played.losses:
            columns["quick_loss_share"] = played.quick_losses / played.losses
        return columns

    def checkpoint(self, saving: TrainingState | None = None) -> None:
        """Write the state as it is now (`saving`, its snapshot, or one made here) in
        the background, unless its batch has a checkpoint already; raise if an earlier
        write failed."""
        if self._checkpointed[0] != self.state.batch:
            self.checkpoints.write(saving if saving is not None else snapshot(self.state))
        self._checkpointed = (self.state.batch, time.monotonic())

    def close(self) -> None:
        """Checkpoint the last finished batch if it has none, and wait until it is on disk
        (a batch submitted ahead, or being played, is dropped from the pool: it is
        played again on resume). Once: a later call does nothing."""
        if self._closed:
            return
        self._closed = True
        try:
            if not self._half_done:
                with signals_held():
                    self.checkpoint()
        finally:
            try:
                self.checkpoints.close()
            finally:
                self._ahead.clear()
                self._published.clear()
                self._unpublished = None
                self.pool.cancel()


def snapshot(state: TrainingState) -> TrainingState:
    """A copy of the state that later steps do not change (about 10 MB: a few ms)."""
    previous = None if state.previous is None else Params.of(state.previous.W1, state.previous.W2)
    return dataclasses.replace(
        state,
        weights=Params.of(state.weights.W1, state.weights.W2),
        cache=Params.of(state.cache.W1, state.cache.W2),
        previous=previous,
    )


@contextmanager
def signals_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait until the block is done: noted meanwhile, then raised
    again for the handlers they had (in the main thread, where Python runs them)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {signum: signal.signal(signum, lambda signum, frame: caught.append(signum)) for signum in HELD}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for number in caught:
            signal.raise_signal(number)


HELD = (signal.SIGINT, signal.SIGTERM)


class CheckpointWriter:
    """Writes checkpoints in a thread of its own while the next batches play, so the
    write (checksum, savez, fsync: about 30 ms for 10 MB) is off the workers' path.
    It is given snapshots (copies), so training goes on meanwhile. One write at a
    time; wait() returns once the last is on disk, or raises RunWriteError.

    A signal (Ctrl-C) never interrupts the write itself, which is in the other thread;
    the trainer waits for it however it stops. Should the process be killed
    mid-write, the checkpoint's rename has not happened: the run resumes from the one
    before, and progress.csv's rows after it are dropped and their batches played
    again, to the same weights (rundir.py)."""

    def __init__(self, run: Run, keep: int):
        self.run = run
        self.keep = keep
        self._jobs: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name="pgpong-checkpoint", daemon=True)
        self._thread.start()

    def write(self, state: TrainingState) -> None:
        if not self._thread.is_alive():
            raise RuntimeError("the checkpoint writer is closed")
        self.wait()
        self._jobs.put(state)

    def _serve(self) -> None:
        while (state := self._jobs.get()) is not None:
            try:
                fsync_file(self.run.progress_path)  # the rows up to the checkpoint's, on disk before it
                fsync_dir(self.run.directory)
                save_checkpoint(state, self.run.checkpoint_dir, keep=self.keep)
            except BaseException as exc:  # handed to the training thread by wait()
                self._error = exc
            finally:
                self._jobs.task_done()
        self._jobs.task_done()

    def wait(self) -> None:
        """Until the last write is done; raises its error, or an earlier one's: after a
        failed write none is made (a second fsync may succeed where data was lost)."""
        self._jobs.join()
        error = self._error
        if isinstance(error, OSError):
            raise RunWriteError.of(self.run.directory, error)
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
    node_phases: dict[str, float] = dataclasses.field(default_factory=dict)  # a node leader's seconds, on clusters


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
