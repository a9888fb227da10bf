"""`pgpong play`: scores equal the episodes played directly, repeat for a seed whatever
the workers, the shipped agent beats the built-in player, bad inputs exit 2."""

import json

import numpy as np
import pytest

from conftest import run_here, run_pgpong
from pgpong.checkpoint import CheckpointError, TrainingState, save_checkpoint
from pgpong.envs import DOWN, UP, make_env
from pgpong.evaluate import EVAL_STREAM, load_policy, match_ids, shipped_agent_path
from pgpong.policy import Params
from pgpong.rollout import EpisodeId, play_episode, play_match
from test_cli import assert_one_line_error

STEPS = 300  # cut matches: a random policy's full match is ~1,000 steps


@pytest.fixture(scope="module")
def weights_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("agent") / "small.npz"
    weights = Params.initial(16, 5)
    np.savez(path, W1=weights.W1, W2=weights.W2)
    return path, weights


def play_json(*args, timeout=300):
    proc = run_pgpong("play", *args, "--json", timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


def test_play_scores_equal_the_episodes_played_directly(weights_file):
    path, weights = weights_file
    report, stderr = play_json(
        str(path), "--episodes", "3", "--seed", "4", "--workers", "0", "--max-episode-steps", str(STEPS)
    )
    env = make_env("ALE/Pong-v5", STEPS)
    direct = [play_episode(env, weights, EpisodeId(4, EVAL_STREAM, k), 0.99) for k in range(3)]
    assert report["scores"] == [e.score for e in direct]
    assert report["steps"] == [e.steps for e in direct]
    assert report["episodes"] == 3
    assert report["mean_score"] == pytest.approx(np.mean([e.score for e in direct]))
    assert report["std_score"] == pytest.approx(np.std([e.score for e in direct]))
    assert report["points_for"] - report["points_against"] == sum(e.score for e in direct)
    assert report["matches_won"] == 0 and report["matches_cut"] == 3  # none reached 21 in 300 steps
    assert stderr.count("match ") >= 3  # one line per match, on stderr with --json


@pytest.mark.long
@pytest.mark.slow
def test_play_repeats_for_a_seed_whatever_the_workers(weights_file):
    path, _ = weights_file
    common = [str(path), "--episodes", "4", "--max-episode-steps", str(STEPS)]
    local, _ = play_json(*common, "--workers", "0")
    on_ray, stderr = play_json(*common, "--workers", "2")
    assert "2 Ray worker(s)" in stderr
    assert (on_ray["scores"], on_ray["steps"]) == (local["scores"], local["steps"])
    other, _ = play_json(*common, "--workers", "0", "--seed", "1")
    assert other["steps"] != local["steps"] or other["scores"] != local["scores"]


class ActionSpy:
    """The environment, noting every action it is given."""

    def __init__(self, env):
        self.env, self.actions = env, []

    def reset(self, **kwargs):
        return self.env.reset(**kwargs)

    def step(self, action):
        self.actions.append(action)
        return self.env.step(action)


@pytest.mark.parametrize("greedy", [True, False])
def test_greedy_takes_the_likelier_action(weights_file, greedy):
    _, weights = weights_file
    env, p_up = ActionSpy(make_env("ALE/Pong-v5", 200)), []
    play_match(
        env,
        weights,
        EpisodeId(0, EVAL_STREAM, 0),
        greedy=greedy,
        observer=lambda _env, _idx, _vals, p, up: (
            None if isinstance(up, tuple) else p_up.append(p)
        ),  # (a tuple: the end)
    )
    likelier = [UP if p > 0.5 else DOWN for p in p_up]
    assert len(env.actions) == len(p_up) == 200
    if greedy:
        assert env.actions == likelier
    else:  # sampling takes the less likely action now and then (p is near 0.5 here)
        assert sum(a != b for a, b in zip(env.actions, likelier, strict=True)) > 20


def test_run_directory_gives_its_newest_good_checkpoint(tmp_path):
    folder = tmp_path / "run" / "checkpoints"
    for batch in (1, 2):
        w = Params.initial(8, batch)
        save_checkpoint(TrainingState(weights=w, cache=w.zeros_like(), batch=batch, info={"env_id": "Pong-v0"}), folder)
    newest = folder / "ckpt-000002.npz"
    newest.write_bytes(newest.read_bytes()[:500])  # damaged
    policy = load_policy(tmp_path / "run")
    np.testing.assert_array_equal(policy.weights.W1, Params.initial(8, 1).W1)
    assert policy.env_id == "Pong-v0" and "ckpt-000001" in policy.source
    with pytest.raises(CheckpointError, match="no checkpoint"):
        load_policy(tmp_path)  # a directory with no checkpoints


def test_shipped_agent_is_plain_weights():
    path = shipped_agent_path()
    assert path.stat().st_size <= 6 * 2**20
    with np.load(path, allow_pickle=False) as data:
        assert sorted(data.files) == ["W1", "W2"]
        assert data["W1"].shape == (200, 6400) and data["W2"].shape == (200,)


@pytest.mark.slow
def test_shipped_agent_beats_the_built_in_player():
    report, _ = play_json("--episodes", "3", "--workers", "0", "--seed", "0")
    assert report["mean_score"] > 0
    assert min(report["steps"]) > 1500  # full matches, not cut


def test_matches_use_their_own_seed_stream():
    assert [m.batch for m in match_ids(3, 2)] == [EVAL_STREAM] * 2
    assert [m.episode for m in match_ids(3, 2)] == [0, 1]


def bad_files(tmp_path):
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"not a zip file at all" * 10)
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, W1=np.zeros((4, 100), np.float32), W2=np.zeros(4, np.float32))
    return {"garbage": garbage, "wrong-shape": wrong, "missing": tmp_path / "nope.npz", "empty-dir": tmp_path / "d"}


