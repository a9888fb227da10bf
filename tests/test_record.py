"""Recordings read back: frame count, size and rate of MP4 and GIF files, frames that
differ, numbered files, the GIF size limit, atomic writes and refused outputs."""

import io
from typing import Any, cast

import numpy as np
import pytest
from PIL import Image

import pgpong.record as record
from conftest import run_pgpong
from pgpong.envs import make_env
from pgpong.evaluate import match_ids, record_matches
from pgpong.policy import Params
from pgpong.rollout import play_match
from test_cli import assert_one_line_error

STEPS = 40


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    path = tmp_path_factory.mktemp("agent") / "agent.npz"
    weights = Params.initial(16, 2)
    np.savez(path, W1=weights.W1, W2=weights.W2)
    return path


def read_mp4(path):
    import imageio.v2 as imageio

    with cast(Any, imageio.get_reader(path, format="FFMPEG")) as reader:
        meta = reader.get_meta_data()
        frames = [frame for frame in reader]
    return meta, frames


def read_gif(path):
    with cast(Any, Image.open(path)) as image:
        frames, durations = [], []
        for k in range(image.n_frames):
            image.seek(k)
            durations.append(image.info["duration"])
            frames.append(np.asarray(image.convert("RGB")))
    return frames, durations


def assert_frames_differ(frames):
    changed = sum(not np.array_equal(a, b) for a, b in zip(frames[:-1], frames[1:], strict=True))
    assert changed >= len(frames) // 2  # the ball, the paddles, the panel and the bar move
    assert frames[0].std() > 10  # not a blank picture


def test_mp4_read_back(tmp_path, agent):
    out = tmp_path / "match.mp4"
    proc = run_pgpong(
        "play", str(agent), "--episodes", "1", "--workers", "0", "--max-episode-steps", str(STEPS), "--record", str(out)
    )
    assert proc.returncode == 0, proc.stderr
    assert f"{STEPS} steps, {(STEPS - 1 + 30) / 15:.0f} s at 15 fps (the end held 2 s)" in proc.stdout
    meta, frames = read_mp4(out)
    assert len(frames) == STEPS - 1 + 30  # the end held 2 s at 15 fps
    held = [np.abs(frames[-1].astype(int) - frames[k]).mean() for k in (-30, -31)]
    assert held[0] < 0.5 < held[1]  # (H.264 frames are near, not equal) the same picture, the one before not
    assert meta["fps"] == 15  # ALE/Pong-v5: 60 frames per second, 4 per step
    width, height = record.Layout(3).size
    assert frames[0].shape == (height, width, 3) and width % 16 == 0 and height % 16 == 0
    assert_frames_differ(frames)
    assert [p.name for p in tmp_path.iterdir()] == ["match.mp4"]  # no temp file left


def test_gif_read_back_with_chosen_fps_and_numbered_files(tmp_path, agent):
    out = tmp_path / "match.gif"
    proc = run_pgpong(
        "play",
        str(agent),
        "--episodes",
        "2",
        "--workers",
        "0",
        "--max-episode-steps",
        str(STEPS),
        "--record",
        str(out),
        "--record-episodes",
        "2",
        "--fps",
        "25",
    )
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["match-1.gif", "match-2.gif"]
    first, durations = read_gif(tmp_path / "match-1.gif")
    second, _ = read_gif(tmp_path / "match-2.gif")
    assert len(first) == len(second) == STEPS
    assert durations[:-1] == [40] * (len(durations) - 1) and durations[-1] == 2000  # 25 fps, the end held 2 s
    width, height = record.Layout(2).size
    assert first[0].shape == (height, width, 3)
    assert_frames_differ(first)
    assert any(not np.array_equal(a, b) for a, b in zip(first, second, strict=True))  # two different matches


def test_recorded_frames_show_the_screen_and_the_difference(agent):
    """The frame's game area is the screen scaled up; the panel lights exactly the
    difference's pixels, in the two colours."""
    from pgpong.checkpoint import load_weights

    weights = load_weights(agent)
    drawer = record.FrameDrawer(3)
    shown = []

    def observe(env, indices, values, p_up, up):
        shown.append(
            (
                env.unwrapped.rgb(),
                indices.copy(),
                values.copy(),
                drawer.draw(env.unwrapped.rgb(), indices, values, p_up, up),
            )
        )

    play_match(make_env("ALE/Pong-v5", 30), weights, match_ids(0, 1)[0], observer=observe)
    lay = drawer.layout
    for screen, indices, values, frame in shown[1:-1]:  # (the last, the end, is written over: below)
        game = frame[lay.pad : lay.pad + 630, lay.pad : lay.pad + 480]
        np.testing.assert_array_equal(game[::3, ::3], screen)
        top = drawer._diff_top()
        panel = frame[top : top + 480 : lay.cell, lay.panel_x : lay.panel_x + 480 : lay.cell].reshape(-1, 3)
        lit = np.flatnonzero((panel != record.PANEL).any(axis=1))
        np.testing.assert_array_equal(lit, np.sort(indices))
        order = np.argsort(indices)
        colours = [tuple(c) for c in panel[np.sort(indices)]]
        assert colours == [record.APPEARED if v > 0 else record.VANISHED for v in values[order]]
    screen, indices, values, end = shown[-1]
    moving = drawer.draw(screen, indices, values, 0.5, True)
    middle = (slice(top + 200, top + 280), slice(lay.panel_x, lay.panel_x + 480))
    assert (end[middle] != moving[middle]).any()  # the match's end, written across the panel


