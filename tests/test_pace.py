"""The early sign of a slow run (pace.py): when it speaks, and that a run shows it once."""

import dataclasses
import io
from typing import Any

import pytest

from conftest import ScriptedPool
from pgpong import pace
from pgpong.config import TrainConfig
from pgpong.rundir import open_run
from pgpong.runlog import LiveProgress
from pgpong.session import open_trainer

AT = pace.SIGN_ENV_STEPS


# The sign was measured with 2016's maths (the default before 2026-11-25).
MEASURED_AT: dict[str, Any] = {"entropy_bonus": 0.0, "max_update_norm": 0.0}


def test_the_note_speaks_once_below_the_line_for_the_settings_it_was_measured_at():
    default = TrainConfig(**MEASURED_AT)
    for measured_rate in (1.5e-3, 3e-3):
        assert pace.slow_run_note(dataclasses.replace(default, learning_rate=measured_rate), AT - 1, AT, -9.0)
    note = pace.slow_run_note(default, AT - 5_000, AT + 300, -10.4)
    assert note is not None and "-10.4 after 2.0M env steps" in note and "docs/LEARNING.md" in note and len(note) < 200
    assert pace.slow_run_note(default, AT - 5_000, AT + 300, -6.1) is None  # above the line: a fast run's
    assert pace.slow_run_note(default, AT + 300, AT + 5_000, -10.4) is None  # once: the batch that crosses 2M
    assert pace.slow_run_note(default, AT - 9_000, AT - 300, -10.4) is None  # not yet
    assert pace.slow_run_note(default, AT - 5_000, AT + 300, None) is None
    for unmeasured in (
        {"batch_size": 60},
        {"ramp_from": 2},
        {"max_episode_steps": 2000},
        {"hidden": 32},
        {"entropy_bonus": 0.01},
        {"w2_init_scale": 0.1},
        {"max_update_norm": 5.0},
        {"lag": 1},
        {"learning_rate": 1e-4},
        {"learning_rate": 5e-3},
        {"gamma": 0.9},
        {"decay_rate": 0.5},
        {"env_id": "PongNoFrameskip-v4"},
    ):
        assert pace.slow_run_note(dataclasses.replace(default, **unmeasured), AT - 1, AT, -15.0) is None, unmeasured


def test_the_note_speaks_for_the_default_with_its_own_figures():
    default = TrainConfig()  # the entropy bonus 0.01 with updates clipped to norm 4
    note = pace.slow_run_note(default, AT - 5_000, AT + 300, -8.2)
    assert note is not None and "4.5M-9.8M (4 of 24)" in note and "20 others 2.0M-3.2M" in note and len(note) < 200
    assert pace.slow_run_note(dataclasses.replace(default, max_update_norm=4.5), AT - 1, AT, -15.0) is None


@pytest.mark.parametrize(("score", "noted"), [(-21.0, True), (0.0, False)])
def test_a_run_shows_the_note_once_on_its_console_and_its_live_line(tmp_path, monkeypatch, score, noted):
    monkeypatch.setattr(pace, "SIGN_ENV_STEPS", 2_500)  # the scripted pool's episodes are 100 steps: batch 3 crosses
    run = open_run(tmp_path / "r", {"iterations": 5, "workers": 0, **MEASURED_AT})
    out = io.StringIO()
    with open_trainer(run, ScriptedPool([score] * 50), {}, out=out, live=True, tensorboard=False) as trainer:
        trainer.train()
        live = [o for o in trainer.log.outputs if isinstance(o, LiveProgress)]
    lines = out.getvalue().splitlines()
    notes = [n for n, line in enumerate(lines) if line.startswith("pgpong: note: running reward")]
    assert len(live) == 1
    if noted:
        assert len(notes) == 1 and "-21.0 after 0.0M env steps" in lines[notes[0]]
        assert lines[notes[0] - 1].split("|")[0].split() == ["batch", "3"]  # right after the batch that crossed
        assert live[0].tag == pace.LIVE_TAG and live[0].tag in live[0]._text()
    else:
        assert notes == [] and live[0].tag == ""
