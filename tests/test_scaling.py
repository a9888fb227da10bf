"""The scaling model (scaling/model.py), its tables (scaling/__main__.py) and the learning
projection (scaling/learning.py)."""

import numpy as np
import pytest

from conftest import refused_in_one_line
from pgpong.placement import best_whole_matches
from pgpong.placement import first_free as makespan
from pgpong.scaling import PHASES, predict


def test_makespan_of_equal_matches_counts_the_waves():
    assert makespan([1.0] * 60, 64, 0.0) == 1.0
    assert makespan([1.0] * 65, 64, 0.0) == 2.0
    # 300 matches on 198 workers anywhere: two waves, as the best whole-match schedule
    assert makespan([1.0] * 300, 198, 0.0) == 2.0
    assert makespan([1.0] * 300, 198, 0.01) == pytest.approx(2.02)
    assert best_whole_matches([1.0] * 300, 198) == 2.0
    # episode order, first free worker: a long match last waits for a free worker
    assert makespan([1.0, 1.0, 2.0], 2, 0.0) == 3.0 and best_whole_matches([1.0, 1.0, 2.0], 2) == 2.0


def test_prediction_is_bounded_by_the_schedule_and_the_driver_does_not_grow_with_the_batch():
    early = PHASES["early"]
    small, big = predict(60, 1, 64, early, samples=20), predict(300, 11, 18, early, samples=20)
    huge = predict(3000, 110, 18, early, samples=5)
    for p in (small, big, huge):
        assert p["lower_bound_s"] <= p["best_whole_matches_s"] <= p["pgpong_schedule_s"] < p["seconds_per_update"]
        assert 0 < p["efficiency"] < 1
        assert p["of_best_whole_matches"] == pytest.approx(p["seconds_per_update"] / p["best_whole_matches_s"])
    # one sum into the driver whatever the batch; a small part per node
    assert small["bytes_into_driver"] == big["bytes_into_driver"] == huge["bytes_into_driver"]
    assert small["driver_cpu_ms"] < big["driver_cpu_ms"] < huge["driver_cpu_ms"]


def test_the_queue_takes_a_bounded_number_of_reports_however_many_nodes():
    """At 110x18, batch 3,000, late in training, the 110 leaders' reports every 0.5 s were
    975 of the queue's 1,740 calls an update (1,748 ms of its CPU); at most 32 a second,
    they are about 140."""
    late = predict(3000, 110, 18, PHASES["late"], samples=20)
    assert late["queue_cpu_ms"] < 1000, late
    small = predict(300, 11, 18, PHASES["late"], samples=20)  # 11 leaders: the cadence of before
    assert 150 < small["queue_cpu_ms"] < 200, small


def test_workers_sharing_the_cores_start_a_batch_of_300_at_once_on_11x18():
    """--workers-per-cpu 1.6 or more: 300 workers for 300 matches, 27-28 a node, all in
    play at once (the cores shared), beats the best schedule of whole matches a core
    each, early and late; at 1.5 (297 workers) three matches wait for a second wave,
    worse than 1 early in training."""
    early = PHASES["early"]
    alone, shared, short, more = (predict(300, 11, 18, early, samples=20, per_cpu=n) for n in (1.0, 1.6, 1.5, 3.0))
    assert (alone["workers"], shared["workers"], short["workers"], more["workers"]) == (198, 300, 297, 300)
    assert more["seconds_per_update"] == shared["seconds_per_update"]
    assert shared["pgpong_schedule_s"] < shared["best_whole_matches_s"] < alone["pgpong_schedule_s"]
    assert shared["of_best_whole_matches"] < 1.0 and alone["of_best_whole_matches"] > 1.1
    late = [predict(300, 11, 18, PHASES["late"], samples=20, per_cpu=n) for n in (1.0, 1.6)]
    assert late[1]["seconds_per_update"] < 0.85 * late[0]["seconds_per_update"]
    assert short["pgpong_schedule_s"] > alone["pgpong_schedule_s"]
    assert shared["lower_bound_s"] <= shared["pgpong_schedule_s"]


