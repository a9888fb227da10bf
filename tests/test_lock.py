"""One writer per run directory: a second trainer is refused at once, naming the
holder; a lock left by a killed trainer blocks nothing."""

import os
import signal
import socket
import subprocess
import time

import numpy as np
import pytest

from conftest import PGPONG, run_pgpong, train_in_process
from pgpong.checkpoint import list_checkpoints, load_checkpoint
from pgpong.rundir import RunBusy, RunLock
from pgpong.runlog import read_progress

SETTINGS = {"seed": 4, "batch_size": 2, "hidden": 16, "max_episode_steps": 300}
FLAGS = ["--seed", "4", "--batch-size", "2", "--hidden", "16", "--max-episode-steps", "300", "--workers", "0"]
FLAGS += ["--checkpoint-every", "0"]  # a checkpoint every batch: the kill below leaves one to resume from


def test_a_held_directory_is_refused_with_the_holder_and_let_go_after(tmp_path):
    first = RunLock(tmp_path / "run")
    with pytest.raises(RunBusy) as caught:
        RunLock(tmp_path / "run")  # a second open file: flock refuses it even in one process
    assert f"in use by pid {os.getpid()} on host {socket.gethostname()}" in str(caught.value)
    first.release()
    assert not (tmp_path / "run").exists()  # made by the lock, never used: removed again
    (tmp_path / "kept").mkdir()
    RunLock(tmp_path / "kept").release()
    assert (tmp_path / "kept").is_dir()


def _start(run_dir, iterations):
    return subprocess.Popen(
        [*PGPONG, "train", *FLAGS, "--iterations", str(iterations), "--run-dir", str(run_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_rows(proc, run_dir, n):
    deadline = time.monotonic() + 60
    while len(read_progress(run_dir / "progress.csv")) < n:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.02)


@pytest.mark.long  # a held run directory refused: the test above
def test_second_trainer_is_refused_within_seconds_and_the_first_is_undisturbed(tmp_path):
    run_dir = tmp_path / "run"
    first = _start(run_dir, 12)
    try:
        _wait_rows(first, run_dir, 1)
        began = time.monotonic()
        second = run_pgpong("train", *FLAGS, "--iterations", "12", "--run-dir", str(run_dir))
        seconds = time.monotonic() - began
        assert second.returncode == 2, second.stderr
        assert f"is in use by pid {first.pid} on host" in second.stderr
        assert len(second.stderr.strip().splitlines()) == 1
        assert seconds < 5, seconds
        assert first.poll() is None  # refused while the first still trains
        out, err = first.communicate(timeout=120)
    finally:
        first.kill() if first.poll() is None else None
    assert first.returncode == 0, err
    alone = train_in_process(tmp_path / "alone", 0, 12, SETTINGS)
    mine = load_checkpoint(list_checkpoints(run_dir / "checkpoints")[-1])
    np.testing.assert_array_equal(mine.weights.W1, alone.weights.W1)
    assert [int(r["batch"]) for r in read_progress(run_dir / "progress.csv")] == list(range(1, 13))


def test_after_kill_9_the_run_resumes_at_once(tmp_path):
    run_dir = tmp_path / "run"
    first = _start(run_dir, 1000)
    _wait_rows(first, run_dir, 2)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)
    resumed = run_pgpong("train", "--run-dir", str(run_dir), "--iterations", "4")
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from batch" in resumed.stdout