def test_default_rate_is_real_speed():
    assert record.EMULATOR_FPS / cast(Any, make_env("Pong-v0", 10).unwrapped).frames_per_step() == 20  # frameskip 2..4
    assert record.EMULATOR_FPS / cast(Any, make_env("PongNoFrameskip-v4", 10).unwrapped).frames_per_step() == 60
    assert record.gif_frame_ms(15) == 70


def test_a_recording_starts_after_the_reset_and_ends_on_the_screen_of_the_end(tmp_path, agent):
    from pgpong.checkpoint import load_weights

    recorder, screens = record.Recorder(tmp_path / "m.gif", fps=15), []

    def observe(env, indices, values, p_up, up):
        screens.append((env.unwrapped.rgb().copy(), up))
        recorder(env, indices, values, p_up, up)

    result = play_match(make_env("ALE/Pong-v5", 40), load_weights(agent), match_ids(0, 1)[0], observer=observe)
    recorder.save()
    assert [isinstance(up, tuple) for _, up in screens] == [False] * result.steps + [True]  # a move a step, the end
    assert screens[-1][1] == (result.points_for, result.points_against)
    assert (record.ended(21, 9), record.ended(3, 21), record.ended(2, 1)) == ("won 21:9", "lost 3:21", "cut at 2:1")
    frames, durations = read_gif(tmp_path / "m.gif")
    assert len(frames) == result.steps == 40
    assert durations == [70] * 39 + [2000]  # the end stays on screen for 2 s
    lay = record.Layout(2)
    games = [frame[lay.pad : lay.pad + 420, lay.pad : lay.pad + 320][::2, ::2] for frame in frames]
    np.testing.assert_array_equal(games[0], screens[1][0])  # the screen after the first step, not the reset's
    np.testing.assert_array_equal(games[-1], screens[-1][0])  # the screen as the match ended
    assert not np.array_equal(screens[0][0], screens[1][0])


def test_gif_is_cut_at_its_size_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(record, "GIF_MAX_BYTES", 50_000)
    monkeypatch.setattr(record, "GIF_CHUNK", 20)
    lines = list(record_matches(tmp_path / "long.gif", 1, Params.initial(16, 2), "ALE/Pong-v5", 200, 0, False, None))
    frames, _ = read_gif(tmp_path / "long.gif")
    assert lines[0] == f"recording match 1 to {tmp_path / 'long.gif'}: playing it again here (tens of seconds)"
    assert "cut after" in lines[1] and len(frames) < 200  # (the first line comes before the wait, the second after)
    assert len(frames) % 20 == 0


def test_a_gif_full_at_its_last_frame_is_whole_and_holds_its_end(tmp_path, monkeypatch):
    monkeypatch.setattr(record, "GIF_MAX_BYTES", 1)  # full at the first measure...
    monkeypatch.setattr(record, "GIF_CHUNK", 40)  # ...which comes with the end, the 40th frame
    lines = list(record_matches(tmp_path / "m.gif", 1, Params.initial(16, 2), "ALE/Pong-v5", 40, 0, False, None))
    frames, durations = read_gif(tmp_path / "m.gif")
    assert len(frames) == 40 and durations[-1] == 2000
    assert "cut" not in lines[1] and lines[1].endswith("(the end held 2 s)"), lines[1]


def test_interrupted_recording_leaves_no_file(tmp_path, monkeypatch):
    class Writer:  # an encoder whose output is half written when Ctrl-C comes
        def __init__(self, path, fps):
            self.path, self.frames = path, 0

        def append_data(self, frame):
            self.frames += 1
            self.path.write_bytes(b"half a video")
            if self.frames == 5:
                raise KeyboardInterrupt

        def close(self):
            pass

    monkeypatch.setattr(record, "_mp4_writer", Writer)
    with pytest.raises(KeyboardInterrupt):
        list(record_matches(tmp_path / "x.mp4", 1, Params.initial(16, 2), "ALE/Pong-v5", 10, 0, False, None))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "name, words",
    [
        ("match.avi", ["match.avi", "unknown extension", ".mp4"]),
        ("missing/match.mp4", ["does not exist"]),
    ],
)
def test_bad_outputs_exit_2_and_write_nothing(tmp_path, agent, name, words):
    proc = run_pgpong(
        "play", str(agent), "--workers", "0", "--max-episode-steps", "20", "--record", str(tmp_path / name)
    )
    assert_one_line_error(proc, *words)
    assert list(tmp_path.iterdir()) == []


