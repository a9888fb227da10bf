"""The training loop: bit-identical across worker counts and across a resume."""

import os
import signal
import time

import numpy as np
import pytest

from conftest import ScriptedPool, train_in_process, train_on
from pgpong.checkpoint import list_checkpoints, load_checkpoint
from pgpong.policy import EpisodeGradient
from pgpong.rmsprop import squared_norm
from pgpong.rundir import open_run
from pgpong.runlog import read_progress

SETTINGS = dict(seed=7, batch_size=4, hidden=32, max_episode_steps=250)
TIME_COLUMNS = {"wall_s", "batch_s", "steps_per_s", "workers", "barrier_s"}


def train(run_dir, workers, iterations, **overrides):
    return train_in_process(run_dir, workers, iterations, {**SETTINGS, **overrides})


def learning_columns(run_dir):
    return [{k: v for k, v in row.items() if k not in TIME_COLUMNS} for row in read_progress(run_dir / "progress.csv")]


@pytest.mark.slow
def test_weights_bit_identical_for_0_1_2_workers(tmp_path, ray_instance):
    states = {w: train(tmp_path / f"w{w}", workers=w, iterations=3) for w in (0, 1, 2)}
    base = states[0]
    assert base.batch == 3 and base.episodes == 12
    initial = open_run(tmp_path / "fresh", SETTINGS).state.weights
    assert not np.array_equal(base.weights.W1, initial.W1)  # it did learn something
    for w in (1, 2):
        np.testing.assert_array_equal(states[w].weights.W1, base.weights.W1)
        np.testing.assert_array_equal(states[w].weights.W2, base.weights.W2)
        np.testing.assert_array_equal(states[w].cache.W1, base.cache.W1)
        assert states[w].running_reward == base.running_reward
        assert learning_columns(tmp_path / f"w{w}") == learning_columns(tmp_path / "w0")


def test_different_seed_gives_different_weights(tmp_path):
    a = train(tmp_path / "a", workers=0, iterations=1)
    b = train(tmp_path / "b", workers=0, iterations=1, seed=8)
    assert not np.array_equal(a.weights.W1, b.weights.W1)


def test_resume_is_bit_identical_to_one_go(tmp_path):
    one_go = train(tmp_path / "one", workers=0, iterations=4)
    train(tmp_path / "split", workers=0, iterations=2)
    resumed = train(tmp_path / "split", workers=0, iterations=4)

    np.testing.assert_array_equal(resumed.weights.W1, one_go.weights.W1)
    np.testing.assert_array_equal(resumed.weights.W2, one_go.weights.W2)
    np.testing.assert_array_equal(resumed.cache.W1, one_go.cache.W1)
    assert resumed.running_reward == one_go.running_reward
    assert (resumed.batch, resumed.episodes, resumed.env_steps) == (one_go.batch, one_go.episodes, one_go.env_steps)
    rows = learning_columns(tmp_path / "split")
    assert [r["batch"] for r in rows] == ["1", "2", "3", "4"]
    assert rows == learning_columns(tmp_path / "one")


def test_checkpoint_after_every_batch_keeps_newest(tmp_path):
    state = train(
        tmp_path / "r",
        workers=0,
        iterations=5,
        keep_checkpoints=2,
        max_episode_steps=50,
        batch_size=1,
        checkpoint_every=0,
    )
    files = list_checkpoints(tmp_path / "r" / "checkpoints")
    assert [f.name for f in files] == ["ckpt-000004.npz", "ckpt-000005.npz"]
    saved = load_checkpoint(files[-1])
    np.testing.assert_array_equal(saved.weights.W1, state.weights.W1)
    assert saved.batch == 5 and saved.episodes == 5
    assert saved.info["env_id"] == "ALE/Pong-v5" and saved.info["hidden"] == 32


