"""`pgpong play`: judge a policy against Pong's built-in player, and record it."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from pgpong.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_SIGINT,
    EXIT_SIGTERM,
    Terminated,
    fail,
    raise_terminated,
    terminated,
)
from pgpong.config import check


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
    from pgpong.cluster import ClusterError, stop_ray
    from pgpong.envs import check_env_id
    from pgpong.evaluate import evaluate, load_policy, match_line, record_matches
    from pgpong.pool import PoolError, WorkerSettings, open_pool
    from pgpong.record import check_output
    from pgpong.runlog import LiveLine
    from pgpong.session import where as session_where

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
        signal.signal(signal.SIGTERM, raise_terminated)  # ray.init installs its own
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
        return fail(str(exc), EXIT_BAD_INPUT)
    except PoolError as exc:
        return fail(str(exc), EXIT_FAILED)
    except KeyboardInterrupt as exc:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print("\npgpong: play interrupted", file=sys.stderr, flush=True)
        return EXIT_SIGTERM if terminated() or isinstance(exc, Terminated) else EXIT_SIGINT
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
