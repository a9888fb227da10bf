"""`pgpong train`."""

from __future__ import annotations

import argparse
import shlex
import signal
import sys

from pgpong.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_SIGINT,
    EXIT_SIGTERM,
    Terminated,
    bad_input,
    env_address,
    fail,
    note,
    pgpong_command,
    resume_command,
    terminated,
)
from pgpong.config import AS_IN_2016, ConfigError, TrainConfig, add_flags, address_text, given
from pgpong.console import fitted
from pgpong.files import given_path

BLAS_NOTE = """\
BLAS threads: each rollout worker is pinned to one BLAS/OpenMP thread (threadpoolctl
in the worker, and OMP/OPENBLAS/MKL_NUM_THREADS=1 in its environment), so N workers
use N cores instead of fighting over them. Exporting those variables yourself after
Python has imported numpy has no effect; pgpong does it for you.
"""


def add_parser(sub) -> None:
    """The train command and its flags."""
    train = sub.add_parser(
        "train",
        help="train a policy (resumes when --run-dir holds a run)",
        description="Train the policy network with REINFORCE, playing each batch's episodes in parallel.",
        epilog=BLAS_NOTE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_train_arguments(train)


def _add_train_arguments(p: argparse.ArgumentParser) -> None:
    add_flags(p, TrainConfig)
    p.add_argument(
        "--as-in-2016",
        action="store_true",
        help="Karpathy's 2016 algorithm with the Ray example's constants: --lr 1e-4 --entropy-bonus 0 "
        "--max-update-norm 0 (flags given beside it win); --entropy-bonus 0 --max-update-norm 0 alone give "
        "pgpong's default before 2026-11-25",
    )
    p.add_argument(
        "--run-dir",
        type=given_path,
        default=None,
        metavar="DIR",
        help="run directory (default: runs/<env>__<seed>__<time>); an existing run is resumed",
    )
    p.add_argument(
        "--resume-from",
        type=given_path,
        default=None,
        metavar="FILE",
        help="resume from this checkpoint instead of the newest good one",
    )
    p.add_argument(
        "--address",
        type=address_text,
        default=None,
        help="address HOST:PORT of an existing Ray cluster (default: $RAY_ADDRESS, else a local Ray instance)",
    )
    p.add_argument("--redis-address", dest="redis_address", type=address_text, default=None, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    from pgpong import api
    from pgpong.cluster import ClusterError
    from pgpong.pool import PoolError
    from pgpong.rundir import RunWriteError
    from pgpong.trainer import TrainingDiverged

    settings = given(args, TrainConfig)
    if args.as_in_2016:
        settings = {**AS_IN_2016, **settings}
    address = args.address or args.redis_address or (env_address() if settings.get("workers") != 0 else None)
    if args.redis_address and not args.address:
        note("--redis-address is the old name of --address")

    if args.resume_from is not None and args.run_dir is None:  # (not the new directory that would be named)
        raise ConfigError("--resume-from FILE goes on with a run: give its directory with --run-dir DIR")
    session = api.plan_training(settings, args.run_dir, args.resume_from, address, note)
    run, run_dir = session.run, session.directory
    if run.finished:
        more = max(2 * run.state.batch, run.state.batch + 1)
        print(
            f"pgpong: {run_dir} already has its {run.state.batch} batches (--iterations {run.config.iterations}); "
            f"to train on, ask for more: {pgpong_command()} train --run-dir {shlex.quote(str(run_dir))} "
            f"--iterations {more}",
            flush=True,
        )
        return 0
    try:
        api.run_training(session, sys.stdout)  # ray.init's SIGTERM handler gives way to ours (main) again
        return 0
    except (ClusterError, *bad_input()) as exc:  # type: ignore[misc]  # a tuple built at run time
        return fail(str(exc), EXIT_BAD_INPUT)
    except (PoolError, RunWriteError) as exc:
        return fail(f"{exc}. {session.newest_checkpoint()}; resume with: {resume_command(run_dir)}", EXIT_FAILED)
    except TrainingDiverged as exc:
        return fail(f"{exc}. {session.newest_checkpoint()} (good); start a new run with a smaller --lr", EXIT_FAILED)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM as Terminated
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not break the clean-up
        status = EXIT_SIGTERM if terminated() or isinstance(exc, Terminated) else EXIT_SIGINT
        if session.started():
            message = f"stopped. {session.newest_checkpoint()}; resume with:\n  {resume_command(run_dir)}"
        else:
            message = "stopped before the run began; nothing was written"
        print("\n" + fitted(f"pgpong: {message}", sys.stderr), file=sys.stderr, flush=True)
        return status