def test_running_reward_follows_the_spec(tmp_path):
    scores = [-21.0, -19.0, -20.0, 5.0]
    run = open_run(tmp_path / "r", {**SETTINGS, "batch_size": 2, "iterations": 2})
    train_on(run, ScriptedPool(scores))
    expected, r = [], None
    for s in scores:
        r = s if r is None else 0.99 * r + 0.01 * s
        expected.append(r)
    rows = read_progress(run.progress_path)
    assert [float(row["running_reward"]) for row in rows] == pytest.approx([expected[1], expected[3]], abs=1e-5)
    assert [row["episodes"] for row in rows] == ["2", "4"]
    assert [row["env_steps"] for row in rows] == ["200", "400"]
    assert [float(row["score_mean"]) for row in rows] == [-20.0, -7.5]
    assert run.state.running_reward == expected[-1]


class PoisonedPool(ScriptedPool):
    """Like ScriptedPool, but the gradient of every episode from batch `from_batch` is NaN."""

    def __init__(self, scores, from_batch):
        super().__init__(scores)
        self.from_batch = from_batch

    def results(self, weights, episodes):
        for result in super().results(weights, episodes):
            if result.episode.batch >= self.from_batch:
                result.grad = EpisodeGradient(
                    np.array([5], np.intp), np.full((weights.hidden, 1), np.nan, np.float32), weights.W2 * 0
                )
            yield result


def test_non_finite_gradient_stops_the_run_before_anything_is_written(tmp_path):
    from pgpong.trainer import TrainingDiverged

    run = open_run(tmp_path / "r", {**SETTINGS, "batch_size": 2, "iterations": 3})
    with pytest.raises(TrainingDiverged, match="batch 2: the batch's summed gradient became NaN.*learning rate"):
        train_on(run, PoisonedPool([-21.0] * 6, from_batch=1))
    assert [r["batch"] for r in read_progress(run.progress_path)] == ["1"]
    assert [p.name for p in list_checkpoints(run.checkpoint_dir)] == ["ckpt-000001.npz"]
    assert np.isfinite(load_checkpoint(run.checkpoint_dir / "ckpt-000001.npz").weights.W1).all()


class RecordingPool(ScriptedPool):
    """Notes which episode ids each batch asks for."""

    def __init__(self, scores):
        super().__init__(scores)
        self.asked: list[list] = []

    def play_batch(self, weights, episodes, finished=lambda result: None):
        self.asked.append(list(episodes))
        return super().play_batch(weights, episodes, finished)


def test_batch_i_episode_k_is_played_with_its_own_seed(tmp_path):
    from pgpong.rollout import EpisodeId, episode_seeds

    run = open_run(tmp_path / "r", {**SETTINGS, "batch_size": 2, "iterations": 3})
    pool = RecordingPool([-21.0] * 6)
    train_on(run, pool)
    assert pool.asked == [[EpisodeId(7, i, k) for k in range(2)] for i in range(3)]
    # ... and an episode id means SeedSequence([seed, batch, episode]): one stream for the
    # environment, one for the action draws.
    env_seed, rng = episode_seeds(EpisodeId(7, 2, 1))
    env_stream, action_stream = np.random.SeedSequence([7, 2, 1]).spawn(2)
    assert env_seed == int(env_stream.generate_state(1)[0])
    assert rng.random() == np.random.default_rng(action_stream).random()


class PublishingPool(ScriptedPool):
    """Notes, for each batch, the rows on disk when its weights were published and
    the weights it was published and played with; every episode's gradient moves W2."""

    def __init__(self, scores, progress_path):
        super().__init__(scores)
        self.progress_path = progress_path
        self.batch_of: dict[int, int] = {}  # ticket -> batch
        self.published: dict[int, tuple[int, np.ndarray]] = {}  # batch -> (rows on disk, W2 as published)
        self.played: dict[int, np.ndarray] = {}  # batch -> W2 as played
        self.squares: dict[int, tuple[tuple[float, float] | None, tuple[float, float]]] = {}  # batch -> given, summed

    def results(self, weights, episodes):
        for result in super().results(weights, episodes):
            result.grad.W2 = np.ones_like(weights.W2)
            yield result

    def announce(self, episodes):
        ticket = super().announce(episodes)
        self.batch_of[ticket] = episodes[0].batch
        return ticket

    def publish(self, ticket, weights, squares=None):
        rows = len(read_progress(self.progress_path)) if self.progress_path.exists() else 0
        self.published[self.batch_of[ticket]] = (rows, weights.W2.copy())
        self.squares[self.batch_of[ticket]] = (squares, (squared_norm(weights.W1), squared_norm(weights.W2)))
        super().publish(ticket, weights, squares)

    def play_batch(self, weights, episodes, finished=lambda result: None):
        self.played[episodes[0].batch] = weights.W2.copy()
        return super().play_batch(weights, episodes, finished)