def test_projection_adds_the_models_seconds_per_update_until_the_threshold():
    from pgpong.scaling.learning import project

    rows = [
        {"batch_episodes": 10, "episode_len_mean": 1000.0, "running_reward": r, "episodes": 10.0 * (k + 1)}
        | {"env_steps": 10_000.0 * (k + 1)}
        for k, r in enumerate([-20.0, -12.0, -3.0, 0.5, 2.0])
    ]
    first = project(rows[:1], 1, 64, threshold=-25.0)  # one early update
    assert first is not None
    # the bank's lengths scaled to the batch's mean (1,000 here; the bank's is about 980)
    assert first["minutes"] * 60 == pytest.approx(predict(10, 1, 64, PHASES["early"])["seconds_per_update"], rel=0.05)
    found = project(rows, 1, 64, threshold=0.0)
    assert found is not None and found["matches"] == 40 and found["env_steps"] == 40_000
    # two updates in the early phase, two in the late one (same mean length, other constants)
    late = project(rows[2:4], 1, 64, threshold=0.0)
    assert late is not None
    assert found["minutes"] == pytest.approx(2 * first["minutes"] + late["minutes"], rel=1e-9)
    assert project(rows, 1, 64, threshold=10.0) is None


def test_learning_table_groups_runs_by_batch_and_names_the_fastest_per_core_count(tmp_path):
    from pgpong.scaling.learning import CORES, learning_table, project

    head = "batch,episodes,env_steps,wall_s,running_reward,episode_len_mean,batch_episodes,workers\n"

    def write(name, batch, rewards):
        run = tmp_path / name
        run.mkdir()
        lines = [
            f"{k + 1},{batch * (k + 1)},{1000 * batch * (k + 1)},{60.0 * (k + 1)},{r},1000,{batch},0"
            for k, r in enumerate(rewards)
        ]
        (run / "progress.csv").write_text(head + "\n".join(lines) + "\n")
        return run

    slow = write("b10-a", 10, [-20, -10, -5, -1, 0.5])  # 5 updates of 10
    fast = write("b10-b", 10, [-20, -5, 0.2])  # 3 updates of 10
    big = write("b60-a", 60, [-20, 1.0])  # 2 updates of 60
    never = write("b60-b", 60, [-20, -19])
    text = learning_table([str(slow), str(fast), str(big), str(never)])
    assert "| b60-b | 60 | not reached: -19.0 after 120 | 0.1M |" in text
    rows = {
        line.split("|")[1].strip(): line
        for line in text.splitlines()
        if line.startswith("| 10 ") or line.startswith("| 60 ")
    }
    assert rows["10"].split("|")[2].strip() == "2/2" and rows["60"].split("|")[2].strip() == "1/2"

    def minutes(run, cores):
        from pgpong.scaling.learning import learning_curve

        found = project(learning_curve(str(run / "progress.csv")), *CORES[cores], 0.0)
        assert found is not None
        return found["minutes"]

    a, b = minutes(slow, 64), minutes(fast, 64)
    assert f"{(a + b) / 2:.1f} ({min(a, b):.1f}-{max(a, b):.1f})" in rows["10"]  # median (range) of the two
    fastest = 60 if minutes(big, 64) < (a + b) / 2 else 10
    assert f"64 cores: batch {fastest}: " in text


def test_the_tables_refuse_bad_input_in_one_line(tmp_path, capsys):
    from pgpong.scaling.__main__ import main

    foreign = tmp_path / "other.csv"
    foreign.write_text("step,loss\n1,0.5\n")
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    damaged = tmp_path / "damaged.csv"  # a run's columns, and a value no run writes on its second row
    head = "batch,episodes,env_steps,wall_s,running_reward,episode_len_mean,batch_episodes,workers\n"
    damaged.write_text(head + "1,10,10000,1.0,-20.5,1000,10,2\n2,20,nan,2.0,-20.4,1000,10,2\n")
    for given, says in [
        (["--learning", str(tmp_path / "nowhere")], "no progress file"),
        (["--learning", str(foreign)], "is not a pgpong progress file (no batch_episodes"),
        (["--learning", str(empty)], "is not a pgpong progress file"),
        (["--learning", str(foreign), "--threshold", "nan"], "--threshold must be a running reward in [-21, 21]"),
        (["--threshold", "5"], "--threshold is the running reward --learning's runs reach: give it with --learning"),
        (["--learning", str(foreign), "--phase", "late"], "--phase is the model's: --learning takes each update's"),
        (["--learning", ""], "argument --learning: an empty path"),
        (["--learning", "/dev/null"], "/dev/null is neither a progress.csv file nor a directory"),
        (["--learning", str(damaged)], "line 3 holds a value no run writes (not finite, or beyond 1e15)"),
        (["--learning", str(foreign), "--lag", "1"], "argument --lag: not allowed with argument --learning"),
        (["--lag", "1", "--lag-share", "0.5"], "argument --lag-share: not allowed with argument --lag"),
        (["--lag-share", "1.5"], "--lag-share must be in (0, 1], got 1.5"),
        (["--lag", "3"], "argument --lag: invalid choice: 3"),  # argparse's own mistakes: one line too
        (["--phase", "middle"], "argument --phase: invalid choice: 'middle'"),
        (["--workers-per-cpu", "abc"], "argument --workers-per-cpu: must be auto or in [1, 4], got 'abc'"),
        (["--workers-per-cpu", "0.5"], "--workers-per-cpu must be auto or in [1, 4], got 0.5"),
        (["--workers-per-cpu", "nan"], "--workers-per-cpu must be auto or in [1, 4], got nan"),
    ]:
        assert says in refused_in_one_line(main, given, "python -m pgpong.scaling", capsys), given


