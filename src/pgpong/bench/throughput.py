"""`pgpong bench`: training throughput against the emulator's physical limit (raw
ALE), against Gymnasium's environment and against the original algorithm, where the
time goes, seconds per update for several batch sizes, and memory; in one run.

The raw-emulation row is the one place outside envs.py that uses ale_py itself:
its point is to measure the emulator with nothing of Gymnasium or pgpong around it.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import resource
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from pgpong.bench.options import BenchOptions
from pgpong.bench.updates import as_trained, scratch_trainer, update_table, updates, waiting_lines
from pgpong.cluster import stop_ray
from pgpong.envs import DOWN, UP, emulator_settings, make_env, make_gymnasium_env
from pgpong.policy import Params
from pgpong.pool import Limits, WorkerSettings, open_pool
from pgpong.pool.cluster_pool import ClusterPool
from pgpong.pool.ray_pool import RayPool
from pgpong.pool.worker import RolloutWorker, WorkerKind
from pgpong.rollout import EpisodeId
from pgpong.trainer import BatchReport

BenchPool = RayPool | ClusterPool

PER_STEP = ("emulator", "input and forward", "bookkeeping")
PER_EPISODE = ("reset", "backward")
PER_BATCH = ("publish weights", "barrier", "sum gradients", "rmsprop step", "checkpoint write")
BETWEEN = "between episodes"
ORIGINAL_BYTES_PER_STEP = 6400 * 8 + 200 * 8 + 3 * 8  # float64 x, h, dlogp, reward, as the original keeps them


class BenchWorker(RolloutWorker):
    """A rollout worker that can also measure: the ceiling (random play on Gymnasium's
    own environment), the original algorithm's speed, and its own peak memory. With
    endless=True its episodes run across matches up to max_episode_steps (a long
    episode on demand, for the memory figure)."""

    def __init__(self, settings: WorkerSettings, endless: bool = False):
        self.endless = endless
        super().__init__(settings)

    def _make_env(self) -> Any:
        return make_env(self.settings.env_id, self.settings.max_episode_steps, endless=self.endless)

    def random_play(self, seconds: float, seed: int, time_resets: bool = True) -> dict[str, float]:
        """The ceiling: Gymnasium's own environment for this id, random UP/DOWN for
        `seconds`, reset between matches, nothing else. With time_resets, also times
        Gymnasium's seeded reset and pgpong's, which the ceiling does not need."""
        env = make_gymnasium_env(self.settings.env_id)
        rng = np.random.default_rng(seed)
        seeded_reset_s = pgpong_reset_s = 0.0
        if time_resets:
            seeded_reset_s = _seconds_per_call(lambda: env.reset(seed=int(rng.integers(2**32))), 3)
            pgpong_reset_s = _seconds_per_call(lambda: self.env.reset(seed=int(rng.integers(2**32))), 3)
        actions = rng.choice([UP, DOWN], size=4096)
        steps = matches = 0
        reset_s = 0.0
        began = time.perf_counter()
        while time.perf_counter() - began < seconds:
            t = time.perf_counter()
            env.reset()
            reset_s += time.perf_counter() - t
            matches += 1
            done = False
            while not done and time.perf_counter() - began < seconds:
                _, _, terminated, truncated, _ = env.step(actions[steps % len(actions)])
                steps += 1
                done = terminated or truncated
        elapsed = time.perf_counter() - began
        env.close()
        return {
            "steps": steps,
            "matches": matches,
            "seconds": elapsed,
            "reset_s": reset_s,
            "seeded_reset_s": seeded_reset_s,
            "pgpong_reset_s": pgpong_reset_s,
        }

    def raw_play(self, seconds: float, seed: int) -> dict[str, float]:
        """The emulator's physical limit: ale_py.ALEInterface with this id's frameskip,
        sticky actions and frame cap set inside ALE, random UP/DOWN, one palette-screen
        fetch per step (the least any player needs to see the game), nothing else.
        A random frameskip (Pong-v0) is drawn here and played as that many act() calls."""
        import ale_py
        from ale_py import roms

        settings = emulator_settings(self.settings.env_id)
        frameskip = settings["frameskip"]
        ale = ale_py.ALEInterface()
        ale.setInt("random_seed", seed)
        ale.setFloat("repeat_action_probability", settings["repeat_action_probability"])
        ale.setInt("frame_skip", frameskip if isinstance(frameskip, int) else 1)
        ale.setInt("max_num_frames_per_episode", settings["max_num_frames_per_episode"] or 0)
        rom = roms.get_rom_path("pong")
        assert rom is not None, "ale-py's wheel ships the Pong ROM"
        ale.loadROM(rom)
        rng = np.random.default_rng(seed)
        minimal = ale.getMinimalActionSet()
        actions = [minimal[a] for a in rng.choice([UP, DOWN], size=4096)]
        if isinstance(frameskip, int):
            repeats = [1] * 4096
        else:
            low, high = frameskip
            repeats = rng.integers(low, high, size=4096).tolist()
        screen = np.empty(ale.getScreenDims(), dtype=np.uint8)
        steps = matches = 0
        began = time.perf_counter()
        while time.perf_counter() - began < seconds:
            action = actions[steps % 4096]
            for _ in range(repeats[steps % 4096]):
                ale.act(action)
            ale.getScreen(screen)
            steps += 1
            if ale.game_over():
                ale.reset_game()
                matches += 1
        elapsed = time.perf_counter() - began
        return {"steps": steps, "matches": matches, "seconds": elapsed, "frames": ale.getFrameNumber()}

    def original_play(self, seconds: float, seed: int) -> dict[str, float]:
        """The original algorithm (pgpong.original: dense float64) playing whole episodes
        for at least `seconds`, on the same environment stepping: the speed pgpong started from."""
        from pgpong.original import play_episode_dense

        env = make_env(self.settings.env_id, self.settings.max_episode_steps, observation="rgb")
        weights = Params.initial(200, seed)
        steps = episodes = 0
        began = time.perf_counter()
        while episodes == 0 or time.perf_counter() - began < seconds:
            steps += play_episode_dense(env, weights, EpisodeId(seed, 0, episodes), self.settings.gamma).steps
            episodes += 1
        elapsed = time.perf_counter() - began
        env.close()
        return {"steps": steps, "episodes": episodes, "seconds": elapsed}

    def peak_rss(self) -> int:
        """Peak resident memory of this process so far, in bytes."""
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _seconds_per_call(call, times: int) -> float:
    began = time.perf_counter()
    for _ in range(times):
        call()
    return (time.perf_counter() - began) / times


def measure(opts: BenchOptions, say: Callable[[str], None], status: Callable[[str], None]) -> dict[str, Any]:
    """Every figure of `pgpong bench` on real workers (this machine or a cluster)."""
    try:
        settings = as_trained(opts)
        pool = open_pool(settings, opts.workers, opts.address, note=say, kind=WorkerKind(BenchWorker))
        assert isinstance(pool, RayPool | ClusterPool)  # bench measures Ray workers: --workers 0 is refused
        workers = pool.num_workers
        try:
            report: dict[str, Any] = {"setup": _setup(opts, workers)}
            say(
                f"rounds: {opts.train_batches} x (Gymnasium's env, then raw ALE, "
                f"{opts.ceiling_seconds / opts.train_batches:.1f} s of random play each; then a training batch "
                "of 10), and raw ALE once more"
            )
            raw, ceiling, reports = _rounds(pool, opts, status)
            report["raw"], report["ceiling"] = _emulation_figures(raw), _ceiling(ceiling)
            say(
                f"original: {workers} worker(s) playing the original dense float64 algorithm "
                f"for {opts.original_seconds:g} s"
            )
            report["original"] = _original(pool, opts)
            report["training"] = _training_figures(reports, raw, ceiling, report["original"])
            report["time"] = _where_time_goes(reports, workers)
            report["updates"] = []
            count = opts.update_batches or 2
            for size in opts.batch_sizes:
                say(f"seconds per update: batch {size}, 1 warm-up + {count} batches")
                with scratch_trainer(pool, opts, batch_size=size) as trainer:
                    report["updates"].append(updates(trainer, pool, count, status))
        finally:
            pool.close()
        say(f"memory: one worker playing a {opts.memory_steps:,}-step episode")
        report["memory"] = _memory(opts, reports)
        return report
    finally:
        stop_ray()


def _setup(opts: BenchOptions, workers: int) -> dict[str, Any]:
    return {
        "env_id": opts.env_id,
        "workers": workers,
        "cpus": os.cpu_count(),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "python": platform.python_version(),
        "max_episode_steps": opts.max_episode_steps,
    }


def _rounds(
    pool: BenchPool, opts: BenchOptions, status: Callable[[str], None]
) -> tuple[list[dict], list[dict], list[BatchReport]]:
    """Gymnasium's env, raw ALE and a training batch, back to back, `train_batches`
    times (after a warm-up batch), then raw ALE once more: on a shared machine whose
    speed drifts, each training batch is compared with the raw emulation measured
    just before it and just after it, and with Gymnasium's env measured before it."""
    slice_s = opts.ceiling_seconds / opts.train_batches
    rounds = opts.train_batches
    raw: list[dict] = []
    ceiling: list[dict] = []
    reports: list[BatchReport] = []
    with scratch_trainer(pool, opts, batch_size=10) as trainer:
        trainer.publish_early = False  # the next batch must not play while the emulator is measured alone
        status("warm-up training batch")
        trainer.train_batch()
        for k in range(rounds):
            status(f"round {k + 1}/{rounds}: Gymnasium's env")
            ceiling.append(_all_workers(pool.call_all("random_play", slice_s, 12345 + k, k == 0)))
            status(f"round {k + 1}/{rounds}: raw ALE")
            raw.append(_all_workers(pool.call_all("raw_play", slice_s, 12345 + k)))
            status(f"round {k + 1}/{rounds}: a training batch")
            reports.append(trainer.train_batch())
        status("raw ALE after the last batch")
        raw.append(_all_workers(pool.call_all("raw_play", slice_s, 12345 + rounds)))
    return raw, ceiling, reports