def test_the_next_batchs_weights_go_out_as_soon_as_the_step_is_checked_before_the_row(tmp_path):
    """Without a lag the next batch, announced while this one plays, is published the
    moment the step is made and checked: its matches play while this batch's row and
    logs are written (on disk: the rows of the batches before only), and with the
    weights that step made, unchanged until they are played."""
    run = open_run(tmp_path / "r", {**SETTINGS, "batch_size": 2, "iterations": 4})
    pool = PublishingPool([-21.0] * 8, run.progress_path)
    state = train_on(run, pool)
    assert {batch: rows for batch, (rows, _) in pool.published.items()} == {0: 0, 1: 0, 2: 1, 3: 2}
    for batch, (_, published) in pool.published.items():
        np.testing.assert_array_equal(published, pool.played[batch])
    assert all(not np.array_equal(pool.played[b], pool.played[b + 1]) for b in range(3))  # each step moved W2
    assert len(read_progress(run.progress_path)) == 4 and state.batch == 4
    # With them, the squared norms the step summed: the published weights' own (the
    # first batch's, published before any step, come without).
    assert pool.squares[0][0] is None
    assert all(given == summed for given, summed in (pool.squares[b] for b in (1, 2, 3)))


class FailingPublishPool(ScriptedPool):
    """Its weights cannot be published after the first batch's: `failure` is raised."""

    def __init__(self, scores, failure):
        super().__init__(scores)
        self.failure, self.tries = failure, 0

    def publish(self, ticket, weights, squares=None):
        if ticket > 1:
            self.tries += 1
            raise self.failure
        super().publish(ticket, weights, squares)


def test_a_publish_that_fails_after_the_step_ends_the_run_with_the_batch_saved(tmp_path):
    """The next batch's weights go out before the batch's row: should the pool fail
    (PoolError), the batch is finished and saved first, and that failure ends the run
    as the next batch would have begun, without a second try."""
    from pgpong.pool import PoolError

    run = open_run(tmp_path / "r", {**SETTINGS, "batch_size": 2, "iterations": 4})
    failure = PoolError("the queue is gone")
    pool = FailingPublishPool([-21.0] * 8, failure)
    with pytest.raises(PoolError, match="the queue is gone") as raised:
        train_on(run, pool)
    assert raised.value is failure and pool.tries == 1
    assert [r["batch"] for r in read_progress(run.progress_path)] == ["1"]
    assert [p.name for p in list_checkpoints(run.checkpoint_dir)] == ["ckpt-000001.npz"]


def test_a_bug_in_the_early_publish_is_raised_at_once_not_after_the_row(tmp_path):
    """Only the pool's own failures wait for the row: a bug (here a TypeError, as a
    wrapper of publish() that missed an argument once raised) ends the update where
    it happens, and nothing of that batch is written."""
    run = open_run(tmp_path / "r", {**SETTINGS, "batch_size": 2, "iterations": 4})
    pool = FailingPublishPool([-21.0] * 8, TypeError("publish() takes 3 positional arguments but 4 were given"))
    with pytest.raises(TypeError, match="positional arguments"):
        train_on(run, pool)
    assert pool.tries == 1
    assert read_progress(run.progress_path) == []


