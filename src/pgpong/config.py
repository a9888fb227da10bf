"""Settings: every one with its default, a one-line meaning, how its flag reads and a
check, and config.json. TrainConfig is `pgpong train`'s (bench/options.py has `pgpong
bench`'s); the command line is built from them (add_flags), so a flag and its setting
cannot drift apart. The defaults of --lr and --decay-rate are the batch rule's
(schedule.py)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import numbers
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pgpong import schedule
from pgpong.errors import PgpongError
from pgpong.files import open_regular
from pgpong.placement import AUTO, MAX_WORKERS_PER_CPU
from pgpong.schedule import (
    RAMP_MATCHES,
    RULE_BATCH,
    RULE_DECAY_RATE,
    RULE_LEARNING_RATE,
    RULE_MIN_DECAY_RATE,
    batch_rule,
    rate_text,
)

# An RMSProp step moves each weight by about the learning rate: past 1 it is noise.
MAX_LEARNING_RATE = 1.0
MAX_BATCH = 8192  # the most matches an exact sum of gradients holds (pool/sums.py: 2**13 x 2**50 < 2**63)
MAX_HIDDEN = 4096  # the largest network pgpong trains or loads (W1 4096 x 6400 float64 is 210 MB)
# A step's advantage-weighted signal is of order 1 (standardised returns times y - p),
# dH/dlogit at most 0.224 in size: past a bonus of 10 the entropy is all that is learned.
MAX_ENTROPY_BONUS = 10.0
MAX_INIT_SCALE = 100.0


class ConfigError(PgpongError, ValueError):
    """A setting has a value pgpong cannot use; the message says which and why."""


def setting(
    default: Any,
    help: str,
    *,
    learning: bool = True,
    metavar: str = "N",
    shown: str | None = None,
    parse: Any = None,
    aliases: tuple[str, ...] = (),
) -> Any:
    """A setting and its flag. learning=True: it shapes what is learned, so a resumed
    run must keep it. `shown` is the default as --help says it (when None is not
    self-explanatory), `parse` turns the flag's text into the value (default: the
    type of the field), `aliases` are further flag names."""
    metadata = {"help": help, "learning": learning, "metavar": metavar, "shown": shown, "parse": parse}
    return field(default=default, metadata={**metadata, "aliases": aliases})


def int_list(text: str) -> tuple[int, ...]:
    """'1,10,60' -> (1, 10, 60), for list flags."""
    parts = [part.strip() for part in text.split(",") if part.strip()]
    try:
        return tuple(int(part) for part in parts)
    except ValueError:
        if all(part.lstrip("+-").isdigit() for part in parts):  # Python's int() stops at 4,300 digits
            longest = max(len(part) for part in parts)
            raise argparse.ArgumentTypeError(f"a number of {longest:,} digits is out of range") from None
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {text!r}") from None


PER_CPU_RANGE = f"must be {AUTO} or in [1, {MAX_WORKERS_PER_CPU:g}]"


def per_cpu_value(text: str) -> float | str:
    """--workers-per-cpu's value: auto, or a number (that validate checks)."""
    try:
        return AUTO if text.strip().lower() == AUTO else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{PER_CPU_RANGE}, got {text!r}") from None


def per_cpu_text(value: float | str) -> str:
    return value if isinstance(value, str) else f"{value:g}"


def per_cpu_valid(value: Any) -> bool:
    return value == AUTO or (is_number(value) and 1 <= value <= MAX_WORKERS_PER_CPU)


