"""A study's plan: the grid of settings, the seeds, the stops, and the trials they
make, each an ordinary pgpong run directory under runs/studies/NAME/trials/.

The plan is checked whole before anything runs (every trial's settings through
TrainConfig's own checks) and kept in NAME/study.json, so that running the same
command again continues the same trials, and a different grid under that name is
refused instead of mixed in."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import re
from pathlib import Path
from typing import Any

from pgpong.config import ConfigError, TrainConfig, check, settings

STUDIES = Path("runs") / "studies"
NOT_VARIED = {
    "seed": "use --seeds",
    "workers": "use --workers-per-trial",
}
SUFFIXES = {"k": 10**3, "m": 10**6, "g": 10**9}


def setting_names() -> dict[str, dataclasses.Field]:
    """Every name a --grid or --set key may use: a train flag without its dashes
    (batch-size), its field name (batch_size) or an alias (lr)."""
    names: dict[str, dataclasses.Field] = {}
    for f in settings(TrainConfig):
        names[f.name] = f
        names[f.name.replace("_", "-")] = f
        for alias in f.metadata["aliases"]:
            names[alias.lstrip("-")] = f
    return names


def flag(name: str) -> str:
    """A field's name as its flag reads, without dashes: batch_size -> batch-size."""
    return name.replace("_", "-")


def short(name: str) -> str:
    """A field's shortest flag, for labels and directory names: learning_rate -> lr."""
    f = {f.name: f for f in settings(TrainConfig)}.get(name)
    names = [flag(name), *(a.lstrip("-") for a in (f.metadata["aliases"] if f else ()))]
    return min(names, key=len)


def parse_value(f: dataclasses.Field, text: str) -> Any:
    """The text of one value, read as the setting's type (what `pgpong train` would)."""
    kind = str(f.type).split(" ")[0]
    text = text.strip()
    try:
        if kind == "str":
            check(text != "", f"--grid/--set {flag(f.name)}: a value is empty")
            return text
        if kind == "float":
            value = float(text)
            check(math.isfinite(value), f"--grid/--set {flag(f.name)}: {text!r} is not a finite number")
            return value
        return int(count(text))
    except ValueError:
        what = "a number" if kind == "float" else "a whole number"
        raise ConfigError(f"--grid/--set {flag(f.name)}: {text!r} is not {what}") from None