def test_the_warm_up_factor_is_the_part_of_the_cache_filled():
    from pgpong.config import TrainConfig
    from pgpong.schedule import warmup_factor

    on = TrainConfig(warmup="on")
    assert warmup_factor(on, 0) == pytest.approx(0.1)  # sqrt(1 - 0.99)
    assert warmup_factor(on, 99) == pytest.approx((1 - 0.99**100) ** 0.5)  # 0.80
    assert warmup_factor(TrainConfig(batch_size=60, warmup="on"), 2) == pytest.approx((1 - 0.94**3) ** 0.5)
    assert warmup_factor(TrainConfig(), 0) == 1.0  # off by default
    # A ramp of 10 -> 30 over 40 matches: updates of 10 (decay 0.99) and 15 (0.985) matches.
    ramp = TrainConfig(batch_size=30, ramp_from=10, ramp_matches=40, warmup="on")
    assert warmup_factor(ramp, 1) == pytest.approx((1 - 0.99 * 0.985) ** 0.5)
    assert warmup_factor(ramp, 100_000) == 1.0  # the cache is full long before; the walk stops early


@pytest.mark.parametrize(("warmup", "first_rate"), [("off", 0.02), ("on", 0.02 * 0.1**0.5)])
def test_a_batch_is_one_rmsprop_step_on_the_summed_episode_gradients(tmp_path, warmup, first_rate):
    """Checked against an independent computation in float64, with non-default
    learning rate, decay and gamma: a swapped or ignored setting fails. The warm-up
    scales the first step's rate by sqrt(1 - decay), the cache's weight after one step."""
    from pgpong.envs import make_env
    from pgpong.policy import Params
    from pgpong.rollout import EpisodeId, play_episode

    settings = {
        **SETTINGS,
        "hidden": 8,
        "batch_size": 2,
        "max_episode_steps": 150,
        "seed": 4,
        "learning_rate": 0.02,
        "decay_rate": 0.9,
        "gamma": 0.95,
        "warmup": warmup,
        "entropy_bonus": 0.0,  # 2016's maths: the step on the plain summed gradients
        "max_update_norm": 0.0,
        "iterations": 1,
        "workers": 0,
    }
    start = Params.initial(8, 4)
    train_in_process(tmp_path / "r2", 0, 1, {k: v for k, v in settings.items() if k not in ("iterations", "workers")})
    trained = load_checkpoint(tmp_path / "r2" / "checkpoints" / "ckpt-000001.npz")

    env = make_env("ALE/Pong-v5", 150)
    total_W1, total_W2 = np.zeros((8, 6400)), np.zeros(8)
    for k in range(2):
        grad = play_episode(env, start, EpisodeId(4, 0, k), gamma=0.95).grad.dense()
        total_W1 += grad.W1
        total_W2 += grad.W2
    for total, w0, got, cache in (
        (total_W1, start.W1, trained.weights.W1, trained.cache.W1),
        (total_W2, start.W2, trained.weights.W2, trained.cache.W2),
    ):
        expected_cache = (1 - 0.9) * total**2  # decay 0.9, the cache starts at zero
        expected = w0 + first_rate * total / (np.sqrt(expected_cache) + 1e-5)
        np.testing.assert_allclose(cache, expected_cache, rtol=1e-4, atol=1e-12)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert np.abs(trained.weights.W1 - start.W1).max() > 1e-3  # the step really moved the weights
    other_gamma = play_episode(env, start, EpisodeId(4, 0, 0), gamma=0.99).grad.dense()
    assert not np.allclose(other_gamma.W2, play_episode(env, start, EpisodeId(4, 0, 0), gamma=0.95).grad.dense().W2)


class Stop(KeyboardInterrupt):
    """What the command line's SIGTERM handler raises."""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_the_checkpoint_write_leaves_every_row_with_its_checkpoint(tmp_path, monkeypatch, signum):
    import pgpong.trainer as trainer_module

    real_save = trainer_module.save_checkpoint
    sent: list[int] = []

    def save_interrupted(state, directory, keep):
        if not sent:
            os.kill(os.getpid(), signum)  # arrives in the middle of the first write
            sent.append(signum)
        return real_save(state, directory, keep=keep)

    def stop(signum, frame):
        raise Stop()

    monkeypatch.setattr(trainer_module, "save_checkpoint", save_interrupted)
    previous = signal.signal(signal.SIGTERM, stop)
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)  # even if this run inherited it ignored
    try:
        run = open_run(tmp_path / "r", {**SETTINGS, "batch_size": 2, "iterations": 3, "checkpoint_every": 0})
        with pytest.raises(KeyboardInterrupt):
            train_on(run, ScriptedPool([-21.0] * 6))
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
    assert sent == [signum]  # it stopped during the first checkpoint's write...
    rows = [r["batch"] for r in read_progress(run.progress_path)]
    assert rows in (["1"], ["1", "2"])  # ...or the next row, written with signals held...
    assert load_checkpoint(list_checkpoints(run.checkpoint_dir)[-1]).batch == int(rows[-1])  # ...and its checkpoint


