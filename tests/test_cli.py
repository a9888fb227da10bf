"""The command line end to end, in subprocesses, on real Ray and the real ALE (input
refused before any work in this process, conftest.run_here)."""

import dataclasses
import json
import signal
import subprocess
import sys
import time

import pytest

from conftest import PGPONG, run_here, run_pgpong
from pgpong.checkpoint import list_checkpoints, load_checkpoint
from pgpong.runlog import read_progress


def assert_one_line_error(proc, *words):
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for word in words:
        assert word in lines[0], lines[0]


def test_help_lists_every_setting():
    proc = run_pgpong("train", "--help")
    assert proc.returncode == 0
    for flag in (
        "--env-id",
        "--hidden",
        "--batch-size",
        "--learning-rate",
        "--lr",
        "--gamma",
        "--decay-rate",
        "--iterations",
        "--workers",
        "--seed",
        "--run-dir",
        "--address",
        "BLAS",
    ):
        assert flag in proc.stdout, flag
    text = " ".join(proc.stdout.split())
    assert "(default: 200)" in text and "(default: ALE/Pong-v5)" in text and "(default: no limit)" in text


@pytest.mark.slow
def test_train_end_to_end_on_ray(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_pgpong("train", "--iterations", "2", "--batch-size", "2", "--run-dir", str(run_dir))
    assert proc.returncode == 0, proc.stderr
    assert "Ray worker" in proc.stdout
    assert (run_dir / "config.json").exists()
    rows = read_progress(run_dir / "progress.csv")
    assert [r["batch"] for r in rows] == ["1", "2"]
    for column in (
        "batch",
        "episodes",
        "env_steps",
        "wall_s",
        "batch_s",
        "running_reward",
        "score_mean",
        "score_min",
        "score_max",
        "episode_len_mean",
        "steps_per_s",
    ):
        assert column in rows[0]
    assert int(rows[1]["episodes"]) == 4
    assert float(rows[0]["episode_len_mean"]) > 500  # full matches
    state = load_checkpoint(list_checkpoints(run_dir / "checkpoints")[-1])
    assert state.batch == 2 and state.weights.W1.shape == (200, 6400)


NO_RAY_TRAIN = """
import sys
from pgpong.cli import main
status = main(sys.argv[1:])
print("ray imported" if "ray" in sys.modules else "no ray")
sys.exit(status)
"""


@pytest.mark.parametrize("env_id", ["ALE/Pong-v5", "Pong-v0", "PongNoFrameskip-v4"])
def test_workers_0_trains_any_pong_id_without_ray_and_config_json_says_how(tmp_path, env_id):
    import json
    import sys

    run_dir = tmp_path / "run"
    settings = ["train", "--env-id", env_id, "--workers", "0", "--iterations", "1", "--batch-size", "1"]
    settings += ["--max-episode-steps", "40", "--hidden", "8", "--seed", "3", "--run-dir", str(run_dir)]
    proc = subprocess.run([sys.executable, "-c", NO_RAY_TRAIN, *settings], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "no ray"  # --workers 0 never even imports Ray
    assert "this process (no Ray)" in proc.stdout
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved["config"] == {
        "env_id": env_id,
        "hidden": 8,
        "batch_size": 1,
        "ramp_from": None,
        "ramp_matches": 1000,
        "learning_rate": 2e-3,
        "warmup": "off",
        "entropy_bonus": 0.01,
        "w2_init_scale": 1.0,
        "max_update_norm": 4.0,
        "lag": 0,
        "lag_share": 0.0,
        "gamma": 0.99,
        "decay_rate": 0.99,
        "seed": 3,
        "max_episode_steps": 40,
        "iterations": 1,
        "workers": 0,
        "workers_per_cpu": 1.0,
        "keep_checkpoints": 3,
        "checkpoint_every": 60.0,
    }
    assert saved["ray_address"] == "local" and "--env-id" in saved["command"]
    assert {"pgpong", "numpy", "gymnasium", "ale-py", "ray"} <= set(saved["versions"])
    assert saved["versions"]["ale-py"] and saved["written"][:2] == "20"
    (row,) = read_progress(run_dir / "progress.csv")
    assert row["env_steps"] == "40"  # one episode, cut at 40 steps
    state = load_checkpoint(list_checkpoints(run_dir / "checkpoints")[-1])
    assert state.info["env_id"] == env_id and state.weights.hidden == 8


BAD_INPUTS = [
    (["--batch-size", "0"], ["--batch-size"]),
    (["--learning-rate", "-0.1"], ["--learning-rate"]),
    (["--hidden", "0"], ["--hidden"]),
    (["--gamma", "1.5"], ["--gamma"]),
    (["--workers", "-1"], ["--workers"]),
    (["--workers-per-cpu", "0.5"], ["--workers-per-cpu must be auto or in [1, 4], got 0.5"]),
    (["--workers-per-cpu", "nan"], ["--workers-per-cpu must be auto or in [1, 4], got nan"]),
    (["--workers-per-cpu", "some"], ["--workers-per-cpu: must be auto or in [1, 4], got 'some'"]),
    (["--hidden", "many"], ["--hidden", "many"]),
    (["--env-id", "Pong-v9"], ["Pong-v9", "unknown environment", "PongNoFrameskip-v4"]),
    (["--env-id", "ALE/Breakout-v5"], ["ALE/Breakout-v5", "is not Pong", "ALE/Pong-v5"]),
    (["--lr", "1e30"], ["--learning-rate", "1e+30"]),
    (["--lr", "inf"], ["--learning-rate", "inf"]),
    (["--lr", "nan"], ["--learning-rate", "nan"]),
    (["--hidden", "100000"], ["--hidden", "at most"]),
    (["--decay-rate", "1"], ["--decay-rate"]),
    (["--entropy-bonus", "-0.01"], ["--entropy-bonus", "-0.01"]),
    (["--entropy-bonus", "nan"], ["--entropy-bonus", "nan"]),
    (["--w2-init-scale", "0"], ["--w2-init-scale", "(0, 100]"]),
    (["--max-update-norm", "-1"], ["--max-update-norm", "0 (none) or positive"]),
    (["--lag-share", "1.5"], ["--lag-share must be in [0, 1], got 1.5"]),
    (["--lag", "1", "--lag-share", "0.5"], ["--lag-share is for runs without --lag"]),
    (["--seed", "-1"], ["--seed"]),
    (["--batch-size", "1" + "0" * 400], ["--batch-size must be at least 1 and at most 8192"]),
    (["--max-episode-steps", "0"], ["--max-episode-steps"]),
    (["--keep-checkpoints", "0"], ["--keep-checkpoints"]),
    (["--iterations", "-1"], ["--iterations"]),
    (["--iterations", "0"], ["--iterations must be at least 1 (leave it out for no limit), got 0"]),
    (["--address", "localhost:99999"], ["localhost:99999", "port 99999 is out of range"]),
    (["--address", "http://127.0.0.1:8265"], ["dashboard", "GCS address"]),
    (["--address", "head..lab:6379"], ["'head..lab' is not a host name or IP address"]),
    (["--address", "localhost:\u00b2"], ["is not HOST:PORT"]),
    (["--address", " "], ["argument --address: an empty address", "HOST:PORT"]),  # "$HEAD" unset: not a local Ray
]


@pytest.mark.parametrize("flags, words", BAD_INPUTS, ids=[" ".join(f) for f, _ in BAD_INPUTS])
def test_bad_input_exits_2_and_writes_nothing(tmp_path, flags, words, capsys, monkeypatch):
    limit = [] if "--iterations" in flags else ["--iterations", "1"]
    monkeypatch.chdir(tmp_path)
    proc = run_here(capsys, "train", *flags, *limit)
    assert_one_line_error(proc, *words)
    assert list(tmp_path.iterdir()) == []


def test_unreachable_address_fails_fast(tmp_path):
    # The subprocess timeout is the hang guard: ray.init alone would retry for minutes.
    proc = run_pgpong("train", "--address", "127.0.0.1:1", "--run-dir", str(tmp_path / "r"), timeout=30)
    assert_one_line_error(proc, "127.0.0.1:1")
    assert not (tmp_path / "r").exists()


def test_ray_address_environment_variable_is_honoured(tmp_path):
    proc = run_pgpong("train", "--run-dir", str(tmp_path / "r"), env={"RAY_ADDRESS": "127.0.0.1:1"}, timeout=60)
    assert_one_line_error(proc, "127.0.0.1:1")


@pytest.mark.parametrize(
    "command", [["study", "--grid", "lr=1e-3"], ["bench", "--simulate", "1x2"], ["play"], ["train"]]
)
def test_an_empty_address_is_refused_by_every_command(tmp_path, command):
    flag = "--redis-address" if command == ["train"] else "--address"
    proc = run_pgpong(*command, flag, "", cwd=tmp_path)
    assert_one_line_error(proc, f"pgpong {command[0]}: error: argument {flag}: an empty address")
    assert list(tmp_path.iterdir()) == []


LONG = "7" * 5000


@pytest.mark.parametrize(
    "args",
    [["train", "--batch-size", LONG], ["study", "s", "--grid", f"batch-size={LONG}"], ["play", "--episodes", LONG]],
)
def test_a_number_of_thousands_of_digits_is_not_echoed_whole(tmp_path, args):
    proc = run_pgpong(*args, cwd=tmp_path)
    assert_one_line_error(proc, "77777777777777777777... (5,000 digits)")
    assert len(proc.stderr) < 300 and list(tmp_path.iterdir()) == []


def test_redis_address_is_an_alias(tmp_path):
    proc = run_pgpong("train", "--redis-address", "127.0.0.1:1", "--run-dir", str(tmp_path / "r"), timeout=60)
    assert proc.returncode == 2
    assert "old name" in proc.stderr and "127.0.0.1:1" in proc.stderr


def test_run_dir_that_is_a_file(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    proc = run_pgpong("train", "--run-dir", str(f), "--iterations", "1")
    assert_one_line_error(proc, str(f), "not a directory")
    assert f.read_text() == "x"


def test_resume_refuses_other_learning_settings(tmp_path):
    run_dir = tmp_path / "r"
    common = ["--workers", "0", "--batch-size", "1", "--max-episode-steps", "50", "--run-dir", str(run_dir)]
    assert run_pgpong("train", *common, "--hidden", "16", "--iterations", "1").returncode == 0
    proc = run_pgpong("train", *common, "--hidden", "32", "--iterations", "2")
    assert_one_line_error(proc, "--hidden 16 -> 32")
    proc = run_pgpong("train", *common, "--iterations", "2")  # hidden 16 comes from the run
    assert proc.returncode == 0, proc.stderr
    assert "resuming from batch 1" in proc.stdout
    assert len(read_progress(run_dir / "progress.csv")) == 2


def wait_for_rows(path, count, proc, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and len(read_progress(path)) >= count:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    raise AssertionError(f"no {count} rows in {path}")


# pgpong as started from a terminal: Ctrl-C raises KeyboardInterrupt. (A test run
# started as a background job inherits SIGINT ignored, and so would pgpong.)
AS_IN_A_TERMINAL = [
    sys.executable,
    "-c",
    "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "from pgpong.cli import main; sys.exit(main(sys.argv[1:]))",
]


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupt_keeps_checkpoint_and_prints_resume(tmp_path, signum, status):
    run_dir = tmp_path / "r"
    proc = subprocess.Popen(
        [*AS_IN_A_TERMINAL, "train", "--batch-size", "2", "--max-episode-steps", "400", "--run-dir", str(run_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_rows(run_dir / "progress.csv", 2, proc)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=20)  # the hang guard: it stops within seconds
    finally:
        if proc.poll() is None:  # it hung: leave nothing running
            proc.kill()
            proc.communicate()
    assert proc.returncode == status, err
    assert "Traceback" not in err
    assert f"pgpong train --run-dir {run_dir}" in err
    done = len(read_progress(run_dir / "progress.csv"))
    assert done >= 2
    assert load_checkpoint(list_checkpoints(run_dir / "checkpoints")[-1]).batch == done


def test_an_address_where_something_else_listens_is_refused(tmp_path):
    import http.server
    import threading

    server = http.server.HTTPServer(("0.0.0.0", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        # The subprocess timeout is the hang guard (pgpong answers within 15 s).
        proc = run_pgpong(
            "train", "--address", f"127.0.0.1:{server.server_port}", "--run-dir", str(tmp_path / "r"), timeout=40
        )
    finally:
        server.shutdown()
    assert_one_line_error(proc, f"127.0.0.1:{server.server_port}", "no Ray cluster answers")
    assert not (tmp_path / "r").exists()


def test_resume_from_a_checkpoint_of_another_run_is_refused(tmp_path):
    common = ["--workers", "0", "--batch-size", "1", "--max-episode-steps", "30", "--hidden", "8", "--iterations", "1"]
    assert run_pgpong("train", *common, "--run-dir", str(tmp_path / "a")).returncode == 0
    assert (
        run_pgpong("train", *common, "--lr", "0.01", "--env-id", "Pong-v0", "--run-dir", str(tmp_path / "b")).returncode
        == 0
    )
    foreign = tmp_path / "b" / "checkpoints" / "ckpt-000001.npz"
    proc = run_pgpong("train", *common[:-1], "2", "--run-dir", str(tmp_path / "a"), "--resume-from", str(foreign))
    assert_one_line_error(proc, "ckpt-000001.npz", "--env-id Pong-v0 (this run: ALE/Pong-v5)", "--learning-rate 0.01")
    weights_only = tmp_path / "w.npz"
    import numpy as np

    np.savez(weights_only, W1=np.zeros((8, 6400), np.float32), W2=np.zeros(8, np.float32))
    proc = run_pgpong("train", *common[:-1], "2", "--run-dir", str(tmp_path / "a"), "--resume-from", str(weights_only))
    assert_one_line_error(proc, "w.npz", "pgpong play")
    assert len(read_progress(tmp_path / "a" / "progress.csv")) == 1


def test_finished_run_says_how_to_continue_and_workers_0_ignores_an_address_and_workers_per_cpu(tmp_path):
    common = ["--workers", "0", "--batch-size", "1", "--max-episode-steps", "30", "--hidden", "8"]
    proc = run_pgpong(
        "train",
        *common,
        "--iterations",
        "1",
        "--address",
        "127.0.0.1:1",
        "--run-dir",
        str(tmp_path / "r"),
        "--workers-per-cpu",
        "2",
    )
    assert proc.returncode == 0 and "--workers 0 plays in this process" in proc.stderr
    assert "--workers-per-cpu 2 is not used" in proc.stderr
    import json

    assert json.loads((tmp_path / "r" / "config.json").read_text())["ray_address"] == "local"
    proc = run_pgpong("train", "--run-dir", str(tmp_path / "r"))
    assert proc.returncode == 0
    assert "already has its 1 batches" in proc.stdout and "--iterations 2" in proc.stdout
    proc = run_pgpong("train", "--run-dir", str(tmp_path / "r"), "--iterations", "2", "--workers-per-cpu", " Auto")
    assert proc.returncode == 0 and "--workers-per-cpu auto is not used" in proc.stderr  # a resumed run may change it
    assert json.loads((tmp_path / "r" / "config.json").read_text())["config"]["workers_per_cpu"] == "auto"


@pytest.mark.long
@pytest.mark.slow
def test_more_workers_than_cpus_runs_what_fits_and_records_it(tmp_path):
    import json

    proc = run_pgpong(
        "train",
        "--workers",
        "50",
        "--iterations",
        "1",
        "--batch-size",
        "2",
        "--max-episode-steps",
        "30",
        "--run-dir",
        str(tmp_path / "r"),
        env={"RAY_ADDRESS": ""},
    )
    assert proc.returncode == 0, proc.stderr
    assert "50 workers asked" in proc.stderr
    cpus = int(proc.stderr.split("has ")[1].split(" CPU")[0])
    assert f"on {cpus} Ray worker(s)" in proc.stdout
    assert json.loads((tmp_path / "r" / "config.json").read_text())["config"]["workers"] == cpus


@pytest.mark.long  # a run's first line: test_cli's others; the rule's rates in training: test_trainer
def test_the_first_line_config_and_checkpoint_say_the_learning_rate(tmp_path):
    common = ["train", "--workers", "0", "--iterations", "1", "--hidden", "8", "--max-episode-steps", "10"]
    proc = run_pgpong(*common, "--batch-size", "60", "--run-dir", str(tmp_path / "default"))
    assert proc.returncode == 0, proc.stderr
    # No --lr: the batch rule's values for 60 (docs/LEARNING.md), said on the first line.
    assert "batch 60, lr 0.0049 = 0.002 x sqrt(60/10), RMSProp decay 0.94 = 1 - 0.01 x 60/10 (the batch rule)" in (
        proc.stdout
    )
    config = json.loads((tmp_path / "default" / "config.json").read_text())["config"]
    assert (config["learning_rate"], config["decay_rate"]) == (0.0049, 0.94)
    info = load_checkpoint(list_checkpoints(tmp_path / "default" / "checkpoints")[-1]).info
    assert (info["learning_rate"], info["decay_rate"]) == (0.0049, 0.94)
    proc = run_pgpong(*common, "--batch-size", "60", "--lr", "1e-3", "--run-dir", str(tmp_path / "given"))
    assert proc.returncode == 0, proc.stderr
    assert "batch 60, lr 0.001, RMSProp decay 0.94 (given; the batch rule would use --lr 0.0049" in proc.stdout
    config = json.loads((tmp_path / "given" / "config.json").read_text())["config"]
    assert (config["learning_rate"], config["decay_rate"]) == (1e-3, 0.94)  # --lr wins; the decay still follows
    proc = run_pgpong("train", "--run-dir", str(tmp_path / "given"), "--iterations", "2")  # resumed: its own rate
    assert proc.returncode == 0 and "lr 0.001" in proc.stdout, proc.stderr
    proc = run_pgpong(*common, "--run-dir", str(tmp_path / "ten"))  # batch 10: 2e-3 and 0.99
    assert proc.returncode == 0 and "batch 10, lr 0.002, RMSProp decay 0.99 (the batch rule" in proc.stdout
    assert "warm-up" not in proc.stdout  # off by default
    proc = run_pgpong(*common, "--batch-size", "60", "--warmup", "on", "--run-dir", str(tmp_path / "on"))
    assert proc.returncode == 0, proc.stderr
    assert "(the batch rule); warm-up: lr x sqrt(1 - 0.94^t) at update t (x0.24 at the first, x1 at the 100th)" in (
        proc.stdout
    )
    assert json.loads((tmp_path / "on" / "config.json").read_text())["config"]["warmup"] == "on"
    assert load_checkpoint(list_checkpoints(tmp_path / "on" / "checkpoints")[-1]).info["warmup"] == "on"
    proc = run_pgpong("train", "--run-dir", str(tmp_path / "on"), "--iterations", "2")  # resumed: where it is
    assert proc.returncode == 0 and "warm-up: lr x 0.34 at update 2" in proc.stdout, proc.stderr  # sqrt(1 - 0.94^2)
    proc = run_pgpong(*common, "--warmup", "yes", "--run-dir", str(tmp_path / "bad"))
    assert proc.returncode == 2 and proc.stderr.strip() == "pgpong: error: --warmup must be on or off, got 'yes'"
    assert not (tmp_path / "bad").exists()


@pytest.mark.long  # the settings' maths: test_policy, test_golden; their checks: test_rundir
def test_the_candidate_settings_are_said_on_the_first_line_and_recorded(tmp_path):
    common = ["train", "--workers", "0", "--iterations", "1", "--hidden", "8", "--max-episode-steps", "10"]
    flags = ["--entropy-bonus", "0.01", "--w2-init-scale", "0.1", "--max-update-norm", "5"]
    said = "; entropy bonus 0.01; W2 initialised x0.1; updates clipped to norm 5"
    proc = run_pgpong(*common, *flags, "--run-dir", str(tmp_path / "r"))
    assert proc.returncode == 0, proc.stderr
    assert f"(the batch rule at 10 and below){said}, on this process" in proc.stdout
    wanted = {"entropy_bonus": 0.01, "w2_init_scale": 0.1, "max_update_norm": 5.0}
    config = json.loads((tmp_path / "r" / "config.json").read_text())["config"]
    assert {k: config[k] for k in wanted} == wanted
    info = load_checkpoint(list_checkpoints(tmp_path / "r" / "checkpoints")[-1]).info
    assert {k: info[k] for k in wanted} == wanted
    proc = run_pgpong("train", "--run-dir", str(tmp_path / "r"), "--iterations", "2")  # resumed: said again
    assert proc.returncode == 0 and said in proc.stdout, proc.stderr
    proc = run_pgpong(*common, "--run-dir", str(tmp_path / "default"))  # the default's, said too
    assert proc.returncode == 0 and "; entropy bonus 0.01; updates clipped to norm 4, on" in proc.stdout
    proc = run_pgpong(*common, "--as-in-2016", "--run-dir", str(tmp_path / "2016"))
    assert proc.returncode == 0 and "entropy" not in proc.stdout and "clipped" not in proc.stdout
    assert "lr 0.0001" in proc.stdout


def test_a_first_step_far_above_the_rules_is_warned_about():
    from pgpong.config import TrainConfig
    from pgpong.schedule import first_step_warning

    for warmup in ("on", "off"):
        assert first_step_warning(TrainConfig(warmup=warmup)) is None  # 2e-3 / sqrt(0.01) = 0.02 at most
        assert first_step_warning(TrainConfig(batch_size=300, warmup=warmup)) is None  # 0.011 / sqrt(0.3) = 0.020
        assert first_step_warning(TrainConfig(learning_rate=1e-4, warmup=warmup)) is None  # 2016's: small steps
    collapse = TrainConfig(batch_size=60, learning_rate=0.0073, decay_rate=0.99)
    warned = first_step_warning(collapse)
    assert warned is not None and "about 0.073 (lr / sqrt(1 - decay); the batch rule keeps it at 0.02)" in warned
    assert first_step_warning(dataclasses.replace(collapse, warmup="on")) is None  # the first step is 0.0073
    warned = first_step_warning(TrainConfig(learning_rate=0.05, warmup="on"))
    assert warned is not None and "about 0.05 (lr, warmed up), and 0.073 made" in warned


@pytest.mark.long  # the ramp in training: test_trainer's batch ramp
def test_a_batch_ramp_is_said_on_the_first_line_and_checked(tmp_path):
    common = ["train", "--workers", "0", "--iterations", "2", "--hidden", "8", "--max-episode-steps", "10"]
    proc = run_pgpong(
        *common, "--batch-size", "60", "--ramp-from", "10", "--ramp-matches", "500", "--run-dir", str(tmp_path / "r")
    )
    assert proc.returncode == 0, proc.stderr
    assert (
        "batch 10 growing to 60 over 500 matches, lr 0.002 to 0.0049, RMSProp decay 0.99 to 0.94 "
        "(the batch rule at each size)"
    ) in proc.stdout
    config = json.loads((tmp_path / "r" / "config.json").read_text())["config"]
    assert (config["ramp_from"], config["ramp_matches"], config["batch_size"]) == (10, 500, 60)
    rows = (tmp_path / "r" / "progress.csv").read_text().splitlines()
    assert [row.split(",")[1] for row in rows[1:]] == ["10", "21"]  # 10 matches, then 11 (10 + 50 x 10 // 500)
    proc = run_pgpong("train", "--run-dir", str(tmp_path / "r"), "--iterations", "3")  # resumed: where it is
    assert proc.returncode == 0, proc.stderr
    assert "0.99 to 0.94 (the batch rule at each size); now at batch 12 after 21 matches" in proc.stdout
    for bad, said in (
        ("61", "--ramp-from must be at least 1 and at most --batch-size (60), got 61"),
        ("0", "--ramp-from must be at least 1"),
    ):
        proc = run_pgpong(*common, "--batch-size", "60", "--ramp-from", bad, "--run-dir", str(tmp_path / bad))
        assert proc.returncode == 2 and said in proc.stderr and "Traceback" not in proc.stderr
        assert not (tmp_path / bad).exists()
    proc = run_pgpong(
        *common, "--batch-size", "6", "--ramp-from", "2", "--ramp-matches", "0", "--run-dir", str(tmp_path / "m")
    )
    assert proc.returncode == 2 and "--ramp-matches must be at least 1, got 0" in proc.stderr
    refused = {
        ("--ramp-from", "10", "--lr", "1e-3"): "--ramp-from takes the batch rule's lr and RMSProp decay at each",
        ("--ramp-matches", "500"): "--ramp-matches 500 needs --ramp-from",
    }
    for flags, said in refused.items():
        proc = run_pgpong(*common, "--batch-size", "60", *flags, "--run-dir", str(tmp_path / "refused"))
        assert proc.returncode == 2 and said in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "refused").exists()


def test_the_command_to_run_again_splits_back_into_the_command_that_ran(monkeypatch):
    import shlex
    import sys

    from pgpong.cli.common import this_command_again

    monkeypatch.setattr(sys, "argv", ["/somewhere/pgpong/__main__.py", "study", "a name", "--seeds", "0,1"])
    assert shlex.split(this_command_again()) == [sys.executable, "-m", "pgpong", "study", "a name", "--seeds", "0,1"]


def test_help_before_a_command_is_the_commands_help(capsys):
    for words in (["--help", "play"], ["-h", "play"], ["--he", "play", "x.npz"]):
        proc = run_here(capsys, *words)
        assert proc.returncode == 0 and proc.stdout.startswith("usage: pgpong play"), (words, proc.stdout[:80])
        assert "--record" in proc.stdout and proc.stderr == ""
    proc = run_here(capsys, "--help")
    assert proc.returncode == 0 and proc.stdout.startswith("usage: pgpong [-h]") and "COMMAND" in proc.stdout
    proc = run_here(capsys, "--help", "trian")  # no such command: said so, as without --help
    assert proc.returncode == 2 and "no command 'trian'; did you mean train?" in proc.stderr


def test_an_unknown_flag_names_the_command_whose_help_to_read():
    proc = run_pgpong("train", "--no-such-flag")
    assert_one_line_error(proc, "pgpong train: error: unrecognized arguments: --no-such-flag", "pgpong train --help")
    assert "did you mean" not in proc.stderr
    proc = run_pgpong("train", "--", "--x")
    assert_one_line_error(proc, "unrecognized arguments: -- --x (see pgpong train --help)")  # no guess for "--"


@pytest.mark.parametrize(
    "args, said",
    [
        (["trian"], "no command 'trian'; did you mean train? (the commands: train, play, plot, weights, bench, study)"),
        (["xyz"], "no command 'xyz' (the commands: train, play"),
        (["--seed", "3", "train"], "--seed must follow a command: pgpong COMMAND --seed ... (see pgpong --help)"),
        (["--seed=3", "train"], "--seed=3 must follow a command: pgpong COMMAND --seed=3 ..."),
        (
            ["train", "--batchsize", "20"],
            "arguments: --batchsize 20; did you mean --batch-size? (see pgpong train --help)",
        ),
        (["plot", "x", "--ouput=y.png"], "arguments: --ouput=y.png; did you mean --output? (see pgpong plot --help)"),
    ],
)
def test_a_mistyped_command_or_flag_is_told_the_closest_one(tmp_path, args, said):
    proc = run_pgpong(*args, cwd=tmp_path)
    assert_one_line_error(proc, said)
    assert list(tmp_path.iterdir()) == []


def test_an_empty_run_dir_is_refused_not_taken_for_here(tmp_path):
    proc = run_pgpong("train", "--run-dir", "", "--iterations", "1", cwd=tmp_path)
    assert_one_line_error(proc, "--run-dir: an empty path")
    assert list(tmp_path.iterdir()) == []


def test_a_reader_that_goes_away_stops_pgpong_quietly(tmp_path):
    # `pgpong ... | head`: the pipe is closed before pgpong writes; no traceback, status 141
    command = ["train", "--run-dir", str(tmp_path / "r"), "--iterations", "1", "--workers", "0"]
    command += ["--batch-size", "1", "--max-episode-steps", "20"]
    proc = subprocess.Popen([*PGPONG, *command], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    proc.stdout.close()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 141, err
    assert err == ""


def test_ctrl_c_while_the_command_line_loads_ends_quietly():
    """Ctrl-C before main() has its handler (numpy and the commands' modules take most of
    a second to load): the `pgpong` command's entry ends with 130 and one line, no
    traceback. The interrupt is raised by the import of pgpong.cli itself, so the test
    does not depend on timing."""
    interrupting = (
        "import sys\n"
        "class Interrupt:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'pgpong.cli':\n"
        "            raise KeyboardInterrupt\n"
        "sys.meta_path.insert(0, Interrupt())\n"
        "from pgpong.__main__ import entry\n"
        "sys.exit(entry())\n"
    )
    proc = subprocess.run([sys.executable, "-c", interrupting, "train"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 130 and proc.stdout == "" and proc.stderr == "\npgpong: interrupted\n", proc.stderr


def test_empty_and_overlong_paths_and_flags_that_would_do_nothing_are_refused_in_one_line(
    tmp_path, monkeypatch, capsys
):
    """Every path argument refuses an empty one (not taken for here: `plot ''` in a run
    directory drew it), a name longer than the system takes is one line wherever it is
    first looked at, --units beyond the network's hidden units is refused, and so are
    play's recording flags without --record."""
    from pgpong.cli import main

    monkeypatch.chdir(tmp_path)
    long = "a" * 300
    for given, says in [
        (["play", ""], "argument CHECKPOINT: an empty path"),
        (["play", "--record", ""], "argument --record: an empty path"),
        (
            ["train", "--resume-from", "x.npz"],
            "--resume-from FILE goes on with a run: give its directory with --run-dir",
        ),
        (["play", "--fps", "30"], "--fps sets the recording: give --record FILE"),  # (was ignored)
        (["play", "--episodes", "2", "--record-episodes", "2"], "--record-episodes sets the recording: give --record"),
        (["plot", ""], "argument RUN_DIR: an empty path"),
        (["plot", "r", "--output", ""], "argument --output: an empty path"),
        (["plot", "/dev/null"], "/dev/null: cannot read (it is not a regular file)"),  # (not "not a directory")
        (["weights", ""], "argument CHECKPOINT: an empty path"),
        (["study", "s", "--root", ""], "argument --root: an empty path"),
        (["plot", long], f"{long[:40]}... (300 characters): a file name longer than this system takes"),
        (["weights", long], "(300 characters): a file name longer than this system takes"),
        (["weights", "--units", "201", "--output", "w.png"], "--units must be at most the network's 200 hidden units"),
    ]:
        status: int | str | None
        try:
            status = main(given)
        except SystemExit as stopped:  # argparse's mistakes
            status = stopped.code
        out, err = capsys.readouterr()
        assert status == 2 and out == "", (given, out, err)
        [line] = err.strip().splitlines()
        assert says in line, (given, line)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "command",
    [
        ["train", "--run-dir", "r"],
        ["bench"],
        ["study", "s", "--grid", "lr=1e-3", "--max-matches", "2"],
        ["play", "--episodes", "1"],
    ],
)
def test_a_mistake_in_ray_address_is_named_as_the_variable(tmp_path, monkeypatch, capsys, command):
    from pgpong.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RAY_ADDRESS", "auto")
    assert main(command) == 2
    out, err = capsys.readouterr()
    [line] = err.strip().splitlines()
    assert line.startswith("pgpong: error: $RAY_ADDRESS: cluster address 'auto' is not HOST:PORT"), line
    assert line.endswith("(unset it for a local Ray instance)") and list(tmp_path.iterdir()) == []
