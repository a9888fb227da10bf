"""Recordings of a policy playing: each frame is the game as a person sees it and,
beside it, what the network sees (the 80x80 difference frame it was given, +1 and -1
in two colours) with its probability of moving up. MP4 through imageio-ffmpeg (whose
wheel ships ffmpeg), GIF through Pillow; both written atomically (temp file, rename)."""

from __future__ import annotations

import contextlib
import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from pgpong.errors import PgpongError
from pgpong.frames import SIDE
from pgpong.rollout import MATCH_POINTS

EMULATOR_FPS = 60  # Atari frames per second
# A GIF frame lasts a whole number of hundredths of a second, at most 65,535 (a 16-bit
# field: 655.35 s): 0.01 fps (100 s a frame) is well inside it, and MP4 takes it too.
MIN_FPS = 0.01
MAX_FPS = 240.0
GIF_MAX_BYTES = 20 * 2**20  # a GIF is cut before it grows past about this
GIF_CHUNK = 200  # frames encoded at a time to measure a GIF's size as it grows
END_HOLD_S = 2.0  # how long a recording's last frame, the match's end, stays on screen
MP4_BLOCK = 16  # H.264 macro block: frame sides are made multiples of it, not resized by imageio
FORMATS = (".mp4", ".gif")

BACKGROUND = (16, 20, 26)
PANEL = (0, 0, 0)
APPEARED = (255, 150, 40)  # +1: a paddle or ball pixel that is new in this frame
VANISHED = (70, 160, 255)  # -1: one that was there in the previous frame
TEXT = (225, 225, 225)
DIM = (140, 145, 150)
BAR_UP = (90, 200, 110)
BAR_BACK = (55, 60, 68)
# The palette GIF frames are mapped to: every colour drawn here and in Pong's screen.
PONG_COLOURS = [(144, 72, 17), (213, 130, 74), (92, 186, 92), (236, 236, 236), (109, 118, 43), (0, 0, 0)]


class RecordingError(PgpongError, ValueError):
    """The recording cannot be written where or as asked (the message says why)."""


def check_output(path: Path, formats: tuple[str, ...] = FORMATS) -> None:
    """Refuse, before anything is played, an output file pgpong cannot write."""
    try:
        folder_named = path.is_dir()  # named as a folder, or a file's place taken by one
    except OSError:  # (a name too long, say: the probe below says so)
        folder_named = False
    if folder_named:
        named = path.suffix.lower() in formats
        hint = "" if named else f"; record to a file in it, e.g. {path / ('match' + formats[0])}"
        raise RecordingError(f"{path}: is a directory{hint}")
    if path.suffix.lower() not in formats:
        raise RecordingError(f"{path}: unknown extension {path.suffix or '(none)'!r}; use {' or '.join(formats)}")
    folder = path.parent
    probe = folder / f".{path.name}.{os.getpid()}.probe"
    try:
        if not folder.is_dir():
            there = next((p for p in (folder, *folder.parents) if p.exists()), folder)  # the nearest that exists
            if there != folder and there.is_dir():
                raise RecordingError(f"{path}: the directory {folder} does not exist; make it first")
            raise RecordingError(f"{path}: {there} is not a directory")
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise RecordingError(f"{path}: cannot write in {folder} ({exc.strerror or exc})") from None


def fps_error(fps: float) -> str:
    return f"--fps must be from {MIN_FPS:g} to {MAX_FPS:g} (a GIF frame lasts at most 655.35 s), got {fps:g}"


def numbered(path: Path, k: int, count: int) -> Path:
    """The file of the k-th recorded match (0-based): the path itself for a single one."""
    return path if count == 1 else path.with_name(f"{path.stem}-{k + 1:0{len(str(count))}d}{path.suffix}")


@dataclass(frozen=True)
class Layout:
    """Where things go on a frame, for a scale s (the game is drawn s times its size)."""

    scale: int

    @property
    def pad(self) -> int:
        return 4 * self.scale

    @property
    def game(self) -> tuple[int, int]:  # width, height of the scaled screen
        return 160 * self.scale, 210 * self.scale

    @property
    def cell(self) -> int:  # screen pixels per difference-frame pixel
        return 2 * self.scale

    @property
    def panel_x(self) -> int:
        return 2 * self.pad + self.game[0]

    @property
    def size(self) -> tuple[int, int]:
        width = self.panel_x + SIDE * self.cell + self.pad
        height = self.game[1] + 2 * self.pad
        return _round_up(width, MP4_BLOCK), _round_up(height, MP4_BLOCK)


