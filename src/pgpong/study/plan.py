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
import os
import re
import tempfile
from fractions import Fraction
from pathlib import Path
from typing import Any

from pgpong.config import ConfigError, TrainConfig, check, is_int, is_number, settings
from pgpong.files import open_regular

STUDIES = Path("runs") / "studies"
NOT_VARIED = {
    "seed": "use --seeds",
    "workers": "use --workers-per-trial",
    "workers_per_cpu": "a trial's workers hold a CPU each (--workers-per-trial says how many)",
}
SUFFIXES = {"k": 10**3, "m": 10**6, "g": 10**9}
# The largest stops: past these a trial would play for more than a year (a few thousand env steps a second).
MAX_ENV_STEPS = 100 * 10**9
MAX_MATCHES = 10**9
MAX_MINUTES = 60 * 24 * 365
MAX_PLAN_BYTES = 2**20  # a study.json is a few hundred bytes
MAX_TRIALS = 10_000  # settings x seeds: far more than a study runs, few enough to check each before it starts


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
        if kind != "float":
            return count(text)
        value = float(text)
    except ValueError:
        what = "a number" if kind == "float" else "a whole number"
        raise ConfigError(f"--grid/--set {flag(f.name)}: {text!r} is not {what}") from None
    check(math.isfinite(value), f"--grid/--set {flag(f.name)}: {text!r} is not a finite number")
    return value


def count(text: str) -> int:
    """'20M' -> 20_000_000, '500k' -> 500_000, '3000' -> 3000, '-1' -> -1 (the checks say what is wrong)."""
    match = re.fullmatch(r"\s*([-+]?\d+(?:\.\d+)?)\s*([kKmMgG]?)\s*", text)
    if not match:
        raise ValueError(text)
    value = Fraction(match.group(1)) * SUFFIXES.get(match.group(2).lower(), 1)  # exact, however long
    if value.denominator != 1:
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

    def validate(self, needed: bool = True) -> Stops:
        """Return self, or raise ConfigError naming the first bad stop (or, if needed, that none is given)."""
        check(
            not needed or any(v is not None for v in dataclasses.asdict(self).values()),
            "a study needs a stop: --until running_reward=R, --max-env-steps N, --max-matches N or --max-minutes M",
        )
        check(
            self.running_reward is None or (is_number(self.running_reward) and -21 <= self.running_reward <= 21),
            f"--until running_reward must be in [-21, 21], got {self.running_reward}",
        )
        for name, most in (("env_steps", MAX_ENV_STEPS), ("matches", MAX_MATCHES)):
            value = getattr(self, name)
            check(
                value is None or (is_int(value) and 1 <= value <= most),
                f"--max-{flag(name)} must be at least 1 and at most {most:,} (a year of play), got {value}",
            )
        check(
            self.minutes is None or (is_number(self.minutes) and 0 < self.minutes <= MAX_MINUTES),
            f"--max-minutes must be positive and at most {MAX_MINUTES:,} (a year), got {self.minutes}",
        )
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

    def validate(self, needs_stop: bool = True) -> Study:
        """Return self, or raise ConfigError naming the first bad part of the plan."""
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
            is_int(self.workers_per_trial) and self.workers_per_trial >= 0,
            f"--workers-per-trial must be 0 or more, got {self.workers_per_trial}",
        )
        self.stops.validate(needs_stop)
        count = math.prod(len(values) for values in self.grid.values()) * len(self.seeds)
        check(count <= MAX_TRIALS, f"the grid and seeds make {count:,} trials; a study has at most {MAX_TRIALS:,}")
        for trial in self.trials():
            try:
                TrainConfig(**trial.settings).validate()
            except ConfigError as exc:
                raise ConfigError(f"trial {trial.label}: {exc}") from None
        return self

    def check_environments(self) -> Study:
        """Refuse an environment id a trial could not make, as `pgpong train` would."""
        from pgpong.envs import UnknownEnvironment, check_env_id

        checked = set()
        for trial in self.trials():
            env_id = TrainConfig(**trial.settings).env_id
            if env_id not in checked:
                try:
                    check_env_id(env_id)
                except UnknownEnvironment as exc:
                    raise ConfigError(f"trial {trial.label}: {exc}") from None
                checked.add(env_id)
        return self

    def check_writable(self) -> None:
        """Refuse, before anything is written, a --root or study directory that cannot take the study."""
        places = [self.directory / "tune", *(t.directory for t in self.trials())]
        for path in (self.root, self.directory, self.directory / "trials", *places):
            check(
                not os.path.lexists(path) or path.is_dir(),
                f"{path} is in the way: it is not a directory; remove it or give --root another directory",
            )
        for path in {_nearest_existing(p) for p in places}:
            check(path.is_dir(), f"{path} is not a directory: give --root a directory")
            try:
                with tempfile.TemporaryFile(dir=path):  # as root, permission bits say nothing
                    pass
            except OSError as exc:
                raise ConfigError(
                    f"cannot write the study in {path}: {exc.strerror or exc}; give --root a directory you can write"
                ) from None

    def save(self) -> None:
        """study.json, whole or not at all."""
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


