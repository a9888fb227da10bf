"""`pgpong train | play | plot | weights | bench | study`: the command line."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from pgpong import __version__
from pgpong.config import BenchOptions, ConfigError, TrainConfig, add_flags, check, given

EXIT_BAD_INPUT = 2
EXIT_FAILED = 1
EXIT_SIGINT = 130
EXIT_SIGTERM = 143

BLAS_NOTE = """\
BLAS threads: each rollout worker is pinned to one BLAS/OpenMP thread (threadpoolctl
in the worker, and OMP/OPENBLAS/MKL_NUM_THREADS=1 in its environment), so N workers
use N cores instead of fighting over them. Exporting those variables yourself after
Python has imported numpy has no effect; pgpong does it for you.
"""


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: stop like Ctrl-C, with exit status 143.

    Ray may re-raise it as a plain KeyboardInterrupt, so the handler also notes it."""


_terminated = False


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="pgpong", description="Policy-gradient Pong from pixels, on Ray.")
    parser.add_argument("--version", action="version", version=f"pgpong {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    train = sub.add_parser(
        "train",
        help="train a policy (resumes when --run-dir holds a run)",
        description="Train the policy network with REINFORCE, playing each batch's episodes in parallel.",
        epilog=BLAS_NOTE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_train_arguments(train)
    play = sub.add_parser(
        "play",
        help="play matches against Pong's built-in player with a trained policy",
        description="Judge a policy: full matches against Pong's built-in player, one line per match, "
        "then the mean score, matches won and points. Match k is seeded from (--seed, k), so an "
        "evaluation repeats exactly, whatever the number of workers.",
    )
    _add_play_arguments(play)
    plot = sub.add_parser(
        "plot",
        help="draw learning curves of one or more runs, or of a study by setting (PNG)",
        description="Draw the running reward and each batch's mean score (with its min-max band) "
        "of one or more runs, and their env steps per second, from their progress.csv.",
    )
    plot.add_argument(
        "run_dirs", nargs="+", type=Path, metavar="RUN_DIR", help="run directories (several are overlaid)"
    )
    plot.add_argument(
        "--output",
        type=Path,
        default=None,
        metavar="FILE",
        help="the PNG to write (default: RUN_DIR/learning.png for one run; required for several)",
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
        "seeds with a min-max band (default: run; draws STUDY/curves.png)",
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
        type=Path,
        default=None,
        metavar="CHECKPOINT",
        help="a checkpoint file, a run directory or a .npz with W1 and W2 (default: the shipped agent)",
    )
    weights.add_argument(
        "--output",
        type=Path,
        default=None,
        metavar="FILE",
        help="the PNG to write (default: RUN_DIR/weights.png for a run directory, else weights.png)",
    )
    weights.add_argument(
        "--units", type=int, default=None, metavar="N", help="draw only the first N hidden units (default: all)"
    )
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
    study = sub.add_parser(
        "study",
        help="train a grid of settings x seeds in parallel on Ray Tune, and report",
        description="Train every combination of the --grid values with every seed, each an ordinary pgpong "
        "run directory under runs/studies/NAME/trials/, in parallel on Ray Tune (one CPU per trial), until "
        "a stop. Running the same command again continues an unfinished study; --report prints the table "
        "of matches, env steps and minutes to each running reward, from the run directories alone.",
        epilog="example: pgpong study lr-vs-batch --grid lr=1e-3,3e-3 --grid batch-size=10,60 --seeds 0,1,2 "
        "--until running_reward=0 --max-env-steps 20M",
    )
    _add_study_arguments(study)
    return parser


def _add_study_arguments(p: argparse.ArgumentParser) -> None:
    from pgpong.config import int_list

    p.add_argument("name", metavar="NAME", help="the study's name: its directory under --root")
    p.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="SETTING=V1,V2",
        help="a train setting and the values to try (repeat for more settings; names as train's flags: "
        "lr, batch-size, hidden, ...)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SETTING=V",
        help="a train setting fixed for every trial, e.g. max-episode-steps=2000 (repeatable)",
    )
    p.add_argument("--seeds", type=int_list, default=(0, 1, 2), metavar="LIST", help="seeds (default: 0,1,2)")
    p.add_argument("--until", default=None, metavar="running_reward=R", help="stop a trial at this running reward")
    p.add_argument("--max-env-steps", default=None, metavar="N", help="stop a trial after N env steps (20M, 500k)")
    p.add_argument("--max-matches", default=None, metavar="N", help="stop a trial after N matches")
    p.add_argument(
        "--max-minutes", type=float, default=None, metavar="M", help="stop a trial after M minutes of training"
    )
    p.add_argument(
        "--workers-per-trial",
        type=int,
        default=0,
        metavar="N",
        help="Ray workers per trial; 0 = the trial plays in its own process on one CPU (default: 0; the "
        "weights are the same either way)",
    )
    p.add_argument("--address", default=None, help="an existing Ray cluster (default: $RAY_ADDRESS, else local)")
    p.add_argument("--root", type=Path, default=None, metavar="DIR", help="where studies live (default: runs/studies)")
    p.add_argument(
        "--report", action="store_true", help="print the study's table from its run directories; train nothing"
    )
    p.add_argument(
        "--thresholds",
        default="-10,0,10",
        metavar="LIST",
        help="running rewards of the table, written --thresholds=-10,0,10 (default: -10,0,10)",
    )
    p.add_argument("--json", action="store_true", help="with --report: print the table as JSON")