def _round_up(n: int, block: int) -> int:
    return -(-n // block) * block


Move = bool | tuple[int, int]  # a step's action (True: up), or the match's end: its points (for, against)


def ended(points_for: int, points_against: int) -> str:
    """The end of a match as a recording's last frame says it (Pong's own digits lag a frame)."""
    verdict = "won" if points_for >= MATCH_POINTS else "lost" if points_against >= MATCH_POINTS else "cut at"
    return f"{verdict} {points_for}:{points_against}"


class FrameDrawer:
    """Composes one picture per step from the screen, the difference and P(UP)."""

    def __init__(self, scale: int):
        self.layout = lay = Layout(scale)
        self.font = ImageFont.load_default(size=5 * scale + 1)
        self.small = ImageFont.load_default(size=4 * scale + 1)
        self.large = ImageFont.load_default(size=16 * scale)
        self.base = Image.new("RGB", lay.size, BACKGROUND)
        draw = ImageDraw.Draw(self.base)
        x, top = lay.panel_x, self._diff_top()
        draw.text((x, lay.pad), "what the network sees", font=self.font, fill=TEXT)
        draw.text((x, lay.pad + 7 * scale), "difference of two 80x80 frames", font=self.small, fill=DIM)
        legend_y = top + SIDE * lay.cell + 3 * scale
        box = 4 * scale
        draw.rectangle((x, legend_y, x + box, legend_y + box), fill=APPEARED)
        draw.text((x + box + 2 * scale, legend_y - scale // 2), "+1 appeared", font=self.small, fill=TEXT)
        x2 = x + 42 * scale
        draw.rectangle((x2, legend_y, x2 + box, legend_y + box), fill=VANISHED)
        draw.text((x2 + box + 2 * scale, legend_y - scale // 2), "-1 vanished", font=self.small, fill=TEXT)
        x3 = x + 84 * scale
        draw.text((x3, legend_y - scale // 2), "agent: green, right", font=self.small, fill=DIM)

    def _diff_top(self) -> int:
        return self.layout.pad + 16 * self.layout.scale

    def draw(self, screen: np.ndarray, indices: np.ndarray, values: np.ndarray, p_up: float, up: Move) -> np.ndarray:
        """One frame (height, width, 3) uint8: the step's move, or the match's end (its points)."""
        lay, s = self.layout, self.layout.scale
        frame = np.array(self.base)
        game = screen.repeat(s, axis=0).repeat(s, axis=1)
        frame[lay.pad : lay.pad + lay.game[1], lay.pad : lay.pad + lay.game[0]] = game
        diff = np.zeros((SIDE * SIDE, 3), dtype=np.uint8)
        diff[:] = PANEL
        values = np.asarray(values)
        diff[np.asarray(indices)[values > 0]] = APPEARED
        diff[np.asarray(indices)[values < 0]] = VANISHED
        big = diff.reshape(SIDE, SIDE, 3).repeat(lay.cell, axis=0).repeat(lay.cell, axis=1)
        top, x = self._diff_top(), lay.panel_x
        frame[top : top + big.shape[0], x : x + big.shape[1]] = big
        image = Image.fromarray(frame)
        draw = ImageDraw.Draw(image)
        self._bar(draw, top + big.shape[0] + 12 * s, p_up, up)
        if isinstance(up, tuple):  # the end, large across the panel
            middle, said = (x + big.shape[1] // 2, top + big.shape[0] // 2), ended(*up)
            left, upper, right, lower = draw.textbbox(middle, said, font=self.large, anchor="mm")
            draw.rectangle((left - 4 * s, upper - 3 * s, right + 4 * s, lower + 3 * s), fill=BACKGROUND)
            draw.text(middle, said, font=self.large, fill=TEXT, anchor="mm")
        return np.asarray(image)

    def _bar(self, draw: ImageDraw.ImageDraw, y: int, p_up: float, up: Move) -> None:
        s, x = self.layout.scale, self.layout.panel_x
        width, height = SIDE * self.layout.cell, 6 * s
        draw.text((x, y), f"P(up) = {p_up:.2f}", font=self.font, fill=TEXT)
        move = "the end" if isinstance(up, tuple) else f"moves {'UP' if up else 'DOWN'}"
        draw.text((x + width, y), move, font=self.font, fill=TEXT, anchor="ra")
        y += 8 * s
        draw.rectangle((x, y, x + width - 1, y + height), fill=BAR_BACK)
        if p_up > 0:
            draw.rectangle((x, y, x + max(1, round(p_up * width)) - 1, y + height), fill=BAR_UP)
        middle = x + width // 2
        draw.line((middle, y - s, middle, y + height + s), fill=TEXT, width=max(1, s // 2))


class Recorder:
    """Records a match as an observer of rollout.play_match. MP4 frames go to the
    encoder as they are drawn (memory stays flat however long the match), into a
    temporary file that `save` renames; GIF frames (a byte a pixel) are kept and
    written by `save`, cut at about GIF_MAX_BYTES. `discard` (or an error, or Ctrl-C
    in the caller's `finally`) leaves no file behind. The screen right after the reset
    is left out: the game has not drawn a frame yet (it shows in other colours, and the
    network sees no difference); the screen of the last point ends the recording."""

    def __init__(self, path: Path, fps: float, scale: int | None = None):
        if not MIN_FPS <= fps <= MAX_FPS:
            raise RecordingError(f"{path}: {fps_error(fps)}")
        self.path = path
        self.fps = fps
        self.gif = path.suffix.lower() == ".gif"
        self.drawer = FrameDrawer(scale or (2 if self.gif else 3))
        self.count = 0  # steps drawn (an MP4 holds the last more times: see seconds)
        self.frames: list[Image.Image] = []  # a GIF's frames
        self.cut = False  # frames were left out: the GIF had reached its size limit
        self.ended = False  # the last frame drawn is the match's end (held END_HOLD_S)
        self._full = False
        self.tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
        self._writer: Any = None  # the MP4 encoder, opened at the first frame
        self._measured_bytes = 0
        self._measured_frames = 0
        self._palette = _palette_image() if self.gif else None
        self._reset_seen = False

    def __call__(self, env, indices, values, p_up: float, up: Move) -> None:
        if not self._reset_seen:
            self._reset_seen = True
            return
        if self._full:
            self.cut = True
            return
        frame = self.drawer.draw(env.unwrapped.rgb(), indices, values, p_up, up)
        self.count += 1
        self.ended = isinstance(up, tuple)
        if not self.gif:
            if self._writer is None:
                self._writer = _mp4_writer(self.tmp, self.fps)
            for _ in range(self._held_frames() if self.ended else 1):
                self._writer.append_data(frame)
            return
        self.frames.append(Image.fromarray(frame).quantize(palette=self._palette, dither=Image.Dither.NONE))
        if len(self.frames) - self._measured_frames == GIF_CHUNK:  # size so far, a chunk at a time
            self._measured_bytes += len(_gif_bytes(self.frames[self._measured_frames :], self.fps))
            self._measured_frames = len(self.frames)
            if self._measured_bytes > 0.95 * GIF_MAX_BYTES:
                self._full = True

    def _held_frames(self) -> int:
        return max(1, round(END_HOLD_S * self.fps))

    @property
    def seconds(self) -> float:
        """How long the recording plays."""
        if not self.ended:
            return self.count / self.fps
        return (self.count - 1) / self.fps + (self._held_frames() / self.fps if not self.gif else END_HOLD_S)

    def save(self) -> Path:
        """Finish the file and put it in place atomically; return its path."""
        if not self.count:
            self.discard()
            raise RecordingError(f"{self.path}: nothing to record (no frame)")
        try:
            if self.gif:
                self.tmp.write_bytes(_gif_bytes(self.frames, self.fps, held=self.ended))
            else:
                self._writer.close()
                self._writer = None
            os.replace(self.tmp, self.path)
        except OSError as exc:  # the place became a directory or unwritable while the match played
            raise RecordingError(f"{self.path}: cannot write it ({exc.strerror or exc})") from None
        finally:
            self.discard()
        return self.path

    def discard(self) -> None:
        """Close the encoder and remove the temporary file, if any."""
        writer, self._writer = self._writer, None
        if writer is not None:
            with contextlib.suppress(Exception):  # an encoder that failed: its file goes anyway
                writer.close()
        self.tmp.unlink(missing_ok=True)


def _mp4_writer(path: Path, fps: float) -> Any:
    import imageio.v2 as imageio

    # Frame sides are already multiples of 16, so imageio does not resize them.
    return imageio.get_writer(
        path,
        format="FFMPEG",
        mode="I",
        fps=fps,
        codec="libx264",
        quality=7,
        macro_block_size=MP4_BLOCK,
        ffmpeg_log_level="error",
    )


def _gif_bytes(frames: list[Image.Image], fps: float, held: bool = False) -> bytes:
    """The GIF of `frames`; held: its last frame (the match's end) stays END_HOLD_S."""
    out = io.BytesIO()
    each = gif_frame_ms(fps)
    durations = [each] * (len(frames) - 1) + [max(each, round(END_HOLD_S * 1000)) if held else each]
    frames[0].save(
        out,
        format="GIF",
        save_all=True,
        append_images=frames[1:],
        duration=durations,
        loop=0,
        optimize=False,
        disposal=1,
    )
    return out.getvalue()


def gif_frame_ms(fps: float) -> int:
    """A GIF frame lasts a whole number of hundredths of a second: the nearest to 1/fps
    (15 fps -> 70 ms, about 14.3 frames per second)."""
    return max(2, round(100 / fps)) * 10


def _palette_image() -> Image.Image:
    colours = [BACKGROUND, PANEL, APPEARED, VANISHED, TEXT, DIM, BAR_UP, BAR_BACK, *PONG_COLOURS]
    flat = [c for colour in colours for c in colour]
    palette = Image.new("P", (1, 1))
    palette.putpalette(flat + flat[-3:] * (256 - len(colours)))
    return palette
