"""The learning schedule: the rate and RMSProp decay of every update, and how the run's
first line and warnings say them.

Three rules make it: the batch rule (what --lr and --decay-rate default to, by batch
size), the batch ramp (--ramp-from: a batch that grows over the first matches, each
update at the rule's rate and decay for its size) and the warm-up (--warmup on: the
rate scaled by how full RMSProp's cache is). Everything here is a function of numbers
and of the settings it is given, so the settings (config.py) build on it and nothing
here knows where they come from.
"""

from __future__ import annotations

import math
from typing import Protocol

# The batch rule. At batch 10 (and below) lr 2e-3 and decay 0.99: measured to reach
# running reward 0 on seeds 0, 1, 2, 3, 4, 6 and 8 within 2.6M-4.4M env steps, where
# 3e-3 took 5.5M-6.4M or missed 7M and 1.5e-3 missed 7M on one seed of five
# (docs/LEARNING.md). A batch k times bigger than 10 takes the learning rate times
# sqrt(k) and (1 - decay) times k: the square-root rule for adaptive optimisers of
# Malladi et al. 2022 ("On the SDEs and scaling rules for adaptive gradient
# algorithms"). Scaling (1 - decay) matters as much as the rate: RMSProp's cache
# starts at zero, so its first step is about lr / sqrt(1 - decay) (lr with --warmup
# on), the same 0.02 at batch 10 and 60 under the rule, where 7.3e-3 with decay 0.99
# moves each weight by 0.073 and collapses the policy (measured,
# docs/study/lr7.3e-3-b60-s0.progress.csv).
RULE_BATCH = 10
RULE_LEARNING_RATE = 2e-3
RULE_DECAY_RATE = 0.99
RULE_MIN_DECAY_RATE = 0.5  # from batch 500 on ((1 - decay) x k would reach 1 at batch 1,000)
RAMP_MATCHES = 1000  # --ramp-matches' default: the noise scale had tripled after about 900 matches
# The first step above which the run's first line warns: the batch rule keeps it at
# 0.02 (lr itself warmed up); 0.073 collapsed a batch of 60.
FIRST_STEP_WARNING = 0.045


class Learning(Protocol):
    """The settings the schedule reads (config.TrainConfig has them)."""

    @property
    def batch_size(self) -> int: ...
    @property
    def ramp_from(self) -> int | None: ...
    @property
    def ramp_matches(self) -> int: ...
    @property
    def learning_rate(self) -> float: ...
    @property
    def decay_rate(self) -> float: ...
    @property
    def warmup(self) -> str: ...


def rate_text(rate: float) -> str:
    """A learning rate as people write it: 2e-3."""
    mantissa, exponent = f"{rate:.1e}".split("e")
    return f"{float(mantissa):g}e{int(exponent)}"


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


def follows_batch_rule(settings: Learning) -> bool:
    """Whether the learning rate and decay are the ones the batch rule gives."""
    return (settings.learning_rate, settings.decay_rate) == batch_rule(settings.batch_size)


def ramps(settings: Learning) -> bool:
    """Whether the batch grows (--ramp-from below --batch-size)."""
    return settings.ramp_from is not None and settings.ramp_from != settings.batch_size


def update_settings(settings: Learning, episodes: int) -> tuple[int, float, float]:
    """The batch size, learning rate and RMSProp decay of the update that follows
    `episodes` matches. Without a ramp they are the settings; with one, the batch
    grows linearly from --ramp-from to --batch-size over --ramp-matches matches,
    with the batch rule's rate and decay at each size."""
    if not ramps(settings):
        return settings.batch_size, settings.learning_rate, settings.decay_rate
    assert settings.ramp_from is not None
    grown = (settings.batch_size - settings.ramp_from) * min(episodes, settings.ramp_matches) // settings.ramp_matches
    batch = settings.ramp_from + grown
    return (batch, *batch_rule(batch))


def warmup_factor(settings: Learning, batches: int) -> float:
    """What the learning rate is multiplied by in the update that follows `batches`
    updates: with --warmup on, sqrt(1 - d1 x d2 x ... x dt) over the decays of updates
    1..t (t = batches + 1), the weight RMSProp's cache, which starts at zero, has
    gathered by then (Adam's bias correction, as a learning-rate schedule); 1 with it off."""
    if settings.warmup == "off":
        return 1.0
    if not ramps(settings):
        return (1 - settings.decay_rate ** (batches + 1)) ** 0.5
    episodes, product = 0, 1.0
    for _ in range(batches + 1):  # a ramp's decay changes with its batch size
        size, _, decay = update_settings(settings, episodes)
        product *= decay
        episodes += size
        if product < 1e-17:  # 1 - product is 1.0 in float64 from here on
            break
    return (1 - product) ** 0.5


