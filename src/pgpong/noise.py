"""The gradient noise scale of a policy (McCandlish et al. 2018, "An Empirical Model of
Large-Batch Training"): the batch size beyond which bigger batches stop saving updates.

pgpong's batch gradient is the sum of per-match gradients g_i (ALGORITHM.md section 4).
With G the mean per-match gradient and Sigma their covariance, the simple noise scale is

    B_simple = tr(Sigma) / |G|^2            (in matches; times the mean match length: in steps)

estimated from n matches played with one policy: tr(Sigma) by the sample variance
S = sum |g_i - mean|^2 / (n - 1), and |G|^2 without bias by |mean|^2 - S / n. When
that is not positive the n matches cannot see the signal under the noise: the
noise scale is then larger than about n, and the estimate is given as None.

    python -m pgpong.noise CHECKPOINT [CHECKPOINT ...] --matches 40
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pgpong.errors import OneLineParser, PgpongError
from pgpong.files import given_path

if TYPE_CHECKING:
    from pgpong.policy import Params

# numpy, the network and the emulator are imported where used, inside main's handling of
# Ctrl-C: loading them takes most of a second, and Ctrl-C then should end as quietly.


def per_match_gradients(weights: Params, matches: int, seed: int, env_id: str, max_episode_steps: int | None):
    """Yield (gradient as Params, match steps) for matches 0..matches-1 of batch 0,
    played in this process with the training's own seeds and code."""
    from threadpoolctl import threadpool_limits

    from pgpong.envs import make_env
    from pgpong.rollout import EpisodeId, play_episode

    env = make_env(env_id, max_episode_steps)
    with threadpool_limits(1):
        for k in range(matches):
            result = play_episode(env, weights, EpisodeId(seed, 0, k), 0.99)
            yield result.grad.dense(weights.W1.shape[1]), result.steps


def noise_scale(grads: Iterable[Params]) -> dict[str, Any]:
    """B_simple from per-match gradients, and the parts it is made of."""
    import numpy as np

    total: np.ndarray | None = None
    squares, n = 0.0, 0
    for g in grads:
        flat = np.concatenate([g.W1.ravel(), g.W2.ravel()]).astype(np.float64)
        total = flat if total is None else total + flat
        squares += float(flat @ flat)
        n += 1
    if total is None or n < 2:
        raise ValueError("the noise scale needs at least two matches")
    mean = total / n
    trace = (squares - n * float(mean @ mean)) / (n - 1)  # sum |g_i - mean|^2 / (n - 1)
    signal = float(mean @ mean) - trace / n
    return {
        "matches": n,
        "trace_sigma": trace,
        "g_squared": signal,
        "b_simple_matches": trace / signal if signal > 0 else None,
    }


def measure(path: Path | None, matches: int, seed: int, max_episode_steps: int | None) -> dict:
    import numpy as np

    from pgpong.envs import check_env_id
    from pgpong.evaluate import Policy, load_policy
    from pgpong.policy import Params

    if str(path) == "initial":  # a new network, as training starts (hidden 200, seed 0)
        policy = Policy(Params.initial(200, 0), "initial weights (H=200, seed 0)")
    else:
        policy = load_policy(path)
    env_id = policy.env_id or "ALE/Pong-v5"
    check_env_id(env_id)  # (the checkpoint's, from outside)
    steps: list[int] = []

    def grads():
        for grad, length in per_match_gradients(policy.weights, matches, seed, env_id, max_episode_steps):
            steps.append(length)
            yield grad

    found = noise_scale(grads())
    mean_steps = float(np.mean(steps))
    b = found["b_simple_matches"]
    return {
        "policy": policy.source,
        **found,
        "mean_match_steps": mean_steps,
        "b_simple_steps": None if b is None else b * mean_steps,
    }


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m pgpong.noise", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "checkpoints",
        nargs="*",
        type=given_path,
        help="checkpoints, run directories, or 'initial' for new weights (default: the shipped agent)",
    )
    parser.add_argument("--matches", type=int, default=40, metavar="N", help="matches per policy (default: 40)")
    parser.add_argument(
        "--seed", type=int, default=0, metavar="N", help="seed of the matches, in [0, 2**32) (default: 0)"
    )
    parser.add_argument(
        "--max-episode-steps",
        type=int,
        default=None,
        metavar="N",
        help="cut matches at N steps (default: full matches)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    if args.matches < 2:
        parser.error(f"--matches must be at least 2, got {args.matches}")
    if not 0 <= args.seed < 2**32:
        parser.error(f"--seed must be in [0, 2**32), got {args.seed}")
    if args.max_episode_steps is not None and args.max_episode_steps < 1:
        parser.error(f"--max-episode-steps must be at least 1, got {args.max_episode_steps}")
    try:
        rows = [measure(p, args.matches, args.seed, args.max_episode_steps) for p in (args.checkpoints or [None])]
    except (OSError, PgpongError) as exc:  # a missing or damaged checkpoint, or its env
        parser.error(str(exc))
    except KeyboardInterrupt:
        parser.exit(130, "python -m pgpong.noise: stopped (Ctrl-C); nothing measured is printed\n")
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print("| policy | matches | mean match steps | B_simple (matches) | B_simple (env steps) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        b = "noise dominates (> ~n)" if r["b_simple_matches"] is None else f"{r['b_simple_matches']:.0f}"
        s = "-" if r["b_simple_steps"] is None else f"{r['b_simple_steps']:,.0f}"
        print(f"| {r['policy']} | {r['matches']} | {r['mean_match_steps']:,.0f} | {b} | {s} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
