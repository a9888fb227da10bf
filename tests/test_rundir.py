"""The run directory: new or resumed, what may change on resume, what is checked before
anything is written, and the files a run keeps (config.json, progress.csv, checkpoints)."""

import csv
import dataclasses
import json
import os
import re
import time

import numpy as np
import pytest

from conftest import ScriptedPool, train_on
from pgpong.checkpoint import TrainingState, save_checkpoint
from pgpong.config import ConfigError, TrainConfig
from pgpong.policy import Params
from pgpong.rundir import check_run_dir_writable, create_run_files, default_run_dir, open_run
from pgpong.runlog import read_progress

SETTINGS: dict = dict(seed=7, batch_size=2, hidden=8, max_episode_steps=50, checkpoint_every=0)  # every batch's
LEARNING = [f for f in dataclasses.fields(TrainConfig) if f.metadata["learning"]]
# For each learning setting, another valid value.
OTHER = {
    "env_id": "Pong-v0",
    "hidden": 9,
    "batch_size": 3,
    "learning_rate": 0.01,
    "gamma": 0.95,
    "decay_rate": 0.9,
    "seed": 8,
    "max_episode_steps": 60,
    "ramp_from": 1,
    "ramp_matches": 500,
    "warmup": "on",
    "entropy_bonus": 0.02,
    "w2_init_scale": 0.1,
    "max_update_norm": 5.0,
    "lag": 1,
    "lag_share": 0.5,
}
BASE: dict[str, dict] = {"ramp_matches": {"ramp_from": 1}}  # --ramp-matches means something only with a ramp


def new_run(directory, **settings):
    run = open_run(directory, {**SETTINGS, **settings})
    create_run_files(run, {})
    return run


def test_every_learning_setting_is_covered_here():
    assert {f.name for f in LEARNING} == set(OTHER)


@pytest.mark.parametrize("name", sorted(OTHER))
def test_resume_refuses_a_change_of_any_learning_setting(tmp_path, name):
    new_run(tmp_path / "r", **BASE.get(name, {}))
    flag = "--" + name.replace("_", "-")
    with pytest.raises(ConfigError, match=f"{flag} .* -> {re.escape(str(OTHER[name]))}.*must keep them"):
        open_run(tmp_path / "r", {name: OTHER[name]})


@pytest.mark.parametrize("name", sorted(OTHER))
def test_resume_from_refuses_a_checkpoint_of_other_learning_settings(tmp_path, name):
    from pgpong.checkpoint import CheckpointError

    new_run(tmp_path / "r", **BASE.get(name, {}))
    theirs = {**TrainConfig(**{**SETTINGS, **BASE.get(name, {})}).to_dict(), name: OTHER[name]}
    weights = Params.initial(theirs["hidden"], 0)
    foreign = save_checkpoint(
        TrainingState(weights=weights, cache=weights.zeros_like(), batch=1, info=theirs), tmp_path / "other"
    )
    with pytest.raises(CheckpointError, match=re.escape(name.replace("_", "-")) if name != "hidden" else "hidden size"):
        open_run(tmp_path / "r", {}, resume_from=foreign)


@pytest.mark.parametrize(("name", "value"), [("iterations", 9), ("workers", 3), ("keep_checkpoints", 5)])
def test_resume_accepts_a_change_of_the_other_settings(tmp_path, name, value):
    new_run(tmp_path / "r")
    again = open_run(tmp_path / "r", {name: value})
    assert again.resumed and getattr(again.config, name) == value


def test_a_run_made_before_the_warm_up_existed_resumes_without_it(tmp_path):
    """Its config.json and checkpoints have no "warmup": it trained with the plain
    rate, goes on so, and its checkpoints do not fit a run with the warm-up."""
    import json

    from pgpong.checkpoint import CheckpointError

    new_run(tmp_path / "r")
    path = tmp_path / "r" / "config.json"
    data = json.loads(path.read_text())
    assert data["config"].pop("warmup") == "off"
    path.write_text(json.dumps(data))
    again = open_run(tmp_path / "r", {})
    assert again.resumed and again.config.warmup == "off"
    with pytest.raises(ConfigError, match="--warmup off -> on"):
        open_run(tmp_path / "r", {"warmup": "on"})
    old = {k: v for k, v in TrainConfig(**SETTINGS).to_dict().items() if k != "warmup"}
    weights = Params.initial(SETTINGS["hidden"], 0)
    state = TrainingState(weights=weights, cache=weights.zeros_like(), batch=1, info=old)
    old_checkpoint = save_checkpoint(state, tmp_path / "old")
    new_run(tmp_path / "warm", warmup="on")
    with pytest.raises(CheckpointError, match="warmup off"):
        open_run(tmp_path / "warm", {}, resume_from=old_checkpoint)
    assert open_run(tmp_path / "r", {}, resume_from=old_checkpoint).state.batch == 1  # fits a run without it


