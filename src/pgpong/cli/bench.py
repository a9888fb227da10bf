"""`pgpong bench`."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from typing import TextIO

from pgpong.bench.options import BenchOptions
from pgpong.cli.common import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_SIGINT, env_address, fail
from pgpong.config import add_flags, given


def add_parser(sub) -> None:
    """The bench command and its flags."""
    bench = sub.add_parser(
        "bench",
        help="measure training speed against the emulator's own limit",
        description="Measure, in one run: the emulator's limit (raw ALE, random play), Gymnasium's "
        "ceiling (its environment, random play), training throughput and its share of both, the "
        "original dense algorithm's speed, where the time goes, seconds per update for several "
        "batch sizes, and memory. Prints Markdown tables (or --json). With --simulate NODESxCPUS it measures "
        "seconds per update for a big machine or cluster of that shape instead, simulated on this one "
        "(docs/SCALING.md).",
    )
    _add_bench_arguments(bench)


def _add_bench_arguments(p: argparse.ArgumentParser) -> None:
    add_flags(p, BenchOptions)
    p.add_argument("--json", action="store_true", help="print the figures as JSON")


def run(args: argparse.Namespace) -> int:
    from pgpong.bench import print_report, run_bench
    from pgpong.cluster import ClusterError
    from pgpong.envs import check_env_id
    from pgpong.pool import PoolError

    flags = given(args, BenchOptions)
    joins = env_address() if "simulate" not in flags and "address" not in flags else None  # (--simulate: its own)
    opts = BenchOptions(**{"address": joins or None, **flags}).validate()
    check_env_id(opts.env_id)
    with stdout_for_the_report(args.json) as out:
        try:
            report = run_bench(opts)
        except ClusterError as exc:
            return fail(str(exc), EXIT_BAD_INPUT)
        except PoolError as exc:
            return fail(str(exc), EXIT_FAILED)
        except KeyboardInterrupt:
            print("\npgpong: bench interrupted", file=sys.stderr)
            return EXIT_SIGINT
        print_report(report, args.json, out)
    return 0


@contextmanager
def stdout_for_the_report(as_json: bool) -> Iterator[TextIO]:
    """With --json, stdout carries the JSON alone: whatever else is written to it
    meanwhile (Ray's processes inherit it, and a raylet warns there when many workers
    start at once) goes to stderr."""
    if not as_json:
        yield sys.stdout
        return
    sys.stdout.flush()
    kept = os.dup(1)
    try:
        os.dup2(2, 1)
        with os.fdopen(os.dup(kept), "w") as out, redirect_stdout(sys.stderr):
            yield out
    finally:
        sys.stdout.flush()
        os.dup2(kept, 1)
        os.close(kept)