def test_ctrl_c_while_a_table_is_worked_out_ends_with_130_and_one_line(monkeypatch, capsys):
    import pgpong.scaling.__main__ as tables

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    for flags, where in [([], "model_table"), (["--lag", "1"], "lag_table"), (["--learning", "x"], "learning_table")]:
        monkeypatch.setattr(tables, where, interrupted)
        with pytest.raises(SystemExit) as stop:
            tables.main(flags)
        captured = capsys.readouterr()
        assert stop.value.code == 130 and captured.out == "", flags
        assert captured.err == "python -m pgpong.scaling: stopped (Ctrl-C); no table printed\n", flags


def test_a_study_directory_without_its_study_json_or_a_directory_of_runs_gives_its_runs(tmp_path):
    from pgpong.scaling.learning import progress_files

    for name in ("batch-size=10__seed=1", "batch-size=10__seed=0"):
        (tmp_path / "s" / "trials" / name).mkdir(parents=True)
        (tmp_path / "s" / "trials" / name / "progress.csv").write_text("")
    found = progress_files([str(tmp_path / "s")])
    assert [p.parent.name for p in found] == ["batch-size=10__seed=0", "batch-size=10__seed=1"]
    found = progress_files([str(tmp_path / "s" / "trials")])  # a directory of run directories
    assert [p.parent.name for p in found] == ["batch-size=10__seed=0", "batch-size=10__seed=1"]


def test_a_study_copied_under_another_name_reads_its_own_trials_and_an_empty_one_is_refused(tmp_path):
    import csv as csv_module

    from pgpong.scaling.learning import progress_files
    from pgpong.study.plan import Stops, Study

    study = Study("made", tmp_path, {"batch_size": [10]}, {}, [0, 1], Stops(matches=4))
    study.save()
    copy = tmp_path / "copied"
    (tmp_path / "made").rename(copy)  # study.json still says "made"
    with pytest.raises(FileNotFoundError, match="no progress file"):
        progress_files([str(copy)])  # no trial has run yet: an error, not an empty table
    trial = copy / "trials" / "batch-size=10__seed=1"
    trial.mkdir(parents=True)
    (trial / "progress.csv").write_text("")
    assert progress_files([str(copy)]) == [trial / "progress.csv"]
    foreign = tmp_path / "long.csv"
    foreign.write_text("x" * (csv_module.field_size_limit() + 10) + "\n")
    from pgpong.scaling.learning import learning_curve

    with pytest.raises(ValueError, match="is not a pgpong progress file"):
        learning_curve(str(foreign))


def test_a_ramp_run_is_grouped_as_its_ramp_and_projected_batch_by_batch(tmp_path):
    from pathlib import Path

    from pgpong.config import TrainConfig, save_config
    from pgpong.scaling.learning import learning_table, project

    run = Path(tmp_path / "ramp")
    run.mkdir()
    save_config(TrainConfig(batch_size=60, ramp_from=10), run / "config.json")
    head = "batch,episodes,env_steps,wall_s,running_reward,episode_len_mean,batch_episodes,workers\n"
    sizes, rewards = [10, 35, 60], [-20.0, -8.0, 0.5]
    done = [sum(sizes[: k + 1]) for k in range(3)]
    lines = [f"{k + 1},{done[k]},{1000 * done[k]},{60.0 * (k + 1)},{rewards[k]},1000,{sizes[k]},0" for k in range(3)]
    (run / "progress.csv").write_text(head + "\n".join(lines) + "\n")
    text = learning_table([str(run)])
    assert "| ramp | 10-60 | 105 | 0.1M |" in text
    assert "| 10 growing to 60 over 1,000 matches (the batch rule) | 1/1 |" in text
    save_config(TrainConfig(batch_size=60, ramp_from=10, warmup="on"), run / "config.json")
    assert "| 10 growing to 60 over 1,000 matches (the batch rule, warm-up) | 1/1 |" in learning_table([str(run)])
    save_config(TrainConfig(batch_size=60, warmup="on"), run / "config.json")
    assert "| 10 (lr 0.0049, decay 0.94, warm-up) |" in learning_table([str(run)])  # batch: its first row's
    rows = [{k: float(v) for k, v in zip(head.strip().split(","), line.split(","), strict=True)} for line in lines]
    whole = project(rows, 1, 64)
    parts = [found["minutes"] for row in rows if (found := project([row], 1, 64, threshold=-99))]
    assert whole is not None and len(parts) == 3
    # each update at its own batch size: the sum of the three one-row projections
    assert whole["minutes"] == pytest.approx(sum(parts), rel=1e-9)
    assert parts[0] < parts[2]  # batch 60 late takes longer than 10 early on 64 cores


