"""pgpong study: a grid x seeds on Ray Tune, killed with SIGKILL and finished by the
same command, gives each trial the weights of the same `pgpong train` run done alone;
the report and the picture come from the run directories alone."""

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from PIL import Image

from conftest import PGPONG, run_here, run_pgpong, train_in_process
from pgpong.checkpoint import list_checkpoints, load_checkpoint
from pgpong.config import ConfigError
from pgpong.runlog import read_progress
from pgpong.study import plan, report

FIXED = ["--set", "hidden=16", "--set", "max-episode-steps=200", "--set", "batch-size=2"]
MATCHES = 20  # 10 batches a trial


def study_command(root, name="lrs", grid=("lr=1e-3,3e-3",)):
    grids = [arg for g in grid for arg in ("--grid", g)]
    return ["study", name, *grids, *FIXED, "--seeds", "0,1", "--max-matches", str(MATCHES), "--root", str(root)]


def pgpong(capsys, *args):
    """conftest.run_here as (status, stdout, stderr)."""
    done = run_here(capsys, *args)
    return done.returncode, done.stdout, done.stderr


def rows(trial_dir):
    return [r for r in read_progress(trial_dir / "progress.csv") if None not in r.values()]


@pytest.mark.slow
@pytest.mark.long
def test_a_study_killed_midway_is_finished_by_the_same_command_with_the_weights_of_lone_runs(tmp_path, capsys):
    root = tmp_path / "studies"
    command = study_command(root)
    proc = subprocess.Popen([*PGPONG, *command], stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    trials = root / "lrs" / "trials"
    try:
        deadline = time.monotonic() + 120
        while not any(len(rows(d)) >= 3 for d in trials.glob("*")) if trials.exists() else True:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)  # the study's driver, as a power cut would
        proc.wait(timeout=10)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # what Ray left of the killed instance
        proc.communicate()
    before = {d.name: len(rows(d)) for d in trials.glob("*")}
    assert any(0 < n < MATCHES // 2 for n in before.values()), before  # killed mid-trial

    again = run_pgpong(*command, timeout=240)
    assert again.returncode == 0, again.stderr
    assert "resuming at batch" in again.stdout, again.stdout
    dirs = sorted(trials.glob("*"))
    assert [d.name for d in dirs] == [
        "lr=0.001__seed=0",
        "lr=0.001__seed=1",
        "lr=0.003__seed=0",
        "lr=0.003__seed=1",
    ]
    for d in dirs:
        lr, seed = float(d.name.split("__")[0][3:]), int(d.name[-1])
        assert [int(r["batch"]) for r in rows(d)] == list(range(1, MATCHES // 2 + 1))  # no row lost or doubled
        alone = train_in_process(
            tmp_path / "alone" / d.name,
            0,
            MATCHES // 2,
            {"hidden": 16, "max_episode_steps": 200, "batch_size": 2, "learning_rate": lr, "seed": seed},
        )
        mine = load_checkpoint(list_checkpoints(d / "checkpoints")[-1])
        assert mine.batch == MATCHES // 2
        made = json.loads((d / "config.json").read_text())
        assert made["study"] == "lrs" and made["command"].endswith(shlex.join(command)), made["command"]
        np.testing.assert_array_equal(mine.weights.W1, alone.weights.W1)
        np.testing.assert_array_equal(mine.weights.W2, alone.weights.W2)
        assert mine.running_reward == alone.running_reward

    # Done trials are not trained again; a different grid under the name is refused.
    status, out, err = pgpong(capsys, *command)  # Ray is not even started
    assert status == 0 and out.count("already done (20 matches)") == 4, out + err
    status, out, err = pgpong(capsys, *study_command(root, grid=("lr=1e-3",)))
    assert status == 2 and "made with another grid" in err and len(err.strip().splitlines()) == 1, err

    # The report needs none of Tune's files.
    shutil.rmtree(root / "lrs" / "tune")
    status, out, err = pgpong(capsys, "study", "lrs", "--root", str(root), "--report", "--json", "--thresholds=-3,-2.5")
    assert status == 0, err
    summary = json.loads(out)
    assert [s["setting"] for s in summary["settings"]] == ["lr=0.001", "lr=0.003"]
    for setting in summary["settings"]:
        lr = setting["setting"].split("=")[1]
        for threshold in ("-3", "-2.5"):
            reached = {}
            for seed in (0, 1):
                for r in rows(trials / f"lr={lr}__seed={seed}"):
                    if float(r["running_reward"]) >= float(threshold):
                        reached[seed] = float(r["env_steps"])
                        break
            found = setting["thresholds"][threshold]
            assert found["seeds_reached"] == sorted(reached)
            if reached:
                assert found["env_steps"]["median"] == np.median(list(reached.values()))
                assert found["env_steps"]["min"] == min(reached.values())
    status, out, err = pgpong(capsys, "study", "lrs", "--root", str(root), "--report")
    assert status == 0 and out.startswith("| setting | running reward | seeds reached |"), out

    status, out, err = pgpong(capsys, "plot", str(root / "lrs"), "--by", "setting", "--x", "steps")
    assert status == 0, err
    with Image.open(root / "lrs" / "curves.png") as image:
        assert image.size == (1000, 600)
        pixels = np.asarray(image.convert("RGB"))
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 50  # drawn, not blank


def test_bad_study_input_is_one_line_and_status_2(tmp_path, capsys):
    root = str(tmp_path)
    cases = {
        "no such setting": ["study", "x", "--grid", "colour=1,2", "--max-matches", "4"],
        "not a whole number": ["study", "x", "--grid", "batch-size=ten", "--max-matches", "4"],
        "one or more values": ["study", "x", "--grid", "lr=", "--max-matches", "4"],
        "at least one --grid": ["study", "x", "--max-matches", "4"],
        "no path separator": ["study", "a/b", "--grid", "lr=1e-3", "--max-matches", "4"],
        "needs a stop": ["study", "x", "--grid", "lr=1e-3"],
        "use --seeds": ["study", "x", "--grid", "seed=1,2", "--max-matches", "4"],
        "workers-per-cpu: a trial's workers hold a CPU each (--workers-per-trial": [
            "study",
            "x",
            "--set",
            "workers-per-cpu=2",
            "--grid",
            "lr=1e-3",
            "--max-matches",
            "4",
        ],
        "--learning-rate must be in": ["study", "x", "--grid", "lr=2", "--max-matches", "4"],
        "no study x": ["study", "x", "--report"],
        "--report reads the study as it was made: drop --workers-per-trial": [
            "study",
            "x",
            "--report",
            "--workers-per-trial",
            "2",
        ],
        "--report reads the study as it was made: drop --address": ["study", "x", "--report", "--address", "h:1"],
        "--report reads the study as it was made: drop --seeds": ["study", "x", "--report", "--seeds", "5"],
    }
    for expected, flags in (  # out of range, not finite, or an environment a trial could not make
        ("trial batch-size=-1 seed=0: --batch-size must be at least 1", "--grid batch-size=-1 --max-matches 4"),
        ("learning-rate: '1e999' is not a finite number", "--grid lr=1e999 --max-matches 4"),
        ("trial env-id=Nope-v0 seed=0: unknown environment id 'Nope-v0'", "--grid env-id=Nope-v0 --max-matches 4"),
        ("id 'ALE/Breakout-v5' is not Pong", "--grid env-id=ALE/Pong-v5,ALE/Breakout-v5 --max-matches 4"),
        ("--max-minutes must be positive and at most 525,600 (a year), got inf", "--grid lr=1e-3 --max-minutes inf"),
        ("--max-minutes must be positive and at most 525,600 (a year), got 1e+", "--grid lr=1 --max-minutes 1e300"),
        ("--max-env-steps must be at least 1 and at most 100,000,000,000", f"--grid lr=1 --max-env-steps {'9' * 23}M"),
        (
            "--max-matches must be at least 1 and at most 1,000,000,000 (a year of play), got -5",
            "--grid lr=1 --max-matches=-5",
        ),
        ("--until running_reward must be in [-21, 21], got inf", "--grid lr=1e-3 --until running_reward=inf"),
        (
            "the grid and seeds make 1,000,000 trials; a study has at most 10,000",
            "--grid batch-size="
            + ",".join(map(str, range(1, 101)))
            + " --grid hidden="
            + ",".join(map(str, range(1, 101)))
            + " --seeds "
            + ",".join(map(str, range(100)))
            + " --max-matches 4",
        ),
    ):
        cases[expected] = ["study", "x", *shlex.split(flags)]
    for expected, args in cases.items():
        status, out, err = pgpong(capsys, *args, "--root", root)
        assert status == 2, (args, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0], (args, err)
    assert list(tmp_path.iterdir()) == []  # nothing was written
    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()


def test_a_root_that_is_a_file_or_cannot_be_written_is_refused_before_anything_starts(tmp_path, capsys, monkeypatch):
    afile = tmp_path / "afile"
    afile.write_text("not a directory")
    args = ["study", "x", "--grid", "lr=1e-3", "--max-matches", "4", "--root"]
    for root, expected in (
        (afile, f"{afile} is in the way: it is not a directory"),
        (afile / "studies", f"{afile} is not a directory: give --root a directory"),
    ):
        status, out, err = pgpong(capsys, *args, str(root))
        assert status == 2, err
        [line] = err.strip().splitlines()
        assert expected in line
    trial = tmp_path / "made" / "x" / "trials" / "lr=0.001__seed=0"
    trial.parent.mkdir(parents=True)
    trial.write_text("")  # a file where a trial's run directory goes
    status, out, err = pgpong(capsys, *args, str(tmp_path / "made"), "--seeds", "0")
    assert status == 2 and f"{trial} is in the way" in err.strip(), err

    def refused(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(plan.tempfile, "TemporaryFile", refused)  # a read-only directory, even as root
    status, out, err = pgpong(capsys, *args, str(tmp_path / "ro"))
    assert status == 2, err
    [line] = err.strip().splitlines()
    assert f"cannot write the study in {tmp_path}: Permission denied; give --root a directory" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "made"]  # nothing new
    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()


def test_a_broken_study_json_or_progress_csv_is_named_in_one_line(tmp_path, capsys):
    good = {"name": "s", "grid": {"learning_rate": [0.001]}, "fixed": {}, "seeds": [0], "stops": {"matches": 2}}
    cases = {
        "maximum recursion depth": "[" * 100_000 + "]" * 100_000,
        "its grid learning_rate is not a list": json.dumps({**good, "grid": {"learning_rate": "x"}}),
        "learning-rate 'x' is not a float": json.dumps({**good, "grid": {"learning_rate": ["x"]}}),
        "--learning-rate must be in (0, 1]": json.dumps({**good, "grid": {"learning_rate": [5.0]}}),
        "'colour' is not a setting": json.dumps({**good, "fixed": {"colour": 1}}),
        "--seed must be in [0, 2**32), got 1.5": json.dumps({**good, "seeds": [1.5]}),
        "--max-minutes must be positive and at most 525,600 (a year), got inf": json.dumps(
            {**good, "stops": {"minutes": float("inf")}}
        ),
        "it has no 'seeds'": json.dumps({k: v for k, v in good.items() if k != "seeds"}),
        "too large for a study's plan": " " * (plan.MAX_PLAN_BYTES + 1) + json.dumps(good),
    }
    for expected, text in cases.items():
        (tmp_path / "s").mkdir(exist_ok=True)
        (tmp_path / "s" / "study.json").write_text(text)
        for args in (
            ["study", "s", "--root", str(tmp_path), "--report"],
            ["plot", str(tmp_path / "s"), "--by", "setting"],
        ):
            status, out, err = pgpong(capsys, *args)
            assert status == 2, (expected, args, err)
            [line] = err.strip().splitlines()
            assert f"cannot read {tmp_path / 's' / 'study.json'}: " in line and expected in line, (args, line)
    (tmp_path / "s" / "study.json").unlink()
    (tmp_path / "s" / "study.json").mkdir()
    status, out, err = pgpong(capsys, "study", "s", "--root", str(tmp_path), "--report")
    assert status == 2 and "study.json: it is not a regular file" in err.strip(), err
    (tmp_path / "s" / "study.json").rmdir()
    (tmp_path / "s" / "study.json").write_text(json.dumps(good))
    trial = tmp_path / "s" / "trials" / "lr=0.001__seed=0"
    trial.mkdir(parents=True)
    (trial / "progress.csv").write_bytes(bytes(range(128, 256)) * 4)
    status, out, err = pgpong(capsys, "study", "s", "--root", str(tmp_path), "--report")
    [line] = err.strip().splitlines()
    assert status == 2 and f"cannot read {trial / 'progress.csv'}: 'utf-8' codec can't decode" in line, err
    assert f"move the trial's directory {trial} away" in line
    again = ["study", "s", "--grid", "lr=1e-3", "--seeds", "0", "--max-matches", "2", "--root", str(tmp_path)]
    status, out, err = pgpong(capsys, *again)  # continuing it: refused before Ray starts
    assert status == 2 and "progress.csv: 'utf-8' codec can't decode" in err.strip().splitlines()[-1], err
    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()
    (trial / "progress.csv").unlink()
    (trial / "progress.csv").mkdir()
    status, out, err = pgpong(capsys, "study", "s", "--root", str(tmp_path), "--report")
    assert status == 2 and "progress.csv: it is not a regular file" in err.strip(), err
    (trial / "progress.csv").rmdir()
    header, row = "batch,episodes,env_steps,wall_s,running_reward", "{0},{0}0,{0}000,{1},-20.5"
    (trial / "progress.csv").write_text("\n".join([header, row.format(1, 5), "1x,junk", row.format(3, 15)]) + "\n")
    for args in (["study", "s", "--root", str(tmp_path), "--report"], again):  # not read as a trial at batch 1
        status, out, err = pgpong(capsys, *args)
        [line] = err.strip().splitlines()
        assert status == 2 and f"{trial / 'progress.csv'}: line 3 is not a row pgpong writes" in line, err
    (trial / "progress.csv").write_text("\n".join([header, row.format(1, 5), row.format(2, 10), "3,2"]) + "\n")
    status, out, err = pgpong(capsys, "study", "s", "--root", str(tmp_path), "--report", "--json")
    [setting] = json.loads(out)["settings"]  # a last row cut short: dropped, the two before it read
    assert (
        status == 0 and setting["at_the_end"]["0"]["matches"] == 20 and setting["at_the_end"]["0"]["env_steps"] == 2000
    )


def test_a_study_json_or_progress_csv_that_is_a_pipe_does_not_hang(tmp_path):
    good = {"name": "s", "grid": {"learning_rate": [0.001]}, "fixed": {}, "seeds": [0], "stops": {"matches": 2}}
    (tmp_path / "s").mkdir()
    os.mkfifo(tmp_path / "s" / "study.json")
    proc = run_pgpong("study", "s", "--root", str(tmp_path), "--report", timeout=60)
    assert proc.returncode == 2 and "study.json: it is not a regular file" in proc.stderr, proc.stderr
    (tmp_path / "s" / "study.json").unlink()
    (tmp_path / "s" / "study.json").write_text(json.dumps(good))
    trial = tmp_path / "s" / "trials" / "lr=0.001__seed=0"
    trial.mkdir(parents=True)
    os.mkfifo(trial / "progress.csv")
    proc = run_pgpong("study", "s", "--root", str(tmp_path), "--report", timeout=60)
    assert proc.returncode == 2 and "progress.csv: it is not a regular file" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_more_cpus_per_trial_than_the_machine_has_is_refused_before_ray_starts(tmp_path, capsys):
    status, out, err = pgpong(
        capsys,
        "study",
        "x",
        "--grid",
        "lr=1e-3",
        "--max-matches",
        "4",
        "--workers-per-trial",
        "64",
        "--root",
        str(tmp_path),
    )
    assert status == 2, err
    assert f"needs 64 CPUs per trial, but the Ray cluster has {os.cpu_count()}" in err.strip().splitlines()[-1]
    assert not (tmp_path / "x").exists()
    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()


def test_a_study_stopped_only_by_until_says_it_may_not_end(tmp_path, capsys):
    many = ["--workers-per-trial", "4096"]  # refused before Ray starts: nothing is trained here
    for stops, open_ended in (
        (["--until", "running_reward=0"], True),
        (["--until", "running_reward=0", "--max-env-steps", "7M"], False),
        (["--max-matches", "9"], False),
    ):
        status, out, err = pgpong(capsys, "study", "x", "--grid", "lr=1e-3", *stops, *many, "--root", str(tmp_path))
        assert status == 2 and "CPU" in err, err
        assert ("a trial that never reaches +0 trains until you stop it" in out) == open_ended, out


def test_plan_reads_values_as_train_does_and_stops_say_why():
    study = plan.build(
        "s", ["lr=1e-3,3e-3", "batch-size=10,60"], ["max-episode-steps=2k"], [0, 1], plan.Stops(env_steps=10)
    )
    assert study.grid == {"learning_rate": [1e-3, 3e-3], "batch_size": [10, 60]}
    assert study.fixed == {"max_episode_steps": 2000}
    trials = study.trials()
    assert len(trials) == 8 and trials[0].directory.name == "lr=0.001__batch-size=10__seed=0"
    assert trials[-1].settings == {
        "max_episode_steps": 2000,
        "learning_rate": 3e-3,
        "batch_size": 60,
        "seed": 1,
        "workers": 0,
    }
    assert plan.count("20M") == 20_000_000 and plan.count("1.5k") == 1500
    assert plan.count("-1") == -1 and plan.count("99999999999999999999") == 99999999999999999999  # exact
    with pytest.raises(ValueError):
        plan.count("1.2345k")
    stops = plan.Stops(running_reward=0.0, env_steps=1000)
    assert stops.reached(-0.5, 999, 5, 1.0) is None
    assert str(stops.reached(0.0, 10, 5, 1.0)).startswith("running reward")
    assert stops.reached(-3.0, 1000, 5, 1.0) == "1,000 env steps"
    with pytest.raises(ConfigError, match="--set hidden takes one value"):
        plan.build("s", ["lr=1e-3"], ["hidden=1,2"], [0], stops)


def test_report_statistics():
    values = [5.0, 1.0, 4.0, 2.0, 3.0, 100.0]
    found = report.spread(values)
    assert found["median"] == 3.5 and found["min"] == 1.0 and found["max"] == 100.0
    assert found["iqm"] == pytest.approx(np.mean([2.0, 3.0, 4.0, 5.0]))  # the middle half
    low, high = found["iqm_95"]
    assert 1.0 <= low <= found["iqm"] <= high <= 100.0
    assert "iqm" not in report.spread([1.0, 2.0, 3.0, 4.0])  # fewer than five seeds
    rows_ = [{"episodes": 10.0, "env_steps": 100.0, "wall_s": 60.0, "running_reward": r} for r in (-20.0, -9.0, 1.0)]
    rows_[2]["episodes"] = 30.0
    assert report.first_reach(rows_, -10.0) == {"matches": 10.0, "env_steps": 100.0, "minutes": 1.0}
    assert report.first_reach(rows_, 0.0) == {"matches": 30.0, "env_steps": 100.0, "minutes": 1.0}
    assert report.first_reach(rows_, 10.0) is None


def test_the_table_counts_seeds_reached_of_all_the_settings_seeds():
    nothing: dict = {}
    row = {"seeds_reached": [0], "seeds_run": [0, 1], "matches": nothing, "env_steps": nothing, "minutes": nothing}
    setting = {"setting": "lr=0.002", "seeds": [0, 1, 2], "thresholds": {"+0": row}, "at_the_end": {}}
    table = report.markdown({"settings": [setting]}).splitlines()
    assert table[2].split(" | ")[2] == "1/3 (1 with no batch yet)"  # seed 0 reached it, 1 has not, 2 has no row yet
    row["seeds_run"] = [0, 1, 2]
    assert report.markdown({"settings": [setting]}).splitlines()[2].split(" | ")[2] == "1/3"


def test_a_trial_made_with_other_learning_settings_is_not_continued_with_new_ones(tmp_path, capsys):
    """A trial begun before the batch rule (batch 60 at lr 3e-3, decay 0.99) would be
    resumed by a study whose flags now give it the rule's values: refused, with the
    flags that continue it as it was made."""
    from pgpong.config import TrainConfig, save_config

    trial = tmp_path / "old" / "trials" / "batch-size=60__seed=0"
    trial.mkdir(parents=True)
    made = TrainConfig(batch_size=60, learning_rate=3e-3, decay_rate=0.99, seed=0, workers=0)
    save_config(made, trial / "config.json")
    args = ["study", "old", "--grid", "batch-size=60", "--seeds", "0", "--max-matches", "4", "--root", str(tmp_path)]
    status, out, err = pgpong(capsys, *args)
    assert status == 2, err
    [line] = err.strip().splitlines()
    assert "trial batch-size=60 seed=0 was made with other settings (learning-rate 0.003, now 0.0049" in line
    assert "give --set learning-rate=0.003 --set decay-rate=0.99 to continue" in line
    assert sorted(p.name for p in trial.iterdir()) == ["config.json"]  # nothing written
    assert not (tmp_path / "old" / "study.json").exists()
    from pgpong.study.plan import Stops, Study, check_trials_as_made

    as_made = {"learning_rate": 3e-3, "decay_rate": 0.99}
    check_trials_as_made(Study("old", tmp_path, {"batch_size": [60]}, as_made, [0], Stops(matches=4)))  # accepted


def test_a_study_behind_a_directory_that_cannot_be_searched_is_not_called_missing(tmp_path, monkeypatch):
    real = os.lstat

    def lstat(path, *args, **kwargs):
        if str(path).startswith(str(tmp_path / "locked")):
            raise PermissionError(13, "Permission denied", str(path))  # what a non-root user meets
        return real(path, *args, **kwargs)

    monkeypatch.setattr(plan.os, "lstat", lstat)
    with pytest.raises(ConfigError, match="cannot read .*study.json: Permission denied"):
        plan.load_study(tmp_path / "locked", "s1")
    assert plan.load_study(tmp_path / "absent", "s1") is None  # no such directory: no study, as before