def test_progress_rows_are_on_disk_before_the_checkpoint_of_their_batch(tmp_path, monkeypatch):
    # Rows are written as batches end, not synced each (an fsync a batch was 4 ms on the
    # workers' path); each checkpoint's write first syncs progress.csv with its row in it.
    import pgpong.trainer as trainer_module

    events: list[tuple[str, int]] = []
    real_sync, real_save = trainer_module.fsync_file, trainer_module.save_checkpoint

    def sync(path):
        if path.name == "progress.csv":
            events.append(("rows synced", len(read_progress(path))))
        return real_sync(path)

    def save(state, directory, keep):
        events.append(("checkpoint", state.batch))
        return real_save(state, directory, keep=keep)

    monkeypatch.setattr(trainer_module, "fsync_file", sync)
    monkeypatch.setattr(trainer_module, "save_checkpoint", save)
    run = open_run(tmp_path / "r", {**SETTINGS, "batch_size": 2, "iterations": 3, "checkpoint_every": 0})
    train_on(run, ScriptedPool([-21.0] * 6))
    saved = [k for what, k in events if what == "checkpoint"]
    assert saved == [1, 2, 3]
    for at, (what, batch) in enumerate(events):  # (later rows may be in the file already: the next batches go on)
        if what == "checkpoint":
            assert at > 0 and events[at - 1][0] == "rows synced" and events[at - 1][1] >= batch


def test_after_a_failed_write_no_checkpoint_is_made_and_none_of_a_batch_without_its_row(tmp_path, monkeypatch):
    # A failed fsync is not retried (a second may succeed where the data was lost), and a
    # batch whose progress.csv row could not be written gets no checkpoint as the run ends.
    import pgpong.trainer as trainer_module
    from pgpong.rundir import RunWriteError
    from pgpong.runlog import RunLog

    real_sync, synced = trainer_module.fsync_file, []

    def sync_failing_once(path):
        synced.append(path.name)
        if synced.count("progress.csv") == 2:
            raise OSError(5, "Input/output error")
        return real_sync(path)

    monkeypatch.setattr(trainer_module, "fsync_file", sync_failing_once)
    run = open_run(tmp_path / "a", {**SETTINGS, "batch_size": 2, "iterations": 4, "checkpoint_every": 0})
    with pytest.raises(RunWriteError, match="Input/output error"):
        train_on(run, ScriptedPool([-21.0] * 8))
    assert [load_checkpoint(p).batch for p in list_checkpoints(run.checkpoint_dir)] == [1]
    monkeypatch.setattr(trainer_module, "fsync_file", real_sync)

    real_record = RunLog.record

    def record_failing_at_batch_2(self, row, phases=None):
        if row.batch == 2:
            raise OSError(28, "No space left on device")
        return real_record(self, row, phases)

    monkeypatch.setattr(RunLog, "record", record_failing_at_batch_2)
    run = open_run(tmp_path / "b", {**SETTINGS, "batch_size": 2, "iterations": 4, "checkpoint_every": 0})
    with pytest.raises(RunWriteError, match="No space left"):
        train_on(run, ScriptedPool([-21.0] * 8))
    assert [r["batch"] for r in read_progress(run.progress_path)] == ["1"]
    assert [load_checkpoint(p).batch for p in list_checkpoints(run.checkpoint_dir)] == [1]


