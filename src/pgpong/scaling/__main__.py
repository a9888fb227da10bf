"""The model of seconds per update for any batch, workers and nodes, with its constants
measured on this project's machine (docs/SCALING.md says how): its tables, as Markdown.

    python -m pgpong.scaling [--phase late] [--workers-per-cpu N|auto]
    python -m pgpong.scaling --lag 1 | --lag-share S [--workers-per-cpu N|auto]
    python -m pgpong.scaling --learning RUN ... [--threshold R] [--workers-per-cpu N|auto]
"""

from __future__ import annotations

import argparse

from pgpong.config import PER_CPU_RANGE, per_cpu_text, per_cpu_valid, per_cpu_value
from pgpong.errors import OneLineParser
from pgpong.files import given_path
from pgpong.placement import AUTO, MAX_WORKERS_PER_CPU, per_cpu_for
from pgpong.scaling.learning import learning_table
from pgpong.scaling.model import PHASES, SCENARIOS, Constants, predict, predict_lag

PROG = "python -m pgpong.scaling"


def model_table(c: Constants, per_cpu: float | str = 1.0, rows: list[tuple[int, int, int]] = SCENARIOS) -> str:
    """The model's figures for `rows` of (batch, nodes, CPUs), by default the Ray
    example's and ten times its biggest, at `per_cpu` workers a CPU (auto: what
    `--workers-per-cpu auto` picks for each row)."""
    lines = [
        "| batch | nodes x CPUs | seconds per update | lower bound | best whole-match schedule | pgpong's schedule"
        " | efficiency | of the best | driver CPU | queue CPU | into the driver |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for batch, nodes, cpus in rows:
        each = per_cpu_for(per_cpu, batch, [cpus] * nodes)
        p = predict(batch, nodes, cpus, c, per_cpu=each)
        shown = f" ({p['workers']:,.0f} workers, {each:.3g} a CPU)" if per_cpu != 1 else ""
        lines.append(
            f"| {batch:,} | {nodes}x{cpus}{shown} | {p['seconds_per_update']:.2f} s | {p['lower_bound_s']:.2f} s"
            f" | {p['best_whole_matches_s']:.2f} s | {p['pgpong_schedule_s']:.2f} s | {p['efficiency']:.2f}"
            f" | {p['of_best_whole_matches']:.2f} | {p['driver_cpu_ms']:,.0f} ms | {p['queue_cpu_ms']:,.0f} ms"
            f" | {p['bytes_into_driver'] / 2**20:,.1f} MB |"
        )
    return "\n".join(lines) + "\n"


def lag_table(
    c: Constants, lag: int, share: float = 0.0, per_cpu: float | str = 1.0, rows: list[tuple[int, int, int]] = SCENARIOS
) -> str:
    """The model's seconds per update without a lag and with `lag` (or a lag `share`)
    for `rows` as model_table's, at `per_cpu` workers a CPU (auto: what it picks for
    each row), as a Markdown table. The last column is over the batch's match
    seconds shared evenly over the CPUs: once batches overlap, the bound; none ('-')
    where the matches that may play at once (a batch and its lag's) are fewer than the
    CPUs, so that bound means nothing."""
    name = f"lag {lag}" if lag else f"lag share {share:g}"
    lines = [
        f"| batch | nodes x CPUs | lag 0 | {name} | {name} over the best whole-match schedule"
        f" | {name} over the work per CPU |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for batch, nodes, cpus in rows:
        each = per_cpu_for(per_cpu, batch, [cpus] * nodes)
        now = predict_lag(batch, nodes, cpus, c, 0, per_cpu=each)
        lagged = predict_lag(batch, nodes, cpus, c, lag, share=share, per_cpu=each)
        shown = f" ({lagged['workers']:,.0f} workers, {each:.3g} a CPU)" if per_cpu != 1 else ""
        fills = (1 + lag + share) * batch >= nodes * cpus  # the matches that may be in play at once
        of_work = f"{lagged['of_work_per_worker']:.2f}" if fills else "-"
        lines.append(
            f"| {batch:,} | {nodes}x{cpus}{shown} | {now['seconds_per_update']:.2f} s"
            f" | {lagged['seconds_per_update']:.2f} s | {lagged['of_best_whole_matches']:.2f} | {of_work} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--phase",
        choices=sorted(PHASES),
        help="the matches early or late in training (default: early); not with --learning",
    )
    instead = parser.add_mutually_exclusive_group()  # three other tables
    instead.add_argument(
        "--learning",
        nargs="+",
        type=given_path,
        metavar="RUN",
        help="instead: minutes to running reward --threshold of these runs (progress.csv files, run directories, "
        "a directory of them, or a study's directory), measured and projected by cores",
    )
    parser.add_argument(
        "--threshold",
        type=float,
        metavar="R",
        help="with --learning: the running reward to reach, in [-21, 21] (default: 0)",
    )
    instead.add_argument(
        "--lag",
        type=int,
        choices=(1, 2),
        help="instead: seconds per update when batch k may start once update k - 1 - LAG is done "
        "(--lag 1 overlaps batches so)",
    )
    parser.add_argument(
        "--workers-per-cpu",
        type=per_cpu_value,
        default=1.0,
        metavar="N|auto",
        help=f"the table (or --learning's projections) at N workers a CPU, as train's flag: {AUTO} (what it "
        f"picks for each row or batch), or 1 to {MAX_WORKERS_PER_CPU:g} (default: 1)",
    )
    instead.add_argument(
        "--lag-share",
        type=float,
        metavar="S",
        help="instead: seconds per update when the first S of batch k's matches may start once update k - 2 "
        "is done, the rest once update k - 1 is (--lag-share S overlaps batches so)",
    )
    args = parser.parse_args(argv)
    try:
        print(tables(args, parser), end="")
    except KeyboardInterrupt:
        parser.exit(130, f"{PROG}: stopped (Ctrl-C); no table printed\n")


def tables(args: argparse.Namespace, parser: OneLineParser) -> str:
    """The table the flags ask for; a mistake in them ends the program by parser.error."""
    per_cpu = args.workers_per_cpu
    if not per_cpu_valid(per_cpu):
        parser.error(f"--workers-per-cpu {PER_CPU_RANGE}, got {per_cpu_text(per_cpu)}")
    if not args.learning and args.threshold is not None:
        parser.error("--threshold is the running reward --learning's runs reach: give it with --learning")
    if args.learning:
        threshold = 0.0 if args.threshold is None else args.threshold
        if args.phase is not None:
            parser.error("--phase is the model's: --learning takes each update's phase from the run's reward")
        if not -21 <= threshold <= 21:
            parser.error(f"--threshold must be a running reward in [-21, 21], got {threshold:g}")
        try:
            return learning_table([str(path) for path in args.learning], threshold, per_cpu)
        except (OSError, ValueError) as exc:  # a missing or broken file (ConfigError is a ValueError)
            parser.error(str(exc))
    c = PHASES[args.phase or "early"]
    if args.lag_share is not None and not 0 < args.lag_share <= 1:
        parser.error(f"--lag-share must be in (0, 1], got {args.lag_share:g}")
    if args.lag or args.lag_share:
        return lag_table(c, args.lag or 0, args.lag_share or 0.0, per_cpu)
    return model_table(c, per_cpu)


if __name__ == "__main__":
    main()