def test_a_lagged_run_is_grouped_apart_and_projected_at_the_lags_pace(tmp_path):
    """A run with --lag 1 (its config.json says so) is its own row, and each of its
    updates takes predict_lag's steady pace, not a lone batch's."""
    from pathlib import Path

    from pgpong.config import TrainConfig, save_config
    from pgpong.scaling import Constants, predict, predict_lag
    from pgpong.scaling.learning import learning_table, project

    head = "batch,episodes,env_steps,wall_s,running_reward,episode_len_mean,batch_episodes,workers\n"
    line = "1,300,300000,60.0,0.5,1000,300,0"
    for lag in (0, 1):
        run = Path(tmp_path / f"lag{lag}")
        run.mkdir()
        save_config(TrainConfig(batch_size=300, lag=lag), run / "config.json")
        (run / "progress.csv").write_text(head + line + "\n")
    text = learning_table([str(tmp_path / "lag0"), str(tmp_path / "lag1")])
    assert "| 300 (lr 0.011, decay 0.7) | 1/1 |" in text
    assert "| 300 (lr 0.011, decay 0.7, lag 1) | 1/1 |" in text
    row = {k: float(v) for k, v in zip(head.strip().split(","), line.split(","), strict=True)}
    alone, lagged = project([row], 11, 18), project([row], 11, 18, lag=1)
    assert alone is not None and lagged is not None
    c = PHASES["late"]
    bank = np.asarray(c.lengths, dtype=float)
    shaped = Constants(**{**c.__dict__, "lengths": tuple(int(x) for x in bank / bank.mean() * 1000)})
    assert lagged["minutes"] * 60 == pytest.approx(predict_lag(300, 11, 18, shaped, 1)["seconds_per_update"])
    assert alone["minutes"] * 60 == pytest.approx(predict(300, 11, 18, shaped, 30)["seconds_per_update"])
    assert lagged["minutes"] < 0.8 * alone["minutes"]  # at 11x18 the lag fills the second wave's idle workers
    shared = project([row], 11, 18, share=0.5)  # half of each batch behind: between the two
    assert shared is not None and lagged["minutes"] < shared["minutes"] < 0.8 * alone["minutes"]
    assert shared["minutes"] * 60 == pytest.approx(predict_lag(300, 11, 18, shaped, 0, share=0.5)["seconds_per_update"])
    run = Path(tmp_path / "shared")
    run.mkdir()
    save_config(TrainConfig(batch_size=300, lag_share=0.5), run / "config.json")
    (run / "progress.csv").write_text(head + line + "\n")
    assert "| 300 (lr 0.011, decay 0.7, lag share 0.5) | 1/1 |" in learning_table([str(run)])


def test_the_table_at_workers_per_cpu_auto_gives_each_row_what_auto_picks():
    """auto keeps one a CPU where the batch fits (1x64, batch 60) and takes 28 of 18 a
    CPU for batch 300 on 11x18, the fewest with a worker for each match: each row is
    predict()'s at that figure, and says how many workers it ran."""
    from pgpong.scaling.__main__ import model_table

    c, rows = PHASES["early"], [(60, 1, 64), (300, 11, 18)]
    auto = model_table(c, "auto", rows).splitlines()[2:]
    assert model_table(c, 1.0, rows).splitlines()[2].replace("1x64", "1x64 (64 workers, 1 a CPU)") == auto[0]
    assert auto[1].startswith("| 300 | 11x18 (300 workers, 1.56 a CPU) | ")
    expected = predict(300, 11, 18, c, per_cpu=28 / 18)
    cells = auto[1].split(" | ")
    assert cells[2] == f"{expected['seconds_per_update']:.2f} s"
    assert cells[4] == f"{expected['best_whole_matches_s']:.2f} s"
    assert model_table(c, 28 / 18, rows).splitlines()[3] == auto[1]


