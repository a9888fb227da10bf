"""Pictures of a run: learning curves from progress.csv, and what the hidden units of
W1 look at. Each is made as a matplotlib Figure first (no pyplot, so no backend and no
display: a notebook shows the figure it is handed), then written to a PNG atomically."""

from __future__ import annotations

import contextlib
import csv
import math
import os
import sys
from pathlib import Path
from shlex import quote
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from pgpong.errors import PgpongError
from pgpong.files import missing, open_regular
from pgpong.frames import SIDE
from pgpong.policy import Params
from pgpong.runlog import COUNTED, MAX_VALUE

if TYPE_CHECKING:
    from matplotlib.figure import Figure

X_AXES = {
    "episodes": ("episodes", "episodes played", 1.0),
    "steps": ("env_steps", "env steps (millions)", 1e-6),
    "hours": ("wall_s", "training wall time (hours)", 1 / 3600),
}
NEEDED = (
    "batch",
    "episodes",
    "env_steps",
    "wall_s",
    "running_reward",
    "score_mean",
    "score_min",
    "score_max",
    "steps_per_s",
)
MAX_PROGRESS_BYTES = 512 * 2**20
# (a value past MAX_VALUE, inf or nan is damage, and matplotlib's axes overflow on it)
NOT_NEGATIVE = (*COUNTED, "steps_per_s")
MAX_BANDS = 3  # runs drawn with their batch scores; more get the running reward only


class PlotError(PgpongError, ValueError):
    """A run cannot be drawn (no progress.csv, unreadable rows) or the picture not written."""


class NothingYet(PlotError):
    """A progress.csv with its header and no finished batch yet."""


def check_inputs(paths: list[Path], by: str = "run") -> None:
    """Refuse, before the output is looked at, a run (or study) that is not there."""
    for path in paths:
        if by == "run":
            progress_file(path)
        elif not _exists(path):
            raise PlotError(missing(path, "no such study directory"))


def progress_file(run_dir: Path) -> Path:
    """RUN_DIR/progress.csv, or run_dir itself when it is a file; PlotError when there is none."""
    if not _exists(run_dir):
        raise PlotError(missing(run_dir, "no such run directory or file"))
    path = run_dir / "progress.csv" if run_dir.is_dir() else run_dir
    if not _exists(path):
        if _exists(run_dir / "study.json"):
            raise PlotError(
                f"{run_dir}: a study, not a run; draw it with: pgpong plot --by setting {quote(str(run_dir))}"
            )
        raise PlotError(f"{run_dir}: no progress.csv (is it a pgpong run directory?)")
    return path


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError as exc:  # a directory above that cannot be searched
        raise PlotError(f"{path}: cannot read ({exc.strerror or exc})") from None


def read_curve(run_dir: Path) -> dict[str, np.ndarray]:
    """The columns of RUN_DIR/progress.csv that the plot draws, as float arrays."""
    path = progress_file(run_dir)
    columns: dict[str, list[float]] = {name: [] for name in NEEDED}
    try:
        with _open_regular_file(path) as f:
            reader = csv.DictReader(f)
            missing = [n for n in NEEDED if n not in (reader.fieldnames or [])]
            if missing:
                raise PlotError(f"{path}: not a pgpong progress.csv (no column {', '.join(missing)})")
            for line, row in enumerate(reader, start=2):
                try:
                    values = [float(row[name]) for name in NEEDED]
                except (TypeError, ValueError):
                    if line > 2 and f.read(1) == "":  # a last line cut short: drop it
                        break
                    raise PlotError(f"{path}: line {line} is not a row of numbers") from None
                if columns["batch"] and values[0] <= columns["batch"][-1]:
                    raise PlotError(
                        f"{path}: line {line} has batch {row['batch'].strip()} after batch {columns['batch'][-1]:g}, "
                        "where a run writes its batches in order; the file is damaged: correct or delete that line"
                    )
                for name, value in zip(NEEDED, values, strict=True):
                    if not (abs(value) <= MAX_VALUE and (value >= 0 or name not in NOT_NEGATIVE)):
                        raise PlotError(
                            f"{path}: line {line}, column {name}: {row[name].strip()} is not a value a run writes "
                            f"({'0' if name in NOT_NEGATIVE else f'-{MAX_VALUE:g}'} to {MAX_VALUE:g}); "
                            "the file is damaged: correct or delete that line"
                        )
                    columns[name].append(value)
    except UnicodeDecodeError as exc:
        raise PlotError(f"{path}: not a pgpong progress.csv (not UTF-8 text: byte {exc.start} is bad)") from None
    except (OSError, csv.Error) as exc:
        raise PlotError(f"{path}: cannot read ({getattr(exc, 'strerror', None) or exc})") from None
    if not columns["batch"]:
        raise NothingYet(f"{path}: no batch finished yet, nothing to draw")
    return {name: np.array(values) for name, values in columns.items()}