@pytest.mark.parametrize(
    ("name", "default", "other"),
    [("entropy_bonus", 0.0, 0.01), ("w2_init_scale", 1.0, 0.1), ("max_update_norm", None, 5.0)],
)
def test_a_run_made_before_a_candidate_setting_existed_resumes_with_its_default(tmp_path, name, default, other):
    """Its config.json and checkpoints lack the setting: it trained with 2016's maths,
    goes on so, and its checkpoints do not fit a run that sets it."""
    from pgpong.checkpoint import CheckpointError

    new_run(tmp_path / "r", **{name: default})  # (the defaults since 2026-11-25 add the bonus and the clipping)
    path = tmp_path / "r" / "config.json"
    data = json.loads(path.read_text())
    assert data["config"].pop(name) == default
    path.write_text(json.dumps(data))
    again = open_run(tmp_path / "r", {})
    assert again.resumed and getattr(again.config, name) == default
    old = {k: v for k, v in TrainConfig(**SETTINGS).to_dict().items() if k != name}
    weights = Params.initial(SETTINGS["hidden"], 0)
    old_checkpoint = save_checkpoint(
        TrainingState(weights=weights, cache=weights.zeros_like(), batch=1, info=old), tmp_path / "old"
    )
    new_run(tmp_path / "set", **{name: other})
    with pytest.raises(CheckpointError, match=name.replace("_", "-")):
        open_run(tmp_path / "set", {}, resume_from=old_checkpoint)
    assert open_run(tmp_path / "r", {}, resume_from=old_checkpoint).state.batch == 1


def test_w2_init_scale_scales_the_first_w2_and_nothing_else(tmp_path):
    plain, small = new_run(tmp_path / "plain"), new_run(tmp_path / "small", w2_init_scale=0.1)
    np.testing.assert_array_equal(small.state.weights.W1, plain.state.weights.W1)
    np.testing.assert_allclose(small.state.weights.W2, plain.state.weights.W2 * 0.1, rtol=1e-6)
    default = Params.initial(SETTINGS["hidden"], SETTINGS["seed"])
    assert plain.state.weights.W2.tobytes() == default.W2.tobytes()  # scale 1: today's bits
    again = open_run(tmp_path / "small", {})  # no checkpoint yet: it starts again from the scaled weights
    assert again.resumed and again.state.weights.W2.tobytes() == small.state.weights.W2.tobytes()


def test_default_run_dir_names_the_env_seed_and_time():
    before = time.strftime("%Y%m%d-%H%M%S")
    path = default_run_dir(TrainConfig(seed=12))
    after = time.strftime("%Y%m%d-%H%M%S")
    assert path.parent.name == "runs"
    env, seed, stamp = path.name.split("__")
    assert (env, seed) == ("ALE-Pong-v5", "12") and before <= stamp <= after


def test_stale_temporary_checkpoints_are_removed_on_resume_and_finished_ones_kept(tmp_path):
    run = new_run(tmp_path / "r")
    weights = run.state.weights
    kept = save_checkpoint(TrainingState(weights=weights, cache=weights.zeros_like(), batch=1), run.checkpoint_dir)
    stale = run.checkpoint_dir / ".ckpt-000002.npz.123.tmp"  # a writer killed mid-write
    stale.write_bytes(b"half a checkpoint")
    other = run.checkpoint_dir / "notes.txt"
    other.write_text("mine")
    create_run_files(open_run(tmp_path / "r", {}), {})
    assert not stale.exists() and kept.exists() and other.exists()


def test_wall_time_adds_up_across_resumes(tmp_path):
    run = new_run(tmp_path / "r", iterations=2)
    train_on(run, ScriptedPool([-21.0] * 4))
    first = [float(r["wall_s"]) for r in read_progress(run.progress_path)]
    again = open_run(tmp_path / "r", {"iterations": 4})
    assert again.state.wall_s == pytest.approx(first[-1], abs=1e-6)  # the checkpoint carries it (csv: rounded)
    train_on(again, ScriptedPool([-21.0] * 4))
    walls = [float(r["wall_s"]) for r in read_progress(run.progress_path)]
    batch_s = [float(r["batch_s"]) for r in read_progress(run.progress_path)]
    assert walls[:2] == first
    assert walls[2] == pytest.approx(first[-1] + batch_s[2], abs=1e-5)  # it goes on from there, not from 0
    assert walls[3] > walls[2]


