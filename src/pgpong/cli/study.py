"""`pgpong study`: a grid of settings x seeds on Ray Tune, and its report."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

from pgpong.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_SIGINT,
    EXIT_SIGTERM,
    env_address,
    fail,
    raise_terminated,
    terminated,
    this_command_again,
)
from pgpong.config import ConfigError, address_text, check
from pgpong.console import fitted
from pgpong.files import given_path

SEEDS = (0, 1, 2)  # a study's seeds unless --seeds says


def add_parser(sub) -> None:
    """The study command and its flags."""
    study = sub.add_parser(
        "study",
        help="train a grid of settings x seeds in parallel on Ray Tune, and report",
        description="Train every combination of the --grid values with every seed, each an ordinary pgpong "
        "run directory under runs/studies/NAME/trials/, in parallel on Ray Tune (one CPU per trial, or "
        "--workers-per-trial), until a stop. Running the same command again continues an unfinished study; "
        "--report prints the table of matches, env steps and minutes to each running reward, from the run "
        "directories alone.",
        epilog="example: pgpong study batch --grid batch-size=10,60 --seeds 0,1,2 "
        "--until running_reward=0 --max-env-steps 7M (each batch size with the batch rule's lr and decay)",
    )
    _add_study_arguments(study)


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
    p.add_argument("--seeds", type=int_list, default=SEEDS, metavar="LIST", help="seeds (default: 0,1,2)")
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
    p.add_argument(
        "--address", type=address_text, default=None, help="an existing Ray cluster (default: $RAY_ADDRESS, else local)"
    )
    p.add_argument(
        "--root", type=given_path, default=None, metavar="DIR", help="where studies live (default: runs/studies)"
    )
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


def run(args: argparse.Namespace) -> int:
    from pgpong.study import plan, report

    root = args.root or plan.STUDIES
    thresholds = _thresholds(args.thresholds)
    if args.report:
        given = [f for f in ("grid", "set", "until", "max_env_steps", "max_matches", "max_minutes") if getattr(args, f)]
        given += [f for f in ("workers_per_trial", "address") if getattr(args, f)]  # (none needed to read it)
        given += ["seeds"] if tuple(args.seeds) != SEEDS else []
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
    check(bool(args.grid), "give at least one --grid SETTING=V1,V2 (for seeds of one setting: --grid lr=2e-3)")
    found = plan.build(args.name, args.grid, args.set, list(args.seeds), stops, args.workers_per_trial, root)
    found.check_writable()
    found.check_same_as_saved()
    plan.check_trials_as_made(found)
    if stops.running_reward is not None and stops == plan.Stops(running_reward=stops.running_reward):
        note = (
            f"pgpong study: note: --until is the only stop, so a trial that never reaches {stops.running_reward:+g} "
            "trains until you stop it (Ctrl-C keeps every trial); --max-env-steps 7M caps each (25-45 minutes "
            "on a core)"
        )
        print(fitted(note, sys.stdout), flush=True)
    return _run_study(found, args.address or env_address(), thresholds)


def _run_study(found, address: str | None, thresholds: tuple[float, ...]) -> int:
    from pgpong.cluster import ClusterError, start_ray, stop_ray
    from pgpong.study import report
    from pgpong.study.runner import StudyError, check_resources, run_study

    def connect() -> None:
        start_ray(address, log_to_driver=False)  # before Tune is imported: Ray reads its settings then
        signal.signal(signal.SIGTERM, raise_terminated)  # ray.init installs its own
        try:
            import ray.tune  # noqa: F401
        except ImportError as exc:
            raise ConfigError(
                f"pgpong study needs Ray Tune ({exc}): in pgpong's clone, pip install -e '.[study]' (make train does)"
            ) from None
        check_resources(found)

    command = this_command_again()
    if address is None:  # a local instance: the machine's CPUs, known before Ray starts
        check_resources(found, os.cpu_count() or 1)
    try:
        run_study(found, sys.stdout, connect)
    except ClusterError as exc:
        return fail(str(exc), EXIT_BAD_INPUT)
    except StudyError as exc:
        return fail(f"{exc}; run the same command to try them again: {command}", EXIT_FAILED)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        stopped = f"pgpong: study stopped; every trial keeps its checkpoints. To continue:\n  {command}"
        print("\n" + fitted(stopped, sys.stderr), file=sys.stderr)
        return EXIT_SIGTERM if terminated() else EXIT_SIGINT
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