def test_a_batch_ramp_grows_the_batch_and_the_rules_rate_with_the_matches_played(tmp_path, monkeypatch):
    """--ramp-from 10 --batch-size 30 --ramp-matches 40: batches of 10, 15, 22, 30, 30
    (after 0, 10, 25, 47, 77 matches), each stepped with the batch rule's rate and decay
    for its own size; and a run resumed in the middle of a ramp is the one-go run."""
    from pgpong.rmsprop import RMSProp
    from pgpong.rollout import EpisodeId
    from pgpong.schedule import batch_rule

    steps: list[tuple[float, float]] = []
    step = RMSProp.step

    def noted_step(self, weights, grad):
        steps.append((self.learning_rate, self.decay_rate))
        step(self, weights, grad)

    monkeypatch.setattr(RMSProp, "step", noted_step)
    sizes = [10, 15, 22, 30, 30]
    for warmup in ("off", "on"):
        steps.clear()
        ramp = {**SETTINGS, "batch_size": 30, "ramp_from": 10, "ramp_matches": 40, "iterations": 5, "warmup": warmup}
        run = open_run(tmp_path / warmup, ramp)
        pool = RecordingPool([-21.0] * 107)
        train_on(run, pool)
        assert pool.asked == [[EpisodeId(7, i, k) for k in range(b)] for i, b in enumerate(sizes)]
        assert [row["batch_episodes"] for row in read_progress(run.progress_path)] == [str(b) for b in sizes]
        if warmup == "off":
            assert steps == [(0.002, 0.99), (0.0024, 0.985), (0.003, 0.978), (0.0035, 0.97), (0.0035, 0.97)]
            assert steps == [batch_rule(b) for b in sizes]
    # The warm-up: each rate times sqrt(1 - the product of the decays up to its step).
    decays = [0.99, 0.985, 0.978, 0.97, 0.97]
    filled = [1 - float(np.prod(decays[: i + 1])) for i in range(5)]
    assert [d for _, d in steps] == decays
    np.testing.assert_allclose(
        [lr for lr, _ in steps], [batch_rule(b)[0] * f**0.5 for b, f in zip(sizes, filled, strict=True)], rtol=1e-12
    )
    assert steps[0][0] == pytest.approx(0.002 * 0.1) and steps[-1][0] < 0.0035 * 0.4

    monkeypatch.setattr(RMSProp, "step", step)
    settings = {**SETTINGS, "batch_size": 14, "ramp_from": 10, "ramp_matches": 20, "max_episode_steps": 40}
    one_go = train(tmp_path / "one", workers=0, iterations=4, **settings)
    train(tmp_path / "split", workers=0, iterations=2, **settings)
    resumed = train(tmp_path / "split", workers=0, iterations=4, **settings)
    np.testing.assert_array_equal(resumed.weights.W1, one_go.weights.W1)
    np.testing.assert_array_equal(resumed.cache.W1, one_go.cache.W1)
    # batches of 10, 12, 14, 14 after 0, 10, 22 and 36 matches (lr 0.002, 0.0022, 0.0024, 0.0024)
    assert [r["batch_episodes"] for r in learning_columns(tmp_path / "split")] == ["10", "12", "14", "14"]
    assert learning_columns(tmp_path / "split") == learning_columns(tmp_path / "one")