def address_text(text: str) -> str:
    """A cluster address flag's value: an empty one (an unset shell variable, say) is a
    mistake, not a wish for a local Ray instance."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            "an empty address (leave the flag out for a local Ray instance, or give the head's HOST:PORT)"
        )
    return text


@dataclass(frozen=True)
class TrainConfig:
    env_id: str = setting("ALE/Pong-v5", "Gymnasium id of the Atari Pong environment", metavar="ID")
    hidden: int = setting(200, "hidden units H of the policy network")
    batch_size: int = setting(10, "matches (episodes) per weight update; with --ramp-from, the size it grows to")
    ramp_from: int | None = setting(
        None,
        "start the batch at this many matches and grow it linearly to --batch-size over --ramp-matches "
        "matches, each update with the batch rule's lr and decay for its size",
        shown="no ramp",
    )
    ramp_matches: int = setting(RAMP_MATCHES, "with --ramp-from: the matches over which the batch grows")
    learning_rate: float = setting(
        None,
        "RMSProp learning rate; 1e-4 is the 2016 setting (about 10 times slower to learn, see docs/LEARNING.md)",
        metavar="RATE",
        aliases=("--lr",),
        shown=f"the batch rule: {rate_text(RULE_LEARNING_RATE)} up to batch {RULE_BATCH}, "
        f"x sqrt(batch/{RULE_BATCH}) above, to 2 significant digits",
    )
    warmup: str = setting(
        "off",
        "on: the rate of update t is lr x sqrt(1 - decay^t) (with --ramp-from, decay^t is the product of "
        "the decays so far), as if RMSProp's cache, which starts at zero and has gathered a weight of "
        "1 - decay^t, held its full weight: each early step then moves a weight by about lr instead of up to "
        "lr / sqrt(1 - decay); off: lr throughout, as in 2016",
        metavar="on|off",
    )
    entropy_bonus: float = setting(
        0.01,
        "beta: add beta x dH/dlogit = -beta p (1 - p) logit to every step's advantage-weighted signal, the "
        "gradient of beta x the policy's entropy H (nats), which pulls P(UP) back towards 0.5; 0: none, as in 2016",
        metavar="BETA",
    )
    w2_init_scale: float = setting(
        1.0,
        "multiply the initial W2 (N(0,1)/sqrt(H)) by this, e.g. 0.1 for a first policy at P(UP) nearer 0.5 on "
        "every input; 1: Xavier, as in 2016",
        metavar="S",
    )
    max_update_norm: float | None = setting(
        4.0,
        "clip each RMSProp update (W1 and W2 together) to this L2 norm; RMSProp's cache is not changed by it; "
        "0: none, as in 2016",
        metavar="NORM",
    )
    lag: int = setting(
        0,
        "1: play each batch with the weights from before the last update (one update stale), so that on Ray "
        "the next batch starts while this one's last matches finish; measured at batch 60, it needed 1.25-1.45 "
        "times the env steps (docs/SCALING.md); 0: none, as in 2016",
        metavar="0|1",
    )
    lag_share: float = setting(
        0.0,
        "without --lag: play the first S of each batch's matches (S x batch, to the nearest, a half to even) "
        "with the weights from before the last update, the rest with the newest, so that on a cluster the first "
        "start while the batch before ends (the model: batch 300 on 11x18 at S 0.5, 0.85 / 0.93 of the best "
        "whole-match schedule early / late in training, against 1.18 / 1.33 at 0; docs/SCALING.md); 0.5 is "
        "recommended for a batch of more than one wave of the cluster's workers, where it learned as 0 did on "
        "three seeds; 0: none, as in 2016; --lag 1 is S 1",
        metavar="S",
    )
    gamma: float = setting(0.99, "discount factor for rewards", metavar="GAMMA")
    decay_rate: float = setting(
        None,
        "RMSProp decay of the squared-gradient cache",
        metavar="RATE",
        shown=f"the batch rule: {RULE_DECAY_RATE:g} up to batch {RULE_BATCH}, "
        f"1 - {1 - RULE_DECAY_RATE:g} x batch/{RULE_BATCH} above (at least {RULE_MIN_DECAY_RATE:g})",
    )
    seed: int = setting(0, "seed of the run: episode k of batch i uses SeedSequence([seed, i, k])")
    max_episode_steps: int | None = setting(None, "cut episodes after this many agent steps", shown="full matches")
    iterations: int | None = setting(
        None, "stop after this many batches in all, counting resumed ones", learning=False, shown="no limit"
    )
    workers: int | None = setting(
        None,
        "rollout workers; 0 = play in this process, without Ray",
        learning=False,
        shown="the CPUs of the Ray cluster",
    )
    workers_per_cpu: float | str = setting(
        1.0,
        "rollout workers per CPU of each Ray node, 1-4 (250-350 MB each), or auto: above 1 the OS shares a node's "
        "cores among more workers, so that a batch larger than the CPUs starts all at once; auto takes just enough "
        "for that if 4 or fewer do, else 1 (the model: batch 300 on 11x18 in 0.8 of the time at 1; docs/SCALING.md)",
        learning=False,
        shown="1",
        metavar="N|auto",
        parse=per_cpu_value,
    )
    keep_checkpoints: int = setting(3, "how many of the newest checkpoints to keep", learning=False)
    checkpoint_every: float = setting(
        60.0,
        "write a checkpoint after the first batch that ends this many seconds after the last one (0: after every "
        "batch), and always at the end; a kill replays at most the batches since, to the same weights",
        learning=False,
        metavar="SECONDS",
    )

    def __post_init__(self) -> None:
        # What is not given follows the batch rule (a bad batch size is validate()'s to report).
        if self.learning_rate is None or self.decay_rate is None:
            usable = is_int(self.batch_size) and 1 <= self.batch_size <= MAX_BATCH  # (10**400 overflows the rule)
            lr, decay = batch_rule(self.batch_size) if usable else (0, 0)
            if self.learning_rate is None:
                object.__setattr__(self, "learning_rate", lr)
            if self.decay_rate is None:
                object.__setattr__(self, "decay_rate", decay)

    def validate(self) -> TrainConfig:
        """Return self, or raise ConfigError naming the first bad setting."""
        check(isinstance(self.env_id, str), f"--env-id must be a Gymnasium id such as ALE/Pong-v5, got {self.env_id!r}")
        check(self.env_id.strip() != "", "--env-id must not be empty")
        check(is_int(self.hidden) and self.hidden >= 1, f"--hidden must be at least 1, got {self.hidden!r}")
        check(
            is_int(self.batch_size) and 1 <= self.batch_size <= MAX_BATCH,
            f"--batch-size must be at least 1 and at most {MAX_BATCH}, got {self.batch_size!r}",
        )
        check(
            self.ramp_from is None or (is_int(self.ramp_from) and 1 <= self.ramp_from <= self.batch_size),
            f"--ramp-from must be at least 1 and at most --batch-size ({self.batch_size}), got {self.ramp_from!r}",
        )
        check(
            is_int(self.ramp_matches) and self.ramp_matches >= 1,
            f"--ramp-matches must be at least 1, got {self.ramp_matches!r}",
        )
        check(
            is_number(self.learning_rate) and 0 < self.learning_rate <= MAX_LEARNING_RATE,
            f"--learning-rate must be in (0, {MAX_LEARNING_RATE:g}] "
            f"(pgpong's default is {rate_text(RULE_LEARNING_RATE)} at batch {RULE_BATCH}), "
            f"got {self.learning_rate!r}",
        )
        check(
            is_int(self.hidden) and self.hidden <= MAX_HIDDEN,
            f"--hidden must be at most {MAX_HIDDEN}, got {self.hidden!r}",
        )
        check(self.warmup in ("on", "off"), f"--warmup must be on or off, got {self.warmup!r}")
        check(
            is_number(self.entropy_bonus) and 0 <= self.entropy_bonus <= MAX_ENTROPY_BONUS,
            f"--entropy-bonus must be in [0, {MAX_ENTROPY_BONUS:g}] (0: none), got {self.entropy_bonus!r}",
        )
        check(
            is_number(self.w2_init_scale) and 0 < self.w2_init_scale <= MAX_INIT_SCALE,
            f"--w2-init-scale must be in (0, {MAX_INIT_SCALE:g}] (1: Xavier), got {self.w2_init_scale!r}",
        )
        check(
            self.max_update_norm is None or (is_number(self.max_update_norm) and self.max_update_norm >= 0),
            f"--max-update-norm must be 0 (none) or positive, got {self.max_update_norm!r}",
        )
        check(self.lag in (0, 1) and is_int(self.lag), f"--lag must be 0 or 1, got {self.lag!r}")
        check(
            is_number(self.lag_share) and 0 <= self.lag_share <= 1,
            f"--lag-share must be in [0, 1], got {self.lag_share!r}",
        )
        check(
            not (self.lag and self.lag_share),
            "--lag-share is for runs without --lag (--lag 1 plays all of a batch behind)",
        )
        check(is_number(self.gamma) and 0 <= self.gamma <= 1, f"--gamma must be in [0, 1], got {self.gamma!r}")
        check(
            is_number(self.decay_rate) and 0 <= self.decay_rate < 1,
            f"--decay-rate must be in [0, 1), got {self.decay_rate!r}",
        )
        check(
            self.ramp_from is not None or self.ramp_matches == RAMP_MATCHES,
            f"--ramp-matches {self.ramp_matches} needs --ramp-from (the batch size the ramp starts at)",
        )
        ramp_error = schedule.ramp_error(self)
        check(ramp_error is None, str(ramp_error))
        check(is_int(self.seed) and 0 <= self.seed < 2**32, f"--seed must be in [0, 2**32), got {self.seed!r}")
        check(
            self.max_episode_steps is None or (is_int(self.max_episode_steps) and self.max_episode_steps >= 1),
            f"--max-episode-steps must be at least 1, got {self.max_episode_steps!r}",
        )
        check(
            self.iterations is None or (is_int(self.iterations) and self.iterations >= 1),
            f"--iterations must be at least 1 (leave it out for no limit), got {self.iterations!r}",
        )
        check(
            self.workers is None or (is_int(self.workers) and self.workers >= 0),
            f"--workers must be 0 or more, got {self.workers!r}",
        )
        check(per_cpu_valid(self.workers_per_cpu), f"--workers-per-cpu {PER_CPU_RANGE}, got {self.workers_per_cpu!r}")
        check(
            is_int(self.keep_checkpoints) and self.keep_checkpoints >= 1,
            f"--keep-checkpoints must be at least 1, got {self.keep_checkpoints!r}",
        )
        check(
            is_number(self.checkpoint_every) and self.checkpoint_every >= 0,
            f"--checkpoint-every must be 0 or more seconds, got {self.checkpoint_every!r}",
        )
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def lagged(self) -> bool:
        """Whether a batch plays matches with the weights from before the last update
        (--lag 1 or --lag-share): the state keeps those weights, and checkpoints them."""
        return bool(self.lag or self.lag_share)

    def stale_matches(self, size: int) -> int:
        """How many of a batch's `size` matches, the first ones, play the weights from
        before the last update: all with --lag 1, the --lag-share of them (to the
        nearest, a half to even), or none."""
        return size if self.lag else round(self.lag_share * size)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def learning_differences(self, other: TrainConfig) -> list[str]:
        """Names of learning settings whose values differ between self and other."""
        return [
            f.name
            for f in dataclasses.fields(self)
            if f.metadata.get("learning") and getattr(self, f.name) != getattr(other, f.name)
        ]


def settings(cls: type = TrainConfig) -> list[dataclasses.Field]:
    """The fields of a settings class, in order, for building the command line."""
    return list(dataclasses.fields(cls))


def shown_default(f: dataclasses.Field) -> str:
    """A setting's default as --help and the README say it."""
    if f.metadata.get("shown"):
        return f.metadata["shown"]
    return ",".join(map(str, f.default)) if isinstance(f.default, tuple) else str(f.default)