def test_runs_projected_at_workers_per_cpu_auto_take_each_batchs_pick(tmp_path):
    """--learning at auto: a batch of 300 on 11x18 is projected at auto's 28/18 a CPU
    (faster than at one a CPU, as the model's table says), a batch that fits the cores
    as at one a CPU, with a lag too."""
    from pathlib import Path

    from pgpong.config import TrainConfig, save_config
    from pgpong.scaling.learning import CORES, learning_table, project

    head = "batch,episodes,env_steps,wall_s,running_reward,episode_len_mean,batch_episodes,workers\n"
    line = "1,300,300000,60.0,0.5,1000,300,0"
    row = {k: float(v) for k, v in zip(head.strip().split(","), line.split(","), strict=True)}
    auto, one = project([row], 11, 18, per_cpu="auto"), project([row], 11, 18)
    assert auto is not None and one is not None
    assert auto == project([row], 11, 18, per_cpu=28 / 18) and auto["minutes"] < 0.9 * one["minutes"]
    assert project([row], 1, 2, per_cpu="auto") == project([row], 1, 2)  # 300 on 2 CPUs: more than 4 a CPU
    lagged = project([row], 11, 18, lag=1, per_cpu="auto")
    assert lagged is not None and lagged == project([row], 11, 18, lag=1, per_cpu=28 / 18)
    assert lagged["minutes"] < auto["minutes"] and lagged != project([row], 11, 18, lag=1)
    for lag in (0, 1):
        run = Path(tmp_path / f"lag{lag}")
        run.mkdir()
        save_config(TrainConfig(batch_size=300, lag=lag), run / "config.json")
        (run / "progress.csv").write_text(head + line + "\n")
    text = learning_table([str(tmp_path / "lag0"), str(tmp_path / "lag1")], per_cpu="auto")
    assert "| 198 cores (11x18, projected, --workers-per-cpu auto) |" in text
    cells = {r.split(" | ")[0]: r.split(" | ") for r in text.splitlines() if r.startswith("| lag")}
    assert cells["| lag1"][-1] == f"{lagged['minutes']:.1f} |"
    assert cells["| lag0"][-1] == f"{auto['minutes']:.1f} |" and len(cells["| lag0"]) == 5 + len(CORES)


def test_the_lag_table_gives_no_bound_of_the_work_where_the_batches_cannot_fill_the_cpus():
    from pgpong.scaling.__main__ import lag_table

    c = PHASES["early"]
    rows = [(10, 1, 64), (60, 1, 64), (300, 11, 18)]  # with lag 1: 20, 120 and 600 matches at once
    lagged = [line.split(" | ")[-1].rstrip(" |") for line in lag_table(c, 1, rows=rows).splitlines()[2:]]
    assert lagged[0] == "-" and all(0.9 < float(x) < 1.3 for x in lagged[1:]), lagged
    shared = [line.split(" | ")[-1].rstrip(" |") for line in lag_table(c, 0, 0.5, rows=rows).splitlines()[2:]]
    assert shared[0] == "-" and all(float(x) > 0.9 for x in shared[1:]), shared  # 15, 90 and 450 at once


def test_the_lag_table_at_auto_shares_the_cores_where_auto_starts_more_workers():
    """--lag 1 --workers-per-cpu auto: 1x64's batches fit its cores (one a CPU, the table
    as without the flag); 11x18's 300 matches start at once on 28 workers a node."""
    from pgpong.scaling import predict_lag
    from pgpong.scaling.__main__ import lag_table

    c, rows = PHASES["early"], [(60, 1, 64), (300, 11, 18)]
    one, auto = lag_table(c, 1, rows=rows).splitlines(), lag_table(c, 1, per_cpu="auto", rows=rows).splitlines()
    assert auto[2] == one[2].replace("| 1x64 |", "| 1x64 (64 workers, 1 a CPU) |")
    assert auto[3].startswith("| 300 | 11x18 (300 workers, 1.56 a CPU) | ")
    shared = predict_lag(300, 11, 18, c, 1, per_cpu=28 / 18)
    assert shared["workers"] == 300 and predict_lag(300, 11, 18, c, 1)["workers"] == 198
    assert auto[3].split(" | ")[3] == f"{shared['seconds_per_update']:.2f} s" and auto[3] != one[3]
