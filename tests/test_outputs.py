"""The run's outputs: TensorBoard events read back as TensorBoard reads them (one value
per batch per tag, also after a resume that replays batches), plain lines only when
output is not a terminal, a live line that redraws on a terminal."""

import dataclasses
import io
import os
import re
from pathlib import Path
from typing import cast

import pytest

from conftest import run_pgpong
from pgpong.runlog import DIAGNOSTICS, BatchRow, ConsoleLines, LiveProgress, RunLog, read_progress

TAGS = [
    "charts/running_reward",
    "charts/episodic_return",
    "charts/episodic_return_min",
    "charts/episodic_return_max",
    "charts/episodic_length",
    "charts/SPS",
    "time/batch_s",
    "time/rmsprop_step_s",
    "time/sum_gradients_s",
    *(f"diagnostics/{name}" for name in DIAGNOSTICS),
]
COMMON = [
    "--workers",
    "0",
    "--batch-size",
    "2",
    "--max-episode-steps",
    "120",
    "--hidden",
    "8",
    "--checkpoint-every",
    "0",
]


def scalars(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    return acc, {tag: acc.Scalars(tag) for tag in acc.Tags()["scalars"]}


def test_a_run_resumed_within_the_same_second_keeps_the_last_ones_events(tmp_path):
    """tensorboardX names an event file by its second and opens it "wb": two sinks
    opened within one second once wrote to the same file, the second emptying the
    first's (test_tensorboard_one_value... then saw only the resumed run's steps)."""
    from pgpong.runlog import TensorBoard

    row = BatchRow(1, 1, 100, 1.0, 1.0, -21.0, -21.0, -21, -21, 100.0, 100.0, 1, 1, 0)
    first = TensorBoard(tmp_path, None, {})
    first.end_batch(row, {})
    first.close()
    second = TensorBoard(tmp_path, 100, {})  # resumed at step 100, at once
    second.end_batch(dataclasses.replace(row, batch=2, env_steps=200, running_reward=-20.0), {})
    second.close()
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 2
    _, found = scalars(tmp_path)
    assert [(e.step, e.value) for e in found["charts/running_reward"]] == [(100, -21.0), (200, -20.0)]


def test_tensorboard_one_value_per_batch_and_tag_across_a_replaying_resume(tmp_path):
    run_dir = tmp_path / "run"
    assert run_pgpong("train", *COMMON, "--iterations", "3", "--run-dir", str(run_dir)).returncode == 0
    # A driver killed after writing batch 3's events but before its checkpoint:
    (run_dir / "checkpoints" / "ckpt-000003.npz").unlink()
    proc = run_pgpong("train", *COMMON, "--iterations", "4", "--run-dir", str(run_dir))
    assert proc.returncode == 0, proc.stderr
    assert "resuming from batch 2" in proc.stdout
    rows = read_progress(run_dir / "progress.csv")
    assert [r["batch"] for r in rows] == ["1", "2", "3", "4"]
    acc, found = scalars(run_dir)
    assert set(TAGS) <= set(found)
    steps = [int(r["env_steps"]) for r in rows]
    for tag in TAGS:
        assert [e.step for e in found[tag]] == steps, tag
    assert [e.value for e in found["charts/running_reward"]] == pytest.approx(
        [float(r["running_reward"]) for r in rows], abs=1e-4
    )
    assert [e.value for e in found["charts/episodic_length"]] == pytest.approx(
        [float(r["episode_len_mean"]) for r in rows], abs=1e-3
    )
    for name in DIAGNOSTICS:  # entropy, p_up, ..., as progress.csv has them
        assert [e.value for e in found[f"diagnostics/{name}"]] == pytest.approx(
            [float(r[name]) for r in rows], rel=1e-5
        ), name
    assert len(acc.Tensors("settings/text_summary")) == 1  # the settings, once


def test_off_a_terminal_train_prints_exactly_the_plain_lines(tmp_path):
    proc = run_pgpong("train", *COMMON, "--iterations", "3", "--run-dir", str(tmp_path / "r"))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert re.fullmatch(
        r"pgpong: new run in .*: ALE/Pong-v5, batch 2, lr 0\.002, RMSProp decay 0\.99 "
        r"\(the batch rule at 10 and below\); entropy bonus 0\.01; updates clipped to norm 4, "
        r"on this process \(no Ray\)",
        lines[0],
    )
    batch_line = (
        r"batch +\d+ \| 2 episodes in +[\d.]+ s \| running reward +-?[\d.]+ \| score +-?[\d.]+ \| +[\d,]+ steps/s"
    )
    assert [bool(re.fullmatch(batch_line, line)) for line in lines[1:4]] == [True] * 3, lines
    assert lines[4].startswith("pgpong: done after 3 batches") and len(lines) == 5
    assert "\r" not in proc.stdout and "\x1b" not in proc.stdout and proc.stderr == ""


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def test_live_line_on_a_terminal_then_the_permanent_line(monkeypatch):
    monkeypatch.setenv("TERM", "xterm")
    out = FakeTerminal()
    log = RunLog(Path("/nonexistent/progress.csv"), out=out, outputs=[LiveProgress(out)])
    log.begin_batch(7, 4, -20.5)
    log.episode(3, 3000, -20.25)
    live = cast(LiveProgress, log.outputs[0])
    assert live.line._live is not None
    live.line._live.refresh()
    row = BatchRow(7, 28, 9000, 10.0, 1.5, -20.1, -20.0, -21, -19, 1000.0, 6000.0, 4, 2, 0)
    log.show(row)  # every output but progress.csv (no file here)
    assert live.line._live is None  # stopped before the permanent line
    text = out.getvalue()
    assert "3/4 episodes" in text and "running reward -20.25" in text
    assert text.rstrip().endswith(row.console_line())


def test_on_a_narrow_terminal_the_batch_line_is_shortened_not_wrapped(monkeypatch):
    import fcntl
    import pty
    import struct
    import termios

    monkeypatch.setenv("TERM", "xterm")
    row = BatchRow(7, 70, 90000, 10.0, 1.5, -20.1, -20.0, -21, -19, 1000.0, 12345.0, 10, 2, 0)
    seen = {}
    for columns in (120, 94, 80, 60, 40):  # (the whole line is 94 characters)
        master, terminal = pty.openpty()
        fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
        with open(terminal, "w") as out:
            ConsoleLines(out).end_batch(row, {})
        seen[columns] = os.read(master, 4096).decode().rstrip("\r\n")
        os.close(master)
    assert seen[120] == row.console_line() and len(seen[120]) == 94
    assert seen[94] == seen[80] == "batch     7 |   1.5 s | running reward  -20.10 | score -20.00 |  12,345 steps/s"
    assert seen[60] == seen[40] == "batch     7 | running reward  -20.10 | score -20.00"  # (40 wraps it)
    plain = io.StringIO()
    ConsoleLines(plain).end_batch(row, {})  # off a terminal: the whole line, whatever $COLUMNS says
    assert plain.getvalue() == row.console_line() + "\n"


def test_on_a_narrow_terminal_a_message_breaks_between_words(monkeypatch):
    import fcntl
    import pty
    import struct
    import termios

    monkeypatch.setenv("TERM", "xterm")
    message = (
        "pgpong: stopped. The newest checkpoint is runs/n/checkpoints/ckpt-000052.npz; resume with:\n"
        "  pgpong train --run-dir runs/n"
    )
    seen = {}
    for columns in (120, 60, 20):
        master, terminal = pty.openpty()
        fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
        with open(terminal, "w") as out:
            RunLog(Path("/nonexistent/progress.csv"), out=out, outputs=[]).say(message)
        seen[columns] = os.read(master, 4096).decode().replace("\r\n", "\n").rstrip("\n").split("\n")
        os.close(master)
    assert seen[120] == message.split("\n")  # it fits: as given
    assert seen[60] == [
        "pgpong: stopped. The newest checkpoint is",
        "  runs/n/checkpoints/ckpt-000052.npz; resume with:",
        "  pgpong train --run-dir runs/n",  # (a command on its own line stays whole)
    ]
    assert max(map(len, seen[60])) < 60
    assert seen[20] == message.split("\n")  # too narrow to break usefully: the terminal wraps it
    plain = io.StringIO()
    RunLog(Path("/nonexistent/progress.csv"), out=plain, outputs=[]).say(message)
    assert plain.getvalue() == message + "\n"  # off a terminal: as given


def test_live_lines_say_no_speed_before_a_match_has_ended():
    """Steps are counted as matches end: before the first, the speed is '-', not a 0
    that reads as a stall."""
    from pgpong.evaluate import MatchStatus

    live = LiveProgress(io.StringIO())
    live.begin_batch(2, 4, -19.04)
    before = r"batch     2 \| 0/4 episodes \| - steps/s \| +[\d.]+ s \| running reward -19\.04"
    assert re.fullmatch(before, live._text())
    live.episode(1, 900, -19.1)
    assert re.search(r"\| 1/4 episodes \| [\d,]+ steps/s \|", live._text()) and "| - steps/s" not in live._text()
    status = MatchStatus(10)
    assert re.fullmatch(r"playing: 0/10 matches done \| - steps/s \| +[\d.]+ s", status.text())
    status.matches, status.steps = 1, 1000
    assert re.search(r"1/10 matches done \| [1-9][\d,]* steps/s", status.text())


def test_live_line_stays_off_without_a_terminal():
    out = io.StringIO()
    live = LiveProgress(out)
    live.begin_batch(1, 2, None)
    assert live.line._live is None
    live.close()
    assert out.getvalue() == ""