def _open_regular_file(path: Path) -> IO[Any]:
    """`path` opened as text (files.open_regular: OSError for a pipe or a folder), refused if too large."""
    f = open_regular(path)
    size = os.fstat(f.fileno()).st_size
    if size > MAX_PROGRESS_BYTES:
        f.close()
        raise PlotError(f"{path}: {size / 2**20:.0f} MB is too large for a progress.csv")
    return f


def run_label(run_dir: Path) -> str:
    """A run's name in titles and legends: its directory (also for its own progress.csv),
    or another CSV file's name (seed2-past-5M.progress.csv: seed2-past-5M)."""
    if run_dir.name == "progress.csv":
        return run_label(run_dir.absolute().parent)
    if run_dir.suffix == ".csv":
        return run_dir.name.removesuffix(".csv").removesuffix(".progress")
    return run_dir.resolve().name or str(run_dir)


def plot_runs(run_dirs: list[Path], output: Path, x: str = "episodes") -> Path:
    """runs_figure, written to `output`."""
    return save_figure(runs_figure(run_dirs, x), output)


def runs_figure(run_dirs: list[Path], x: str = "episodes") -> Figure:
    """Running reward and each batch's mean score (min-max band) per run, and env
    steps per second below; the 0 line is the built-in player's level."""
    import matplotlib
    from matplotlib.figure import Figure

    curves = [(run_dir, read_curve(run_dir)) for run_dir in run_dirs]
    column, label, factor = X_AXES[x]
    fig = Figure(figsize=(10, 7.5), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[3, 1])
    colours = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, (run_dir, c) in enumerate(curves):
        colour = colours[k % len(colours)]
        xs = c[column] * factor
        name = run_label(run_dir)
        if len(curves) <= MAX_BANDS:  # with more runs the bands would hide the curves
            band = "batch score min-max" if len(curves) == 1 else None
            top.fill_between(xs, c["score_min"], c["score_max"], color=colour, alpha=0.12, linewidth=0, label=band)
            top.plot(
                xs,
                c["score_mean"],
                color=colour,
                alpha=0.35,
                linewidth=0.8,
                label="batch mean score" if len(curves) == 1 else None,
            )
        top.plot(
            xs,
            c["running_reward"],
            color=colour,
            linewidth=2.2,
            label=name if len(curves) > 1 else "running reward",
        )
        bottom.plot(xs, c["steps_per_s"], color=colour, linewidth=1, label=name)
    _score_axis(top, label_right=False)
    top.set_ylabel("score per match (points for - against)")
    top.grid(alpha=0.3)
    top.legend(loc="upper left", fontsize=9)
    if len(curves) == 1:
        title = run_label(curves[0][0])
    elif len(curves) <= MAX_BANDS:
        title = f"{len(curves)} runs: running reward (thick), batch mean and min-max (faint)"
    else:
        title = f"{len(curves)} runs: running reward"
    top.set_title(f"pgpong learning curve: {title}")
    bottom.set_ylabel("env steps / s")
    bottom.set_xlabel(label)
    bottom.set_ylim(bottom=0)
    bottom.grid(alpha=0.3)
    return fig


