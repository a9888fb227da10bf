"""`pgpong bench`'s settings (its flags are built from them, as train's are from
TrainConfig) and the shape of a simulated cluster (--simulate NODESxCPUS)."""

from __future__ import annotations

from dataclasses import dataclass

from pgpong.config import (
    MAX_BATCH,
    PER_CPU_RANGE,
    ConfigError,
    TrainConfig,
    address_text,
    check,
    int_list,
    is_int,
    is_number,
    per_cpu_valid,
    per_cpu_value,
    setting,
)

MAX_SLOTS = 32  # simulated workers per process at most
# The bank's matches are played before anything is timed, and sit pinned in the head's
# object store of 1 GB with their gradients (24 of the shipped agent's: about 100 MB).
MAX_BANK_MATCHES = 100
MAX_MEASURE_S = 3600.0  # --ceiling-seconds, --original-seconds: an hour each at the most


@dataclass(frozen=True)
class Shape:
    """NODES x CPUS: a cluster of `nodes` nodes with `cpus` CPUs each."""

    nodes: int
    cpus: int

    @classmethod
    def parse(cls, text: str) -> Shape:
        nodes, sep, cpus = text.lower().partition("x")
        if not (sep and nodes.strip().isdecimal() and cpus.strip().isdecimal()):
            raise ValueError(f"--simulate takes NODESxCPUS, e.g. 1x64 or 11x18, got {text!r}")
        shape = cls(int(nodes), int(cpus))
        if not (1 <= shape.nodes <= 64 and 1 <= shape.cpus <= 512):
            raise ValueError(f"--simulate {text}: 1-64 nodes of 1-512 CPUs each")
        return shape

    @property
    def workers(self) -> int:
        return self.nodes * self.cpus

    @property
    def per_process(self) -> int:
        """Simulated workers per process: the largest divisor of CPUS up to MAX_SLOTS."""
        return max(d for d in range(1, min(self.cpus, MAX_SLOTS) + 1) if self.cpus % d == 0)

    def __str__(self) -> str:
        return f"{self.nodes}x{self.cpus}"


