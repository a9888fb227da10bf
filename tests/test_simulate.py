"""`pgpong bench --simulate`: a small simulated cluster through the real command line,
so the simulation cannot rot; its shapes and bad input."""

import json
import os
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from conftest import run_here, run_pgpong
from pgpong.bench.options import Shape
from pgpong.bench.simulate import SharedCores, bank_index
from pgpong.bench.updates import updates
from pgpong.rollout import EpisodeId
from pgpong.runlog import BatchRow
from pgpong.trainer import BatchReport


@pytest.mark.slow
@pytest.mark.long
def test_a_simulated_cluster_of_two_nodes_reports_every_figure():
    proc = run_pgpong(
        "bench",
        "--simulate",
        "2x4",
        "--batch-size",
        "20",
        "--bank-matches",
        "3",
        "--max-episode-steps",
        "200",
        "--update-batches",
        "1",
        "--pace",
        "1500",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    shape = report["simulated"]
    assert (shape["nodes"], shape["workers"], shape["worker_processes"]) == (2, 8, 2)
    bank = report["bank"]
    assert bank["matches"] == len(bank["steps"]) == 3 and max(bank["steps"]) <= 200
    (update,) = report["updates"]
    assert (update["batch_size"], update["workers"], update["nodes"]) == (20, 8, 2)
    assert len(update["updates"]) == 1
    # the matches last as long as at the pace asked (--pace), whatever this machine's own
    assert bank["pace_set"] and bank["steps_per_s_per_core"] == 1500 and bank["measured_steps_per_s_per_core"] > 0
    # and the longest of them is a floor of any schedule
    assert update["lower_bound_s"] >= max(bank["steps"]) / 1500 * 0.999
    assert update["seconds_per_update"] >= max(bank["steps"]) / 1500
    assert 0 < update["lower_bound_s"] <= update["seconds_per_update"] and 0 < update["efficiency"] <= 1
    assert update["lower_bound_s"] <= update["best_whole_matches_s"] * 1.000001
    assert update["of_best_whole_matches"] >= 1 and update["overhead_s"] > 0
    assert update["driver_cpu_ms"] > 0 and 0 < update["machine_busy"] <= 1.5
    # the queue's share (it publishes the weights, and hands out the matches) is measured apart
    assert update["queue_cpu_ms"] > 0 and update["reducer_cpu_ms"] >= 0
    assert all(row["queue_cpu_ms"] > 0 for row in update["updates"])
    # each part's CPU and wait for one, read from Linux (on it): the simulated cluster's
    # processes are found, the driver's CPU agrees with its own clock
    if os.path.exists("/proc/self/schedstat"):
        (row,) = update["updates"]
        parts = row["processes"]
        assert {"driver", "queue", "reducer", "leaders", "workers", "ray"} <= set(parts)
        assert all(p["cpu_ms"] >= 0 and 0 <= p["code_wait_ms"] <= p["wait_ms"] for p in parts.values())
        assert parts["leaders"]["cpu_ms"] > 0 and parts["workers"]["cpu_ms"] > 0
        assert parts["driver"]["cpu_ms"] >= 0.5 * row["driver_cpu_ms"]  # the right process (read a little stale)
        assert set(update["waiting_for_cpu"]) == set(parts) and update["waiting_for_cpu"]["leaders"]["processes"] == 2
    # the driver received two chunk sums (16 and 4 episodes, each from the same 3 banked
    # matches), not 20 episodes' gradients
    per_episode = 20 * bank["gradient_mb_mean"] * 2**20
    assert 0 < update["bytes_into_driver"] < 0.5 * per_episode


def test_matches_sharing_a_process_cpus_slow_down_together():
    """Three matches of 1 s on 2 CPUs each play at 2/3 of their pace: all end at 1.5 s;
    once one ends, the other two have a CPU each (SharedCores, by its clock alone)."""
    now = [0.0]
    cores = SharedCores(2.0, clock=lambda: now[0])
    ends = [cores.start(1.0) for _ in range(3)]
    assert [cores.left(end) for end in ends] == pytest.approx([1.5, 1.5, 1.5])
    now[0] = 0.75  # half-way: 0.5 s of work done each
    cores.stop()  # one is given up (say, its slot's caller went away): two left, a CPU each
    assert cores.done == pytest.approx(0.5) and cores.left(ends[0]) == pytest.approx(0.5)
    now[0] = 1.25
    assert cores.left(ends[1]) == pytest.approx(0.0)
    for _ in range(2):  # both end
        cores.stop()
    longer = cores.start(1.0)  # alone: a CPU of its own
    assert cores.rate() == 1.0 and cores.left(longer) == pytest.approx(1.0)


def test_the_simulated_workers_layout_by_node_and_process():
    from pgpong.bench.options import Shape
    from pgpong.bench.simulate import layout

    workers, counts, per_process, node_cpus = layout(Shape(11, 18), 28 / 18, 300)  # auto at 11x18
    assert (workers, sorted(set(counts)), per_process, node_cpus) == (300, [27, 28], 28, 18.0) and sum(counts) == 300
    assert layout(Shape(11, 18), 1.0, 300)[:2] == (198, [18] * 11) and layout(Shape(11, 18), 1.0, 300)[3] is None
    workers, counts, per_process, node_cpus = layout(Shape(1, 20), 4.0, 80)  # 80 on a node: 3 processes
    assert (workers, counts, per_process, node_cpus) == (80, [80], 32, None)


def test_a_process_holding_a_whole_nodes_workers_shares_the_nodes_cpus_not_rays_count():
    """27 workers at 1.6 a CPU hold 27 x 0.625 = 16.9 of Ray's CPUs, but the operating
    system shares all 18 of their node's cores among them: so does their process."""
    process = simulating(100, 0.001)
    shared = type(process)(process.settings, process.bank, 0.001, per_cpu=1.6, cores=18.0)
    assert shared._cores is not None and shared._cores.cores == 18.0
    assert process._cores is None  # one a CPU: nothing shared


@pytest.mark.slow
@pytest.mark.long
def test_a_simulated_node_of_2_cpus_shares_them_among_3_workers():
    """bench --simulate 1x2 --workers-per-cpu auto, batch 3: 1.5 a CPU, three simulated
    workers in one process holding 2 CPUs (3 x 0.6666), whose three matches share them: an
    update takes at least 3 matches' work on 2 CPUs, not the longest match's time."""
    proc = run_pgpong(
        "bench",
        *("--simulate", "1x2", "--workers-per-cpu", "auto", "--batch-size", "3", "--bank-matches", "3"),
        *("--max-episode-steps", "200", "--update-batches", "1", "--pace", "300", "--json"),
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    shape, bank = report["simulated"], report["bank"]
    assert (shape["workers"], shape["worker_processes"], shape["workers_per_cpu"]) == (3, 1, 1.5)
    (update,) = report["updates"]
    assert update["workers"] == 3
    assert update["seconds_per_update"] >= 0.95 * 3 * min(bank["steps"]) / 300 / 2
    # the bounds are the 2 cores': 3 whole matches on 2 cores take at least two one after another
    assert update["best_whole_matches_s"] >= 2 * min(bank["steps"]) / 300 * 0.999
    assert update["overhead_s"] < update["seconds_per_update"]  # the rule's schedule is the shared one


@pytest.mark.slow
@pytest.mark.long
def test_a_simulated_cluster_with_lag_1_overlaps_the_batches():
    """--lag 1: the next batch is in the queue while this one's last matches play, so
    no worker waits for the slowest match of the batch: with full matches of different
    lengths, the workers' idle time with nothing to play is a fraction of a millisecond
    (without a lag, a worker waits about a quarter of the longest match at each batch's
    end: 40-170 ms with this bank, at 1,700-5,000 env steps/s a core). Up to 25 ms is
    allowed, for a machine busy with other work (10 ms was passed once, with an idle Ray
    instance of other tests beside it)."""
    proc = run_pgpong(
        "bench", "--simulate", "1x4", "--batch-size", "6", "--bank-matches", "3",
        "--update-batches", "3", "--lag", "1", "--json",
        env={"RAY_ADDRESS": "127.0.0.1:1"},  # a cluster of another command's: --simulate starts its own
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["simulated"]["lag"] == 1 and len(set(report["bank"]["steps"])) > 1
    (update,) = report["updates"]
    assert (update["batch_size"], update["workers"], len(update["updates"])) == (6, 4, 3)
    assert update["seconds_per_update"] > 0 and update["bytes_into_driver"] > 0
    idle = [row["barrier_s"] for row in update["updates"]]
    assert all(seconds < 0.025 for seconds in idle), idle


@pytest.mark.parametrize("lag,pace", [(0, 0.5), (1, 0.4)])
def test_an_update_runs_from_one_row_to_the_next(lag, pace):
    """An update's seconds run from the row before (here 0.2, 0.5 and 0.5 s apart),
    not over a call of the trainer (0.07 s here): the next batch plays between two
    calls, its weights out as soon as the step is checked (with --lag 1 before it),
    while bench makes its own measures. The pace is their median, or with --lag 1
    their mean (overlapping updates make up for each other)."""
    walls = [0.3, 0.6, 0.8, 1.3, 1.8]  # the warm-up's rows (one, or two with a lag), then the three updates'
    reports = iter(
        BatchReport(BatchRow(b, 10 * b, 9000 * b, wall, 0.3, 0, 0, 0, 0, 900, 0, 10, 4, 0), {}, {}, [0.025] * 10, 0)
        for b, wall in enumerate(walls[1 - lag :], 1)
    )

    def train_batch() -> BatchReport:
        time.sleep(0.07)
        return next(reports)

    trainer: Any = SimpleNamespace(
        config=SimpleNamespace(lag=lag, lagged=bool(lag), batch_size=10), train_batch=train_batch
    )
    pool: Any = SimpleNamespace(num_workers=4, nodes=lambda: 1)
    measured = updates(trainer, pool, 3, lambda _: None)
    assert [row["seconds"] for row in measured["updates"]] == pytest.approx([0.2, 0.5, 0.5], abs=1e-9)
    assert measured["seconds_per_update"] == pytest.approx(pace, abs=1e-9)
    assert measured["efficiency"] == pytest.approx(0.025 * 10 / 4 / measured["seconds_per_update"])
    assert (measured["overhead_s"] is None) == bool(lag)  # overlapping batches: no one-batch schedule to compare with


def spin(seconds: float) -> bool:
    """Burn `seconds` of this process's CPU (a reading's cost); False."""
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
    return False


class PublishingPool:
    """A pool whose reading costs 0.04 s of CPU; it records the tickets published, and
    says how many batches its queue has published with its own step (`stepped`)."""

    num_workers = 4

    def __init__(self) -> None:
        self.published: list[int] = []
        self.stepped = 0

    def nodes(self) -> int:
        return 1

    def helpers_cpu_seconds(self) -> dict[str, float]:
        spin(0.04)
        return {"queue": 1.0}

    def queue_calls(self) -> dict[str, int]:
        return {"stepped ahead": self.stepped}

    def publish(self, ticket: int, weights: Any, squares: Any = None) -> None:
        self.published.append(ticket)


def test_bench_leaves_its_own_reading_out_of_the_drivers_cpu():
    """Between two calls of the trainer bench reads its measures (the queue's CPU,
    every thread's times) while the next batch plays: that reading's CPU (here 60 ms)
    is not the driver's, whose update here took 20 ms of it."""

    walls = iter([0.5, 1.0, 1.5, 2.0])

    def train_batch() -> BatchReport:
        spin(0.02)
        wall = next(walls)
        return BatchReport(BatchRow(1, 10, 9000, wall, 0.3, 0, 0, 0, 0, 900, 0, 10, 4, 0), {}, {}, [0.025] * 10, 0)

    trainer: Any = SimpleNamespace(config=SimpleNamespace(lag=0, lagged=False, batch_size=10), train_batch=train_batch)
    pool: Any = SimpleNamespace(
        num_workers=4, nodes=lambda: 1, helpers_cpu_seconds=lambda: spin(0.06) or {"queue": 1.0, "reducer": 2.0}
    )
    measured = updates(trainer, pool, 3, lambda _: None)
    cpus = [row["driver_cpu_ms"] for row in measured["updates"]]
    assert all(19 <= cpu < 40 for cpu in cpus), cpus
    assert [row["seconds"] for row in measured["updates"]] == pytest.approx([0.5, 0.5, 0.5])
    assert all(row["queue_cpu_ms"] == row["reducer_cpu_ms"] == 0 for row in measured["updates"])


def test_without_a_lag_bench_reads_as_the_weights_go_out_and_leaves_the_reading_out():
    """Without a lag the trainer publishes the next batch's weights as soon as the
    step is checked, and bench reads its measures just before (no match plays
    then): an update runs from one batch's weights going out to the next's, here
    0.01 s of the row and 0.05 s of play, and the reading's 0.04 s (and its CPU)
    are left out of it."""
    pool: Any = PublishingPool()
    published = pool.published
    walls = iter(range(1, 10))

    def train_batch() -> BatchReport:
        time.sleep(0.05)  # the batch plays, the step
        pool.publish(len(published), None)  # the next batch's weights go out
        time.sleep(0.01)  # the row and the logs
        return BatchReport(
            BatchRow(1, 10, 9000, next(walls), 0.3, 0, 0, 0, 0, 900, 0, 10, 4, 0), {}, {}, [0.025] * 10, 0
        )

    trainer: Any = SimpleNamespace(config=SimpleNamespace(lag=0, lagged=False, batch_size=10), train_batch=train_batch)
    measured = updates(trainer, pool, 3, lambda _: None)
    assert published == [0, 1, 2, 3, 4]  # a warm-up, one batch more, three updates
    assert [row["seconds"] for row in measured["updates"]] == pytest.approx([0.06] * 3, abs=0.015)
    assert all(row["driver_cpu_ms"] < 30 for row in measured["updates"])
    assert "publish" not in vars(pool)  # bench's reading is gone from the pool after


def test_shapes():
    assert (Shape.parse("11x18").workers, Shape.parse("11x18").per_process) == (198, 18)
    assert Shape.parse("1x64").per_process == 32 and Shape.parse("2X4").per_process == 4
    assert Shape.parse("3x34").per_process == 17  # a divisor of the node's CPUs: no slot left over
    for bad in ("0x4", "4", "ax4", "2x0", "2x4x1", ""):
        with pytest.raises(ValueError, match="--simulate"):
            Shape.parse(bad)


def test_each_episode_has_a_fixed_banked_match_and_all_are_used():
    picks = [bank_index(EpisodeId(0, 1, k), 24) for k in range(300)]
    assert picks == [bank_index(EpisodeId(0, 1, k), 24) for k in range(300)]
    assert set(picks) == set(range(24))


@pytest.mark.parametrize(
    "args,message",
    [
        (["--simulate", "0x4"], "--simulate 0x4: 1-64 nodes"),
        (["--simulate", "many"], "--simulate takes NODESxCPUS"),
        (["--simulate", "2x4", "--address", "127.0.0.1:1"], "drop --address"),
        (["--simulate", "2x4", "--bank-matches", "0"], "--bank-matches must be at least 1"),
        (["--simulate", "2x4", "--bank-policy", "/nonexistent"], "/nonexistent: no such file or directory"),
        (["--simulate", "\u00b2x4"], "--simulate takes NODESxCPUS"),
        (["--ceiling-seconds", "1e300"], "--ceiling-seconds must be more than 0 and at most 3600 seconds"),
        (["--simulate", "2x4", "--lag", "2"], "--lag must be 0 or 1"),
        (["--lag", "1"], "--lag is measured with --simulate only"),
        (["--simulate", "2x4", "--lag-share", "-0.5"], "--lag-share must be in [0, 1], got -0.5"),
        (["--lag-share", "0.5"], "--lag-share is measured with --simulate only"),
        (["--simulate", "2x4", "--lag", "1", "--lag-share", "0.5"], "give --lag 1 or --lag-share, not both"),
        (["--simulate", "2x4", "--pace", "10"], "--pace must be 100-1000000 steps/s, got 10"),
        (["--pace", "2600"], "--pace sets the simulated matches' pace: it needs --simulate"),
        (["--simulate", "2x4", "--workers-per-cpu", "0.5"], "--workers-per-cpu must be auto or in [1, 4], got 0.5"),
        (["--workers-per-cpu", "2"], "--workers-per-cpu is measured with --simulate"),
    ],
)
def test_bad_simulate_flags_are_one_line_and_exit_2(args, message, capsys):
    proc = run_here(capsys, "bench", *args)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def gate_actor() -> Any:
    """An actor whose wait(value) answers once open() was called: weights still to come.
    (Its class made here, so that Ray sends it by value: the workers cannot import this
    module.)"""
    import ray

    class Gate:
        def __init__(self):
            import asyncio

            self.event = asyncio.Event()

        async def wait(self, value):
            await self.event.wait()
            return value

        async def open(self):
            self.event.set()

    return ray.remote(Gate).remote()


def simulating(steps: int, seconds_per_step: float) -> Any:
    """A simulating process in this one, its bank one match of `steps` steps."""
    import numpy as np

    import pgpong.bench.simulate as simulate
    from pgpong.policy import EpisodeGradient
    from pgpong.pool import WorkerSettings
    from pgpong.pool.sums import Played
    from pgpong.rollout import EpisodeResult

    grad = EpisodeGradient(np.zeros(0, np.int16), np.zeros((4, 0), np.float32, order="F"), np.zeros(4, np.float32))
    banked = Played(EpisodeResult(EpisodeId(0, 0, 0), grad, -21.0, steps, steps * seconds_per_step).stats(), grad)
    return simulate.SimulatedWorkers(WorkerSettings(), [banked], seconds_per_step)


def test_a_slot_waiting_for_the_next_batchs_weights_lets_its_match_of_this_batch_play_first(ray_instance, monkeypatch):
    """A simulating process takes a slot's calls in any order (on its threads): the
    call of an announced batch's match, which waits for weights that wait for this
    batch, must not keep the slot's match of this batch from playing (it did: at 11x18
    every slot's process stopped until the stuck-worker watch ended it)."""
    import threading

    import ray

    import pgpong.bench.simulate as simulate
    from pgpong.policy import Params
    from pgpong.pool.worker import WeightsToCome, publish

    monkeypatch.setattr(simulate, "kept_for_life", lambda: None)  # (not in the test's process)
    process = simulating(20, 0.001)
    weights, gate = Params.initial(4, 0), gate_actor()
    results: dict[str, Any] = {}

    def play(name, with_weights, batch):
        results[name] = process.play(with_weights, [0, batch, 0], 0)

    later = threading.Thread(target=play, args=("next", WeightsToCome(gate.wait.remote(publish(weights)[0])), 2))
    later.start()
    time.sleep(0.2)  # it waits for its weights
    now = threading.Thread(target=play, args=("this", weights, 1))
    now.start()
    now.join(10)
    finished_first = not now.is_alive()
    ray.get(gate.open.remote())
    later.join(10)
    now.join(10)
    assert finished_first and results["this"].stats.episode.batch == 1
    assert not later.is_alive() and results["next"].stats.episode.batch == 2


def test_with_the_step_taken_ahead_bench_counts_its_reading_in_the_update():
    """When a cluster's queue has published the next batch's weights from the reducer's
    step (its count of steps taken ahead grew), that batch plays while bench reads just
    before the trainer's publish: the reading (0.04 s) held nothing back, so the update
    runs from one reading's start to the next's, 0.10 s here, not 0.06 (pool/ahead.py)."""
    pool: Any = PublishingPool()
    walls = iter(range(1, 10))

    def train_batch() -> BatchReport:
        time.sleep(0.05)  # the batch plays; the reducer takes the step, the queue publishes
        pool.stepped += 1
        pool.publish(len(pool.published), None)  # the trainer's publish: a check
        time.sleep(0.01)  # the row and the logs
        return BatchReport(
            BatchRow(1, 10, 9000, next(walls), 0.3, 0, 0, 0, 0, 900, 0, 10, 4, 0), {}, {}, [0.025] * 10, 0
        )

    trainer: Any = SimpleNamespace(config=SimpleNamespace(lag=0, lagged=False, batch_size=10), train_batch=train_batch)
    measured = updates(trainer, pool, 3, lambda _: None)
    # (at least the play, the row and the reading: 0.05 + 0.01 + 0.04 s; a busy machine only adds)
    assert all(0.097 <= row["seconds"] < 0.5 for row in measured["updates"]), measured["updates"]
    assert [row["queue_stepped_ahead_calls"] for row in measured["updates"]] == [1, 1, 1]
    assert all(row["driver_cpu_ms"] < 30 for row in measured["updates"])


def test_slots_woken_together_start_their_matches_when_the_weights_were_read(ray_instance, monkeypatch):
    """The slots of a simulating process that wait for an announced batch's weights
    stand for workers in processes of their own: each starts its match when the
    weights were read, however late its thread then gets a CPU; a call that comes
    after the read starts when it comes, not before."""
    import threading

    import ray

    import pgpong.bench.simulate as simulate
    from pgpong.policy import Params
    from pgpong.pool.worker import WeightsToCome, publish

    late, match = 0.3, 0.5  # seconds: a waiting slot's thread gets going that late after the read; a match

    class LateFuture(simulate.Future):
        def result(self, timeout=None):
            waited = not self.done()
            value = super().result(timeout)
            time.sleep(late if waited else 0.0)
            return value

    monkeypatch.setattr(simulate, "kept_for_life", lambda: None)  # (not in the test's process)
    monkeypatch.setattr(simulate, "Future", LateFuture)
    process = simulating(500, match / 500)
    slept: dict[int, float] = {}

    def sleep(seconds: Any) -> None:
        slept[len(slept)] = float(seconds)

    process._sleep = sleep
    gate = gate_actor()
    come = WeightsToCome(gate.wait.remote(publish(Params.initial(4, 0))[0]))
    slots = [threading.Thread(target=process.play, args=(come, [0, 1, slot], slot)) for slot in range(2)]
    for thread in slots:
        thread.start()
    time.sleep(0.5)  # both wait for the weights; one will read them, the other wait for that read
    ray.get(gate.open.remote())
    for thread in slots:
        thread.join(10)
    process.play(come, [0, 1, 2], 2)  # after the read, and at once
    assert len(slept) == 3
    assert min(slept[0], slept[1]) < match - late + 0.05  # its clock ran from the weights' read
    assert slept[2] > match - late  # from its own call, not from the read before it came


def test_a_bank_policy_of_another_size_is_refused_before_a_cluster_starts(tmp_path):
    small = tmp_path / "h3.npz"
    np.savez(small, W1=np.full((3, 6400), 0.01, np.float32), W2=np.ones(3, np.float32))
    proc = run_pgpong("bench", "--simulate", "1x2", "--bank-policy", str(small), timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "its network has 3 hidden units; bench simulates training's default of 200" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "starting a local Ray cluster" not in proc.stdout
