"""`pgpong play`: judge a policy against Pong's built-in player, and record it."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from pgpong.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_SIGINT,
    EXIT_SIGTERM,
    Terminated,
    fail,
    terminated,
)


def add_parser(sub) -> None:
    """The play command and its flags."""
    play = sub.add_parser(
        "play",
        help="play matches against Pong's built-in player with a trained policy",
        description="Judge a policy: full matches against Pong's built-in player, one line per match, "
        "then the mean score, matches won and points. Match k is seeded from (--seed, k), so an "
        "evaluation repeats exactly, whatever the number of workers.",
    )
    _add_play_arguments(play)


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


def run(args: argparse.Namespace) -> int:
    from pgpong import api
    from pgpong.cluster import ClusterError
    from pgpong.pool import PoolError

    lines = sys.stderr if args.json else sys.stdout
    try:
        summary = api.evaluate_agent(
            args.checkpoint,
            args.episodes,
            seed=args.seed,
            greedy=args.greedy,
            workers=args.workers,
            env_id=args.env_id,
            max_episode_steps=args.max_episode_steps,
            address=args.address,
            record=args.record,
            record_episodes=args.record_episodes,
            fps=args.fps,
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
