"""`pgpong plot` and `pgpong weights`: PNGs of the expected size that are not blank;
bad input exits 2 and writes nothing."""

import csv

import numpy as np
import pytest
from PIL import Image

from conftest import run_here, run_pgpong
from pgpong.plot import NEEDED, PlotError, read_curve
from pgpong.policy import Params
from test_cli import assert_one_line_error


def fake_run(folder, batches=30, seed=0):
    """A run directory with a progress.csv that climbs from -20 towards 0."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    with open(folder / "progress.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, NEEDED)  # the columns plot needs, nothing more
        writer.writeheader()
        for b in range(1, batches + 1):
            mean = -20 + 15 * b / batches + rng.normal()
            writer.writerow(
                {
                    "batch": b,
                    "episodes": 10 * b,
                    "env_steps": 11_000 * b,
                    "wall_s": 1.3 * b,
                    "running_reward": -20 + 14 * b / batches,
                    "score_mean": mean,
                    "score_min": mean - 3,
                    "score_max": mean + 3,
                    "steps_per_s": 8000 + 300 * rng.normal(),
                }
            )
    return folder


def picture(path):
    with Image.open(path) as image:
        assert image.format == "PNG"
        return np.asarray(image.convert("RGB"))


def assert_not_blank(pixels):
    colours = np.unique(pixels.reshape(-1, 3), axis=0)
    assert len(colours) > 20  # lines, bands, text: not one flat colour
    assert pixels.std() > 10


def test_plot_one_run_default_output(tmp_path):
    run = fake_run(tmp_path / "run-a")
    proc = run_pgpong("plot", str(run), timeout=120)
    assert proc.returncode == 0, proc.stderr
    pixels = picture(run / "learning.png")
    assert pixels.shape == (750, 1000, 3)
    assert_not_blank(pixels)
    (run / "learning.png").unlink()
    proc = run_pgpong("plot", str(run / "progress.csv"), timeout=120)  # the file itself: the picture beside it
    assert proc.returncode == 0, proc.stderr
    assert f"wrote {run / 'learning.png'}" in proc.stdout
    np.testing.assert_array_equal(picture(run / "learning.png"), pixels)


@pytest.mark.parametrize("x", ["episodes", "steps", "hours"])
def test_plot_several_runs_need_output(tmp_path, x, capsys):
    runs = [str(fake_run(tmp_path / f"run-{k}", seed=k)) for k in range(2)]
    proc = run_here(capsys, "plot", *runs)
    assert_one_line_error(proc, "--output")
    out = tmp_path / "both.png"
    proc = run_here(capsys, "plot", *runs, "--output", str(out), "--x", x)
    assert proc.returncode == 0, proc.stderr
    assert_not_blank(picture(out))


def test_a_cut_last_line_is_dropped_and_garbage_refused(tmp_path):
    run = fake_run(tmp_path / "run", batches=5)
    text = (run / "progress.csv").read_text()
    (run / "progress.csv").write_text(text + "6,60,66000,7.")  # power loss in the middle of a row
    assert list(read_curve(run)["batch"]) == [1, 2, 3, 4, 5]
    lines = text.splitlines()
    (run / "progress.csv").write_text("\n".join([lines[0], "garbage," * 8, *lines[1:]]) + "\n")
    with pytest.raises(PlotError, match="line 2"):
        read_curve(run)
    assert set(NEEDED) <= set(lines[0].split(","))


def test_batches_out_of_order_are_refused_naming_the_line(tmp_path, capsys):
    run = fake_run(tmp_path / "run", batches=5)
    lines = (run / "progress.csv").read_text().splitlines()
    (run / "progress.csv").write_text("\n".join([lines[0], *lines[1:3], lines[4], lines[3], lines[5]]) + "\n")
    proc = run_here(capsys, "plot", str(run))
    assert_one_line_error(proc, str(run / "progress.csv"), "line 5 has batch 3 after batch 4", "delete that line")
    (run / "progress.csv").write_text("\n".join([*lines, lines[-1]]) + "\n")  # the last row twice
    with pytest.raises(PlotError, match="line 7 has batch 5 after batch 5"):
        read_curve(run)
    assert not (run / "learning.png").exists()


@pytest.mark.parametrize(
    "case, words",
    [
        ("no-progress", ["no progress.csv"]),
        ("missing-dir", ["does not exist"]),
        ("bad-extension", ["unknown extension"]),
    ],
)
def test_plot_bad_input_exits_2_and_writes_nothing(tmp_path, case, words):
    run = fake_run(tmp_path / "run")
    empty = tmp_path / "empty"
    empty.mkdir()
    args = {
        "no-progress": [str(empty)],
        "missing-dir": [str(run), "--output", str(tmp_path / "nope" / "x.png")],
        "bad-extension": [str(run), "--output", str(tmp_path / "x.jpg")],
    }[case]
    before = sorted(p.name for p in tmp_path.rglob("*"))
    proc = run_pgpong("plot", *args, timeout=120)
    assert_one_line_error(proc, *words)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_weights_picture_of_a_weights_file(tmp_path):
    weights = Params.initial(12, 3)
    weights.W1[:, :] = 0
    weights.W1[0, 100:140] = 1.0  # one unit with a bright stripe on an otherwise zero grid
    weights.W1[1, 100:140] = -1.0
    path = tmp_path / "w.npz"
    np.savez(path, W1=weights.W1, W2=weights.W2)
    out = tmp_path / "w.png"
    proc = run_pgpong("weights", str(path), "--output", str(out), timeout=120)
    assert proc.returncode == 0, proc.stderr
    pixels = picture(out)
    # 10 columns x 2 rows of 80x80 cells with 3-pixel gaps, 2 pixels a weight, plus margins
    assert pixels.shape[1] == 2 * (10 * 83 - 3) + 160 and pixels.shape[0] == 2 * (2 * 83 - 3) + 100
    reds = ((pixels[..., 0] > 150) & (pixels[..., 2] < 100)).sum()
    blues = ((pixels[..., 2] > 100) & (pixels[..., 0] < 50)).sum()
    assert reds >= 2 * 2 * 40 and blues >= 2 * 2 * 40  # the two stripes (and the colour bar)


def test_weights_of_a_damaged_checkpoint_exits_2(tmp_path):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"\x93NUMPY garbage")
    proc = run_pgpong("weights", str(bad), "--output", str(tmp_path / "w.png"), timeout=120)
    assert_one_line_error(proc, "bad.npz")
    assert not (tmp_path / "w.png").exists()


def test_study_curves_keep_a_seed_that_reached_the_goal_and_drop_one_that_stopped_short(tmp_path):
    from pgpong.plot import setting_curves
    from pgpong.study.plan import Stops, Study

    study = Study("s", tmp_path, {"batch_size": [10]}, {}, [0, 1, 2], Stops(running_reward=0.0, env_steps=300_000))
    study.save()

    def write(seed, rewards):
        folder = tmp_path / "s" / "trials" / f"batch-size=10__seed={seed}"
        folder.mkdir(parents=True)
        with open(folder / "progress.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, NEEDED)
            writer.writeheader()
            for b, r in enumerate(rewards, start=1):
                writer.writerow(
                    {"batch": b, "episodes": 10 * b, "env_steps": 100_000 * b, "wall_s": b, "running_reward": r}
                    | {k: 0 for k in NEEDED if k not in ("batch", "episodes", "env_steps", "wall_s", "running_reward")}
                )

    write(0, [-20, 1.0])  # reached the goal at 200k steps
    write(1, [-20, -10, -5])  # stopped at the 300k cap
    write(2, [-20, -10])  # stopped short (killed, say) at 200k
    [found] = setting_curves(tmp_path / "s", "steps", points=301)  # x every 1,000 steps
    at = {round(x * 1e6): k for k, x in enumerate(found["x"])}  # steps axis is in millions
    k = at[300_000]
    # at 300k: seed 0 holds +1 (done), seed 1 is at -5, seed 2 has left the statistics
    assert (found["median"][k], found["min"][k], found["max"][k]) == (-2.0, -5.0, 1.0)
    assert not found["all_seeds"][k] and found["all_seeds"][at[200_000]]

    (tmp_path / "s" / "trials" / "batch-size=10__seed=1" / "progress.csv").write_text(",".join(NEEDED) + "\n")
    assert [c["seeds"] for c in setting_curves(tmp_path / "s", "steps")] == [2]  # seed 1: no batch yet
    (tmp_path / "s" / "trials" / "batch-size=10__seed=2" / "progress.csv").write_text("junk\n" * 3)
    with pytest.raises(PlotError, match="seed=2/progress.csv: not a pgpong progress.csv"):
        setting_curves(tmp_path / "s", "steps")  # damage is named, not taken for a trial not begun


@pytest.mark.parametrize(
    "column, value",
    [
        ("running_reward", "1.7e308"),
        ("episodes", "1e308"),
        ("score_max", "inf"),
        ("steps_per_s", "nan"),
        ("wall_s", "-5"),
    ],
)
def test_a_value_no_run_writes_is_refused_naming_file_line_and_column(tmp_path, column, value, capsys):
    run = fake_run(tmp_path / "run", batches=5)
    with open(run / "progress.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    rows[2][column] = value  # line 4 of the file
    with open(run / "progress.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, NEEDED)
        writer.writeheader()
        writer.writerows(rows)
    for x in ("episodes", "hours"):
        proc = run_here(capsys, "plot", str(run), "--x", x)
        assert_one_line_error(proc, str(run / "progress.csv"), "line 4", f"column {column}", value, "delete that line")
    assert not (run / "learning.png").exists()


def test_a_progress_csv_that_is_no_text_file_is_refused(tmp_path, capsys):
    import os

    runs = {name: tmp_path / name for name in ("fifo", "folder", "binary", "missing")}
    for run in runs.values():
        run.mkdir()
    os.mkfifo(runs["fifo"] / "progress.csv")  # nothing writes to it: reading would wait for ever
    (runs["folder"] / "progress.csv").mkdir()
    (runs["binary"] / "progress.csv").write_bytes(bytes(range(128, 256)) * 8)
    expected = {
        "fifo": "not a regular file",
        "folder": "not a regular file",
        "binary": "not UTF-8 text",
        "missing": "no progress.csv",
    }
    for name, words in expected.items():  # (the pipe in a process of its own: were it read, it would hang)
        proc = (
            run_pgpong("plot", str(runs[name]), timeout=60)
            if name == "fifo"
            else run_here(capsys, "plot", str(runs[name]))
        )
        assert_one_line_error(proc, str(runs[name]), words)
    proc = run_here(capsys, "plot", str(tmp_path / "nowhere"))  # the run, not the picture beside it
    assert_one_line_error(proc, f"{tmp_path / 'nowhere'}: no such run directory")
    assert "did you mean" not in proc.stderr  # nothing beside it is close
    for command in ("plot", "play", "weights"):  # a name mistyped: the closest one beside it
        proc = run_here(capsys, command, str(tmp_path / "foldr"))
        assert_one_line_error(proc, f"{tmp_path / 'foldr'}: no such", f"; did you mean {runs['folder']}?")
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    proc = run_here(capsys, "play", str(tmp_path / "dangling"))
    assert_one_line_error(proc, f"{tmp_path / 'dangling'}: a broken symbolic link (to {tmp_path / 'gone'})")
    (runs["missing"] / "study.json").write_text("{}")  # a study's directory where a run's was expected
    proc = run_here(capsys, "plot", str(runs["missing"]))
    assert_one_line_error(proc, "a study, not a run", f"pgpong plot --by setting {runs['missing']}")
    proc = run_here(
        capsys,
        "plot",
        str(fake_run(tmp_path / "ok", batches=3)),
        "--output",
        str(runs["binary"] / "progress.csv" / "x.png"),
    )
    assert_one_line_error(proc, f"{runs['binary'] / 'progress.csv'} is not a directory")
    assert sorted(p.name for p in tmp_path.rglob("*.png")) == []


def test_an_unreadable_run_is_one_line(tmp_path, monkeypatch):
    import os

    run = fake_run(tmp_path / "run", batches=3)

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "open", denied)  # progress.csv chmod 000
    with pytest.raises(PlotError, match=r"progress.csv: cannot read \(Permission denied\)"):
        read_curve(run)
    monkeypatch.undo()
    monkeypatch.setattr(type(run), "exists", lambda self: denied())  # the run directory chmod 000
    with pytest.raises(PlotError, match="cannot read"):
        read_curve(run)