def test_unwritable_output_directory_exits_2(agent):
    proc = run_pgpong("play", str(agent), "--workers", "0", "--max-episode-steps", "20", "--record", "/proc/match.mp4")
    assert_one_line_error(proc, "/proc/match.mp4", "cannot write")


def test_damaged_checkpoint_records_nothing(tmp_path):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"PK\x03\x04 broken")
    proc = run_pgpong("play", str(bad), "--workers", "0", "--record", str(tmp_path / "m.mp4"))
    assert_one_line_error(proc, "bad.npz")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.npz"]


class Interrupt(Exception):
    pass


def test_mp4_frames_stream_to_the_encoder_and_an_interrupted_match_leaves_no_file(tmp_path, agent):
    """MP4 frames go to ffmpeg as they are drawn (the recorder holds none), into a
    temporary file; a match stopped midway (Ctrl-C) leaves neither it nor the output."""
    env = make_env("ALE/Pong-v5", 200)
    weights = Params.initial(16, 2)
    out = tmp_path / "stream.mp4"
    recorder = record.Recorder(out, fps=15)
    seen = []

    def observe(*args):
        recorder(*args)
        seen.append(recorder.tmp.stat().st_size if recorder.tmp.exists() else 0)
        if len(seen) == 150:
            raise Interrupt()

    try:
        with pytest.raises(Interrupt):
            play_match(env, weights, match_ids(0, 1)[0], False, observer=observe)
    finally:
        recorder.discard()
    assert recorder.frames == [] and recorder.count == 149  # (the screen of the reset is left out)
    assert seen[-1] > 0  # ffmpeg was writing the file while the match played
    assert list(tmp_path.iterdir()) == []  # no partial file, no temporary file

    whole = record.Recorder(out, fps=15)
    result = play_match(env, weights, match_ids(0, 1)[0], False, observer=whole)
    whole.save()
    env.close()
    _, frames = read_mp4(out)
    assert whole.count == result.steps  # less the reset's screen, with the last point's
    assert len(frames) == whole.count - 1 + round(record.END_HOLD_S * 15)  # (the last held)
    assert [p.name for p in tmp_path.iterdir()] == ["stream.mp4"]


def test_an_output_under_a_file_is_said_to_be_not_a_directory(tmp_path, agent):
    (tmp_path / "afile").write_text("not a directory")
    for name in ("afile/match.gif", "afile/deeper/match.mp4"):
        proc = run_pgpong(
            "play", str(agent), "--workers", "0", "--max-episode-steps", "20", "--record", str(tmp_path / name)
        )
        assert_one_line_error(proc, f"{tmp_path / 'afile'} is not a directory")
        assert "does not exist" not in proc.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["afile"]


def test_fps_below_what_a_gif_can_hold_is_refused_before_playing(tmp_path, agent):
    out = tmp_path / "slow.gif"
    flags = ["--workers", "0", "--max-episode-steps", "20", "--record", str(out), "--fps", "0.001"]
    proc = run_pgpong("play", str(agent), *flags)
    assert_one_line_error(proc, "--fps must be from 0.01 to 240", "655.35 s", "got 0.001")
    assert "match 1" not in proc.stdout and list(tmp_path.iterdir()) == []
    with pytest.raises(record.RecordingError, match="--fps"):  # the library's own callers too
        record.Recorder(out, 0.001)
    # The slowest rate allowed is one every format holds: GIF's 16-bit delay, in 1/100 s.
    gif = record._gif_bytes([Image.new("P", (4, 4), k) for k in range(2)], record.MIN_FPS)
    with Image.open(io.BytesIO(gif)) as image:
        assert image.info["duration"] == 100_000  # ms: 100 s a frame


def test_a_numbered_recording_whose_place_is_a_directory_is_refused_before_playing(tmp_path, agent):
    (tmp_path / "m-2.gif").mkdir()  # the second of two recordings' file
    flags = ["--workers", "0", "--episodes", "2", "--max-episode-steps", "5", "--record-episodes", "2"]
    proc = run_pgpong("play", str(agent), *flags, "--record", str(tmp_path / "m.gif"))
    assert_one_line_error(proc, f"{tmp_path / 'm-2.gif'}: is a directory")
    assert "match 1" not in proc.stdout and [p.name for p in tmp_path.iterdir()] == ["m-2.gif"]


def test_a_directory_given_as_the_recording_is_refused_with_a_file_to_use_instead(tmp_path, agent):
    proc = run_pgpong("play", str(agent), "--workers", "0", "--max-episode-steps", "5", "--record", str(tmp_path))
    assert_one_line_error(proc, f"{tmp_path}: is a directory; record to a file in it, e.g. {tmp_path / 'match.mp4'}")
    assert "unknown extension" not in proc.stderr and list(tmp_path.iterdir()) == []
    with pytest.raises(record.RecordingError, match="cannot write in"):  # a name too long for the file system
        record.check_output(tmp_path / ("m" * 300 + ".mp4"))