def count(text: str) -> int:
    """'20M' -> 20_000_000, '500k' -> 500_000, '3000' -> 3000."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)\s*", text)
    if not match:
        raise ValueError(text)
    value = float(match.group(1)) * SUFFIXES.get(match.group(2).lower(), 1)
    if value != int(value):
        raise ValueError(text)
    return int(value)


def parse_assignment(text: str, option: str) -> tuple[str, list[str]]:
    """'lr=1e-3,3e-3' -> ('learning_rate', ['1e-3', '3e-3'])."""
    key, sep, values = text.partition("=")
    check(bool(sep) and key.strip() != "", f"{option} takes NAME=VALUE[,VALUE...], got {text!r}")
    names = setting_names()
    key = key.strip().lstrip("-")
    if key not in names:
        known = ", ".join(sorted(flag(f.name) for f in settings(TrainConfig)))
        raise ConfigError(f"{option} {key}: no such setting of pgpong train (settings: {known})")
    field_name = names[key].name
    if field_name in NOT_VARIED:
        raise ConfigError(f"{option} {key}: {NOT_VARIED[field_name]} instead")
    parts = [part for part in values.split(",")]
    check(
        bool(values.strip()) and all(part.strip() for part in parts),
        f"{option} {key}: give one or more values separated by commas, got {values!r}",
    )
    return field_name, parts


@dataclasses.dataclass(frozen=True)
class Stops:
    """When a trial ends: the first of these to hold (checked after every batch)."""

    running_reward: float | None = None
    env_steps: int | None = None
    matches: int | None = None
    minutes: float | None = None

    def validate(self) -> Stops:
        check(
            any(v is not None for v in dataclasses.asdict(self).values()),
            "a study needs a stop: --until running_reward=R, --max-env-steps N, --max-matches N or --max-minutes M",
        )
        if self.running_reward is not None:
            check(
                -21 <= self.running_reward <= 21,
                f"--until running_reward must be in [-21, 21], got {self.running_reward}",
            )
        for name in ("env_steps", "matches"):
            value = getattr(self, name)
            check(value is None or value >= 1, f"--max-{flag(name)} must be at least 1, got {value}")
        check(self.minutes is None or self.minutes > 0, f"--max-minutes must be positive, got {self.minutes}")
        return self

    def reached(self, running_reward: float | None, env_steps: int, matches: int, wall_s: float) -> str | None:
        """Why a trial at these totals is done, or None if it is not."""
        if self.running_reward is not None and running_reward is not None and running_reward >= self.running_reward:
            return f"running reward {running_reward:+.2f} >= {self.running_reward:+g}"
        if self.env_steps is not None and env_steps >= self.env_steps:
            return f"{env_steps:,} env steps"
        if self.matches is not None and matches >= self.matches:
            return f"{matches:,} matches"
        if self.minutes is not None and wall_s >= 60 * self.minutes:
            return f"{wall_s / 60:.1f} minutes"
        return None

    @staticmethod
    def parse_until(text: str) -> float:
        key, sep, value = text.partition("=")
        check(
            sep == "=" and key.strip() in ("running_reward", "running-reward"),
            f"--until takes running_reward=R (e.g. running_reward=0), got {text!r}",
        )
        try:
            return float(value)
        except ValueError:
            raise ConfigError(f"--until running_reward: {value!r} is not a number") from None


@dataclasses.dataclass(frozen=True)
class Trial:
    """One run of the study: a setting (the grid's values) and a seed."""

    setting: tuple[tuple[str, Any], ...]  # (field name, value), in the grid's order
    seed: int
    directory: Path
    settings: dict[str, Any]  # what `pgpong train` is given for it (fixed, setting, seed, workers)

    @property
    def setting_label(self) -> str:
        return setting_label(self.setting)

    @property
    def label(self) -> str:
        return f"{self.setting_label} seed={self.seed}".strip()


def setting_label(setting: tuple[tuple[str, Any], ...] | list) -> str:
    return " ".join(f"{short(name)}={_text(value)}" for name, value in setting) or "(the defaults)"


def _text(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _dir_part(name: str, value: Any) -> str:
    return f"{short(name)}={_text(value)}".replace("/", "-").replace(" ", "_")


@dataclasses.dataclass
class Study:
    """A grid of settings x seeds under runs/studies/NAME/."""

    name: str
    root: Path
    grid: dict[str, list[Any]]
    fixed: dict[str, Any]
    seeds: list[int]
    stops: Stops = Stops()
    workers_per_trial: int = 0

    @property
    def directory(self) -> Path:
        return self.root / self.name

    @property
    def plan_path(self) -> Path:
        return self.directory / "study.json"

    def settings_grid(self) -> list[tuple[tuple[str, Any], ...]]:
        names = list(self.grid)
        return [tuple(zip(names, values, strict=True)) for values in itertools.product(*self.grid.values())]

    def trials(self) -> list[Trial]:
        found = []
        for setting in self.settings_grid():
            for seed in self.seeds:
                parts = [_dir_part(n, v) for n, v in setting] + [f"seed={seed}"]
                given = {**self.fixed, **dict(setting), "seed": seed, "workers": self.workers_per_trial}
                found.append(Trial(setting, seed, self.directory / "trials" / "__".join(parts), given))
        return found

    def definition(self) -> dict[str, Any]:
        """What makes the study what it is: a rerun must give the same."""
        return {"grid": self.grid, "fixed": self.fixed, "seeds": self.seeds}

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            **self.definition(),
            "stops": dataclasses.asdict(self.stops),
            "workers_per_trial": self.workers_per_trial,
        }

    def validate(self) -> Study:
        check(
            bool(self.name)
            and self.name not in (".", "..")
            and re.fullmatch(r"[A-Za-z0-9._-]+", self.name) is not None,
            f"a study's name is one word of letters, digits, '.', '_' or '-' (no path separator), got {self.name!r}",
        )
        check(bool(self.seeds), "--seeds needs at least one seed")
        check(len(set(self.seeds)) == len(self.seeds), f"--seeds has a seed twice: {self.seeds}")
        for name, values in self.grid.items():
            check(bool(values), f"--grid {flag(name)} has no values")
            check(len(set(values)) == len(values), f"--grid {flag(name)} has a value twice: {values}")
        both = set(self.grid) & set(self.fixed)
        check(not both, f"{', '.join(map(flag, both))} is both in --grid and in --set")
        check(
            isinstance(self.workers_per_trial, int) and self.workers_per_trial >= 0,
            f"--workers-per-trial must be 0 or more, got {self.workers_per_trial}",
        )
        self.stops.validate()
        for trial in self.trials():
            try:
                TrainConfig(**trial.settings).validate()
            except ConfigError as exc:
                raise ConfigError(f"trial {trial.label}: {exc}") from None
        return self

    def save(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.plan_path.with_name("study.json.tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        tmp.replace(self.plan_path)

    def check_same_as_saved(self) -> None:
        """Refuse a different grid, set of fixed settings or seeds under a name in use."""
        saved = load_study(self.root, self.name)
        if saved is None:
            return
        mine, theirs = self.definition(), saved.definition()
        if json.loads(json.dumps(mine)) != json.loads(json.dumps(theirs)):
            differ = ", ".join(k for k in mine if json.dumps(mine[k]) != json.dumps(theirs[k]))
            raise ConfigError(
                f"study {self.name} in {self.directory} was made with another {differ} "
                f"({describe(saved)}); give the same flags to continue it, or another name"
            )


def check_trials_as_made(study: Study) -> None:
    """Refuse to continue a trial whose run was made with other learning settings than
    the study's flags give it now (the batch rule's defaults changed since, or a --set
    differs): its rows would mix two settings, and the resume would be refused anyway."""
    from pgpong.config import load_config

    for trial in study.trials():
        config_file = trial.directory / "config.json"
        if not config_file.exists():
            continue
        made, now = load_config(config_file), TrainConfig(**trial.settings)
        changed = made.learning_differences(now)
        if changed:
            was = " ".join(f"--set {flag(n)}={_text(getattr(made, n))}" for n in changed)
            raise ConfigError(
                f"trial {trial.label} was made with other settings ("
                + ", ".join(f"{flag(n)} {_text(getattr(made, n))}, now {_text(getattr(now, n))}" for n in changed)
                + f"); give {was} to continue the study as it was made, or use another name"
            )


def describe(study: Study) -> str:
    grid = " ".join(f"--grid {short(n)}={','.join(_text(v) for v in vs)}" for n, vs in study.grid.items())
    fixed = " ".join(f"--set {short(n)}={_text(v)}" for n, v in study.fixed.items())
    seeds = "--seeds " + ",".join(map(str, study.seeds))
    return " ".join(part for part in (grid, fixed, seeds) if part)


def load_study(root: Path, name: str) -> Study | None:
    """The study saved under root/name, or None if there is none."""
    path = root / name / "study.json"
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        return Study(
            name=data["name"],
            root=root,
            grid={k: list(v) for k, v in data["grid"].items()},
            fixed=dict(data["fixed"]),
            seeds=[int(s) for s in data["seeds"]],
            stops=Stops(**data.get("stops", {})),
            workers_per_trial=int(data.get("workers_per_trial", 0)),
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None


def build(
    name: str,
    grid: list[str],
    fixed: list[str],
    seeds: list[int],
    stops: Stops,
    workers_per_trial: int = 0,
    root: Path = STUDIES,
) -> Study:
    """A study from the command line's --grid and --set texts, checked whole."""
    names = setting_names()
    parsed_grid: dict[str, list[Any]] = {}
    for text in grid:
        key, values = parse_assignment(text, "--grid")
        check(key not in parsed_grid, f"--grid {flag(key)} is given twice")
        parsed_grid[key] = [parse_value(names[key], v) for v in values]
    parsed_fixed: dict[str, Any] = {}
    for text in fixed:
        key, values = parse_assignment(text, "--set")
        check(len(values) == 1, f"--set {flag(key)} takes one value (to try several, use --grid)")
        parsed_fixed[key] = parse_value(names[key], values[0])
    return Study(name, root, parsed_grid, parsed_fixed, list(seeds), stops, workers_per_trial).validate()