class Clock:
    """time.monotonic for the trainer: each batch played takes 25 s."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self):
        return self.now

    def perf_counter(self):
        return time.perf_counter()


class SlowPool(ScriptedPool):
    def __init__(self, scores, clock):
        super().__init__(scores)
        self.clock = clock

    def play_batch(self, weights, episodes, finished=lambda result: None):
        self.clock.now += 25.0
        return super().play_batch(weights, episodes, finished)


def test_checkpoints_follow_the_cadence_and_the_last_batch_always_gets_one(tmp_path, monkeypatch):
    import pgpong.trainer as trainer_module

    clock = Clock()
    monkeypatch.setattr(trainer_module, "time", clock)
    run = open_run(tmp_path / "r", {**SETTINGS, "batch_size": 2, "iterations": 7, "keep_checkpoints": 9})
    train_on(run, SlowPool([-21.0] * 14, clock))  # --checkpoint-every 60 (the default)
    # 25 s a batch: 75 s after the start at batch 3, 75 s later at batch 6, and at the end
    assert [load_checkpoint(p).batch for p in list_checkpoints(run.checkpoint_dir)] == [3, 6, 7]
    assert [r["batch"] for r in read_progress(run.progress_path)] == [str(b) for b in range(1, 8)]  # a row each


def test_a_run_killed_between_checkpoints_replays_the_batches_since_to_the_same_weights(tmp_path):
    """As if the driver were killed after batch 4's row with its last checkpoint at
    batch 2: the rows after it are dropped, batches 3 and 4 played again."""
    train(tmp_path / "r", workers=0, iterations=4, checkpoint_every=0)
    for batch in (3, 4):
        (tmp_path / "r" / "checkpoints" / f"ckpt-{batch:06d}.npz").unlink()
    assert [r["batch"] for r in read_progress(tmp_path / "r" / "progress.csv")] == ["1", "2", "3", "4"]
    resumed = train(tmp_path / "r", workers=0, iterations=4, checkpoint_every=0)
    one_go = train(tmp_path / "one", workers=0, iterations=4)
    np.testing.assert_array_equal(resumed.weights.W1, one_go.weights.W1)
    np.testing.assert_array_equal(resumed.cache.W2, one_go.cache.W2)
    assert learning_columns(tmp_path / "r") == learning_columns(tmp_path / "one")


@pytest.mark.parametrize("max_update_norm", [None, 0.5])
def test_progress_has_the_diagnostic_columns_and_they_say_what_happened(tmp_path, max_update_norm):
    """The norms against the checkpoints' weights; the played ones within their ranges;
    a binding --max-update-norm makes every update that long."""
    settings = {"max_update_norm": max_update_norm} if max_update_norm else {}
    train(tmp_path / "r", workers=0, iterations=3, max_episode_steps=120, checkpoint_every=0, **settings)
    rows = read_progress(tmp_path / "r" / "progress.csv")
    states = [load_checkpoint(p) for p in list_checkpoints(tmp_path / "r" / "checkpoints")]
    assert [s.batch for s in states] == [1, 2, 3]
    for before, after, row in zip(states, states[1:], rows[1:], strict=False):
        for name in ("W1", "W2"):
            norm = np.linalg.norm(getattr(after.weights, name).astype(np.float64))
            assert float(row[f"{name.lower()}_norm"]) == pytest.approx(norm, rel=1e-5)
        moved = np.sqrt(
            sum(
                np.square(getattr(after.weights, n).astype(np.float64) - getattr(before.weights, n)).sum()
                for n in ("W1", "W2")
            )
        )
        assert float(row["update_norm"]) == pytest.approx(moved, rel=1e-3)
    for row in rows:
        assert 0.3 < float(row["entropy"]) <= np.log(2) + 1e-6
        assert 0 < float(row["p_up"]) < 1 and 0 <= float(row["dead_units"]) <= 1
        assert 0 < float(row["repeat_share"]) < 1 and 0 <= float(row["quick_loss_share"]) <= 1
        if max_update_norm:
            assert float(row["update_clip"]) < 1 and float(row["update_norm"]) == pytest.approx(0.5, rel=1e-4)
        else:
            assert float(row["update_clip"]) == 1 and float(row["update_norm"]) > 1


def test_a_resumed_run_of_an_older_pgpong_gets_nan_in_the_new_columns(tmp_path):
    import csv

    train(tmp_path / "r", workers=0, iterations=2, max_episode_steps=60)
    path = tmp_path / "r" / "progress.csv"
    rows = read_progress(path)
    old = list(rows[0])[: list(rows[0]).index("entropy")]  # the columns before the diagnostics
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, old, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    train(tmp_path / "r", workers=0, iterations=3, max_episode_steps=60)
    again = read_progress(path)
    assert [r["batch"] for r in again] == ["1", "2", "3"]
    assert [r["entropy"] for r in again[:2]] == ["nan", "nan"] and float(again[2]["entropy"]) > 0
    assert list(again[0]) == list(rows[0])  # the header has every column again