def ramp_error(settings: Learning) -> str | None:
    """Why these settings cannot ramp (a ramp takes the rule's rate and decay), or None."""
    if settings.ramp_from is None or follows_batch_rule(settings):
        return None
    lr, decay = batch_rule(settings.batch_size)
    return (
        f"--ramp-from takes the batch rule's lr and RMSProp decay at each batch size: drop --lr and "
        f"--decay-rate (given {settings.learning_rate:g} and {settings.decay_rate:g}; the rule ends the ramp at "
        f"{lr:g} and {decay:g})"
    )


def batch_settings(settings: Learning, resumed: bool = False, episodes: int = 0, batches: int = 0) -> str:
    """'batch 10, lr 0.002, ...', or with a ramp 'batch 10 growing to 60 over 1,000
    matches, lr 0.002 to 0.0049, ...', then the warm-up (and where a resumed run is on
    them: `episodes` matches and `batches` updates played)."""
    if not ramps(settings):
        return (
            f"batch {settings.batch_size}, {optimiser_settings(settings, resumed)}{warmup_settings(settings, batches)}"
        )
    start, end = update_settings(settings, 0), update_settings(settings, settings.ramp_matches)
    return (
        f"batch {settings.ramp_from} growing to {settings.batch_size} over {settings.ramp_matches:,} matches, "
        f"lr {start[1]:g} to {end[1]:g}, RMSProp decay {start[2]:g} to {end[2]:g} (the batch rule at each size)"
        + (f"; now at batch {update_settings(settings, episodes)[0]} after {episodes:,} matches" if episodes else "")
        + warmup_settings(settings, batches)
    )


def warmup_settings(settings: Learning, batches: int = 0) -> str:
    """'; warm-up: lr x sqrt(1 - 0.99^t) at update t (x0.1 at the first, x0.8 at the
    100th)', and where a resumed run is on it; '' with --warmup off."""
    if settings.warmup == "off":
        return ""
    if batches:
        factor = warmup_factor(settings, batches)
        return "; warm-up done" if factor > 0.995 else f"; warm-up: lr x {factor:.2f} at update {batches + 1:,}"
    decay = "the product of the decays so far" if ramps(settings) else f"{settings.decay_rate:g}^t"
    return (
        f"; warm-up: lr x sqrt(1 - {decay}) at update t "
        f"(x{warmup_factor(settings, 0):.2g} at the first, x{warmup_factor(settings, 99):.2g} at the 100th)"
    )


def optimiser_settings(settings: Learning, resumed: bool = False) -> str:
    """'lr 0.002, RMSProp decay 0.99 (the batch rule ...)', or the values given (or, on
    resume, recorded) instead."""
    if follows_batch_rule(settings):
        return describe_batch_rule(settings.batch_size)
    if resumed:
        return f"lr {settings.learning_rate:g}, RMSProp decay {settings.decay_rate:g} (as the run was made)"
    lr, decay = batch_rule(settings.batch_size)
    return (
        f"lr {settings.learning_rate:g}, RMSProp decay {settings.decay_rate:g} "
        f"(given; the batch rule would use --lr {lr:g} --decay-rate {decay:g})"
    )


def first_step_warning(settings: Learning) -> str | None:
    """A warning when RMSProp's first step is well above the 0.02 per weight the batch
    rule keeps without the warm-up: about lr / sqrt(1 - decay) from a zero cache, and
    lr itself with --warmup on."""
    _, lr, decay = update_settings(settings, 0)  # with a ramp, its first batch's
    step = lr * warmup_factor(settings, 0) / max(1e-12, 1 - decay) ** 0.5
    if step <= FIRST_STEP_WARNING:
        return None
    how = "lr, warmed up" if settings.warmup == "on" else "lr / sqrt(1 - decay); the batch rule keeps it at 0.02"
    return (
        f"pgpong: warning: the first update will move each weight by about {step:.3g} "
        f"({how}), and 0.073 made a batch of 60 lose every point from then on (docs/LEARNING.md)"
    )


def step_description(settings: Learning, learning_rate: float, decay_rate: float, warmup: float) -> str:
    """How an update stepped, for the message of a diverged run: 'lr 0.002, RMSProp
    decay 0.99' (with ' x warm-up 0.34' after the rate when the warm-up is on)."""
    rate = f"lr {learning_rate:g}" + (f" x warm-up {warmup:.2f}" if settings.warmup == "on" else "")
    return f"{rate}, RMSProp decay {decay_rate:g}"


def divergence_advice(batch_size: int) -> str:
    """'the batch rule gives lr 0.002 and decay 0.99 for this batch of 10'."""
    lr, decay = batch_rule(batch_size)
    return f"the batch rule gives lr {lr:g} and decay {decay:g} for this batch of {batch_size}"