def _all_workers(runs: list[dict]) -> dict:
    """One measurement of all workers at once: their steps over the longest one's time."""
    total = {
        key: sum(r[key] for r in runs) for key in runs[0] if key not in ("seconds", "seeded_reset_s", "pgpong_reset_s")
    }
    total["seconds"] = max(r["seconds"] for r in runs)
    total["steps_per_s"] = total["steps"] / total["seconds"]
    for key in ("seeded_reset_s", "pgpong_reset_s"):
        if key in runs[0]:
            total[key] = statistics.mean(r[key] for r in runs)
    return total


def _emulation_figures(rounds: list[dict]) -> dict[str, Any]:
    return {
        "steps_per_s": statistics.median(r["steps_per_s"] for r in rounds),
        "steps_per_s_rounds": [r["steps_per_s"] for r in rounds],
        "matches": sum(r["matches"] for r in rounds),
    }


def _ceiling(rounds: list[dict]) -> dict[str, Any]:
    matches = max(1, sum(r["matches"] for r in rounds))
    return {
        **_emulation_figures(rounds),
        "reset_s_per_match": sum(r["reset_s"] for r in rounds) / matches,
        "gymnasium_seeded_reset_s": rounds[0]["seeded_reset_s"],
        "pgpong_seeded_reset_s": rounds[0]["pgpong_reset_s"],
    }


