"""`pgpong bench`: how fast pgpong trains, measured.

- throughput.py: training against the emulator's own limit (raw ALE), Gymnasium's
  environment and the original algorithm; where the time goes; memory.
- updates.py: seconds per update for several batch sizes, with the lower bound of
  any schedule, the efficiency, the driver's CPU and the bytes it receives.
- simulate.py: `--simulate NODESxCPUS`, those update figures for a big machine or a
  cluster, with the real driver and simulated workers, on this machine.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, TextIO

from pgpong.bench.options import BenchOptions
from pgpong.bench.throughput import BenchWorker, format_report, measure
from pgpong.console import LiveLine

__all__ = ["BenchWorker", "format_report", "print_report", "run_bench"]


def run_bench(opts: BenchOptions, progress: TextIO = sys.stderr) -> dict[str, Any]:
    stage: dict[str, Any] = {"text": "starting Ray", "began": time.monotonic()}
    live = LiveLine(lambda: f"bench: {stage['text']} | {time.monotonic() - stage['began']:5.1f} s", progress)

    def status(text: str) -> None:  # the live line only: where inside a stage
        stage.update(text=text, began=time.monotonic())

    def say(text: str) -> None:  # a plain line per stage, and on a terminal the stage's elapsed time
        status(text)
        live.print(f"bench: {text}")

    with live:
        if opts.simulate:
            from pgpong.bench.simulate import simulate

            return simulate(opts, say, status)
        return measure(opts, say, status)


def print_report(report: dict[str, Any], as_json: bool, out: TextIO = sys.stdout) -> None:
    if as_json:
        text = json.dumps(report, indent=2)
    elif "simulated" in report:
        from pgpong.bench.simulate import format_simulation

        text = format_simulation(report)
    else:
        text = format_report(report)
    print(text, file=out, flush=True)
