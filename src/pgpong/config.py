"""Training settings: every one with its default, a one-line meaning and a check."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# An RMSProp step moves each weight by about the learning rate: past 1 it is noise.
MAX_LEARNING_RATE = 1.0
MAX_HIDDEN = 4096  # the largest network pgpong trains or loads (W1 4096 x 6400 float64 is 210 MB)


class ConfigError(ValueError):
    """A setting has a value pgpong cannot use; the message says which and why."""


def _setting(default: Any, help: str, *, learning: bool = True) -> Any:
    # learning=True: the setting shapes what is learned, so a resumed run must keep it.
    return field(default=default, metadata={"help": help, "learning": learning})


@dataclass(frozen=True)
class TrainConfig:
    env_id: str = _setting("ALE/Pong-v5", "Gymnasium id of the Atari Pong environment")
    hidden: int = _setting(200, "hidden units H of the policy network")
    batch_size: int = _setting(10, "episodes per weight update")
    learning_rate: float = _setting(
        3e-3, "RMSProp learning rate; 1e-4 is the 2016 setting (about 10 times slower to learn, see README)"
    )
    gamma: float = _setting(0.99, "discount factor for rewards")
    decay_rate: float = _setting(0.99, "RMSProp decay of the squared-gradient cache")
    seed: int = _setting(0, "seed of the run: episode k of batch i uses SeedSequence([seed, i, k])")
    max_episode_steps: int | None = _setting(None, "cut episodes after this many agent steps")
    iterations: int | None = _setting(
        None, "stop after this many batches in all, counting resumed ones", learning=False
    )
    workers: int | None = _setting(
        None,
        "rollout workers; 0 = play in this process, without Ray",
        learning=False,
    )
    keep_checkpoints: int = _setting(3, "how many of the newest checkpoints to keep", learning=False)

    def validate(self) -> TrainConfig:
        """Return self, or raise ConfigError naming the first bad setting."""
        check(isinstance(self.env_id, str) and self.env_id.strip() != "", "--env-id must not be empty")
        check(_is_int(self.hidden) and self.hidden >= 1, f"--hidden must be at least 1, got {self.hidden}")
        check(
            _is_int(self.batch_size) and self.batch_size >= 1,
            f"--batch-size must be at least 1, got {self.batch_size}",
        )
        check(
            _is_number(self.learning_rate) and 0 < self.learning_rate <= MAX_LEARNING_RATE,
            f"--learning-rate must be in (0, {MAX_LEARNING_RATE:g}] (pgpong's default is 3e-3), "
            f"got {self.learning_rate}",
        )
        check(
            _is_int(self.hidden) and self.hidden <= MAX_HIDDEN,
            f"--hidden must be at most {MAX_HIDDEN}, got {self.hidden}",
        )
        check(_is_number(self.gamma) and 0 <= self.gamma <= 1, f"--gamma must be in [0, 1], got {self.gamma}")
        check(
            _is_number(self.decay_rate) and 0 <= self.decay_rate < 1,
            f"--decay-rate must be in [0, 1), got {self.decay_rate}",
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


def settings() -> list[dataclasses.Field]:
    """The fields of TrainConfig, in order, for building the command line."""
    return list(dataclasses.fields(TrainConfig))


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
