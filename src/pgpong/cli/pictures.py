"""`pgpong plot` and `pgpong weights`: the pictures."""

from __future__ import annotations

import argparse
from pathlib import Path

from pgpong.config import ConfigError, check
from pgpong.files import given_path


def add_parsers(sub) -> None:
    """The plot and weights commands and their flags."""
    plot = sub.add_parser(
        "plot",
        help="draw learning curves of one or more runs, or of a study by setting (PNG)",
        description="Draw the running reward and each batch's mean score (with its min-max band) "
        "of one or more runs, and their env steps per second, from their progress.csv.",
    )
    plot.add_argument(
        "run_dirs", nargs="+", type=given_path, metavar="RUN_DIR", help="run directories (several are overlaid)"
    )
    plot.add_argument(
        "--output",
        type=given_path,
        default=None,
        metavar="FILE",
        help="the PNG to write (default: RUN_DIR/learning.png for one run, STUDY/curves.png with --by setting; "
        "required for several runs)",
    )
    plot.add_argument(
        "--x",
        choices=("episodes", "steps", "hours"),
        default="episodes",
        help="horizontal axis: episodes, env steps or training hours (default: episodes)",
    )
    plot.add_argument(
        "--by",
        choices=("run", "setting"),
        default="run",
        help="run: a curve per run directory; setting: a study directory, each setting's median over its "
        "seeds with a min-max band (default: run)",
    )
    weights = sub.add_parser(
        "weights",
        help="draw what each hidden unit of W1 looks at (PNG)",
        description="Draw every hidden unit's row of W1 as an 80x80 image, in a grid, with one "
        "diverging colour map centred on 0 (the picture from 'Pong from Pixels').",
    )
    weights.add_argument(
        "checkpoint",
        nargs="?",
        type=given_path,
        default=None,
        metavar="CHECKPOINT",
        help="a checkpoint file, a run directory or a .npz with W1 and W2 (default: the shipped agent)",
    )
    weights.add_argument(
        "--output",
        type=given_path,
        default=None,
        metavar="FILE",
        help="the PNG to write (default: RUN_DIR/weights.png for a run directory, else weights.png)",
    )
    weights.add_argument(
        "--units", type=int, default=None, metavar="N", help="draw only the first N hidden units (default: all)"
    )


def plot(args: argparse.Namespace) -> int:
    from pgpong import api
    from pgpong.plot import check_inputs

    if args.by == "setting":
        check(len(args.run_dirs) == 1, "--by setting draws one study: give its directory (runs/studies/NAME)")
        output = args.output or args.run_dirs[0] / "curves.png"
    elif args.output is None and len(args.run_dirs) > 1:
        raise ConfigError("--output FILE is needed to plot several runs")
    else:
        given = args.run_dirs[0]  # a run directory, or a progress.csv itself: the picture goes beside it
        output = args.output or (given if given.is_dir() else given.parent) / "learning.png"
    check_inputs(args.run_dirs, args.by)  # a missing run first, not the output beside it
    api.plot_learning_curve(*args.run_dirs, x=args.x, by=args.by, output=output)
    print(f"pgpong: wrote {output}")
    return 0


def weights(args: argparse.Namespace) -> int:
    from pgpong import api

    if args.output is not None:
        output = args.output
    elif args.checkpoint is not None and args.checkpoint.is_dir():
        output = args.checkpoint / "weights.png"
    else:
        output = Path("weights.png")
    api.plot_weights(args.checkpoint, units=args.units, output=output)
    print(f"pgpong: wrote {output}")
    return 0
