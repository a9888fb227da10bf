"""Judge a policy: full matches against Pong's built-in player, seeded so that an
evaluation repeats exactly, played on a pool; no gradient."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import cast

from pgpong.checkpoint import CheckpointError, list_checkpoints, read_weights
from pgpong.config import TrainConfig, address_text, check, is_int, is_number, setting
from pgpong.files import given_path, missing
from pgpong.policy import Params
from pgpong.pool import Pool
from pgpong.record import MAX_FPS, MIN_FPS, fps_error
from pgpong.rollout import EpisodeId, MatchResult, play_match

# Matches use their own seed stream: match k of an evaluation seeded s is played as
# "episode k of batch EVAL_STREAM", a batch number no training run reaches.
EVAL_STREAM = 2**32 - 2
SHIPPED_AGENT = "pong-v5.npz"
# The most matches an evaluation plays (their seeds are listed before the first starts):
# some 3 days of full matches on one core, 20 minutes on 200.
MAX_EPISODES = 100_000


@dataclass(frozen=True)
class PlayOptions:
    """`pgpong play`'s settings (its flags are built from them, as train's are from
    TrainConfig); the policy, --greedy and --json are flags of their own."""

    episodes: int = setting(10, f"matches to play, at most {MAX_EPISODES:,}")
    workers: int | None = setting(
        None,
        "Ray workers; 0 = play in this process, without Ray",
        shown="the CPUs of the Ray cluster, at most --episodes",
    )
    seed: int = setting(0, "match k is seeded from (seed, k)")
    env_id: str | None = setting(
        None, "environment id", metavar="ID", shown="the one the checkpoint was trained on, else ALE/Pong-v5"
    )
    max_episode_steps: int | None = setting(None, "cut matches after N steps", shown="full matches")
    address: str | None = setting(
        None, "an existing Ray cluster", metavar="ADDRESS", shown="$RAY_ADDRESS, else local", parse=address_text
    )
    record: Path | None = setting(
        None,
        "record the first match to FILE (.mp4 or .gif): the game, and beside it the difference frame the network "
        "sees and its probability of moving up",
        metavar="FILE",
        parse=given_path,
        shown="none",
    )
    record_episodes: int = setting(
        1,
        "record the first K matches, one file each (FILE-1.mp4, ..., numbered with as many digits as K has)",
        metavar="K",
    )
    fps: float | None = setting(
        None,
        f"frames per second of the recording, from {MIN_FPS:g} (a GIF frame lasts at most 655.35 s) to {MAX_FPS:g}",
        metavar="F",
        shown="real speed, 60 / the frameskip",
    )

    def validate(self) -> PlayOptions:
        """Return self, or raise ConfigError on a value play cannot use (TrainConfig's checks where shared)."""
        check_episodes(self.episodes)
        TrainConfig(
            env_id=TrainConfig.env_id if self.env_id is None else self.env_id,
            max_episode_steps=self.max_episode_steps,
            workers=self.workers,
            seed=self.seed,
        ).validate()
        check(
            is_int(self.record_episodes) and 1 <= self.record_episodes <= self.episodes,
            f"--record-episodes must be a whole number from 1 to --episodes ({self.episodes}), "
            f"got {self.record_episodes!r}",
        )
        check(self.fps is None or is_number(self.fps), f"--fps must be a number, got {self.fps!r}")
        check(self.fps is None or MIN_FPS <= self.fps <= MAX_FPS, fps_error(self.fps or 0))
        for name, default in (("record_episodes", 1), ("fps", None)):  # nothing to film: not to be ignored
            flag = "--" + name.replace("_", "-")
            check(
                self.record is not None or getattr(self, name) == default,
                f"{flag} sets the recording: give --record FILE",
            )
        return self


class MatchStatus:
    """The live line of an evaluation: matches done, steps per second, elapsed."""

    def __init__(self, total: int):
        self.total, self.matches, self.steps, self.began = total, 0, 0, time.monotonic()

    def text(self) -> str:
        elapsed = time.monotonic() - self.began
        speed = f"{self.steps / max(elapsed, 1e-9):,.0f}" if self.steps else "-"  # (counted as matches end)
        return f"playing: {self.matches}/{self.total} matches done | {speed} steps/s | {elapsed:5.1f} s"


def check_episodes(episodes: int) -> None:
    check(is_int(episodes) and episodes >= 1, f"--episodes must be a whole number, at least 1, got {episodes!r}")
    check(episodes <= MAX_EPISODES, f"--episodes must be at most {MAX_EPISODES:,}, got {episodes}")


@dataclass
class Policy:
    """Weights to play with, where they came from, and what they were trained on (if known)."""

    weights: Params
    source: str
    env_id: str | None = None
    info: dict = field(default_factory=dict)


def shipped_agent_path() -> Path:
    return Path(str(resources.files("pgpong") / "agents" / SHIPPED_AGENT))


def load_policy(where: Path | None) -> Policy:
    """The weights of a checkpoint file, of a run directory's newest good checkpoint, of
    any .npz with W1 (H, 6400) and W2 (H,), or (where=None) of the shipped agent."""
    if where is None:
        path = shipped_agent_path()
        if not path.exists():
            raise CheckpointError(f"the shipped agent {path} is missing from this installation")
        return _policy_of(path, f"the shipped agent ({path.name})")
    try:
        is_dir = where.is_dir()
        folder = where / "checkpoints" if is_dir and (where / "checkpoints").is_dir() else where
    except OSError as exc:  # a directory that cannot be searched
        raise CheckpointError(f"{where}: cannot read ({exc.strerror or exc})") from None
    if is_dir:
        found = list_checkpoints(folder)
        if not found:
            raise CheckpointError(f"{where}: no checkpoint in this directory (expected ckpt-NNNNNN.npz files)")
        problems = []
        for path in reversed(found):
            try:
                return _policy_of(path, str(path))
            except CheckpointError as exc:
                problems.append(str(exc))
        raise CheckpointError(f"{where}: no usable checkpoint ({problems[0]})")
    if not where.exists():
        raise CheckpointError(missing(where))
    return _policy_of(where, str(where))


def _policy_of(path: Path, source: str) -> Policy:
    weights, info = read_weights(path)
    env_id = info.get("env_id")
    return Policy(weights, source, env_id if isinstance(env_id, str) else None, info)


def match_ids(seed: int, count: int) -> list[EpisodeId]:
    return [EpisodeId(seed, EVAL_STREAM, k) for k in range(count)]


@dataclass
class Summary:
    """An evaluation's result: the mean score (in [-21, 21]) and its standard deviation,
    matches won, points for and against, and each match's score and steps, in match
    order; what was played (environment, policy, seed, greedy) when known. A match cut
    short (--max-episode-steps) is neither won nor lost: matches_cut counts them."""

    episodes: int
    mean_score: float
    std_score: float
    matches_won: int
    points_for: int
    points_against: int
    scores: list[float]
    steps: list[int]
    env_id: str | None = None
    policy: str | None = None
    seed: int | None = None
    greedy: bool | None = None
    matches_cut: int = 0

    def as_dict(self) -> dict:
        return {
            "episodes": self.episodes,
            "mean_score": self.mean_score,
            "std_score": self.std_score,
            "matches_won": self.matches_won,
            "matches_cut": self.matches_cut,
            "points_for": self.points_for,
            "points_against": self.points_against,
            "scores": self.scores,
            "steps": self.steps,
        }

    def __str__(self) -> str:
        return self.line()

    def line(self) -> str:
        return (
            f"mean score {self.mean_score:+.2f} +- {self.std_score:.2f} over {self.episodes} matches"
            f" | won {self.matches_won} of {self.episodes}"
            + (f" ({self.matches_cut} cut short)" if self.matches_cut else "")
            + f" | points {self.points_for}:{self.points_against}"
        )


def summarise(results: list[MatchResult]) -> Summary:
    scores = [r.score for r in results]
    return Summary(
        episodes=len(results),
        mean_score=statistics.fmean(scores),
        std_score=statistics.pstdev(scores),
        matches_won=sum(r.finished and r.points_for > r.points_against for r in results),
        matches_cut=sum(not r.finished for r in results),
        points_for=sum(r.points_for for r in results),
        points_against=sum(r.points_against for r in results),
        scores=scores,
        steps=[r.steps for r in results],
    )


def evaluate(
    pool: Pool,
    weights: Params,
    episodes: int,
    seed: int = 0,
    greedy: bool = False,
    on_match: Callable[[MatchResult], None] | None = None,
) -> Summary:
    """Play `episodes` seeded matches on the pool; results come in match order."""
    check_episodes(episodes)
    results = []
    for result in pool.evaluate(weights, match_ids(seed, episodes), greedy):
        results.append(result)
        if on_match is not None:
            on_match(result)
    return summarise(results)


def match_line(result: MatchResult, total: int) -> str:
    k = result.episode.episode + 1
    verdict = "cut " if not result.finished else "won " if result.points_for > result.points_against else "lost"
    return (
        f"match {k:{len(str(total))}d}/{total} | {verdict} {result.points_for:2d}:{result.points_against:<2d}"
        f" | score {result.score:+3.0f} | {result.steps:5d} steps"
    )


def record_matches(
    path: Path,
    count: int,
    weights: Params,
    env_id: str,
    max_episode_steps: int | None,
    seed: int,
    greedy: bool,
    fps: float | None,
    scale: int | None = None,
) -> Iterator[str]:
    """Play matches 0..count-1 of the evaluation again in this process (the same seeds
    give the same matches) and record each to its file, drawn `scale` times the
    screen's size (default: the Recorder's); yield a line about each."""
    from pgpong.envs import SeededAtari, make_env
    from pgpong.record import EMULATOR_FPS, END_HOLD_S, Recorder, numbered

    env = make_env(env_id, max_episode_steps)
    atari = cast(SeededAtari, env.unwrapped)
    fps = fps or EMULATOR_FPS / atari.frames_per_step()
    try:
        for match in match_ids(seed, count):
            recorder = Recorder(numbered(path, match.episode, count), fps, scale)
            yield f"recording match {match.episode + 1} to {recorder.path}: playing it again here (tens of seconds)"
            try:
                result = play_match(env, weights, match, greedy, observer=recorder)
                recorder.save()
            finally:
                recorder.discard()  # after Ctrl-C or an error: no partial file
            frames = recorder.count
            line = (
                f"recorded match {match.episode + 1} ({result.points_for}:{result.points_against}) to "
                f"{recorder.path}: {frames} steps, {recorder.seconds:.0f} s at {fps:g} fps"
                + (f" (the end held {END_HOLD_S:g} s)" if recorder.ended else "")
            )
            if recorder.cut:
                line += (
                    f" (cut after {frames} of {result.steps} steps to keep the GIF under about 20 MB; use .mp4 for all)"
                )
            yield line
    finally:
        env.close()