def _nearest_existing(path: Path) -> Path:
    """path, or its nearest ancestor that exists."""
    while not os.path.lexists(path) and path != path.parent:
        path = path.parent
    return path


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
    """The study saved under root/name, or None if there is none; checked whole, as
    build() checks one, so that a study.json that is not one is named at once."""
    path = root / name / "study.json"
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:  # a directory above that cannot be searched: not "no study"
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    if re.fullmatch(r"[A-Za-z0-9._-]+", name) is None or name in (".", ".."):  # `plot . --by setting`
        root, name = (root / name).resolve().parent, (root / name).resolve().name
    try:
        data = _object(json.loads(_read_plan(path)), "study.json")
        fields = {f.name: f for f in settings(TrainConfig)}
        study = Study(
            name=name,  # the directory's: a study copied under another name reads its own trials
            root=root,
            grid={
                k: [_typed(fields, k, v) for v in _list(vs, f"grid {k}")]
                for k, vs in _object(data["grid"], "grid").items()
            },
            fixed={k: _typed(fields, k, v) for k, v in _object(data["fixed"], "fixed").items()},
            seeds=_list(data["seeds"], "seeds"),
            stops=Stops(**_object(data.get("stops", {}), "stops")),
            workers_per_trial=data.get("workers_per_trial", 0),
        )
        return study.validate(needs_stop=False)
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        why = f"it has no {exc}" if isinstance(exc, KeyError) else exc
        raise ConfigError(f"cannot read {path}: {why}; fix it, or remove it and give the study's flags again") from None


def _read_plan(path: Path) -> str:
    """study.json's text; a pipe, a device or a file too large for a plan is refused unread."""
    with open_regular(path, binary=True) as f:
        data = f.read(MAX_PLAN_BYTES + 1)
    if len(data) > MAX_PLAN_BYTES:
        raise ValueError(f"it is larger than {MAX_PLAN_BYTES // 2**20} MB, too large for a study's plan")
    return data.decode("utf-8")


def _object(value: Any, what: str) -> dict[str, Any]:
    check(isinstance(value, dict), f"its {what} is not a JSON object")
    return value


def _list(value: Any, what: str) -> list[Any]:
    check(isinstance(value, list), f"its {what} is not a list")
    return value


def _typed(fields: dict[str, dataclasses.Field], name: str, value: Any) -> Any:
    """A setting's value as study.json gives it, if it is one parse_value could have made."""
    check(name in fields and name not in NOT_VARIED, f"{name!r} is not a setting a study varies or fixes")
    kind = str(fields[name].type).split(" ")[0]
    ok = isinstance(value, str) if kind == "str" else is_int(value) or (kind == "float" and is_number(value))
    check(ok, f"{flag(name)} {value!r} is not {'text' if kind == 'str' else 'a ' + kind}")
    return value


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
    study = Study(name, root, parsed_grid, parsed_fixed, list(seeds), stops, workers_per_trial)
    return study.validate().check_environments()
