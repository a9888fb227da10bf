"""pgpong from Python: what the command line and notebooks call. Settings in; runs,
agents, summaries and figures out, as values.

`train` is `pgpong train`, `evaluate_agent` is `pgpong play`, `plot_learning_curve`
and `plot_weights` are `pgpong plot` and `pgpong weights`: the same defaults, checks
and messages (the command line parses its flags, calls these and maps what they raise
to exit statuses). Bad input raises a PgpongError whose message is the command line's
one line, with a traceback that ends here rather than deep inside pgpong."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TextIO, TypeVar

from pgpong.config import ConfigError, TrainConfig, check, is_int, whole
from pgpong.console import fitted
from pgpong.errors import PgpongError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from pgpong.agent import Agent
    from pgpong.evaluate import Summary
    from pgpong.policy import Params
    from pgpong.runlog import BatchRow
    from pgpong.session import TrainingSession

P = ParamSpec("P")
R = TypeVar("R")
Progress = bool | TextIO  # True: lines on stdout (a refreshing line in a notebook); False: none; or a stream


def _public(function: Callable[P, R]) -> Callable[P, R]:
    """A PgpongError raised inside shows its one line with a traceback that ends at
    the API function the caller called, not deep inside pgpong."""

    @functools.wraps(function)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return function(*args, **kwargs)
        except PgpongError as exc:
            raise exc.with_traceback(None) from None

    return call


@dataclass(repr=False)
class Run:
    """A run directory as it stands on disk: its settings (config.json), its progress
    rows (progress.csv, one BatchRow per batch) and the weights of its newest good
    checkpoint (the initial weights when it has none yet). `interrupted` says the
    train() that returned it was stopped (Ctrl-C, a notebook's stop button)."""

    directory: Path
    settings: dict[str, Any]
    progress: list[BatchRow]
    weights: Params
    checkpoint: Path | None
    interrupted: bool = False

    @classmethod
    def load(cls, directory: str | Path, interrupted: bool = False) -> Run:
        """Read a run directory (as train() left it, or `pgpong train`)."""
        return _public(lambda: _load_run(_a_path(directory, "directory"), interrupted))()

    @property
    def running_reward(self) -> float | None:
        """The running reward after the last batch (None before the first)."""
        return self.progress[-1].running_reward if self.progress else None

    @property
    def batches(self) -> int:
        return self.progress[-1].batch if self.progress else 0

    def agent(self, *, seed: int | None = None, greedy: bool = False) -> Agent:
        """An Agent playing with the run's weights."""
        from pgpong.agent import Agent

        source = str(self.checkpoint) if self.checkpoint else f"{self.directory} (initial weights)"
        return Agent(self.weights, seed=seed, greedy=greedy, source=source, env_id=self.settings.get("env_id"))

    def plot(self, x: str = "episodes") -> Figure:
        """The run's learning curve (plot_learning_curve)."""
        return plot_learning_curve(self, x=x)

    def __repr__(self) -> str:
        running = "no batch yet" if self.running_reward is None else f"running reward {self.running_reward:.2f}"
        stopped = ", interrupted" if self.interrupted else ""
        return f"Run({str(self.directory)!r}: {self.batches} batches, {running}{stopped})"


def _load_run(directory: Path, interrupted: bool) -> Run:
    from pgpong.checkpoint import list_checkpoints
    from pgpong.config import load_config
    from pgpong.evaluate import load_policy
    from pgpong.policy import Params
    from pgpong.runlog import read_rows

    if not (directory / "config.json").is_file():
        raise ConfigError(f"{directory}: not a pgpong run directory (no config.json)")
    config = load_config(directory / "config.json")
    if list_checkpoints(directory / "checkpoints"):
        policy = load_policy(directory)
        weights, checkpoint = policy.weights, Path(policy.source)
    else:
        weights, checkpoint = Params.initial(config.hidden, config.seed, w2_scale=config.w2_init_scale), None
    rows = read_rows(directory / "progress.csv")
    return Run(directory, config.to_dict(), rows, weights, checkpoint, interrupted)


@_public
def train(
    run_dir: str | Path | None = None,
    *,
    env_id: str | None = None,
    hidden: int | None = None,
    batch_size: int | None = None,
    ramp_from: int | None = None,
    ramp_matches: int | None = None,
    learning_rate: float | None = None,
    warmup: bool | str | None = None,
    entropy_bonus: float | None = None,
    w2_init_scale: float | None = None,
    max_update_norm: float | None = None,
    lag: int | None = None,
    lag_share: float | None = None,
    gamma: float | None = None,
    decay_rate: float | None = None,
    seed: int | None = None,
    max_episode_steps: int | None = None,
    iterations: int | None = None,
    workers: int | None = None,
    workers_per_cpu: float | str | None = None,
    keep_checkpoints: int | None = None,
    checkpoint_every: float | None = None,
    resume_from: str | Path | None = None,
    address: str | None = None,
    stop: Callable[[BatchRow], object] | None = None,
    progress: Progress = True,
) -> Run:
    """Train the policy network, as `pgpong train` does, and return the run.

    Each setting is `pgpong train`'s flag of that name (`batch_size` is
    `--batch-size`); one left out (None) takes its default, or in a resumed run the
    run's own value. `run_dir` (default runs/<env>__<seed>__<time>) is resumed when it
    holds a run. `iterations` stops after that many batches in all (None: no limit);
    `stop(row)` is called with each batch's progress row (a BatchRow) and ends the
    training when it returns true, e.g. `stop=lambda row: row.running_reward > -10`.
    `workers` 0 plays in this process without Ray; None, one Ray worker per CPU of a
    local Ray instance, or of the cluster at `address` (default $RAY_ADDRESS). A Ray
    instance you started yourself (ray.init) is used, and left running.

    Interrupted (Ctrl-C, a notebook's stop button), it returns the run as the last
    finished batch left it on disk (checkpoint and progress row), with
    `interrupted=True`: train(run_dir=run.directory) goes on from there. Bad settings
    raise a PgpongError (ConfigError; UnknownEnvironment for an env_id that is not
    Pong's) before anything is written.
    """
    if isinstance(warmup, bool):
        warmup = "on" if warmup else "off"
    named = locals()  # the settings given, by TrainConfig's names (a test keeps the two alike)
    given = {f.name: named[f.name] for f in dataclasses.fields(TrainConfig) if named[f.name] is not None}
    out = _stream(progress)
    check(stop is None or callable(stop), f"stop must be a function of a BatchRow, or None; got {stop!r}")
    paths = _path(run_dir, "run_dir"), _path(resume_from, "resume_from")
    session = plan_training(given, *paths, _address(address), _noter(out))
    directory = session.directory
    again = f"pgpong.train(run_dir={str(directory)!r})"
    if session.run.finished:
        batch, more = session.run.state.batch, max(2 * session.run.state.batch, session.run.state.batch + 1)
        _say(
            out,
            f"pgpong: {directory} already has its {batch} batches (iterations={session.run.config.iterations}); "
            f"to train on, ask for more: pgpong.train(run_dir={str(directory)!r}, iterations={more})",
        )
        return _load_run(directory, False)
    from pgpong.pool import PoolError
    from pgpong.rundir import RunWriteError
    from pgpong.trainer import TrainingDiverged

    try:
        run_training(session, out, stop)
    except (PoolError, RunWriteError) as exc:
        raise type(exc)(f"{exc}. {session.newest_checkpoint()}; resume with: {again}") from None
    except TrainingDiverged as exc:
        raise TrainingDiverged(
            f"{exc}. {session.newest_checkpoint()} (good); start a new run with a smaller learning_rate"
        ) from None
    except KeyboardInterrupt:
        if not session.started():
            _say(sys.stderr, "pgpong: stopped before the run began; nothing was written")
            raise
        _say(sys.stderr, f"pgpong: stopped. {session.newest_checkpoint()}; resume with:\n  {again}")
        return _load_run(directory, True)
    return _load_run(directory, False)


def plan_training(
    given: dict[str, Any],
    run_dir: Path | None,
    resume_from: Path | None,
    address: str | None,
    note: Callable[[str], None],
) -> TrainingSession:
    """Check the settings and the run directory (new or resumed) and hold it; nothing
    else is written. `given`: the settings given, by TrainConfig's names."""
    from pgpong.session import TrainingSession

    return TrainingSession.plan(given, run_dir, resume_from, address, note)


def run_training(
    session: TrainingSession, out: TextIO | None, stop: Callable[[BatchRow], object] | None = None
) -> None:
    """Train a planned session until its iterations or until `stop(row)` holds; lines
    on `out`. Ray's start does not keep the SIGTERM handler it replaces."""
    rows: list[BatchRow] = []
    ends = (lambda state: bool(rows) and bool(stop(rows[-1]))) if stop else (lambda state: False)
    session.train(out, _keep_sigterm(), ends, lambda report: rows.append(report.row))


@_public
def evaluate_agent(
    agent: Agent | Run | str | Path | None = None,
    episodes: int = 10,
    *,
    seed: int = 0,
    greedy: bool | None = None,
    workers: int | None = None,
    env_id: str | None = None,
    max_episode_steps: int | None = None,
    address: str | None = None,
    record: str | Path | None = None,
    record_episodes: int = 1,
    fps: float | None = None,
    record_scale: int | None = None,
    progress: Progress = True,
) -> Summary:
    """Play `episodes` matches against Pong's built-in player (whole unless
    `max_episode_steps` cuts them), as `pgpong play` does, and return their Summary
    (mean score, standard deviation, matches won, points). `agent`: an Agent, a Run,
    a run directory, a checkpoint or a W1/W2 .npz, or None for the shipped agent.
    Match k is seeded from (seed, k), so an evaluation repeats exactly, on any number
    of workers (0: this process, without Ray).
    `greedy` None takes the agent's own choice (sampled unless it was made greedy).
    `record` films the first `record_episodes` matches to .mp4 or .gif files (drawn
    `record_scale` times the screen's size: default 3 for MP4, 2 for GIF)."""
    from pgpong.agent import Agent
    from pgpong.cluster import ray_running
    from pgpong.console import LiveLine
    from pgpong.envs import check_env_id
    from pgpong.evaluate import MatchStatus, PlayOptions, evaluate, load_policy, match_line, record_matches
    from pgpong.pool import WorkerSettings, open_pool
    from pgpong.record import check_output, numbered
    from pgpong.session import where as pool_where

    PlayOptions(  # pgpong play's checks, before anything is played
        episodes=episodes,
        workers=workers,
        seed=seed,
        env_id=env_id,
        max_episode_steps=max_episode_steps,
        record=None if record is None else Path(record),
        record_episodes=record_episodes,
        fps=fps,
    ).validate()
    record_scale = whole(record_scale)
    check(
        record_scale is None or (is_int(record_scale) and 1 <= record_scale <= 8),
        f"record_scale must be a whole number from 1 to 8, got {record_scale!r}",
    )
    lines = _stream(progress)
    if record is not None:
        for k in range(record_episodes):  # every file that will be written: FILE, or FILE-1, FILE-2, ...
            check_output(numbered(_a_path(record, "record"), k, record_episodes))
    agent = agent.agent() if isinstance(agent, Run) else agent  # the weights it holds, as plot_weights draws
    if isinstance(agent, Agent):
        weights, source, trained_on = agent.weights, agent.source, agent.env_id
        greedy = agent.greedy if greedy is None else greedy
    else:
        policy = load_policy(_path(agent, "agent", "an Agent, a Run, a path or None"))
        weights, source, trained_on = policy.weights, policy.source, policy.env_id
    greedy = bool(greedy)
    env_id = env_id or trained_on or "ALE/Pong-v5"
    check_env_id(env_id)
    pool = None
    ray_was_up = ray_running()
    try:
        restore = _keep_sigterm()
        pool = open_pool(WorkerSettings(env_id, max_episode_steps), workers, _address(address), at_most=episodes)
        restore()
        how = "greedy actions" if greedy else "sampled actions"
        _say(
            lines,
            f"pgpong: {episodes} match(es) of {env_id}, {source} (H={weights.hidden}), {how}, seed {seed}, "
            f"on {pool_where(pool)}",
        )
        status = MatchStatus(episodes)
        live = LiveLine(status.text, lines) if lines is not None else None

        def on_match(result) -> None:
            status.matches, status.steps = status.matches + 1, status.steps + result.steps
            if live is not None:
                live.print(match_line(result, episodes))
                live.refresh()

        with live or contextlib.nullcontext():
            summary = evaluate(pool, weights, episodes, seed, greedy, on_match=on_match)
        if record is not None:
            for message in record_matches(
                Path(record), record_episodes, weights, env_id, max_episode_steps, seed, greedy, fps, record_scale
            ):
                _say(lines, f"pgpong: {message}")
    finally:
        if pool is not None:
            pool.close()
        if not ray_was_up:
            from pgpong.cluster import stop_ray

            stop_ray()
    return replace(summary, env_id=env_id, policy=source, seed=seed, greedy=greedy)


@_public
def plot_learning_curve(
    *runs: Run | str | Path, x: str = "episodes", by: str = "run", output: str | Path | None = None
) -> Figure:
    """The learning curve of one or more runs, as `pgpong plot` draws it: the running
    reward, each batch's mean score with its min-max band, and env steps per second,
    against `x` ("episodes", "steps" or "hours"). by="setting": one study directory,
    each setting's median over its seeds. A matplotlib Figure (a notebook shows it);
    with `output`, also written to that PNG."""
    from pgpong.plot import X_AXES, runs_figure, save_figure, shown_inline, study_figure
    from pgpong.record import check_output

    check(len(runs) >= 1, "give at least one run directory")
    check(x in X_AXES, f"x must be one of {', '.join(X_AXES)}, got {x!r}")
    check(by in ("run", "setting"), f"by must be run or setting, got {by!r}")
    directories = [run.directory if isinstance(run, Run) else _a_path(run, "a run", "a Run or a path") for run in runs]
    if by == "setting":
        check(len(directories) == 1, "--by setting draws one study: give its directory (runs/studies/NAME)")
    png = _path(output, "output")
    if png is not None:
        check_output(png, (".png",))
    figure = study_figure(directories[0], x) if by == "setting" else runs_figure(directories, x)
    if png is not None:
        save_figure(figure, png)
    return shown_inline(figure)


@_public
def plot_weights(
    agent: Agent | Run | str | Path | None = None,
    *,
    units: int | None = None,
    title: str | None = None,
    output: str | Path | None = None,
    zoom: int = 2,
) -> Figure:
    """What each hidden unit looks at, as `pgpong weights` draws it: every unit's row
    of W1 as an 80x80 image (red: a paddle or ball pixel there raises the unit).
    `agent`: an Agent, a Run, a run directory, a checkpoint, a W1/W2 .npz, or None for
    the shipped agent; `units`: only the first N; `zoom`: screen pixels per weight.
    A matplotlib Figure; with `output`, also written to that PNG."""
    from pgpong.agent import Agent
    from pgpong.checkpoint import described
    from pgpong.evaluate import load_policy
    from pgpong.plot import save_figure, shown_inline, weights_figure
    from pgpong.record import check_output

    units, zoom = whole(units), whole(zoom)
    check(units is None or (is_int(units) and units >= 1), f"--units must be a whole number, at least 1, got {units!r}")
    check(is_int(zoom) and 1 <= zoom <= 8, f"zoom must be a whole number from 1 to 8, got {zoom!r}")
    png = _path(output, "output")
    if png is not None:
        check_output(png, (".png",))
    if isinstance(agent, Agent):
        weights, named = agent.weights, described(Path(agent.source))
    elif isinstance(agent, Run):
        weights, named = agent.weights, described(agent.checkpoint) if agent.checkpoint else agent.directory.name
    else:
        policy = load_policy(_path(agent, "agent", "an Agent, a Run, a path or None"))
        weights, named = policy.weights, described(Path(policy.source)) if agent is not None else "the shipped agent"
    hidden = weights.W1.shape[0]
    check(units is None or units <= hidden, f"--units must be at most the network's {hidden} hidden units, got {units}")
    figure = weights_figure(weights, title or named, units, zoom)
    if png is not None:
        save_figure(figure, png, dpi=100)
    return shown_inline(figure)


def _stream(progress: Progress) -> TextIO | None:
    if progress is True:
        return sys.stdout
    if progress is False or progress is None:
        return None
    check(callable(getattr(progress, "write", None)), f"progress must be True, False or a stream, got {progress!r}")
    return progress


def _say(out: TextIO | None, line: str) -> None:
    if out is not None:
        print(fitted(line, out), file=out, flush=True)


def _noter(out: TextIO | None) -> Callable[[str], None]:
    """Notes ("pgpong: note: ...") go to stderr, as the command line's, unless quiet."""
    return (lambda text: _say(sys.stderr, f"pgpong: note: {text}")) if out is not None else (lambda text: None)


def _path(value: str | Path | None, what: str, kinds: str = "a path") -> Path | None:
    return None if value is None else _a_path(value, what, kinds)


def _a_path(value: str | Path, what: str, kinds: str = "a path") -> Path:
    check(isinstance(value, str | os.PathLike), f"{what} must be {kinds}, got {value!r}")
    return Path(value)


def _address(address: str | None) -> str | None:
    check(address is None or isinstance(address, str), f"address must be HOST:PORT or None, got {address!r}")
    check(
        address is None or bool(address.strip()), "address is empty: give None for a local Ray instance, or HOST:PORT"
    )
    return address or os.environ.get("RAY_ADDRESS") or None


def _keep_sigterm() -> Callable[[], None]:
    """ray.init installs its own SIGTERM handler: the returned function puts back the
    one there is now (the command line's, which stops like Ctrl-C; a notebook's)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    before = signal.getsignal(signal.SIGTERM)
    if before is None:  # installed outside Python: nothing to put back
        return lambda: None

    def put_back() -> None:
        signal.signal(signal.SIGTERM, before)

    return put_back
