"""A study's results, read from its run directories alone (study.json and each
trial's progress.csv; Tune's files are not needed): for each setting and each
running-reward threshold, how many seeds reached it and the matches, env steps and
minutes they took, as median and range over those seeds; with five seeds or more
that reached it, also the interquartile mean (IQM) of the env steps and a
bootstrap 95% interval of it, as rliable reports Atari results."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from pgpong.config import ConfigError
from pgpong.runlog import read_progress
from pgpong.study.plan import Study, Trial

THRESHOLDS = (-10.0, 0.0, 10.0)
IQM_FROM = 5  # seeds that reached a threshold before the IQM and its interval are given
BOOTSTRAP_RESAMPLES = 2000


def curve(directory: Path) -> list[dict[str, float]]:
    """A trial's complete progress rows as numbers (none yet: an empty list)."""
    rows = []
    found = progress(directory)
    for line, row in enumerate(found, start=2):
        try:
            numbers = {k: float(row[k]) for k in ("batch", "episodes", "env_steps", "wall_s", "running_reward")}
            whole = None not in row.values() and all(map(math.isfinite, numbers.values()))
        except (TypeError, ValueError, KeyError):
            whole = False
        if whole:
            rows.append(numbers)
        elif line - 1 < len(found):  # (the last row may be cut short by a kill: the trial replays it)
            raise ConfigError(
                f"{directory / 'progress.csv'}: line {line} is not a row pgpong writes; "
                "the file is damaged: correct or delete that line"
            )
    return rows


def progress(directory: Path) -> list[dict[str, str]]:
    """The rows of a trial's progress.csv (none yet: an empty list); one that cannot be
    read (binary, a directory, a pipe) is named, not a traceback or a wait."""
    path = directory / "progress.csv"
    try:
        return read_progress(path)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ConfigError(
            f"cannot read {path}: {exc}; move the trial's directory {directory} away (the study trains it anew)"
        ) from None


def first_reach(rows: list[dict[str, float]], threshold: float) -> dict[str, float] | None:
    """Matches, env steps and minutes when the running reward first reached threshold."""
    for row in rows:
        if row["running_reward"] >= threshold:
            return {"matches": row["episodes"], "env_steps": row["env_steps"], "minutes": row["wall_s"] / 60}
    return None


def spread(values: list[float]) -> dict[str, Any]:
    """Median and range; with IQM_FROM values or more, the IQM and a bootstrap 95% interval."""
    if not values:
        return {}
    found: dict[str, Any] = {"median": float(np.median(values)), "min": min(values), "max": max(values)}
    if len(values) >= IQM_FROM:
        from scipy import stats

        iqm = lambda x, axis=-1: stats.trim_mean(x, 0.25, axis=axis)
        found["iqm"] = float(iqm(np.asarray(values)))
        interval = stats.bootstrap(
            (np.asarray(values),),
            iqm,
            confidence_level=0.95,
            n_resamples=BOOTSTRAP_RESAMPLES,
            method="percentile",
            rng=np.random.default_rng(0),
        ).confidence_interval
        found["iqm_95"] = [float(interval.low), float(interval.high)]
    return found


def summarize(study: Study, thresholds: tuple[float, ...] = THRESHOLDS) -> dict[str, Any]:
    """The study's table as data: per setting, per threshold, what its seeds took."""
    by_setting: dict[str, list[Trial]] = {}
    for trial in study.trials():
        by_setting.setdefault(trial.setting_label, []).append(trial)
    settings = []
    for label, trials in by_setting.items():
        curves = {t.seed: curve(t.directory) for t in trials}
        rows: dict[str, Any] = {}
        for threshold in thresholds:
            reached = {seed: first_reach(c, threshold) for seed, c in curves.items()}
            hits = {seed: r for seed, r in reached.items() if r is not None}
            rows[f"{threshold:+g}"] = {
                "seeds_reached": sorted(hits),
                "seeds_run": sorted(s for s, c in curves.items() if c),
                **{what: spread([r[what] for r in hits.values()]) for what in ("matches", "env_steps", "minutes")},
            }
        ends = {seed: c[-1] for seed, c in curves.items() if c}
        settings.append(
            {
                "setting": label,
                "values": dict(trials[0].setting),
                "seeds": [t.seed for t in trials],
                "thresholds": rows,
                "at_the_end": {
                    str(seed): {
                        "running_reward": row["running_reward"],
                        "matches": row["episodes"],
                        "env_steps": row["env_steps"],
                    }
                    for seed, row in ends.items()
                },
            }
        )
    return {
        "study": study.name,
        "directory": str(study.directory),
        "thresholds": list(thresholds),
        "settings": settings,
    }