@dataclass(frozen=True)
class BenchOptions:
    """What `pgpong bench` measures, and for how long."""

    workers: int | None = setting(None, "Ray workers", shown="the CPUs of the Ray cluster")
    env_id: str = setting("ALE/Pong-v5", "environment id", metavar="ID")
    batch_sizes: tuple[int, ...] = setting(
        (1, 10, 60),
        f"batch sizes of the seconds-per-update table, each at most {MAX_BATCH}",
        metavar="LIST",
        shown="1,10,60",
        parse=int_list,
        aliases=("--batch-size",),
    )
    train_batches: int = setting(
        7, "rounds of Gymnasium's env, raw ALE and one training batch of 10, after a warm-up batch"
    )
    update_batches: int | None = setting(
        None, "batches timed per batch size, after a warm-up batch", shown="2, or 5 with --simulate"
    )
    ceiling_seconds: float = setting(
        10.0, "seconds of random play on raw ALE, and again on Gymnasium's env, over all rounds", metavar="S"
    )
    original_seconds: float = setting(10.0, "seconds the original dense algorithm plays, for comparison", metavar="S")
    max_episode_steps: int | None = setting(None, "cut episodes short", shown="full matches")
    memory_steps: int = setting(10_000, "length of the episode whose peak memory is measured")
    address: str | None = setting(
        None,
        "an existing Ray cluster",
        metavar="ADDRESS",
        shown="$RAY_ADDRESS, else a local Ray instance",
        parse=address_text,
    )
    seed: int = setting(0, "seed of the measured training batches")
    simulate: str | None = setting(
        None,
        "measure seconds per update on a simulated cluster of NODES nodes of CPUS CPUs each (e.g. 1x64, 11x18): "
        "real driver, Ray and sums on this machine, workers that wait as long as a real match takes",
        metavar="NODESxCPUS",
        shown="off",
    )
    lag: int = setting(
        0,
        "with --simulate: the timed updates' --lag (1: the next batch starts while this one ends; an update is "
        "then timed from the row before, their mean taken, after two warm-up batches)",
        metavar="0|1",
    )
    lag_share: float = setting(
        0.0,
        "with --simulate: the timed updates' --lag-share (the first S of each batch's matches start while the "
        "batch before ends; timed as with --lag 1)",
        metavar="S",
    )
    workers_per_cpu: float | str = setting(
        1.0,
        "with --simulate: rollout workers a CPU of each simulated node, as train's --workers-per-cpu (auto: for "
        "the largest batch); above 1 a process's simulated matches share the CPUs it holds (each of k on c CPUs at "
        "min(1, c/k) of the pace)",
        shown="1",
        metavar="N|auto",
        parse=per_cpu_value,
    )
    bank_matches: int = setting(
        24,
        f"with --simulate: real matches played first, whose lengths and gradients it uses (at most {MAX_BANK_MATCHES})",
    )
    pace: float | None = setting(
        None,
        "with --simulate: the bank's matches last as long as at this many env steps/s a core (the model's 2600, "
        "say), so that runs on other days and machines compare; their lengths and gradients stay the real ones",
        metavar="STEPS",
        shown="this machine's pace, measured with the bank",
    )
    bank_policy: str = setting(
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
        check(
            max(self.batch_sizes) <= MAX_BATCH,
            f"--batch-sizes must be at most {MAX_BATCH} (as --batch-size of train), got {max(self.batch_sizes)}",
        )
        for name in ("train_batches", "update_batches", "memory_steps"):
            value = getattr(self, name)
            if value is not None:
                check(is_int(value) and value >= 1, f"--{name.replace('_', '-')} must be at least 1, got {value}")
        check(
            is_int(self.bank_matches) and 1 <= self.bank_matches <= MAX_BANK_MATCHES,
            f"--bank-matches must be at least 1 and at most {MAX_BANK_MATCHES}, got {self.bank_matches}",
        )
        if self.simulate is not None:
            try:
                Shape.parse(self.simulate)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
            check(self.address is None, "--simulate starts a cluster of its own on this machine: drop --address")
        check(self.lag in (0, 1) and is_int(self.lag), f"--lag must be 0 or 1, got {self.lag}")
        check(self.lag == 0 or self.simulate is not None, "--lag is measured with --simulate only")
        check(
            is_number(self.lag_share) and 0 <= self.lag_share <= 1,
            f"--lag-share must be in [0, 1], got {self.lag_share}",
        )
        check(self.lag_share == 0 or self.simulate is not None, "--lag-share is measured with --simulate only")
        check(not (self.lag and self.lag_share), "give --lag 1 or --lag-share, not both")
        check(per_cpu_valid(self.workers_per_cpu), f"--workers-per-cpu {PER_CPU_RANGE}, got {self.workers_per_cpu}")
        check(self.workers_per_cpu == 1 or self.simulate is not None, "--workers-per-cpu is measured with --simulate")
        if self.pace is not None:
            shown = f"{self.pace:g}" if is_number(self.pace) else repr(self.pace)
            check(is_number(self.pace) and 100 <= self.pace <= 1e6, f"--pace must be 100-1000000 steps/s, got {shown}")
            check(self.simulate is not None, "--pace sets the simulated matches' pace: it needs --simulate")
        for name in ("bank_matches", "bank_policy"):
            check(
                getattr(self, name) == getattr(BenchOptions, name) or self.simulate is not None,  # (its default)
                f"--{name.replace('_', '-')} sets the simulated matches' bank: it needs --simulate",
            )
        check(
            isinstance(self.bank_policy, str) and self.bank_policy.strip() != "",
            "--bank-policy must be new, shipped, or a checkpoint or run directory, got an empty one",
        )
        for name in ("ceiling_seconds", "original_seconds"):
            value = getattr(self, name)
            check(
                is_number(value) and 0 < value <= MAX_MEASURE_S,
                f"--{name.replace('_', '-')} must be more than 0 and at most {MAX_MEASURE_S:g} seconds, got {value}",
            )
        return self
