"""pgpong from Python: the public names (lazy, documented, none hidden by a module),
train() as `pgpong train` (settings, resume, stop, the same messages as a PgpongError
whose traceback ends at the API), an Agent on raw frames playing exactly as pgpong's
own matches, evaluate_agent as `pgpong play`, and the pictures as figures."""

from __future__ import annotations

import dataclasses
import inspect
import io
import json
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

import pgpong
from conftest import run_pgpong
from pgpong import api
from pgpong.config import TrainConfig
from pgpong.envs import make_env
from pgpong.evaluate import EVAL_STREAM, load_policy
from pgpong.policy import Params
from pgpong.rollout import EpisodeId, episode_seeds, play_match

SRC = Path(pgpong.__file__).parent
TINY: dict[str, Any] = {"batch_size": 2, "max_episode_steps": 100, "workers": 0, "hidden": 8}


def test_the_public_names_resolve_are_documented_and_no_module_hides_them():
    modules = {p.stem for p in SRC.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    public = [name for name in pgpong.__all__ if name != "__version__"]
    assert set(public) == set(pgpong._HOME)
    for name in public:
        value = getattr(pgpong, name)
        assert inspect.getdoc(value), f"pgpong.{name} has no docstring"
        # `import pgpong.NAME` would replace the attribute by the module
        assert name not in modules, f"pgpong.{name} is also a module's name"
    error_types = [getattr(pgpong, n) for n in public if n.endswith(("Error", "Environment", "Diverged"))]
    assert len(error_types) == 10 and all(issubclass(e, pgpong.PgpongError) for e in error_types)
    with pytest.raises(AttributeError):
        pgpong.no_such_name  # noqa: B018


def test_import_pgpong_loads_no_heavy_library():
    heavy = ["ray", "gymnasium", "ale_py", "numba", "matplotlib", "numpy"]
    code = f"import sys, pgpong; print([m for m in {heavy!r} if m in sys.modules])"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_train_takes_every_setting_of_pgpong_train_by_name():
    parameters = inspect.signature(pgpong.train).parameters
    settings = [f.name for f in dataclasses.fields(TrainConfig)]
    assert [p for p in parameters if p in settings] == settings, "train() must name every TrainConfig setting"
    assert all(parameters[name].default is None for name in settings)  # None: the setting's own default


def test_train_returns_the_run_and_resumes_it_with_stop(tmp_path):
    out = io.StringIO()
    run = pgpong.train(tmp_path / "run", iterations=2, progress=out, **TINY)
    assert run.directory == tmp_path / "run" and not run.interrupted
    assert [row.batch for row in run.progress] == [1, 2] and run.batches == 2
    assert [row.episodes for row in run.progress] == [2, 4]
    assert run.settings["batch_size"] == 2 and run.settings["hidden"] == 8
    assert run.checkpoint == tmp_path / "run" / "checkpoints" / "ckpt-000002.npz"
    assert np.array_equal(run.weights.W1, load_policy(run.checkpoint).weights.W1)
    assert run.running_reward == pytest.approx(run.progress[-1].running_reward)
    assert "batch     2 |" in out.getvalue() and "new run" in out.getvalue()

    seen = []

    def stop(row):
        seen.append(row.batch)
        return row.batch >= 3

    more = pgpong.train(run.directory, iterations=10, stop=stop, progress=False)
    assert seen == [3] and more.batches == 3  # resumed at batch 2, stopped after batch 3
    assert not np.array_equal(more.weights.W1, run.weights.W1)
    # Resumed and stopped, the weights are those of an uninterrupted run of 3 batches.
    straight = pgpong.train(tmp_path / "straight", iterations=3, progress=False, **TINY)
    assert np.array_equal(straight.weights.W1, more.weights.W1)
    again = io.StringIO()
    same = pgpong.train(run.directory, iterations=3, progress=again)
    assert same.batches == 3 and "already has its 3 batches" in again.getvalue()
    assert repr(same).startswith(f"Run({str(run.directory)!r}: 3 batches, running reward ")


@pytest.mark.parametrize(
    ("call", "flags"),
    [
        (lambda d: pgpong.train(d, batch_size=0, progress=False), ["train", "--batch-size", "0"]),
        (lambda d: pgpong.train(d, env_id="Breakout-v4", progress=False), ["train", "--env-id", "Breakout-v4"]),
        (lambda d: pgpong.train(d, learning_rate=5.0, progress=False), ["train", "--lr", "5"]),
        (lambda d: pgpong.evaluate_agent(d / "nothing.npz"), ["play", "{d}/nothing.npz"]),
        (lambda d: pgpong.evaluate_agent(None, 0), ["play", "--episodes", "0"]),
        (lambda d: pgpong.plot_learning_curve(d), ["plot", "{d}"]),
        (lambda d: pgpong.plot_weights(None, units=0, output=d / "w.png"), ["weights", "--units", "0"]),
    ],
)
def test_bad_input_raises_the_command_lines_message(tmp_path, call, flags):
    with pytest.raises(pgpong.PgpongError) as caught:
        call(tmp_path)
    proc = run_pgpong(*[f.format(d=tmp_path) for f in flags], cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"pgpong: error: {caught.value}"
    assert "\n" not in str(caught.value)
    # The traceback ends at the API function called, not inside pgpong.
    frames = traceback.extract_tb(caught.value.__traceback__)
    assert Path(frames[-1].filename).name == "api.py", [f.filename for f in frames]
    assert not (tmp_path / "runs").exists()  # nothing written, by either


ODD: Any = {"five": 5, "seven": 7, "yes": "yes", "three": "3", "x": "x", "2.5": 2.5, "two": "2"}  # (typed Any)


@pytest.mark.parametrize(
    ("call", "said"),
    [
        (lambda d: pgpong.train(d, env_id=ODD["five"], progress=False), "--env-id must be a Gymnasium id such as"),
        (lambda d: pgpong.train(d, address=ODD["five"], progress=False), "address must be HOST:PORT or None, got 5"),
        (lambda d: pgpong.train(d, stop=ODD["five"], progress=False, **TINY), "stop must be a function of a BatchRow"),
        (lambda d: pgpong.train(d, progress=ODD["yes"], **TINY), "progress must be True, False or a stream, got 'yes'"),
        (lambda d: pgpong.train(ODD["five"], progress=False), "run_dir must be a path, got 5"),
        (
            lambda d: pgpong.evaluate_agent(ODD["five"], workers=0),
            "agent must be an Agent, a Run, a path or None, got 5",
        ),
        (lambda d: pgpong.evaluate_agent(None, ODD["three"]), "--episodes must be a whole number, at least 1, got '3'"),
        (lambda d: pgpong.evaluate_agent(None, 1, fps=ODD["x"], record=d / "m.gif"), "--fps must be a number, got 'x'"),
        (
            lambda d: pgpong.evaluate_agent(None, 1, record=d / "m.gif", record_scale=ODD["2.5"]),
            "record_scale must be a whole number from 1 to 8, got 2.5",
        ),
        (lambda d: pgpong.plot_weights(None, units=ODD["2.5"]), "--units must be a whole number, at least 1, got 2.5"),
        (lambda d: pgpong.plot_weights(None, zoom=ODD["two"]), "zoom must be a whole number from 1 to 8, got '2'"),
        (lambda d: pgpong.plot_weights(None, output=ODD["five"]), "output must be a path, got 5"),
        (lambda d: pgpong.plot_learning_curve(ODD["seven"]), "a run must be a Run or a path, got 7"),
        (lambda d: pgpong.Run.load(ODD["seven"]), "directory must be a path, got 7"),
    ],
)
def test_a_value_of_the_wrong_kind_is_named_before_anything_runs(tmp_path, call, said):
    with pytest.raises(pgpong.PgpongError) as caught:
        call(tmp_path)
    assert said in str(caught.value) and "\n" not in str(caught.value)
    assert Path(traceback.extract_tb(caught.value.__traceback__)[-1].filename).name == "api.py"
    assert list(tmp_path.iterdir()) == []  # nothing written, nothing played


def test_an_empty_address_is_refused_not_taken_for_a_local_ray(tmp_path):
    for call in (
        lambda: pgpong.train(tmp_path / "r", address=" ", progress=False),
        lambda: pgpong.evaluate_agent(address=""),
    ):
        with pytest.raises(pgpong.ConfigError, match="address is empty: give None for a local Ray instance"):
            call()
    assert list(tmp_path.iterdir()) == []


def test_an_agent_on_raw_frames_plays_as_pgpong_plays():
    """The agent driven frame by frame on RGB screens takes exactly the actions of
    play_match, which reads the emulator's palette screens: same seeds, same match."""
    weights = load_policy(None).weights
    for match in (EpisodeId(2, EVAL_STREAM, 0), EpisodeId(5, EVAL_STREAM, 1)):
        expected = play_match(make_env("ALE/Pong-v5", 400), weights, match)
        env_seed, draws = episode_seeds(match)
        env = make_env("ALE/Pong-v5", 400, observation="rgb")
        agent = pgpong.Agent(weights)
        agent.reset(seed=draws)
        frame, _ = env.reset(seed=env_seed)
        score, steps = 0.0, 0
        while True:
            frame, reward, terminated, truncated, _ = env.step(agent.act(frame))
            score, steps = score + reward, steps + 1
            if terminated or truncated:
                break
        assert (score, steps) == (expected.score, expected.steps)
        assert agent.p_up is not None and 0 <= agent.p_up <= 1


def test_an_agent_is_seeded_greedy_when_asked_and_checks_its_input():
    frames = [np.full((210, 160, 3), 144, np.uint8) for _ in range(3)]
    frames[1][100:104, 80:82] = 236  # a ball appears, then moves
    frames[2][102:106, 82:84] = 236
    one, two = pgpong.Agent.load(seed=7), pgpong.Agent.load(seed=7)
    assert [one.act(f) for f in frames * 5] == [two.act(f) for f in frames * 5]
    greedy = pgpong.Agent.load(greedy=True)
    actions = [greedy.act(f) for f in frames]
    assert actions == [2 if p > 0.5 else 3 for p in [_p_up(greedy, frames[: k + 1]) for k in range(3)]]
    with pytest.raises(pgpong.ConfigError, match="210x160x3 uint8 RGB frame"):
        greedy.act(np.zeros((84, 84), np.uint8))
    with pytest.raises(pgpong.ConfigError, match=r"W1 must have shape \(H, 6400\)"):
        pgpong.Agent.from_weights(np.zeros((4, 100)), np.zeros(4))
    assert pgpong.Agent.from_weights(np.zeros((4, 6400)), np.zeros(4)).act(frames[0]) in (2, 3)


def _p_up(agent, frames):
    agent.reset()
    for frame in frames:
        agent.act(frame)
    return agent.p_up


def test_evaluate_agent_returns_what_pgpong_play_prints(tmp_path):
    path = tmp_path / "small.npz"
    weights = Params.initial(16, 5)
    np.savez(path, W1=weights.W1, W2=weights.W2)
    lines = io.StringIO()
    summary = pgpong.evaluate_agent(path, 3, seed=4, workers=0, max_episode_steps=300, progress=lines)
    proc = run_pgpong("play", str(path), "--episodes", "3", "--seed", "4", "--workers", "0",
                      "--max-episode-steps", "300", "--json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    printed = json.loads(proc.stdout)
    assert {**summary.as_dict(), "env_id": summary.env_id, "policy": summary.policy} == {
        k: printed[k] for k in [*summary.as_dict(), "env_id", "policy"]
    }
    assert lines.getvalue() == proc.stderr  # the header and a line per match, the same words
    assert str(summary) == summary.line() and summary.seed == 4 and summary.greedy is False
    agent = pgpong.Agent(weights, greedy=True)
    greedy = pgpong.evaluate_agent(agent, 2, workers=0, max_episode_steps=300, progress=False)
    assert greedy.greedy is True
    run = pgpong.train(tmp_path / "run", iterations=1, progress=False, **TINY)
    of_run = pgpong.evaluate_agent(run, 1, workers=0, max_episode_steps=50, progress=False)  # a Run, as train gave it
    alike = pgpong.evaluate_agent(run.checkpoint, 1, workers=0, max_episode_steps=50, progress=False)
    assert of_run.as_dict() == alike.as_dict() and of_run.policy == alike.policy


def test_the_pictures_are_figures_and_files(tmp_path):
    from matplotlib.figure import Figure

    run = pgpong.train(tmp_path / "run", iterations=2, progress=False, **TINY)
    curve = pgpong.plot_learning_curve(run, x="steps", output=tmp_path / "curve.png")
    assert isinstance(curve, Figure) and (tmp_path / "curve.png").stat().st_size > 10_000
    assert curve.axes[1].get_xlabel() == "env steps (millions)"
    assert np.size(curve.axes[0].lines[1].get_xdata()) == 2  # the running reward: a point per batch
    assert isinstance(run.plot(), Figure)
    picture = pgpong.plot_weights(run, units=4)
    assert picture.texts[0].get_text().startswith("run run, batch 2: ")  # the run and its batch, not 'ckpt-000002.npz'
    for drawn, batch in ((tmp_path / "run", 2), (tmp_path / "run" / "checkpoints" / "ckpt-000002.npz", 2)):
        assert pgpong.plot_weights(drawn, units=1).texts[0].get_text().startswith(f"run run, batch {batch}: ")
    three, one = cast(Any, np.int64(3)), cast(Any, np.int64(1))  # numpy's integers are whole numbers too
    assert "the first 3 hidden units" in pgpong.plot_weights(run, units=three, zoom=one).texts[0].get_text()
    picture = pgpong.plot_weights(units=12, title="shipped", output=tmp_path / "w.png")
    assert picture.texts[0].get_text().startswith("shipped: the W1 weights of the first 12 hidden units")
    assert (tmp_path / "w.png").exists()
    with pytest.raises(pgpong.PlotError, match="no progress.csv"):
        pgpong.plot_learning_curve(tmp_path)


def test_a_run_directory_loads_as_a_run(tmp_path):
    with pytest.raises(pgpong.ConfigError, match="not a pgpong run directory"):
        pgpong.Run.load(tmp_path)
    pgpong.train(tmp_path / "run", iterations=1, progress=False, **TINY)
    run = pgpong.Run.load(tmp_path / "run")
    assert run.batches == 1 and run.agent().hidden == 8
    assert api.Run.load(str(tmp_path / "run")).checkpoint == run.checkpoint