@pytest.mark.parametrize(
    "case, words",
    [
        ("garbage", ["garbage.npz"]),
        ("wrong-shape", ["wrong.npz", "shape"]),
        ("missing", ["nope.npz", "no such file"]),
        ("empty-dir", ["no checkpoint"]),
    ],
)
def test_play_bad_files_exit_2(tmp_path, case, words, capsys):
    (tmp_path / "d").mkdir()
    proc = run_here(capsys, "play", str(bad_files(tmp_path)[case]), "--workers", "0")
    assert_one_line_error(proc, *words)


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--episodes", "0"], ["--episodes"]),
        (["--workers", "-1"], ["--workers"]),
        (["--seed", "-1"], ["--seed"]),
        (["--max-episode-steps", "0"], ["--max-episode-steps"]),
        (["--env-id", "Pong-v9"], ["Pong-v9"]),
        (["--env-id", ""], ["--env-id must not be empty"]),  # as train says, not the default in its place
        (["--episodes", "99999999999999999999"], ["--episodes must be at most 100,000, got 99999999999999999999"]),
        (["--episodes", "100000001"], ["--episodes must be at most 100,000"]),
    ],
)
def test_play_bad_flags_exit_2(weights_file, flags, words, capsys):
    proc = run_here(capsys, "play", str(weights_file[0]), "--workers", "0", *flags)
    assert_one_line_error(proc, *words)
    assert proc.stdout == ""  # refused before a match is listed or played


def test_play_help_states_the_bounds():
    proc = run_pgpong("play", "--help", timeout=60)
    help_text = " ".join(proc.stdout.split())
    assert "matches to play, at most 100,000 (default: 10)" in help_text
    assert "from 0.01 (a GIF frame lasts at most 655.35 s) to 240" in help_text


def test_a_run_directory_that_cannot_be_searched_is_one_line(tmp_path, monkeypatch):
    def denied(self):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(type(tmp_path), "is_dir", denied)  # chmod 000 on the run directory
    with pytest.raises(CheckpointError, match=r"cannot read \(Permission denied\)"):
        load_policy(tmp_path)


def test_the_library_refuses_too_many_matches_before_listing_them():
    from pgpong.config import ConfigError
    from pgpong.evaluate import MAX_EPISODES, evaluate

    with pytest.raises(ConfigError, match="--episodes must be at most 100,000"):
        evaluate(None, Params.initial(4, 0), MAX_EPISODES + 1)  # type: ignore[arg-type]  # no pool needed


def test_a_match_cut_short_is_neither_won_nor_lost():
    from pgpong.evaluate import match_line, summarise
    from pgpong.rollout import MatchResult

    def result(k, points_for, points_against):
        return MatchResult(
            EpisodeId(0, EVAL_STREAM, k), points_for - points_against, points_for, points_against, 900, 1.0
        )

    results = [result(0, 21, 5), result(1, 3, 21), result(2, 2, 1), result(3, 0, 4)]
    assert [match_line(r, 4).split(" | ")[1] for r in results] == [
        "won  21:5 ",
        "lost  3:21",
        "cut   2:1 ",
        "cut   0:4 ",
    ]
    summary = summarise(results)
    assert (summary.matches_won, summary.matches_cut) == (1, 2)  # 2:1 is ahead, not won
    assert "| won 1 of 4 (2 cut short) |" in summary.line()
    assert "cut" not in summarise(results[:2]).line()
