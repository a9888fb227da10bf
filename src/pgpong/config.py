"""Settings: every one with its default, a one-line meaning, how its flag reads and a
check. TrainConfig is `pgpong train`'s, BenchOptions `pgpong bench`'s; the command
line is built from them (add_flags), so a flag and its setting cannot drift apart."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# An RMSProp step moves each weight by about the learning rate: past 1 it is noise.
MAX_LEARNING_RATE = 1.0
MAX_HIDDEN = 4096  # the largest network pgpong trains or loads (W1 4096 x 6400 float64 is 210 MB)


# The batch rule: what --lr and --decay-rate default to, by batch size. At batch 10 (and
# below) 2e-3 and 0.99: measured to reach running reward 0 on seeds 0, 1, 2 and 6 in
# 2.6M-4.4M env steps and on seed 5 in 8.7M, where 3e-3 took 5.5M-6.4M or was still at
# -5.9 and -7.2 after 7M, and 1.5e-3 was as fast or faster on four seeds but at -7.6
# after 7M on the fifth
# (README "Learning"). A batch
# k times bigger than 10 takes the learning rate times sqrt(k) and (1 - decay) times k:
# the square-root rule for adaptive optimisers of Malladi et al. 2022 ("On the SDEs and
# scaling rules for adaptive gradient algorithms"). Scaling (1 - decay) matters as much
# as the rate: RMSProp's cache starts at zero, so its first step is about
# lr / sqrt(1 - decay) (lr with --warmup on), the same 0.02 at batch 10 and 60 under the rule, where 7.3e-3
# with decay 0.99 moves each weight by 0.073 and collapses the policy (measured,
# docs/study/lr7.3e-3-b60-s0.progress.csv).
RULE_BATCH = 10
RULE_LEARNING_RATE = 2e-3
RULE_DECAY_RATE = 0.99
RULE_MIN_DECAY_RATE = 0.5  # from batch 500 on ((1 - decay) x k would reach 1 at batch 1,000)
RAMP_MATCHES = 1000  # --ramp-matches' default: the noise scale had tripled after about 900 matches (README)


def batch_rule(batch_size: int) -> tuple[float, float]:
    """The learning rate and RMSProp decay the batch rule gives a batch size."""
    k = max(batch_size, RULE_BATCH) / RULE_BATCH
    decay = max(RULE_MIN_DECAY_RATE, 1 - (1 - RULE_DECAY_RATE) * k)
    return float(f"{RULE_LEARNING_RATE * math.sqrt(k):.2g}"), round(decay, 12)  # the rate to 2 digits, as printed


def describe_batch_rule(batch_size: int) -> str:
    """'lr 0.0049 = 0.002 x sqrt(60/10), RMSProp decay 0.94 = 1 - 0.01 x 60/10 (the batch rule)'."""
    lr, decay = batch_rule(batch_size)
    if batch_size <= RULE_BATCH:
        return f"lr {lr:g}, RMSProp decay {decay:g} (the batch rule at {RULE_BATCH} and below)"
    k = f"{batch_size}/{RULE_BATCH}"
    scaled = f"1 - {1 - RULE_DECAY_RATE:g} x {k}"
    if decay == RULE_MIN_DECAY_RATE:
        scaled = f"its floor; {scaled} would be {round(1 - (1 - RULE_DECAY_RATE) * batch_size / RULE_BATCH, 9) + 0.0:g}"
    shown = f"({scaled})" if decay == RULE_MIN_DECAY_RATE else f"= {scaled}"
    return f"lr {lr:g} = {RULE_LEARNING_RATE:g} x sqrt({k}), RMSProp decay {decay:g} {shown} (the batch rule)"


class ConfigError(ValueError):
    """A setting has a value pgpong cannot use; the message says which and why."""


def _setting(
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
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {text!r}") from None


@dataclass(frozen=True)
class TrainConfig:
    env_id: str = _setting("ALE/Pong-v5", "Gymnasium id of the Atari Pong environment", metavar="ID")
    hidden: int = _setting(200, "hidden units H of the policy network")
    batch_size: int = _setting(10, "matches (episodes) per weight update; with --ramp-from, the size it grows to")
    ramp_from: int | None = _setting(
        None,
        "start the batch at this many matches and grow it linearly to --batch-size over --ramp-matches "
        "matches, each update with the batch rule's lr and decay for its size",
        shown="no ramp",
    )
    ramp_matches: int = _setting(RAMP_MATCHES, "with --ramp-from: the matches over which the batch grows")
    learning_rate: float = _setting(
        None,
        "RMSProp learning rate; 1e-4 is the 2016 setting (about 10 times slower to learn, see README)",
        metavar="RATE",
        aliases=("--lr",),
        shown="the batch rule: 2e-3 up to batch 10, x sqrt(batch/10) above (2 digits)",
    )
    warmup: str = _setting(
        "off",
        "on: the rate of update t is lr x sqrt(1 - decay^t) (with --ramp-from, decay^t is the product of "
        "the decays so far), as if RMSProp's cache, which starts at zero and has gathered a weight of "
        "1 - decay^t, held its full weight: each early step then moves a weight by about lr instead of up to "
        "lr / sqrt(1 - decay); off: lr throughout, as in 2016",
        metavar="on|off",
    )
    gamma: float = _setting(0.99, "discount factor for rewards", metavar="GAMMA")
    decay_rate: float = _setting(
        None,
        "RMSProp decay of the squared-gradient cache",
        metavar="RATE",
        shown="the batch rule: 0.99 up to batch 10, 1 - 0.01 x batch/10 above (at least 0.5)",
    )
    seed: int = _setting(0, "seed of the run: episode k of batch i uses SeedSequence([seed, i, k])")
    max_episode_steps: int | None = _setting(None, "cut episodes after this many agent steps", shown="full matches")
    iterations: int | None = _setting(
        None, "stop after this many batches in all, counting resumed ones", learning=False, shown="no limit"
    )
    workers: int | None = _setting(
        None,
        "rollout workers; 0 = play in this process, without Ray",
        learning=False,
        shown="the CPUs of the Ray cluster",
    )
    keep_checkpoints: int = _setting(3, "how many of the newest checkpoints to keep", learning=False)

    def __post_init__(self) -> None:
        # What is not given follows the batch rule (a bad batch size is validate()'s to report).
        if self.learning_rate is None or self.decay_rate is None:
            lr, decay = batch_rule(self.batch_size) if _is_int(self.batch_size) and self.batch_size >= 1 else (0, 0)
            if self.learning_rate is None:
                object.__setattr__(self, "learning_rate", lr)
            if self.decay_rate is None:
                object.__setattr__(self, "decay_rate", decay)

    def follows_batch_rule(self) -> bool:
        """Whether the learning rate and decay are the ones the batch rule gives."""
        return (self.learning_rate, self.decay_rate) == batch_rule(self.batch_size)

    @property
    def ramps(self) -> bool:
        """Whether the batch grows (--ramp-from below --batch-size)."""
        return self.ramp_from is not None and self.ramp_from != self.batch_size

    def update_settings(self, episodes: int) -> tuple[int, float, float]:
        """The batch size, learning rate and RMSProp decay of the update that follows
        `episodes` matches. Without a ramp they are the settings; with one, the batch
        grows linearly from --ramp-from to --batch-size over --ramp-matches matches,
        with the batch rule's rate and decay at each size."""
        if not self.ramps:
            return self.batch_size, self.learning_rate, self.decay_rate
        assert self.ramp_from is not None
        grown = (self.batch_size - self.ramp_from) * min(episodes, self.ramp_matches) // self.ramp_matches
        batch = self.ramp_from + grown
        return (batch, *batch_rule(batch))

    def warmup_factor(self, batches: int) -> float:
        """What the learning rate is multiplied by in the update that follows `batches`
        updates: with --warmup on, sqrt(1 - d1 x d2 x ... x dt) over the decays of updates
        1..t (t = batches + 1), the weight RMSProp's cache, which starts at zero, has
        gathered by then (Adam's bias correction, as a learning-rate schedule); 1 with it off."""
        if self.warmup == "off":
            return 1.0
        if not self.ramps:
            return (1 - self.decay_rate ** (batches + 1)) ** 0.5
        episodes, product = 0, 1.0
        for _ in range(batches + 1):  # a ramp's decay changes with its batch size
            size, _, decay = self.update_settings(episodes)
            product *= decay
            episodes += size
            if product < 1e-17:  # 1 - product is 1.0 in float64 from here on
                break
        return (1 - product) ** 0.5

    def validate(self) -> TrainConfig:
        """Return self, or raise ConfigError naming the first bad setting."""
        check(isinstance(self.env_id, str) and self.env_id.strip() != "", "--env-id must not be empty")
        check(_is_int(self.hidden) and self.hidden >= 1, f"--hidden must be at least 1, got {self.hidden}")
        check(
            _is_int(self.batch_size) and self.batch_size >= 1,
            f"--batch-size must be at least 1, got {self.batch_size}",
        )
        check(
            self.ramp_from is None or (_is_int(self.ramp_from) and 1 <= self.ramp_from <= self.batch_size),
            f"--ramp-from must be at least 1 and at most --batch-size ({self.batch_size}), got {self.ramp_from}",
        )
        check(
            _is_int(self.ramp_matches) and self.ramp_matches >= 1,
            f"--ramp-matches must be at least 1, got {self.ramp_matches}",
        )
        check(
            _is_number(self.learning_rate) and 0 < self.learning_rate <= MAX_LEARNING_RATE,
            f"--learning-rate must be in (0, {MAX_LEARNING_RATE:g}] (pgpong's default is 2e-3 at batch 10), "
            f"got {self.learning_rate}",
        )
        check(
            _is_int(self.hidden) and self.hidden <= MAX_HIDDEN,
            f"--hidden must be at most {MAX_HIDDEN}, got {self.hidden}",
        )
        check(self.warmup in ("on", "off"), f"--warmup must be on or off, got {self.warmup!r}")
        check(_is_number(self.gamma) and 0 <= self.gamma <= 1, f"--gamma must be in [0, 1], got {self.gamma}")
        check(
            _is_number(self.decay_rate) and 0 <= self.decay_rate < 1,
            f"--decay-rate must be in [0, 1), got {self.decay_rate}",
        )
        check(
            self.ramp_from is not None or self.ramp_matches == RAMP_MATCHES,
            f"--ramp-matches {self.ramp_matches} needs --ramp-from (the batch size the ramp starts at)",
        )
        check(
            self.ramp_from is None or self.follows_batch_rule(),
            f"--ramp-from takes the batch rule's lr and RMSProp decay at each batch size: drop --lr and "
            f"--decay-rate (given {self.learning_rate:g} and {self.decay_rate:g}; the rule ends the ramp at "
            f"{batch_rule(self.batch_size)[0]:g} and {batch_rule(self.batch_size)[1]:g})",
        )
        check(_is_int(self.seed) and 0 <= self.seed < 2**32, f"--seed must be in [0, 2**32), got {self.seed}")
        check(
            self.max_episode_steps is None or (_is_int(self.max_episode_steps) and self.max_episode_steps >= 1),
            f"--max-episode-steps must be at least 1, got {self.max_episode_steps}",
        )
        check(
            self.iterations is None or (_is_int(self.iterations) and self.iterations >= 0),
            f"--iterations must be 0 or more, got {self.iterations}",
        )
        check(
            self.workers is None or (_is_int(self.workers) and self.workers >= 0),
            f"--workers must be 0 or more, got {self.workers}",
        )
        check(
            _is_int(self.keep_checkpoints) and self.keep_checkpoints >= 1,
            f"--keep-checkpoints must be at least 1, got {self.keep_checkpoints}",
        )
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

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


