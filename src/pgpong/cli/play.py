"""`pgpong play`: judge a policy against Pong's built-in player, and record it."""

from __future__ import annotations

import argparse
import json
import signal
import sys

from pgpong.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_SIGINT,
    EXIT_SIGTERM,
    Terminated,
    env_address,
    fail,
    terminated,
)
from pgpong.config import add_flags, given
from pgpong.evaluate import PlayOptions
from pgpong.files import given_path


def add_parser(sub) -> None:
    """The play command and its flags."""
    play = sub.add_parser(
        "play",
        help="play matches against Pong's built-in player with a trained policy",
        description="Judge a policy: full matches against Pong's built-in player, one line per match (won, lost, "
        "or cut short by --max-episode-steps), then the mean score, matches won and points. Match k is "
        "seeded from (--seed, k), so an evaluation repeats exactly, whatever the number of workers.",
    )
    _add_play_arguments(play)


def _add_play_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "checkpoint",
        nargs="?",
        type=given_path,
        default=None,
        metavar="CHECKPOINT",
        help="a checkpoint file, a run directory (its newest good checkpoint), or any .npz "
        "with W1 (H, 6400) and W2 (H,) (default: the agent shipped with pgpong)",
    )
    add_flags(p, PlayOptions)
    p.add_argument("--greedy", action="store_true", help="take the likelier action instead of sampling it")
    p.add_argument(
        "--json", action="store_true", help="print the summary as one JSON object (match lines go to stderr)"
    )


def run(args: argparse.Namespace) -> int:
    from pgpong import api
    from pgpong.cluster import ClusterError
    from pgpong.pool import PoolError

    opts = PlayOptions(**given(args, PlayOptions)).validate()
    lines = sys.stderr if args.json else sys.stdout
    try:
        summary = api.evaluate_agent(
            args.checkpoint,
            opts.episodes,
            seed=opts.seed,
            greedy=args.greedy,
            workers=opts.workers,
            env_id=opts.env_id,
            max_episode_steps=opts.max_episode_steps,
            address=opts.address or (env_address() if opts.workers != 0 else None),
            record=opts.record,
            record_episodes=opts.record_episodes,
            fps=opts.fps,
            progress=lines,
        )
    except ClusterError as exc:
        return fail(str(exc), EXIT_BAD_INPUT)
    except PoolError as exc:
        return fail(str(exc), EXIT_FAILED)
    except KeyboardInterrupt as exc:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print("\npgpong: play interrupted", file=sys.stderr, flush=True)
        return EXIT_SIGTERM if terminated() or isinstance(exc, Terminated) else EXIT_SIGINT
    if args.json:
        print(
            json.dumps(
                {
                    "env_id": summary.env_id,
                    "policy": summary.policy,
                    "seed": summary.seed,
                    "greedy": summary.greedy,
                    **summary.as_dict(),
                }
            )
        )
    else:
        print(summary.line(), flush=True)
    return 0
