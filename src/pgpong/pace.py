"""An early sign of a slow run, from measured runs (docs/LEARNING.md, "Fast and slow
seeds"): a pure function of a run's settings and its progress, which the trainer asks
after every batch and shows, once, as a note. It never stops a run.

Measured on ALE/Pong-v5 at batch 10 with 2016's maths (the default before
2026-11-25, and its variants with another learning rate or the warm-up): after 2M env
steps every run that reached running reward 0 within 7M env steps stood at -6.1 or
better, and every run that did not stood at -9.8 or worse. The line between is drawn
at -8. The default since (the entropy bonus 0.01 with updates clipped to norm 4) was
measured on seeds 0-11 against the same line, with its own figures for the note.
"""

from __future__ import annotations

from pgpong.config import TrainConfig

SIGN_ENV_ID = "ALE/Pong-v5"
SIGN_BATCH_SIZE = 10  # the batch the sign was measured at
SIGN_ENV_STEPS = 2_000_000  # when it is read
SIGN_RUNNING_REWARD = -8.0  # below this then: the slow path
SIGN_LEARNING_RATES = (1.5e-3, 3e-3)  # the rates of the measured runs (gamma and RMSProp decay 0.99)
# What the measured runs did, for the note (docs/LEARNING.md's tables of batch-10 runs), by
# (entropy bonus, update clipping): env steps to running reward 0 below the line, and above.
# 2016's maths with the exact sums on seeds 0-11 (docs/study/default12): above the line
# 1.5M-4.8M, but seed 8 (-6.8 at 2M) stood at -1.8 at 7M; below it, seed 7 at 6.2M, and
# seeds 3, 4 and 10 not within 7M. So 21 of the 22 runs above the line reached 0 by 4.8M.
# The default since 2026-11-25 on seeds 0-11 (docs/study/clipbonus): one run below the
# line (seed 10, -8.2 at 2M) reached 0 after 6.1M; the 11 above it after 2.1M-3.2M. The
# same seeds again with the bits of 2026-11-27 (docs/study/default-now*): three below the
# line (seeds 2, 3, 11) after 4.45M-9.81M, the 9 above after 2.04M-3.17M.
TO_ZERO = {
    (0.0, None): ("6.2M or more", "21 of 22 others 1.5M-4.8M"),
    (0.01, 4.0): ("4.5M-9.8M (4 of 24)", "20 others 2.0M-3.2M"),
}
LIVE_TAG = " | slow start: see the note above"  # what the live line adds once the note was shown


def maths(config: TrainConfig) -> tuple[float, float | None]:
    """(entropy bonus, update clipping or None): which of TO_ZERO's the run's are."""
    return config.entropy_bonus, config.max_update_norm or None


def measured(config: TrainConfig) -> bool:
    """Whether the sign was measured for runs like this one: Pong-v5's full matches,
    batch 10 without a ramp, 200 hidden units, lr 1.5e-3 to 3e-3, gamma and RMSProp
    decay 0.99, the initial W2 as in 2016, and 2016's maths or the default's."""
    low, high = SIGN_LEARNING_RATES
    return (
        maths(config) in TO_ZERO
        and config.env_id == SIGN_ENV_ID
        and low <= config.learning_rate <= high
        and config.gamma == 0.99
        and config.decay_rate == 0.99
        and config.batch_size == SIGN_BATCH_SIZE
        and config.ramp_from is None
        and config.max_episode_steps is None
        and config.hidden == 200
        and config.w2_init_scale == 1
        and not config.lagged
    )


def slow_run_note(config: TrainConfig, steps_before: int, steps_after: int, running_reward: float | None) -> str | None:
    """The note to show when a batch took the run past SIGN_ENV_STEPS below the line;
    None otherwise (another batch, a run above the line, or settings never measured)."""
    if not measured(config) or running_reward is None or not steps_before < SIGN_ENV_STEPS <= steps_after:
        return None
    if running_reward >= SIGN_RUNNING_REWARD:
        return None
    slow, fast = TO_ZERO[maths(config)]
    return (
        f"pgpong: note: running reward {running_reward:.1f} after {steps_after / 1e6:.1f}M env steps looks slow: "
        f"measured runs below {SIGN_RUNNING_REWARD:g} here took {slow} env steps to reach 0, "
        f"{fast} (docs/LEARNING.md). Training goes on."
    )