class SlowOutput:
    """An output that takes 0.2 s to show each row."""

    def begin_batch(self, batch, episodes, running_reward):
        pass

    def episode(self, finished, steps, running_reward):
        pass

    def end_batch(self, row, phases):
        time.sleep(0.2)

    def close(self):
        pass


def test_wall_time_counts_what_comes_after_a_row_too(tmp_path):
    """A row is shown and recorded after it is made (and a checkpoint may be written):
    that time is the run's too, counted in the next row's wall time (it was left out)."""
    from pgpong.session import open_trainer

    run = new_run(tmp_path / "r", iterations=3)
    with open_trainer(run, ScriptedPool([-21.0] * 6), {}, tensorboard=False) as trainer:
        trainer.log.outputs.append(SlowOutput())
        trainer.train()
    rows = read_progress(run.progress_path)
    walls, batch_s = [float(r["wall_s"]) for r in rows], [float(r["batch_s"]) for r in rows]
    assert max(batch_s) < 0.2  # the batches themselves are quick
    assert walls[2] - walls[0] == pytest.approx(0.4 + batch_s[1] + batch_s[2], abs=0.05)


def test_check_run_dir_writable_refuses_a_file_in_the_way(tmp_path):
    (tmp_path / "file").write_text("x")
    run = open_run(tmp_path / "file" / "r", SETTINGS)
    with pytest.raises(ConfigError, match="cannot write the run directory"):
        check_run_dir_writable(run)


def test_check_run_dir_writable_refuses_checkpoints_that_is_a_file(tmp_path):
    run = open_run(tmp_path / "r", {**SETTINGS, "iterations": 1})
    create_run_files(run, {})
    (tmp_path / "r" / "checkpoints").write_text("not a folder")
    with pytest.raises(ConfigError, match="checkpoints is not a directory"):
        check_run_dir_writable(open_run(tmp_path / "r", {"iterations": 2}))


def _made_run(tmp_path):
    run = open_run(tmp_path / "r", {**SETTINGS, "iterations": 1})
    create_run_files(run, {})
    return run


@pytest.mark.parametrize("kind", ["binary", "folder", "pipe"])
def test_a_progress_csv_that_cannot_be_read_is_refused_before_anything_is_written(tmp_path, kind):
    path = _made_run(tmp_path).progress_path
    if kind == "binary":
        path.write_bytes(bytes(range(256)) * 4)
    elif kind == "folder":
        path.mkdir()
    else:
        os.mkfifo(path)  # opening it to read would wait for a writer for ever
    with pytest.raises(ConfigError, match="progress.csv: cannot be read .*move it aside") as refused:
        open_run(tmp_path / "r", {"iterations": 2})
    assert "\n" not in str(refused.value)


def test_a_run_directory_that_cannot_be_read_is_one_error(tmp_path, monkeypatch):
    _made_run(tmp_path)

    def refused(self):  # what a folder of mode 000 answers a user who is not root
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(type(tmp_path), "exists", refused)
    with pytest.raises(ConfigError, match="cannot read the run directory .*: Permission denied"):
        open_run(tmp_path / "r", {"iterations": 2})


def test_config_json_keeps_the_first_command_and_appends_resumes(tmp_path):

    run = open_run(tmp_path / "r", {**SETTINGS, "iterations": 1})
    create_run_files(run, {"command": "pgpong train first", "written": "t0"})
    for k in (1, 2):
        again = open_run(tmp_path / "r", {"iterations": 1 + k})
        create_run_files(again, {"command": f"pgpong train resume {k}", "written": f"t{k}"})
    data = json.loads((tmp_path / "r" / "config.json").read_text())
    assert data["command"] == "pgpong train first" and data["written"] == "t0"
    assert [r["command"] for r in data["resumes"]] == ["pgpong train resume 1", "pgpong train resume 2"]
    assert data["config"]["iterations"] == 3


@pytest.mark.parametrize(
    "text, words",
    [
        ("{not json", "cannot read"),
        ('{"config": {"hidden": "many"}}', "--hidden"),
        ('{"config": [1, 2]}', 'no "config" object'),
        ("[1, 2, 3]", "not a JSON object"),
    ],
)
def test_damaged_config_json_is_refused(tmp_path, text, words):
    from pgpong.config import ConfigError

    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "config.json").write_text(text)
    with pytest.raises(ConfigError, match=words):
        open_run(tmp_path / "r", {})


def test_huge_config_json_is_refused_unread(tmp_path):
    from pgpong.config import ConfigError

    (tmp_path / "r").mkdir()
    with open(tmp_path / "r" / "config.json", "wb") as f:
        f.truncate(2 * 2**30)  # 2 GB of holes: reading it would take 2 GB
    with pytest.raises(ConfigError, match="too large"):
        open_run(tmp_path / "r", {})