def _original(pool: BenchPool, opts: BenchOptions) -> dict[str, float]:
    """All workers play the original algorithm's episodes (pgpong.original) at once."""
    runs = pool.call_all("original_play", opts.original_seconds, opts.seed)
    steps_per_s = sum(r["steps"] for r in runs) / max(r["seconds"] for r in runs)
    return {"steps_per_s": steps_per_s, "episodes": sum(r["episodes"] for r in runs)}


def _training_figures(
    reports: list[BatchReport], raw: list[dict], ceiling: list[dict], original: dict[str, float]
) -> dict[str, Any]:
    per_batch = [r.row.steps_per_s for r in reports]
    steps = sum(_batch_steps(r) for r in reports)
    seconds = sum(r.row.batch_s for r in reports)
    median = statistics.median(per_batch)
    return {
        "steps_per_s_median": median,
        "steps_per_s_overall": steps / seconds,
        # each batch against raw emulation measured just before and just after it, and
        # against Gymnasium's env measured before it; the medians of those ratios
        "ratio_to_raw": statistics.median(
            t / ((before["steps_per_s"] + after["steps_per_s"]) / 2)
            for t, before, after in zip(per_batch, raw[:-1], raw[1:], strict=True)
        ),
        "ratio_to_ceiling": statistics.median(t / c["steps_per_s"] for t, c in zip(per_batch, ceiling, strict=True)),
        "speedup_vs_original": median / original["steps_per_s"],
        "seconds_per_batch_median": statistics.median(r.row.batch_s for r in reports),
        "episode_len_mean": statistics.mean(r.row.episode_len_mean for r in reports),
        "batches": len(reports),
        "rows": [dataclasses.asdict(r.row) for r in reports],
    }