def _add_bench_arguments(p: argparse.ArgumentParser) -> None:
    add_flags(p, BenchOptions)
    p.add_argument("--json", action="store_true", help="print the figures as JSON")


def _add_play_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "checkpoint",
        nargs="?",
        type=Path,
        default=None,
        metavar="CHECKPOINT",
        help="a checkpoint file, a run directory (its newest good checkpoint), or any .npz "
        "with W1 (H, 6400) and W2 (H,) (default: the agent shipped with pgpong)",
    )
    p.add_argument("--episodes", type=int, default=10, metavar="N", help="matches to play (default: 10)")
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="Ray workers; 0 = play in this process, without Ray (default: the CPUs of the Ray cluster)",
    )
    p.add_argument("--seed", type=int, default=0, metavar="N", help="match k is seeded from (seed, k) (default: 0)")
    p.add_argument(
        "--env-id",
        default=None,
        metavar="ID",
        help="environment id (default: the one the checkpoint was trained on, else ALE/Pong-v5)",
    )
    p.add_argument("--greedy", action="store_true", help="take the likelier action instead of sampling it")
    p.add_argument(
        "--max-episode-steps",
        type=int,
        default=None,
        metavar="N",
        help="cut matches after N steps (default: full matches)",
    )
    p.add_argument("--address", default=None, help="an existing Ray cluster (default: $RAY_ADDRESS, else local)")
    p.add_argument(
        "--json", action="store_true", help="print the summary as one JSON object (match lines go to stderr)"
    )
    p.add_argument(
        "--record",
        type=Path,
        default=None,
        metavar="FILE",
        help="record the first match to FILE (.mp4 or .gif): the game, and beside it the "
        "difference frame the network sees and its probability of moving up",
    )
    p.add_argument(
        "--record-episodes",
        type=int,
        default=1,
        metavar="K",
        help="record the first K matches, one file each (FILE-1.mp4, ...) (default: 1)",
    )
    p.add_argument(
        "--fps",
        type=float,
        default=None,
        metavar="F",
        help="frames per second of the recording (default: real speed, 60 / the frameskip)",
    )


def _add_train_arguments(p: argparse.ArgumentParser) -> None:
    add_flags(p, TrainConfig)
    p.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="run directory (default: runs/<env>__<seed>__<time>); an existing run is resumed",
    )
    p.add_argument(
        "--resume-from",
        type=Path,
        default=None,
        metavar="FILE",
        help="resume from this checkpoint instead of the newest good one",
    )
    p.add_argument(
        "--address",
        default=None,
        help="address HOST:PORT of an existing Ray cluster (default: $RAY_ADDRESS, else a local Ray instance)",
    )
    p.add_argument("--redis-address", dest="redis_address", default=None, help=argparse.SUPPRESS)


def main(argv: Sequence[str] | None = None) -> int:
    # Only light modules are imported above, so that Ctrl-C at any moment after
    # start-up ends here, not in a traceback.
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        return _run(argv)
    except KeyboardInterrupt:
        print("\npgpong: interrupted", file=sys.stderr, flush=True)
        return EXIT_SIGTERM if _terminated else EXIT_SIGINT