def test_a_progress_row_cut_by_a_power_loss_is_dropped_on_resume(tmp_path):
    run = open_run(tmp_path / "r", {**SETTINGS, "batch_size": 2, "iterations": 2})
    train_on(run, ScriptedPool([-21.0] * 4))
    text = run.progress_path.read_text()
    run.progress_path.write_text(text + "3,6,600,1.")  # batch 3's row, cut short
    (run.checkpoint_dir / "ckpt-000002.npz").unlink()  # and the driver died before its checkpoint
    again = open_run(tmp_path / "r", {"iterations": 2})
    create_run_files(again, {})
    assert [r["batch"] for r in read_progress(run.progress_path)] == ["1"]


@pytest.mark.parametrize("column, value", [("env_steps", "nan"), ("wall_s", "-3"), ("running_reward", "1e400")])
def test_a_kept_progress_row_with_a_value_no_run_writes_is_refused_on_resume(tmp_path, column, value):
    """A row before the checkpoint (kept on resume) damaged by hand: the resume is refused
    naming the batch, the column and the value, and the file is left as it was; the
    diagnostics, which an older pgpong's rows hold as nan, are not checked."""
    run = open_run(tmp_path / "r", {**SETTINGS, "batch_size": 2, "iterations": 2})
    train_on(run, ScriptedPool([-21.0] * 4))
    rows = read_progress(run.progress_path)
    rows[0][column] = value
    rows[1]["entropy"] = "nan"
    with open(run.progress_path, "w", newline="") as f:
        writer = csv.DictWriter(f, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    damaged = run.progress_path.read_text()
    again = open_run(tmp_path / "r", {"iterations": 3})
    with pytest.raises(ConfigError, match=f"batch 1's row holds {column}: {value}, not a value a run writes"):
        create_run_files(again, {})
    assert run.progress_path.read_text() == damaged
    rows[0][column] = "1"  # mended, as the message asks
    with open(run.progress_path, "w", newline="") as f:
        writer = csv.DictWriter(f, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    create_run_files(open_run(tmp_path / "r", {"iterations": 3}), {})
    assert [r["batch"] for r in read_progress(run.progress_path)] == ["1", "2"]


def lose_the_last_row(run_dir):
    """Drop progress.csv's last row, as a kill between a checkpoint and its row does; the file's path."""
    progress = run_dir / "progress.csv"
    lines = progress.read_text().splitlines(keepends=True)
    progress.write_text("".join(lines[:-1]))
    return progress


def test_a_checkpoint_whose_row_was_never_written_is_played_again(tmp_path):
    """Killed between batch 2's checkpoint and its progress.csv row: the run resumes
    from batch 1 and plays batch 2 again, so every batch keeps its row."""
    from conftest import train_in_process
    from pgpong.runlog import read_progress

    train_in_process(tmp_path / "r", 0, 2, SETTINGS)
    progress = lose_the_last_row(tmp_path / "r")  # batch 2's row lost, its checkpoint kept
    assert open_run(tmp_path / "r", {}).state.batch == 1
    final = train_in_process(tmp_path / "r", 0, 3, SETTINGS)
    assert final.batch == 3 and [r["batch"] for r in read_progress(progress)] == ["1", "2", "3"]
    one_go = train_in_process(tmp_path / "one", 0, 3, SETTINGS)
    np.testing.assert_array_equal(final.weights.W1, one_go.weights.W1)
    # with every row there, the newest checkpoint is used
    assert open_run(tmp_path / "r", {}).state.batch == 3


def test_a_checkpoint_ahead_of_its_row_with_none_before_is_played_again_from_the_start(tmp_path):
    """The same, with a checkpoint once a minute (the default): the checkpoint before is
    not there. The run starts again from the initial weights rather than lose batch 2's
    row, and ends with the weights of a run never stopped."""
    from conftest import train_in_process

    reference = train_in_process(tmp_path / "ref", 0, 3, SETTINGS)
    train_in_process(tmp_path / "r", 0, 2, {**SETTINGS, "keep_checkpoints": 1})  # only batch 2's is kept
    progress = lose_the_last_row(tmp_path / "r")  # batch 2's row lost, its checkpoint kept
    assert open_run(tmp_path / "r", {}).state.batch == 0
    final = train_in_process(tmp_path / "r", 0, 3, SETTINGS)
    assert final.batch == 3 and [r["batch"] for r in read_progress(progress)] == ["1", "2", "3"]
    np.testing.assert_array_equal(final.weights.W1, reference.weights.W1)