def _batch_steps(report: BatchReport) -> float:
    return report.row.episode_len_mean * report.row.batch_episodes


def _where_time_goes(reports: list[BatchReport], workers: int) -> dict[str, dict[str, float]]:
    steps = sum(_batch_steps(r) for r in reports)
    episodes = sum(r.row.batch_episodes for r in reports)
    total = lambda key: sum(r.worker_time.get(key, 0.0) for r in reports)  # noqa: E731
    batch_s = statistics.mean(r.row.batch_s for r in reports)
    per_batch = {name: statistics.mean(r.phases.get(name, 0.0) for r in reports) for name in PER_BATCH}
    # A worker's share of a batch that is neither its episodes nor the barrier: the
    # round trips between its episodes (Ray's dispatch, the results' transfer) and the
    # driver's work between batches.
    per_batch[BETWEEN] = statistics.mean(
        r.row.batch_s - _episode_seconds(r) / workers - r.phases.get("barrier", 0.0) for r in reports
    )
    return {
        "worker_us_per_step": {name: 1e6 * total(name) / steps for name in PER_STEP},
        "worker_ms_per_episode": {name: 1e3 * total(name) / episodes for name in PER_EPISODE},
        "driver_ms_per_batch": {name: 1e3 * s for name, s in per_batch.items()},
        "driver_share_of_batch": {name: s / batch_s for name, s in per_batch.items()},
    }


def _episode_seconds(report: BatchReport) -> float:
    """The batch's episodes' own time, summed: every phase an episode times."""
    return sum(report.worker_time.get(name, 0.0) for name in (*PER_STEP, *PER_EPISODE))


def _memory(opts: BenchOptions, reports: list[BatchReport]) -> dict[str, float]:
    """Bytes per step of the episode records, and a fresh worker's peak RSS on a long episode."""
    import ray

    steps = sum(_batch_steps(r) for r in reports)
    record_bytes = sum(r.worker_time.get("record_bytes", 0) for r in reports)
    probe_class = ray.remote(num_cpus=1)(BenchWorker)
    settings = dataclasses.replace(as_trained(opts), max_episode_steps=opts.memory_steps)
    probe: Any = probe_class.remote(settings, endless=True)
    try:
        before = ray.get(probe.peak_rss.remote(), timeout=Limits().start_s)
        episode = probe.play.remote(Params.initial(200, opts.seed), EpisodeId(opts.seed, 0, 0))
        result = ray.get(episode, timeout=Limits().stall_s).stats
        peak = ray.get(probe.peak_rss.remote(), timeout=Limits().stall_s)
    finally:
        ray.kill(probe)
    return {
        "record_bytes_per_step": record_bytes / steps,
        "original_bytes_per_step": ORIGINAL_BYTES_PER_STEP,
        "long_episode_steps": result.steps,
        "long_episode_record_bytes_per_step": result.record_bytes / result.steps,
        "worker_rss_before_bytes": before,
        "worker_peak_rss_bytes": peak,
    }