def _run(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "train":
            return train(args)
        if args.command == "play":
            return play(args)
        if args.command == "plot":
            return plot(args)
        if args.command == "weights":
            return weights(args)
        if args.command == "bench":
            return bench(args)
        if args.command == "study":
            return study(args)
        raise AssertionError(args.command)
    except bad_input() as exc:
        return _fail(str(exc), EXIT_BAD_INPUT)


def bad_input() -> tuple[type[Exception], ...]:
    """The exceptions that mean the user's input cannot be used (exit status 2)."""
    from pgpong.checkpoint import CheckpointError
    from pgpong.envs import UnknownEnvironment
    from pgpong.plot import PlotError
    from pgpong.record import RecordingError

    return ConfigError, CheckpointError, UnknownEnvironment, RecordingError, PlotError


def _raise_terminated(signum, frame) -> None:
    global _terminated
    _terminated = True
    raise Terminated()


def _fail(message: str, status: int) -> int:
    print(f"pgpong: error: {message}", file=sys.stderr, flush=True)
    return status


def train(args: argparse.Namespace) -> int:
    from pgpong.cluster import ClusterError
    from pgpong.rundir import RunWriteError
    from pgpong.session import TrainingSession
    from pgpong.trainer import TrainingDiverged
    from pgpong.workers import PoolError

    settings = given(args, TrainConfig)
    address = args.address or args.redis_address or os.environ.get("RAY_ADDRESS") or None
    if args.redis_address and not args.address:
        _note("--redis-address is the old name of --address")

    session = TrainingSession.plan(settings, args.run_dir, args.resume_from, address, _note)
    run, run_dir = session.run, session.directory
    if run.finished:
        more = max(2 * run.state.batch, run.state.batch + 1)
        print(
            f"pgpong: {run_dir} already has its {run.state.batch} batches (--iterations {run.config.iterations}); "
            f"to train on, ask for more: {_pgpong_command()} train --run-dir {shlex.quote(str(run_dir))} "
            f"--iterations {more}",
            flush=True,
        )
        return 0
    try:
        # ray.init installs its own SIGTERM handler: ours goes back once Ray is up
        session.train(connected=lambda: signal.signal(signal.SIGTERM, _raise_terminated))
        return 0
    except (ClusterError, *bad_input()) as exc:  # type: ignore[misc]  # a tuple built at run time
        return _fail(str(exc), EXIT_BAD_INPUT)
    except (PoolError, RunWriteError) as exc:
        return _fail(f"{exc}. {session.newest_checkpoint()}; resume with: {_resume_command(run_dir)}", EXIT_FAILED)
    except TrainingDiverged as exc:
        return _fail(f"{exc}. {session.newest_checkpoint()} (good); start a new run with a smaller --lr", EXIT_FAILED)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM as Terminated
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not break the clean-up
        status = EXIT_SIGTERM if _terminated or isinstance(exc, Terminated) else EXIT_SIGINT
        if session.started():
            message = f"stopped. {session.newest_checkpoint()}; resume with: {_resume_command(run_dir)}"
        else:
            message = "stopped before the run began; nothing was written"
        print(f"\npgpong: {message}", file=sys.stderr, flush=True)
        return status


def study(args: argparse.Namespace) -> int:
    from pgpong.study import plan, report

    root = args.root or plan.STUDIES
    thresholds = _thresholds(args.thresholds)
    if args.report:
        given = [f for f in ("grid", "set", "until", "max_env_steps", "max_matches", "max_minutes") if getattr(args, f)]
        if given:
            raise ConfigError(f"--report reads the study as it was made: drop --{given[0].replace('_', '-')}")
        found = plan.load_study(root, args.name)
        check(found is not None, f"no study {args.name} in {root} (no {root / args.name / 'study.json'})")
        assert found is not None
        summary = report.summarize(found, thresholds)
        print(
            json.dumps(summary, indent=2) if args.json else report.markdown(summary), end="" if not args.json else "\n"
        )
        return 0
    check(not args.json, "--json goes with --report")
    stops = plan.Stops(
        running_reward=plan.Stops.parse_until(args.until) if args.until else None,
        env_steps=_count(args.max_env_steps, "--max-env-steps"),
        matches=_count(args.max_matches, "--max-matches"),
        minutes=args.max_minutes,
    )
    check(bool(args.grid), "give at least one --grid SETTING=V1,V2 (for seeds of one setting: --grid lr=3e-3)")
    found = plan.build(args.name, args.grid, args.set, list(args.seeds), stops, args.workers_per_trial, root)
    found.check_same_as_saved()
    return _run_study(found, args.address or os.environ.get("RAY_ADDRESS") or None, thresholds)


def _run_study(found, address: str | None, thresholds: tuple[float, ...]) -> int:
    from pgpong.cluster import ClusterError, start_ray, stop_ray
    from pgpong.study import report
    from pgpong.study.runner import StudyError, check_resources, run_study

    def connect() -> None:
        start_ray(address, log_to_driver=False)  # before Tune is imported: Ray reads its settings then
        try:
            import ray.tune  # noqa: F401
        except ImportError as exc:
            raise ConfigError(f"pgpong study needs Ray Tune ({exc}): pip install 'pgpong[study]'") from None
        check_resources(found)

    command = " ".join(shlex.quote(a) for a in [_pgpong_command(), *sys.argv[1:]])
    if address is None:  # a local instance: the machine's CPUs, known before Ray starts
        check_resources(found, os.cpu_count() or 1)
    try:
        run_study(found, sys.stdout, connect)
    except ClusterError as exc:
        return _fail(str(exc), EXIT_BAD_INPUT)
    except StudyError as exc:
        return _fail(f"{exc}; run the same command to try them again: {command}", EXIT_FAILED)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print(f"\npgpong: study stopped; every trial keeps its checkpoints. To continue: {command}", file=sys.stderr)
        return EXIT_SIGTERM if _terminated else EXIT_SIGINT
    finally:
        stop_ray()
    summary = report.summarize(found, thresholds)
    md, js = report.write(summary, found.directory)
    print(f"\npgpong study: {found.name} done.\n\n{report.markdown(summary)}\n(also in {md} and {js})", flush=True)
    return 0


def _thresholds(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ConfigError(f"--thresholds takes running rewards separated by commas, got {text!r}") from None
    check(bool(values) and all(-21 <= v <= 21 for v in values), f"--thresholds must be in [-21, 21], got {text!r}")
    return values


def _count(text: str | None, option: str) -> int | None:
    from pgpong.study.plan import count

    if text is None:
        return None
    try:
        return count(text)
    except ValueError:
        raise ConfigError(f"{option} takes a whole number (e.g. 5000000, 5M, 500k), got {text!r}") from None


def _note(text: str) -> None:
    print(f"pgpong: note: {text}", file=sys.stderr, flush=True)


def play(args: argparse.Namespace) -> int:
    from pgpong.cluster import ClusterError, stop_ray
    from pgpong.envs import check_env_id
    from pgpong.evaluate import evaluate, load_policy, match_line, record_matches
    from pgpong.record import check_output
    from pgpong.runlog import LiveLine
    from pgpong.session import where as session_where
    from pgpong.workers import PoolError, WorkerSettings, open_pool

    check(args.episodes >= 1, f"--episodes must be at least 1, got {args.episodes}")
    check(args.workers is None or args.workers >= 0, f"--workers must be 0 or more, got {args.workers}")
    check(0 <= args.seed < 2**32, f"--seed must be in [0, 2**32), got {args.seed}")
    check(
        args.max_episode_steps is None or args.max_episode_steps >= 1,
        f"--max-episode-steps must be at least 1, got {args.max_episode_steps}",
    )
    check(
        1 <= args.record_episodes <= args.episodes,
        f"--record-episodes must be from 1 to --episodes ({args.episodes}), got {args.record_episodes}",
    )
    check(args.fps is None or 0 < args.fps <= 240, f"--fps must be in (0, 240], got {args.fps}")
    if args.record is not None:
        check_output(args.record)
    policy = load_policy(args.checkpoint)
    env_id = args.env_id or policy.env_id or "ALE/Pong-v5"
    check_env_id(env_id)
    address = args.address or os.environ.get("RAY_ADDRESS") or None
    lines = sys.stderr if args.json else sys.stdout
    pool = None
    try:
        pool = open_pool(WorkerSettings(env_id, args.max_episode_steps), args.workers, address, at_most=args.episodes)
        signal.signal(signal.SIGTERM, _raise_terminated)  # ray.init installs its own
        where = session_where(pool)
        how = "greedy actions" if args.greedy else "sampled actions"
        print(
            f"pgpong: {args.episodes} match(es) of {env_id}, {policy.source} (H={policy.weights.hidden}), "
            f"{how}, seed {args.seed}, on {where}",
            file=lines,
            flush=True,
        )
        done = {"matches": 0, "steps": 0, "began": time.monotonic()}

        def status() -> str:
            elapsed = time.monotonic() - done["began"]
            return (
                f"playing: {done['matches']}/{args.episodes} matches done | "
                f"{done['steps'] / max(elapsed, 1e-9):,.0f} steps/s | {elapsed:5.1f} s"
            )

        def on_match(result) -> None:
            done["matches"] += 1
            done["steps"] += result.steps
            live.print(match_line(result, args.episodes))

        with LiveLine(status, lines) as live:
            summary = evaluate(pool, policy.weights, args.episodes, args.seed, args.greedy, on_match=on_match)
        if args.record is not None:
            for message in record_matches(
                args.record,
                args.record_episodes,
                policy.weights,
                env_id,
                args.max_episode_steps,
                args.seed,
                args.greedy,
                args.fps,
            ):
                print(f"pgpong: {message}", file=lines, flush=True)
    except ClusterError as exc:
        return _fail(str(exc), EXIT_BAD_INPUT)
    except PoolError as exc:
        return _fail(str(exc), EXIT_FAILED)
    except KeyboardInterrupt as exc:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print("\npgpong: play interrupted", file=sys.stderr, flush=True)
        return EXIT_SIGTERM if _terminated or isinstance(exc, Terminated) else EXIT_SIGINT
    finally:
        if pool is not None:
            pool.close()
        stop_ray()
    if args.json:
        print(
            json.dumps(
                {
                    "env_id": env_id,
                    "policy": policy.source,
                    "seed": args.seed,
                    "greedy": args.greedy,
                    **summary.as_dict(),
                }
            )
        )
    else:
        print(summary.line(), flush=True)
    return 0


def plot(args: argparse.Namespace) -> int:
    from pgpong.plot import plot_runs, plot_study
    from pgpong.record import check_output

    if args.by == "setting":
        check(len(args.run_dirs) == 1, "--by setting draws one study: give its directory (runs/studies/NAME)")
        output = args.output or args.run_dirs[0] / "curves.png"
        check_output(output, (".png",))
        print(f"pgpong: wrote {plot_study(args.run_dirs[0], output, args.x)}")
        return 0
    if args.output is None and len(args.run_dirs) > 1:
        raise ConfigError("--output FILE is needed to plot several runs")
    output = args.output or args.run_dirs[0] / "learning.png"
    check_output(output, (".png",))
    print(f"pgpong: wrote {plot_runs(args.run_dirs, output, args.x)}")
    return 0


def weights(args: argparse.Namespace) -> int:
    from pgpong.evaluate import load_policy
    from pgpong.plot import plot_weights
    from pgpong.record import check_output

    if args.output is not None:
        output = args.output
    elif args.checkpoint is not None and args.checkpoint.is_dir():
        output = args.checkpoint / "weights.png"
    else:
        output = Path("weights.png")
    check(args.units is None or args.units >= 1, f"--units must be at least 1, got {args.units}")
    check_output(output, (".png",))
    policy = load_policy(args.checkpoint)
    title = Path(policy.source).name if args.checkpoint else "the shipped agent"
    print(f"pgpong: wrote {plot_weights(policy.weights, output, title, args.units)}")
    return 0


def bench(args: argparse.Namespace) -> int:
    from pgpong.bench import print_report, run_bench
    from pgpong.cluster import ClusterError
    from pgpong.envs import check_env_id
    from pgpong.workers import PoolError

    opts = BenchOptions(**{"address": os.environ.get("RAY_ADDRESS") or None, **given(args, BenchOptions)}).validate()
    check_env_id(opts.env_id)
    try:
        report = run_bench(opts)
    except ClusterError as exc:
        return _fail(str(exc), EXIT_BAD_INPUT)
    except PoolError as exc:
        return _fail(str(exc), EXIT_FAILED)
    except KeyboardInterrupt:
        print("\npgpong: bench interrupted", file=sys.stderr)
        return EXIT_SIGINT
    print_report(report, args.json)
    return 0


def _resume_command(run_dir: Path) -> str:
    return f"{_pgpong_command()} train --run-dir {shlex.quote(str(run_dir))}"


def _pgpong_command() -> str:
    """How to run this pgpong again from here: plain `pgpong` when that is the one on
    PATH, else its path (after `make train` it lives in .venv/bin only)."""
    import shutil

    exe = Path(sys.argv[0])
    if exe.name != "pgpong":
        return f"{shlex.quote(sys.executable)} -m pgpong"
    found = shutil.which("pgpong")
    if found and Path(found).resolve() == exe.resolve():
        return "pgpong"
    try:
        return shlex.quote(str(exe.absolute().relative_to(Path.cwd())))
    except ValueError:
        return shlex.quote(str(exe.absolute()))


if __name__ == "__main__":
    sys.exit(main())