def add_flags(parser: argparse.ArgumentParser, cls: type) -> None:
    """One flag per setting of `cls`, each defaulting to None: what the user did not
    give stays the setting's own default (or, on resume, the run's)."""
    kinds = {"str": str, "float": float}
    for f in settings(cls):
        kind = str(f.type).split(" ")[0]
        parser.add_argument(
            "--" + f.name.replace("_", "-"),
            *f.metadata["aliases"],
            dest=f.name,
            type=f.metadata["parse"] or kinds.get(kind, int),
            default=None,
            metavar=f.metadata["metavar"],
            help=f"{f.metadata['help']} (default: {shown_default(f)})",
        )


def given(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The settings of `cls` that the command line gave."""
    return {f.name: getattr(args, f.name) for f in settings(cls) if getattr(args, f.name, None) is not None}


MAX_CONFIG_BYTES = 1 << 20


def save_config(config: TrainConfig, path: Path, extra: dict[str, Any] | None = None) -> None:
    """Write config.json atomically. A new run records how it was made (`extra`: time,
    command, Ray address, versions); a resumed one keeps that and appends `extra` to
    its "resumes" list."""
    data: dict[str, Any] = {"config": config.to_dict(), **(extra or {})}
    if path.exists():
        first = _read_json(path)
        data = {**first, "config": config.to_dict(), "resumes": [*first.get("resumes", []), extra or {}]}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


# What a run made before a setting existed trained with: 2016's maths (its config.json
# and checkpoints lack the setting). The defaults changed since (2026-11-25: the entropy
# bonus and the update clipping are on), so a missing setting means this, not the default.
BEFORE_THEY_EXISTED: dict[str, Any] = {
    "warmup": "off",
    "entropy_bonus": 0.0,
    "w2_init_scale": 1.0,
    "max_update_norm": None,
    "lag": 0,
    "lag_share": 0.0,
}
# Karpathy's 2016 algorithm with the Ray example's constants: `pgpong train --as-in-2016`.
AS_IN_2016: dict[str, Any] = {"learning_rate": 1e-4, "entropy_bonus": 0.0, "max_update_norm": 0.0}


def load_config(path: Path) -> TrainConfig:
    data = _read_json(path)
    try:
        if not isinstance(data.get("config"), dict):
            raise ValueError('no "config" object')
        return TrainConfig.from_dict({**BEFORE_THEY_EXISTED, **data["config"]}).validate()
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        with open_regular(path) as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_CONFIG_BYTES:
                raise ValueError(f"{size / 2**20:.0f} MB is too large for a config.json")
            data = json.loads(f.read())
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        if not isinstance(data.get("resumes", []), list):
            raise ValueError('"resumes" is not a list')
        return data
    except (OSError, ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None


def check(ok: bool, message: str) -> None:
    """Raise ConfigError(message) unless ok."""
    if not ok:
        raise ConfigError(message)


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def whole(value: Any) -> Any:
    """A numpy integer as a Python int (what is_int accepts); anything else as it is."""
    return int(value) if isinstance(value, numbers.Integral) and not isinstance(value, bool) else value


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
