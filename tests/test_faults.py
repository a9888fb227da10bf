"""Faults injected for real: killed workers, workers that cannot run, killed drivers,
damaged checkpoints, full or unwritable disks. Each asserts the defined outcome."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import PGPONG, hang_guard, run_pgpong, train_in_process
from faults import fault_env, set_fault
from pgpong.checkpoint import list_checkpoints, load_checkpoint
from pgpong.config import TrainConfig
from pgpong.policy import Params
from pgpong.pool import Limits, PoolError, WorkerSettings
from pgpong.pool.ray_pool import RayPool
from pgpong.rollout import EpisodeId
from pgpong.runlog import read_progress

SETTINGS = dict(seed=3, batch_size=4, hidden=16, max_episode_steps=500, checkpoint_every=0)  # every batch's
BONUS = TrainConfig().entropy_bonus  # a pool made here plays the default's maths, as the run's config says


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Weights after 1..4 batches without any fault (in-process, no Ray)."""
    return checkpoints_after(tmp_path_factory.mktemp("reference"), {})


def checkpoints_after(root, setting: dict) -> dict:
    """The checkpoints (by batch) of 4 batches with SETTINGS and `setting`, without any fault (in-process)."""
    train_in_process(root / "run", 0, 4, {**SETTINGS, "keep_checkpoints": 4, **setting})
    return {load_checkpoint(p).batch: load_checkpoint(p) for p in list_checkpoints(root / "run" / "checkpoints")}


def assert_same_weights(state, expected):
    np.testing.assert_array_equal(state.weights.W1, expected.weights.W1)
    np.testing.assert_array_equal(state.weights.W2, expected.weights.W2)
    assert state.running_reward == expected.running_reward


@pytest.mark.slow
def test_killed_worker_is_replaced_and_the_batch_is_unchanged(tmp_path, ray_instance, reference, monkeypatch):
    """A worker killed (SIGKILL) at its first episode of batch 2: an event, not a sleep."""
    marker = tmp_path / "killed.pid"
    set_fault(monkeypatch, f"die:1:{marker}")
    pool = RayPool(WorkerSettings("ALE/Pong-v5", int(SETTINGS["max_episode_steps"]), entropy_bonus=BONUS), 2)
    victims = pool.call_all("pid")  # the workers' process ids
    run_dir = tmp_path / "run"
    try:
        state = train_in_process(run_dir, 2, 3, SETTINGS, pool=pool)
    finally:
        pool.close()
    assert int(marker.read_text()) in victims  # the fault happened, to one of the first workers
    assert pool.replaced == 1
    assert_same_weights(state, reference[3])
    rows = read_progress(run_dir / "progress.csv")
    assert [r["workers_replaced"] for r in rows] == ["0", "1", "0"]


@pytest.mark.long
@pytest.mark.slow
def test_a_worker_killed_with_part_of_the_next_batch_in_play_is_replaced_and_the_weights_are_unchanged(
    tmp_path, ray_instance, monkeypatch
):
    """--lag-share 0.5 on the cluster pool (a batch's two parts and the next's first in
    its queue at once): a worker killed at its first match of batch 3, which the batch
    before's last matches overlap, is replaced, and the weights are those of --workers 0."""
    from pgpong.pool.cluster_pool import ClusterPool

    settings = {**SETTINGS, "lag_share": 0.5}
    alone = train_in_process(tmp_path / "alone", 0, 4, settings)
    marker = tmp_path / "killed.pid"
    set_fault(monkeypatch, f"die:2:{marker}")
    pool = ClusterPool(WorkerSettings("ALE/Pong-v5", int(SETTINGS["max_episode_steps"]), entropy_bonus=BONUS), 2)
    try:
        with hang_guard(300):
            state = train_in_process(tmp_path / "run", 2, 4, settings, pool=pool)
    finally:
        pool.close()
    assert marker.exists() and pool.replaced == 1
    assert_same_weights(state, alone)
    np.testing.assert_array_equal(state.previous.W1, alone.previous.W1)


