"""`pgpong bench` with a tiny budget: every section present, numbers plausible."""

import json
import statistics

import pytest

from conftest import run_here, run_pgpong
from test_cli import assert_one_line_error


@pytest.mark.slow
@pytest.mark.long
def test_bench_smoke_prints_every_section_with_plausible_numbers():
    args = [
        "bench",
        "--workers",
        "2",
        "--batch-sizes",
        "1,2",
        "--train-batches",
        "2",
        "--update-batches",
        "1",
        "--ceiling-seconds",
        "1.2",
        "--original-seconds",
        "0.5",
        "--max-episode-steps",
        "150",
        "--memory-steps",
        "600",
    ]
    proc = run_pgpong(*args, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)

    assert report["setup"]["workers"] == 2
    raw, ceiling, training = report["raw"], report["ceiling"], report["training"]
    assert len(raw["steps_per_s_rounds"]) - 1 == len(ceiling["steps_per_s_rounds"]) == training["batches"] == 2
    assert raw["steps_per_s"] == statistics.median(raw["steps_per_s_rounds"]) > 0
    assert ceiling["steps_per_s"] > 0 and ceiling["matches"] >= 2
    assert ceiling["gymnasium_seeded_reset_s"] > ceiling["pgpong_seeded_reset_s"] > 0
    assert training["steps_per_s_median"] > 0
    # each training batch is compared with raw emulation just before and after it
    # (the mean of the two), and with Gymnasium's env just before it
    per_batch, rounds = [row["steps_per_s"] for row in training["rows"]], raw["steps_per_s_rounds"]
    assert training["ratio_to_raw"] == pytest.approx(
        statistics.median(2 * t / (a + b) for t, a, b in zip(per_batch, rounds[:-1], rounds[1:], strict=True))
    )
    assert training["ratio_to_ceiling"] == pytest.approx(
        statistics.median(t / c for t, c in zip(per_batch, ceiling["steps_per_s_rounds"], strict=True))
    )
    original = report["original"]
    assert original["episodes"] >= 2 and original["steps_per_s"] > 0
    assert training["speedup_vs_original"] == pytest.approx(training["steps_per_s_median"] / original["steps_per_s"])

    per_step = report["time"]["worker_us_per_step"]
    assert set(per_step) == {"emulator", "input and forward", "bookkeeping"}
    assert all(v > 0 for v in per_step.values())
    assert per_step["emulator"] > per_step["input and forward"]  # the emulator is the bulk of a step
    assert report["time"]["worker_ms_per_episode"]["backward"] > 0
    driver = report["time"]["driver_ms_per_batch"]
    assert set(driver) == {
        "publish weights",
        "barrier",
        "sum gradients",
        "rmsprop step",
        "checkpoint write",
        "between episodes",
    }
    assert all(v >= 0 for v in driver.values())  # checkpoints come once a minute: their phase may be 0
    # between episodes: the batch's time a worker spends neither in its episodes nor in the barrier
    share = report["time"]["driver_share_of_batch"]
    assert 0 < share["between episodes"] < 1 and share["barrier"] + share["between episodes"] < 1
    assert all(0 <= share < 1 for share in report["time"]["driver_share_of_batch"].values())

    assert [u["batch_size"] for u in report["updates"]] == [1, 2]
    for u in report["updates"]:
        assert u["seconds_per_update"] > 0 and u["workers"] == 2 and u["nodes"] == 1
        # the lower bound of any schedule never exceeds what the update took
        assert 0 < u["lower_bound_s"] <= u["seconds_per_update"] and 0 < u["efficiency"] <= 1
        assert u["driver_cpu_ms"] > 0
        # one worker's gradient is at most a dense one; batch 2 on 2 workers: each episode's own
        assert 0 < u["bytes_into_driver"] <= u["batch_size"] * (200 * 6400 * 4 + 6400 * 2 + 200 * 4)

    memory = report["memory"]
    assert 0 < memory["record_bytes_per_step"] < 1024
    assert memory["long_episode_steps"] == 600  # one long episode across several matches
    assert 50 * 2**20 < memory["worker_peak_rss_bytes"] < 2**30