def setting_curves(study_dir: Path, x: str, points: int = 400) -> list[dict]:
    """Per setting of a study: x on a common grid, and the median, min and max running
    reward over the seeds whose run has reached that x, with where each seed ended. A
    seed that stopped because it reached the study's running reward keeps its last
    value beyond its end (it is done, not gone); any other seed that stopped early
    leaves the statistics there."""
    from pgpong.study.plan import load_study

    study = load_study(study_dir.parent, study_dir.name)
    if study is None:
        raise PlotError(f"{study_dir}: not a study (no study.json); --by setting draws a pgpong study's directory")
    column, _, factor = X_AXES[x]
    groups: dict[str, list] = {}
    for trial in study.trials():
        curves = groups.setdefault(trial.setting_label, [])
        if not _exists(trial.directory / "progress.csv"):
            continue  # a trial not begun
        with contextlib.suppress(NothingYet):  # a trial that has not played a batch yet; a damaged one is named
            curves.append(read_curve(trial.directory))
    found = []
    for label, curves in groups.items():
        curves = [c for c in curves if len(c["batch"])]
        if not curves:
            continue
        end = max(c[column][-1] for c in curves)
        grid = np.linspace(0, end, points)
        ys = np.full((len(curves), points), np.nan)
        goal = study.stops.running_reward
        for k, c in enumerate(curves):
            inside = (grid >= c[column][0]) & (grid <= c[column][-1])
            ys[k, inside] = np.interp(grid[inside], c[column], c["running_reward"])
            if goal is not None and c["running_reward"][-1] >= goal:
                ys[k, grid > c[column][-1]] = c["running_reward"][-1]
        covered = ~np.isnan(ys).all(axis=0)
        running = (~np.isnan(ys)).sum(axis=0)[covered]
        with np.errstate(all="ignore"):
            stats = {
                name: f(ys[:, covered], axis=0)
                for name, f in (("median", np.nanmedian), ("min", np.nanmin), ("max", np.nanmax))
            }
        found.append(
            {
                "setting": label,
                "seeds": len(curves),
                "x": grid[covered] * factor,
                "all_seeds": running == len(curves),
                **stats,
                "ends": [(c[column][-1] * factor, c["running_reward"][-1]) for c in curves],
            }
        )
    if not found:
        raise PlotError(f"{study_dir}: no trial has finished a batch yet, nothing to draw")
    return found


def plot_study(study_dir: Path, output: Path, x: str = "steps") -> Path:
    """study_figure, written to `output`."""
    return save_figure(study_figure(study_dir, x), output)


def study_figure(study_dir: Path, x: str = "steps") -> Figure:
    """Each setting's median running reward over its seeds, with a min-max band."""
    import matplotlib
    from matplotlib.figure import Figure

    curves = setting_curves(study_dir, x)
    _, label, _ = X_AXES[x]
    fig = Figure(figsize=(10, 6), layout="constrained")
    ax = fig.subplots()
    colours = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, c in enumerate(curves):
        colour = colours[k % len(colours)]
        ax.fill_between(c["x"], c["min"], c["max"], color=colour, alpha=0.18, linewidth=0)
        full = np.where(c["all_seeds"], c["median"], np.nan)
        ax.plot(
            c["x"],
            full,
            color=colour,
            linewidth=2.2,
            label=f"{c['setting']} ({c['seeds']} seed{'s' if c['seeds'] != 1 else ''})",
        )
        fewer = np.where(~c["all_seeds"], c["median"], np.nan)
        ax.plot(c["x"], fewer, color=colour, linewidth=1.2, linestyle=":")
        ends = np.array(c["ends"])
        ax.plot(ends[:, 0], ends[:, 1], linestyle="none", marker="o", markersize=4, color=colour)
    _score_axis(ax, label_right=True)
    ax.set_xlim(left=0)
    ax.set_xlabel(label)
    ax.set_ylabel("running reward (points for - against)")
    ax.grid(alpha=0.3)
    ax.legend(
        loc="upper left",
        fontsize=9,
        title_fontsize=9,
        title="median over seeds (dotted: over the seeds that ran that far;\na seed that reached the goal keeps its "
        "last value), band: min-max,\ndot: where a seed ended",
    )
    ax.set_title(f"pgpong study {study_dir.name}: running reward by setting")
    return fig


def plot_weights(weights: Params, output: Path, title: str, units: int | None = None, zoom: int = 2) -> Path:
    """weights_figure, written to `output`."""
    return save_figure(weights_figure(weights, title, units, zoom), output, dpi=100)