@dataclass(frozen=True)
class BenchOptions:
    """What `pgpong bench` measures, and for how long."""

    workers: int | None = _setting(None, "Ray workers", shown="the CPUs of the Ray cluster")
    env_id: str = _setting("ALE/Pong-v5", "environment id", metavar="ID")
    batch_sizes: tuple[int, ...] = _setting(
        (1, 10, 60),
        "batch sizes of the seconds-per-update table",
        metavar="LIST",
        shown="1,10,60",
        parse=int_list,
        aliases=("--batch-size",),
    )
    train_batches: int = _setting(
        7, "rounds of Gymnasium's env, raw ALE and one training batch of 10, after a warm-up batch"
    )
    update_batches: int | None = _setting(
        None, "batches timed per batch size, after a warm-up batch", shown="2, or 5 with --simulate"
    )
    ceiling_seconds: float = _setting(
        10.0, "seconds of random play on raw ALE, and again on Gymnasium's env, over all rounds", metavar="S"
    )
    original_seconds: float = _setting(10.0, "seconds the original dense algorithm plays, for comparison", metavar="S")
    max_episode_steps: int | None = _setting(None, "cut episodes short", shown="full matches")
    memory_steps: int = _setting(10_000, "length of the episode whose peak memory is measured")
    address: str | None = _setting(
        None, "an existing Ray cluster", metavar="ADDRESS", shown="$RAY_ADDRESS, else a local Ray instance"
    )
    seed: int = _setting(0, "seed of the measured training batches")
    simulate: str | None = _setting(
        None,
        "measure seconds per update on a simulated cluster of NODES nodes of CPUS CPUs each (e.g. 1x64, 11x18): "
        "real driver, Ray and sums on this machine, workers that wait as long as a real match takes",
        metavar="NODESxCPUS",
        shown="off",
    )
    bank_matches: int = _setting(24, "with --simulate: real matches played first, whose lengths and gradients it uses")
    bank_policy: str = _setting(
        "new",
        "with --simulate: who plays the bank's matches: new (a new policy: short, lost matches), "
        "shipped (the shipped agent: long, close ones) or a checkpoint/run directory",
        metavar="POLICY",
    )

    def validate(self) -> BenchOptions:
        """Return self, or raise ConfigError on a value bench cannot use (TrainConfig's checks where shared)."""
        TrainConfig(
            env_id=self.env_id, max_episode_steps=self.max_episode_steps, workers=self.workers, seed=self.seed
        ).validate()
        check(self.workers != 0, "--workers must be at least 1 for bench (it measures Ray workers)")
        check(
            bool(self.batch_sizes) and min(self.batch_sizes) >= 1,
            f"--batch-sizes must be positive whole numbers, got {self.batch_sizes}",
        )
        for name in ("train_batches", "update_batches", "memory_steps", "bank_matches"):
            value = getattr(self, name)
            if value is not None:
                check(_is_int(value) and value >= 1, f"--{name.replace('_', '-')} must be at least 1, got {value}")
        if self.simulate is not None:
            from pgpong.bench.simulate import Shape

            try:
                Shape.parse(self.simulate)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
            check(self.address is None, "--simulate starts a cluster of its own on this machine: drop --address")
        for name in ("ceiling_seconds", "original_seconds"):
            value = getattr(self, name)
            check(_is_number(value) and value > 0, f"--{name.replace('_', '-')} must be positive, got {value}")
        return self


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


def load_config(path: Path) -> TrainConfig:
    data = _read_json(path)
    try:
        if not isinstance(data.get("config"), dict):
            raise ValueError('no "config" object')
        return TrainConfig.from_dict(data["config"]).validate()
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise ValueError(f"{path.stat().st_size / 2**20:.0f} MB is too large for a config.json")
        data = json.loads(path.read_text(encoding="utf-8"))
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


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