def _num(value: float, what: str) -> str:
    if what == "env_steps":
        return f"{value / 1e6:.1f}M" if value >= 1e5 else f"{value / 1e3:.1f}k"
    if what == "minutes":
        return f"{value:.0f}" if value >= 10 else f"{value:.1f}"
    return f"{value:,.0f}"


def _cell(found: dict[str, Any], what: str) -> str:
    if not found:
        return "-"
    median, low, high = (_num(found[k], what) for k in ("median", "min", "max"))
    return median if low == high else f"{median} ({low}-{high})"


def _seeds(row: dict[str, Any], seeds: list[int]) -> str:
    """Seeds that reached the threshold of all the setting's seeds: '3/5', or '1/3 (1 with
    no batch yet)' while some trials have not finished a batch (or not begun)."""
    reached, waiting = len(row["seeds_reached"]), len(seeds) - len(row["seeds_run"])
    return f"{reached}/{len(seeds)}" + (f" ({waiting} with no batch yet)" if waiting else "")


def markdown(summary: dict[str, Any]) -> str:
    """The table to paste into a README: median (range) over the seeds that reached
    each threshold; with IQM_FROM such seeds or more, the IQM of the env steps and
    its bootstrap 95% interval too."""
    with_iqm = any(
        "iqm" in row["env_steps"] for setting in summary["settings"] for row in setting["thresholds"].values()
    )
    head = ["setting", "running reward", "seeds reached", "matches", "env steps", "minutes"]
    if with_iqm:
        head.append("env steps IQM [95% CI]")
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(["---"] * 2 + ["---:"] * (len(head) - 2)) + " |"]
    for setting in summary["settings"]:
        for threshold, row in setting["thresholds"].items():
            cells = [
                setting["setting"],
                threshold,
                _seeds(row, setting["seeds"]),
                _cell(row["matches"], "matches"),
                _cell(row["env_steps"], "env_steps"),
                _cell(row["minutes"], "minutes"),
            ]
            if with_iqm:
                found = row["env_steps"]
                cells.append(
                    f"{_num(found['iqm'], 'env_steps')} [{_num(found['iqm_95'][0], 'env_steps')}-"
                    f"{_num(found['iqm_95'][1], 'env_steps')}]"
                    if "iqm" in found
                    else "-"
                )
            lines.append("| " + " | ".join(cells) + " |")
    ends = []
    for setting in summary["settings"]:
        for seed, end in setting["at_the_end"].items():
            ends.append(
                f"- {setting['setting']} seed={seed}: {end['running_reward']:+.2f} after "
                f"{end['matches']:,.0f} matches, {_num(end['env_steps'], 'env_steps')} env steps"
            )
    note = "Median (min-max) over the seeds that reached the running reward; minutes are the trial's own training time."
    return "\n".join([*lines, "", note, *(["", "Where each trial stands:", *ends] if ends else [])]) + "\n"


def write(summary: dict[str, Any], directory: Path) -> tuple[Path, Path]:
    """report.md and report.json in the study's directory."""
    md, js = directory / "report.md", directory / "report.json"
    for path, text in ((md, markdown(summary)), (js, json.dumps(summary, indent=2) + "\n")):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return md, js