def weights_figure(weights: Params, title: str, units: int | None = None, zoom: int = 2) -> Figure:
    """Every hidden unit's row of W1 as an 80x80 image, in a grid, one diverging colour
    map centred on 0. Each unit is scaled by the 99th percentile of its |weights| (a
    few large weights would otherwise wash out the rest), drawn `zoom` pixels a weight."""
    import matplotlib
    from matplotlib.figure import Figure

    W1 = np.asarray(weights.W1, dtype=np.float32)[:units]
    hidden = W1.shape[0]
    columns = min(20 if hidden > 60 else 10, hidden)
    rows = math.ceil(hidden / columns)
    gap = 3
    cell = SIDE + gap
    mosaic = np.full((rows * cell - gap, columns * cell - gap), np.nan, dtype=np.float32)
    scale = np.percentile(np.abs(W1), 99, axis=1)
    scale[scale == 0] = 1
    for unit in range(hidden):
        r, c = divmod(unit, columns)
        mosaic[r * cell : r * cell + SIDE, c * cell : c * cell + SIDE] = (W1[unit] / scale[unit]).reshape(SIDE, SIDE)
    dpi = 100
    width_in = mosaic.shape[1] * zoom / dpi  # the mosaic is drawn at exactly `zoom` pixels a weight
    height_in = mosaic.shape[0] * zoom / dpi
    fig = Figure(figsize=(width_in + 1.6, height_in + 1.0), dpi=dpi)
    ax = fig.add_axes(
        (0.2 / (width_in + 1.6), 0.2 / (height_in + 1.0), width_in / (width_in + 1.6), height_in / (height_in + 1.0))
    )
    cmap = matplotlib.colormaps["RdBu_r"].with_extremes(bad="#808080")  # the gaps between units (NaN): grey
    image = ax.imshow(mosaic, cmap=cmap, vmin=-1, vmax=1, interpolation="nearest", aspect="equal")
    ax.set_axis_off()
    shown = f"each of the {hidden} hidden units" if units is None else f"the first {hidden} hidden units"
    fig.suptitle(
        f"{title}: the W1 weights of {shown} over the 80x80 input\n"
        "red: a paddle or ball pixel there raises the unit, blue: lowers it",
        x=0.2 / (width_in + 1.6),
        ha="left",
        y=1 - 0.1 / (height_in + 1.0),
        fontsize=14 if hidden > 60 else 11,
    )
    bar_ax = fig.add_axes(((width_in + 0.35) / (width_in + 1.6), 0.25, 0.25 / (width_in + 1.6), 0.5))
    bar = fig.colorbar(image, cax=bar_ax)
    bar.set_label("weight / the unit's 99th percentile |weight|", fontsize=11)
    return fig


def _score_axis(ax, label_right: bool) -> None:
    """A score axis from -21 to 21 with the built-in player's level (0) marked, its
    label at the left above the line or at the right below it."""
    ax.axhline(0, color="black", linestyle="--", linewidth=1)
    text = "as good as the built-in player (0) " if label_right else " as good as the built-in player (0)"
    x, y, ha, va = (0.995, -0.3, "right", "top") if label_right else (0.005, 0.5, "left", "bottom")
    ax.text(x, y, text, transform=ax.get_yaxis_transform(), ha=ha, va=va, fontsize=9)
    ax.set_ylim(-21.5, 21.5)
    ax.set_yticks(range(-20, 21, 5))


def save_figure(fig: Figure, output: Path, dpi: int = 100) -> Path:
    """Write `fig` to the PNG `output` atomically (a temporary file, then a rename)."""
    tmp = output.with_name(f".{output.stem}.{os.getpid()}.tmp.png")
    try:
        fig.savefig(tmp, format="png", dpi=dpi)
        os.replace(tmp, output)
    except OSError as exc:
        raise PlotError(f"{output}: cannot write ({exc.strerror or exc})") from None
    finally:
        tmp.unlink(missing_ok=True)
    return output


def shown_inline(figure: Figure) -> Figure:
    """In a Jupyter kernel, make sure that a Figure returned to a cell is drawn as a
    PNG (matplotlib's inline backend registers that only once pyplot has drawn)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is not None and hasattr(shell, "kernel"):
        from matplotlib.figure import Figure

        png = shell.display_formatter.formatters["image/png"]
        try:
            png.lookup_by_type(Figure)
        except KeyError:
            from IPython.core.pylabtools import print_figure

            png.for_type(Figure, lambda fig: print_figure(fig, "png", bbox_inches="tight"))
    return figure