def format_report(report: dict[str, Any]) -> str:
    """Markdown tables a user can paste into an issue."""
    s, r, c, o, t, tm, m = (report[k] for k in ("setup", "raw", "ceiling", "original", "training", "time", "memory"))

    def row(label: str, steps_per_s: float, bold: bool = False) -> str:
        of_raw, of_ceiling = steps_per_s / r["steps_per_s"], steps_per_s / c["steps_per_s"]
        share = f"**{of_raw:.2f}**" if bold else f"{of_raw:.2f}"
        return f"| {label} | {steps_per_s:,.0f} | {share} | {of_ceiling:.2f} |"

    lines = [
        f"pgpong bench: {s['env_id']}, {s['workers']} worker(s) on {s['cpus']} CPU(s), Python {s['python']}"
        + (f", episodes cut at {s['max_episode_steps']} steps" if s["max_episode_steps"] else ", full matches"),
        "",
        "| throughput, all workers together | env steps/s | of raw ALE | of Gymnasium's |",
        "| --- | ---: | ---: | ---: |",
        row("raw emulation: ALE alone, random UP/DOWN, one screen fetch a step", r["steps_per_s"]),
        row("ceiling: Gymnasium's env, random UP/DOWN, nothing else", c["steps_per_s"]),
        row(f"training, batch 10 (median of {t['batches']} batches)", t["steps_per_s_median"], bold=True),
        row("the original algorithm's episodes (dense float64), no driver", o["steps_per_s"]),
        "",
        f"Training runs {t['speedup_vs_original']:.1f} times as fast as the original algorithm on the same workers.",
        "",
        f"Resets per match: Gymnasium's plain reset {1e3 * c['reset_s_per_match']:.1f} ms (in the ceiling); "
        f"its seeded reset, which reloads the ROM, {1e3 * c['gymnasium_seeded_reset_s']:.0f} ms; "
        f"pgpong's seeded reset (emulator snapshot) {1e3 * c['pgpong_seeded_reset_s']:.2f} ms.",
        "",
        "| inside a worker | time |",
        "| --- | ---: |",
    ]
    lines += [f"| {name} | {us:,.1f} us/step |" for name, us in tm["worker_us_per_step"].items()]
    lines += [f"| {name} | {ms:,.1f} ms/episode |" for name, ms in tm["worker_ms_per_episode"].items()]
    lines += [
        "",
        "| per batch: the driver's work, the workers' idle time | ms | share of the batch |",
        "| --- | ---: | ---: |",
    ]
    for name, ms in tm["driver_ms_per_batch"].items():
        label = {
            "barrier": "barrier: workers idle, waiting for the slowest episode",
            BETWEEN: "workers idle between episodes: Ray's round trips, the driver's step",
        }.get(name, name)
        lines.append(f"| {label} | {ms:,.1f} | {100 * tm['driver_share_of_batch'][name]:.1f}% |")
    lines += ["", *update_table(report["updates"]), *waiting_lines(report["updates"])]
    lines += [
        "",
        "| memory | |",
        "| --- | ---: |",
        f"| episode record | {m['record_bytes_per_step']:,.0f} bytes/step"
        f" (the original: {m['original_bytes_per_step']:,}) |",
        f"| worker peak RSS, {m['long_episode_steps']:,}-step episode | {m['worker_peak_rss_bytes'] / 2**20:,.0f} MB"
        f" (before it: {m['worker_rss_before_bytes'] / 2**20:,.0f} MB) |",
    ]
    return "\n".join(lines)