def test_bench_text_output_has_every_table():
    from pgpong.bench import format_report

    report = {
        "setup": {"env_id": "ALE/Pong-v5", "workers": 2, "cpus": 2, "python": "3.11", "max_episode_steps": None},
        "raw": {"steps_per_s": 5000.0, "matches": 12},
        "ceiling": {
            "steps_per_s": 4000.0,
            "reset_s_per_match": 0.008,
            "matches": 9,
            "gymnasium_seeded_reset_s": 0.15,
            "pgpong_seeded_reset_s": 0.0001,
        },
        "original": {"steps_per_s": 1000.0, "episodes": 8},
        "training": {"steps_per_s_median": 3500.0, "ratio_to_ceiling": 0.875, "speedup_vs_original": 3.5, "batches": 3},
        "time": {
            "worker_us_per_step": {"emulator": 400.0, "input and forward": 30.0, "bookkeeping": 9.0},
            "worker_ms_per_episode": {"reset": 150.0, "backward": 6.0},
            "driver_ms_per_batch": {"publish weights": 3.0, "barrier": 500.0},
            "driver_share_of_batch": {"publish weights": 0.001, "barrier": 0.1},
        },
        "updates": [
            {
                "batch_size": 10,
                "workers": 2,
                "nodes": 1,
                "seconds_per_update": 2.5,
                "lower_bound_s": 2.25,
                "best_whole_matches_s": 2.3,
                "efficiency": 0.9,
                "overhead_s": 0.05,
                "driver_cpu_ms": 41.0,
                "bytes_into_driver": 9 * 2**20,
                "waiting_for_cpu": {
                    "driver": {"processes": 1, "code_wait_ms": 3.2},
                    "rollout workers": {"processes": 2, "code_wait_ms": 1234.5},
                    "ray": {"processes": 3, "code_wait_ms": 20.0},
                },
            }
        ],
        "memory": {
            "record_bytes_per_step": 93.0,
            "original_bytes_per_step": 52824,
            "long_episode_steps": 10000,
            "worker_peak_rss_bytes": 150 * 2**20,
            "worker_rss_before_bytes": 110 * 2**20,
        },
    }
    text = format_report(report)
    for needle in (
        "| raw emulation: ALE alone, random UP/DOWN, one screen fetch a step | 5,000 | 1.00 | 1.25 |",
        "| 4,000 | 0.80 | 1.00 |",
        "| 3,500 | **0.70** | 0.88 |",
        "| 1,000 | 0.20 | 0.25 |",
        "3.5 times as fast as the original",
        "| emulator | 400.0 us/step |",
        "waiting for the slowest episode",
        "| 10 | 2 | 1 | 2.50 s | 2.25 s | 2.30 s | 0.90 | 50 ms | 41 ms | - | 9.0 MB |",  # no queue on one node
        "93 bytes/step",
        "150 MB",
        "Batch 10: waiting for a CPU here, ms per update, summed over the threads that run each part's code: driver 3, "
        "rollout workers 1,234 (2 processes), ray 20 (3 processes).",
    ):
        assert needle in text, needle


@pytest.mark.parametrize(("env_id", "low", "high"), [("ALE/Pong-v5", 4, 4), ("Pong-v0", 2, 4)])
def test_raw_emulation_steps_frameskip_frames_per_step_inside_ale(env_id, low, high):
    from pgpong.bench import BenchWorker
    from pgpong.pool import WorkerSettings

    worker = BenchWorker(WorkerSettings(env_id))
    run = worker.raw_play(0.3, seed=5)
    assert run["steps"] > 50
    # ALE counts the frames it emulates: 4 a step for v5, 2 to 4 for Pong-v0 (a step
    # that ends a match stops at its last frame)
    assert low * run["steps"] - high * run["matches"] <= run["frames"] <= high * run["steps"]
    if low < high:
        assert abs(run["frames"] / run["steps"] - 3) < 0.3


def test_bench_refuses_bad_values():
    proc = run_pgpong("bench", "--batch-sizes", "0,10")
    assert proc.returncode == 2 and "--batch-sizes" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_pgpong("bench", "--workers", "0")
    assert proc.returncode == 2 and "--workers" in proc.stderr
    proc = run_pgpong("bench", "--original-seconds", "0")
    assert proc.returncode == 2 and "--original-seconds must be more than 0 and at most 3600 seconds" in proc.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--bank-policy", "shipped"], "--bank-policy sets the simulated matches' bank: it needs --simulate"),
        (["--bank-matches", "5"], "--bank-matches sets the simulated matches' bank: it needs --simulate"),
        (
            ["--simulate", "1x2", "--bank-matches", "99999999999999999999"],
            "--bank-matches must be at least 1 and at most 100, got 99999999999999999999",
        ),
        (["--simulate", "1x2", "--batch-sizes", "10,8193"], "--batch-sizes must be at most 8192"),
        (
            ["--simulate", "1x2", "--batch-sizes", "10," + "9" * 5000],
            "--batch-size: a number of 5,000 digits is out of range",
        ),
        (
            ["--simulate", "1x2", "--batch-sizes", "10,x"],
            "--batch-size: expected numbers separated by commas, got '10,x'",
        ),
        (["--simulate", "1x2", "--bank-policy", ""], "--bank-policy must be new, shipped, or a checkpoint"),
        (["--simulate", "1x2", "--bank-policy", "nowhere"], "(give new, shipped, or a checkpoint or run directory)"),
    ],
)
def test_bench_refuses_what_it_would_ignore_or_never_finish(args, message, capsys):
    proc = run_here(capsys, "bench", *args)  # at once: before Ray, before any bank is played
    assert_one_line_error(proc, message)


def test_with_json_stdout_carries_the_report_alone(capfd):
    """Ray's processes inherit stdout (a raylet once warned there, in front of the JSON):
    while bench runs with --json, anything else written to stdout goes to stderr."""
    import subprocess

    from pgpong.cli.bench import stdout_for_the_report

    with stdout_for_the_report(True) as out:
        print("a line of noise")
        subprocess.run(["echo", "a child's noise"], check=True)
        out.write('{"ok": 1}\n')
    captured = capfd.readouterr()
    assert json.loads(captured.out) == {"ok": 1}
    assert "a line of noise" in captured.err and "a child's noise" in captured.err
    print("stdout again")
    assert capfd.readouterr().out == "stdout again\n"


def test_bench_plays_with_the_settings_training_plays_with():
    """bench's workers are built as `pgpong train`'s are, the default entropy bonus
    included (a pool built by hand plays without it: its gradients differ)."""
    from pgpong.bench.options import BenchOptions
    from pgpong.bench.updates import as_trained
    from pgpong.config import TrainConfig
    from pgpong.session import worker_settings

    settings = as_trained(BenchOptions(env_id="Pong-v0", max_episode_steps=300))
    assert settings == worker_settings(TrainConfig(env_id="Pong-v0", max_episode_steps=300))
    assert settings.entropy_bonus == TrainConfig().entropy_bonus > 0
    assert (settings.env_id, settings.max_episode_steps) == ("Pong-v0", 300)
