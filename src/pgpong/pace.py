"""An early sign of a slow run, from measured runs (docs/LEARNING.md, "Fast and slow
seeds"): a pure function of a run's settings and its progress, which the trainer asks
after every batch and shows, once, as a note. It never stops a run.

Measured on ALE/Pong-v5 at batch 10 (the default's, and its variants with another
learning rate or the warm-up): after 2M env steps every run that reached running
reward 0 within 7M env steps stood at -6.1 or better, and every run that did not stood
at -9.8 or worse. The line between is drawn at -8.
"""

from __future__ import annotations

from pgpong.config import TrainConfig

SIGN_ENV_ID = "ALE/Pong-v5"
SIGN_BATCH_SIZE = 10  # the batch the sign was measured at
SIGN_ENV_STEPS = 2_000_000  # when it is read
SIGN_RUNNING_REWARD = -8.0  # below this then: the slow path
SIGN_LEARNING_RATES = (1.5e-3, 3e-3)  # the rates of the measured runs (gamma and RMSProp decay 0.99)
# What the measured runs did, for the note (docs/LEARNING.md's table of batch-10 runs).
# With the default on seeds 0-11 with the exact sums (docs/study/default12): above the line
# 1.5M-4.8M, but seed 8 (-6.8 at 2M) stood at -1.8 at 7M; below it, seed 7 at 6.2M, and
# seeds 3, 4 and 10 not within 7M. So 21 of the 22 runs above the line reached 0 by 4.8M.
FAST_TO_ZERO = "21 of 22 others 1.5M-4.8M"  # the runs above the line: env steps to running reward 0
SLOW_TO_ZERO = "6.2M or more"  # the runs below it (the one followed further: 8.7M)
LIVE_TAG = " | slow start: see the note above"  # what the live line adds once the note was shown


def measured(config: TrainConfig) -> bool:
    """Whether the sign was measured for runs like this one: Pong-v5's full matches,
    batch 10 without a ramp, 200 hidden units, lr 1.5e-3 to 3e-3, gamma and RMSProp
    decay 0.99, none of the candidate settings."""
    low, high = SIGN_LEARNING_RATES
    return (
        config.env_id == SIGN_ENV_ID
        and low <= config.learning_rate <= high
        and config.gamma == 0.99
        and config.decay_rate == 0.99
        and config.batch_size == SIGN_BATCH_SIZE
        and config.ramp_from is None
        and config.max_episode_steps is None
        and config.hidden == 200
        and config.entropy_bonus == 0
        and config.w2_init_scale == 1
        and config.max_update_norm is None
        and config.lag == 0
    )


def slow_run_note(config: TrainConfig, steps_before: int, steps_after: int, running_reward: float | None) -> str | None:
    """The note to show when a batch took the run past SIGN_ENV_STEPS below the line;
    None otherwise (another batch, a run above the line, or settings never measured)."""
    if not measured(config) or running_reward is None or not steps_before < SIGN_ENV_STEPS <= steps_after:
        return None
    if running_reward >= SIGN_RUNNING_REWARD:
        return None
    return (
        f"pgpong: note: running reward {running_reward:.1f} after {steps_after / 1e6:.1f}M env steps looks slow: "
        f"measured runs below {SIGN_RUNNING_REWARD:g} here took {SLOW_TO_ZERO} env steps to reach 0, "
        f"{FAST_TO_ZERO} (docs/LEARNING.md). Training goes on."
    )
