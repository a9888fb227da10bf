"""Chaos soak: train on 2 Ray workers while a random rollout worker is killed (kill -9)
every few seconds; then train the same batches undisturbed in one process and check
the weights are bit-identical and progress.csv counted every replacement.

    python tests/soak.py --minutes 10          # what `make soak` runs
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

SETTINGS = ["--hidden", "16", "--batch-size", "8", "--max-episode-steps", "1000", "--seed", "3"]
WORKER_TITLE = "ray::RolloutWorker"


def rollout_workers(driver: int, min_age: float) -> list[psutil.Process]:
    """The running rollout workers of the training process `driver` (its Ray instance's
    descendants), at least `min_age` seconds old: never one that is still starting."""
    found = []
    now = time.time()
    try:
        descendants = psutil.Process(driver).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    for proc in descendants:
        try:
            cmdline = proc.cmdline()
            if cmdline and cmdline[0].startswith(WORKER_TITLE) and now - proc.create_time() >= min_age:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def rows(run_dir: Path) -> list[dict[str, str]]:
    import csv

    path = run_dir / "progress.csv"
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return [r for r in csv.DictReader(f) if None not in r.values()]


def soak(
    run_dir: Path,
    batches: int | None,
    seconds: float | None,
    kill_every: float = 5.0,
    seed: int = 0,
    reference_workers: int = 0,
) -> dict:
    """Train with kills until `batches` are done (or `seconds` pass, then stop it with
    SIGTERM); return what happened and whether the weights match an undisturbed run."""
    rng = random.Random(seed)
    iterations = str(batches) if batches else "1000000"
    command = [sys.executable, "-m", "pgpong", "train", *SETTINGS, "--workers", "2", "--iterations", iterations]
    env = {**os.environ, "RAY_ADDRESS": ""}
    train = subprocess.Popen(
        [*command, "--run-dir", str(run_dir / "chaos")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    kills, began, next_kill = 0, time.monotonic(), time.monotonic() + kill_every
    try:
        while train.poll() is None:
            time.sleep(0.1)
            done = len(rows(run_dir / "chaos"))
            if seconds is not None and time.monotonic() - began > seconds:
                train.send_signal(signal.SIGTERM)
                break
            # No kills in the last batches: a worker killed then must still be found dead.
            near_end = batches is not None and done >= batches - 3
            if time.monotonic() >= next_kill and done >= 1 and not near_end:
                workers = rollout_workers(train.pid, min_age=3.0)
                if len(workers) == 2:  # both running: never kill a replacement while it starts
                    try:
                        os.kill(rng.choice(workers).pid, signal.SIGKILL)
                        kills += 1
                    except ProcessLookupError:
                        pass
                next_kill = time.monotonic() + kill_every * rng.uniform(0.6, 1.4)
        out, err = train.communicate(timeout=120)
    finally:
        if train.poll() is None:
            train.kill()
    done_rows = rows(run_dir / "chaos")
    replaced = sum(int(r["workers_replaced"]) for r in done_rows)
    # The same batches, undisturbed (the weights do not depend on the worker count).
    reference = subprocess.run(
        [
            sys.executable,
            "-m",
            "pgpong",
            "train",
            *SETTINGS,
            "--workers",
            str(reference_workers),
            "--iterations",
            str(len(done_rows)),
            "--run-dir",
            str(run_dir / "reference"),
        ],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    same = reference.returncode == 0 and _same_weights(run_dir / "chaos", run_dir / "reference", len(done_rows))
    return {
        "kills": kills,
        "replaced": replaced,
        "batches": len(done_rows),
        "seconds": round(time.monotonic() - began),
        "exit_status": train.returncode,
        "weights_identical": same,
        "stderr_tail": err.strip().splitlines()[-3:],
    }


def _same_weights(a: Path, b: Path, batch: int) -> bool:
    from pgpong.checkpoint import checkpoint_path, load_checkpoint

    x, y = (load_checkpoint(checkpoint_path(run / "checkpoints", batch)) for run in (a, b))
    return bool(
        np.array_equal(x.weights.W1, y.weights.W1)
        and np.array_equal(x.weights.W2, y.weights.W2)
        and np.array_equal(x.cache.W1, y.cache.W1)
        and x.running_reward == y.running_reward
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0, help="how long to train under fire (default: 10)")
    parser.add_argument("--kill-every", type=float, default=5.0, metavar="S", help="seconds between kills (about)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pgpong-soak-") as folder:
        print(
            f"soak: training on 2 workers for {args.minutes:g} min, killing a worker about every "
            f"{args.kill_every:g} s ...",
            flush=True,
        )
        report = soak(
            Path(folder), batches=None, seconds=60 * args.minutes, kill_every=args.kill_every, reference_workers=2
        )
    print(json.dumps(report, indent=2))
    ok = report["weights_identical"] and report["replaced"] >= report["kills"] - 2  # the last kills may go unseen
    print(
        f"soak: survived {report['kills']} kills in {report['batches']} batches ({report['seconds']} s); "
        f"{report['replaced']} replacements counted in progress.csv; weights identical to an undisturbed run: "
        f"{'yes' if report['weights_identical'] else 'NO'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