def test_worker_that_cannot_start_ends_with_a_reason(ray_instance, monkeypatch):
    set_fault(monkeypatch, "start")
    with pytest.raises(PoolError, match="could not start.*test fault"):  # gives up instead of retrying forever
        RayPool(WorkerSettings("ALE/Pong-v5", 100), 2)


def test_a_hung_worker_ends_the_batch_at_the_stall_limit(ray_instance, monkeypatch):
    set_fault(monkeypatch, "hang")  # every episode sleeps for an hour
    pool = RayPool(WorkerSettings("ALE/Pong-v5", 50), 2, limits=Limits(stall_s=3.0))  # 600 s in real runs
    try:
        with hang_guard(60), pytest.raises(PoolError, match="no episode finished in 3 s"):
            pool.play_batch(Params.initial(8, 0), [EpisodeId(0, 0, k) for k in range(2)])
    finally:
        pool.close()  # and the hung actors are killed


def test_workers_that_cannot_be_placed_end_at_the_start_limit(ray_instance):
    taken = RayPool(WorkerSettings("ALE/Pong-v5", 50), 2)  # both CPUs of the instance
    try:
        with hang_guard(60), pytest.raises(PoolError, match="no rollout worker started within 3 s"):
            RayPool(WorkerSettings("ALE/Pong-v5", 50), 1, limits=Limits(start_s=3.0))
    finally:
        taken.close()


@pytest.mark.long
def test_worker_that_cannot_start_ends_the_cli_run_with_status_1(tmp_path):
    proc = run_pgpong(
        "train", "--iterations", "1", "--run-dir", str(tmp_path / "run"), env=fault_env("start"), timeout=120
    )
    assert proc.returncode == 1, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("pgpong:")]
    assert len(errors) == 1 and "could not start" in errors[0] and "test fault" in errors[0]
    assert "Traceback" not in proc.stderr


def test_console_line_says_a_worker_was_replaced():
    from pgpong.runlog import BatchRow

    row = BatchRow(
        batch=3,
        episodes=30,
        env_steps=9000,
        wall_s=9.0,
        batch_s=3.0,
        running_reward=-20.0,
        score_mean=-20.5,
        score_min=-21,
        score_max=-19,
        episode_len_mean=900.0,
        steps_per_s=3000.0,
        batch_episodes=10,
        workers=2,
        workers_replaced=1,
    )
    assert "1 worker(s) replaced after a crash" in row.console_line()
    assert "replaced" not in BatchRow(**{**row.__dict__, "workers_replaced": 0}).console_line()


@pytest.mark.long
@pytest.mark.slow
def test_worker_crashing_on_every_episode_ends_the_run_with_status_1(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_pgpong(
        "train",
        "--batch-size",
        "2",
        "--max-episode-steps",
        "200",
        "--hidden",
        "16",
        "--run-dir",
        str(run_dir),
        env=fault_env("crash:1"),
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("pgpong:")]
    assert len(errors) == 1 and "keep failing" in errors[0] and "--run-dir" in errors[0]
    assert "Traceback" not in proc.stderr
    # Batch 1 (index 0) completed before the crashes began: its checkpoint is kept.
    assert [p.name for p in list_checkpoints(run_dir / "checkpoints")] == ["ckpt-000001.npz"]
    assert load_checkpoint(run_dir / "checkpoints" / "ckpt-000001.npz").batch == 1


def cli_settings(run_dir, iterations=4):
    return [
        "--seed",
        "3",
        "--batch-size",
        "4",
        "--hidden",
        "16",
        "--max-episode-steps",
        "500",
        "--keep-checkpoints",
        "4",
        "--checkpoint-every",
        "0",
        "--iterations",
        str(iterations),
        "--run-dir",
        str(run_dir),
    ]


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.parametrize("workers", ["0", "2"])
@pytest.mark.parametrize("cadence", ["0", "60"])
def test_driver_killed_then_resumed_gives_the_uninterrupted_weights(tmp_path, reference, workers, cadence):
    """Killed right after batch 1's row is written (in one process), or once a Ray
    worker has started an episode of batch 3 (mid-batch): events, not delays. With a
    checkpoint after every batch, or once a minute (so none yet: every batch is
    played again)."""
    kill_and_resume(tmp_path, reference, workers, cadence)


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.parametrize(
    "flags, setting", [(("--lag", "1"), {"lag": 1}), (("--lag-share", "0.5"), {"lag_share": 0.5})], ids=["lag", "share"]
)
def test_driver_killed_with_a_batch_submitted_ahead_then_resumed(tmp_path, flags, setting):
    """--lag 1 (or --lag-share 0.5: the batch's first half) on 2 Ray workers (the cluster
    pool, batches overlapping): killed between two checkpoints, once a worker has started
    an episode of batch 3, which was submitted before batch 2 was collected. The resumed
    run plays the lost batches again and ends with the weights and the previous weights
    of the uninterrupted run."""
    reference = checkpoints_after(tmp_path / "reference", setting)
    final = kill_and_resume(tmp_path, reference, "2", "0", *flags)
    np.testing.assert_array_equal(final.previous.W1, reference[4].previous.W1)
    np.testing.assert_array_equal(final.previous.W2, reference[4].previous.W2)


def kill_and_resume(tmp_path, reference, workers, cadence, *more):
    """Train 4 batches with `pgpong train`, SIGKILL it (see the tests above), resume it;
    check the weights against `reference` and return the final checkpoint."""
    run_dir, marker = tmp_path / "run", tmp_path / "batch-3-started"
    # batch index 2 is the third batch; in one process the kill follows batch 1's row
    env = {**os.environ, **fault_env(f"mark:2:{marker}")} if workers != "0" else None
    proc = subprocess.Popen(
        [*PGPONG, "train", *cli_settings(run_dir, 4), "--workers", workers, "--checkpoint-every", cadence, *more],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + 120
        while not (marker.exists() if env else read_progress(run_dir / "progress.csv")):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        os.killpg(proc.pid, signal.SIGKILL) if _group_alive(proc.pid) else None
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    done = len(read_progress(run_dir / "progress.csv"))
    # The kill landed where it was meant to: batch 3 in play (batch 2's row may still be
    # on its way: rows and checkpoints are written while the next batch plays), or batch 2.
    assert done in ((1, 2) if env else (1,))

    checkpoints = [load_checkpoint(p).batch for p in list_checkpoints(run_dir / "checkpoints")]
    if cadence == "60":
        assert checkpoints == []  # none yet: the kill came before the first minute was up
    else:  # a checkpoint, written in the background, may reach the disk before its row: resuming plays it again
        assert checkpoints == list(range(1, len(checkpoints) + 1)) and len(checkpoints) <= done + 1
    resumed = run_pgpong("train", "--run-dir", str(run_dir))  # settings come from the run
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from" in resumed.stdout
    final = load_checkpoint(list_checkpoints(run_dir / "checkpoints")[-1])
    assert final.batch == 4
    assert_same_weights(final, reference[4])
    assert [r["batch"] for r in read_progress(run_dir / "progress.csv")] == ["1", "2", "3", "4"]
    return final


def _group_alive(pgid):
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


@pytest.mark.parametrize(
    "damage", ["truncate", *(pytest.param(d, marks=pytest.mark.long) for d in ("garbage", "wrong-version"))]
)  # (every kind of damage is refused in test_checkpoint and test_hostile_files)
def test_damaged_newest_checkpoint_falls_back_and_says_so(tmp_path, reference, damage):
    run_dir = tmp_path / "run"
    assert run_pgpong("train", *cli_settings(run_dir, 3), "--workers", "0").returncode == 0
    newest = list_checkpoints(run_dir / "checkpoints")[-1]
    if damage == "truncate":
        newest.write_bytes(newest.read_bytes()[:5000])
    elif damage == "garbage":
        newest.write_bytes(os.urandom(4000))
    else:
        with np.load(newest) as data:
            arrays = {k: data[k] for k in data.files}
        arrays["header"] = np.frombuffer(arrays["header"].tobytes().replace(b'"version": 1', b'"version": 7'), np.uint8)
        with open(newest, "wb") as f:
            np.savez(f, **arrays)

    proc = run_pgpong("train", *cli_settings(run_dir, 4), "--workers", "0")
    assert proc.returncode == 0, proc.stderr
    assert f"skipped a bad checkpoint: {newest}" in proc.stdout
    assert "resuming from batch 2" in proc.stdout
    assert_same_weights(load_checkpoint(list_checkpoints(run_dir / "checkpoints")[-1]), reference[4])


@pytest.mark.long  # resuming from the newest checkpoint stays in make test
def test_resume_from_an_explicit_checkpoint(tmp_path, reference):
    run_dir = tmp_path / "run"
    assert run_pgpong("train", *cli_settings(run_dir, 3), "--workers", "0").returncode == 0
    first = run_dir / "checkpoints" / "ckpt-000001.npz"
    proc = run_pgpong("train", *cli_settings(run_dir, 4), "--workers", "0", "--resume-from", str(first))
    assert proc.returncode == 0, proc.stderr
    assert "resuming from batch 1" in proc.stdout
    assert [r["batch"] for r in read_progress(run_dir / "progress.csv")] == ["1", "2", "3", "4"]
    assert_same_weights(load_checkpoint(list_checkpoints(run_dir / "checkpoints")[-1]), reference[4])


def test_resume_from_a_bad_file_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    assert run_pgpong("train", *cli_settings(run_dir, 1), "--workers", "0").returncode == 0
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"PK\x03\x04 not really a zip")
    proc = run_pgpong("train", *cli_settings(run_dir, 2), "--workers", "0", "--resume-from", str(bad))
    assert proc.returncode == 2 and str(bad) in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.long
def test_resume_with_another_env_id_is_refused_but_workers_may_change(tmp_path):
    run_dir = tmp_path / "run"
    assert run_pgpong("train", *cli_settings(run_dir, 1), "--workers", "0").returncode == 0
    proc = run_pgpong("train", *cli_settings(run_dir, 2), "--workers", "0", "--env-id", "Pong-v0")
    assert proc.returncode == 2 and "--env-id ALE/Pong-v5 -> Pong-v0" in proc.stderr
    assert len(read_progress(run_dir / "progress.csv")) == 1
    proc = run_pgpong("train", *cli_settings(run_dir, 2), "--workers", "1")  # now on one Ray worker
    assert proc.returncode == 0, proc.stderr
    assert "resuming from batch 1" in proc.stdout and "on 1 Ray worker(s)" in proc.stdout
    assert [r["workers"] for r in read_progress(run_dir / "progress.csv")] == ["0", "1"]


def test_unwritable_run_directory_is_refused_at_start(tmp_path):
    proc = run_pgpong("train", "--run-dir", "/proc/pgpong-run", "--iterations", "1", "--workers", "0")
    assert proc.returncode == 2, proc.stderr
    assert "cannot write the run directory /proc/pgpong-run" in proc.stderr


@pytest.fixture
def small_disk(tmp_path):
    """A real 3 MB file system (tmpfs), unmounted afterwards."""
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_full_disk_is_refused_at_start(small_disk):
    proc = run_pgpong("train", "--run-dir", str(small_disk / "run"), "--iterations", "1", "--workers", "0")
    assert proc.returncode == 2
    assert "not enough free space" in proc.stderr and "Traceback" not in proc.stderr
    assert list(small_disk.iterdir()) == []


TENSORBOARD_ON_A_FULL_DISK = """
import sys
from pathlib import Path
from pgpong.runlog import BatchRow, TensorBoard
sink = TensorBoard(Path(sys.argv[1]), None, {"seed": 0})
row = BatchRow(1, 2, 900, 1.0, 1.0, -21.0, -21.0, -21, -21, 450.0, 900.0, 2, 1, 0)
sink.end_batch(row, {})
with open(sys.argv[2], "wb", buffering=0) as f:  # fill what is left of the disk
    try:
        while True:
            f.write(bytes(65536))
            f.flush()
    except OSError:
        pass
try:
    for _ in range(100):  # (a file's last page takes a few rows yet)
        sink.end_batch(row, {})
except OSError as exc:
    print("refused:", exc.strerror)
sink.end_batch(row, {})  # given up: nothing more is tried, now or at exit
sink.close()
print("closed")
"""


def test_tensorboard_on_a_full_disk_raises_once_and_leaves_no_traceback(small_disk):
    """A fresh clone's CI run once printed tensorboardX's tracebacks under the run's
    one-line error: its disk filled while TensorBoard's flush, rather than progress.csv,
    was writing, and tensorboardX's writer tried the write again at close and at exit."""
    proc = subprocess.run(
        [sys.executable, "-c", TENSORBOARD_ON_A_FULL_DISK, str(small_disk), str(small_disk / "filler")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout.splitlines() == ["refused: No space left on device", "closed"]


def test_disk_filling_up_mid_run_stops_cleanly_and_keeps_the_last_checkpoint(small_disk):
    run_dir = small_disk / "run"
    proc = subprocess.Popen(
        [
            *PGPONG,
            "train",
            "--hidden",
            "8",
            "--batch-size",
            "1",
            "--max-episode-steps",
            "100",
            "--workers",
            "0",
            "--checkpoint-every",
            "0",
            "--run-dir",
            str(run_dir),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    # checkpoints are written in the background, after their batch's row: wait for the second one itself
    while len(list_checkpoints(run_dir / "checkpoints")) < 2:
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    with open(small_disk / "filler", "wb") as f:  # fill what is left of the disk
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert "No space left on device" in err and "Traceback" not in err
    assert "resume with: " in err and f"-m pgpong train --run-dir {run_dir}" in err
    checkpoints = list_checkpoints(run_dir / "checkpoints")
    assert checkpoints and load_checkpoint(checkpoints[-1]).batch >= 2  # the newest is whole
    assert not list((run_dir / "checkpoints").glob(".*tmp"))  # no half-written file left


@pytest.mark.slow
@pytest.mark.long
def test_a_frozen_worker_is_ended_and_its_episodes_played_elsewhere(tmp_path, ray_instance, reference, monkeypatch):
    """A worker stopped with SIGSTOP at its first episode of batch 2 (an event, not a
    sleep) is ended once silent for the stuck limit, and the weights do not change."""
    marker = tmp_path / "frozen.pid"
    set_fault(monkeypatch, f"stop:1:{marker}")
    floor = 3.0
    pool = RayPool(
        WorkerSettings("ALE/Pong-v5", int(SETTINGS["max_episode_steps"]), entropy_bonus=BONUS),
        2,
        limits=Limits(stuck_floor_s=floor),
    )
    run_dir = tmp_path / "run"
    try:
        with hang_guard(120):
            state = train_in_process(run_dir, 2, 3, SETTINGS, pool=pool)
        limit = pool._watch.limit()
    finally:
        pool.close()
    frozen = int(marker.read_text())  # the fault happened
    deadline = time.monotonic() + 30  # Ray ends a stopped process with SIGKILL after a few seconds
    while os.path.exists(f"/proc/{frozen}") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not os.path.exists(f"/proc/{frozen}")  # the frozen process was ended
    assert pool.replaced == 1
    assert_same_weights(state, reference[3])
    rows = read_progress(run_dir / "progress.csv")
    assert [r["workers_replaced"] for r in rows] == ["0", "1", "0"]
    assert limit >= floor  # the floor, or 10 times the longest episode if that is longer
    assert floor < float(rows[1]["batch_s"]) < limit + 20  # ended after the limit, not at the 600 s stall
