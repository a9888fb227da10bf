import numpy as np

from pgpong.frames import D, preprocess, sparse_difference
from pgpong.original import dense_difference, to_dense

BACKGROUND = (144, 72, 17)  # Pong's brown background
OTHER_BACKGROUND = (109, 118, 43)


def blank_frame() -> np.ndarray:
    frame = np.zeros((210, 160, 3), dtype=np.uint8)
    frame[:] = BACKGROUND
    return frame


def test_mask_marks_paddles_and_ball_only():
    frame = blank_frame()
    frame[50:60, 20:24] = OTHER_BACKGROUND  # second background colour: still background
    frame[35 + 2 * 10, 2 * 5] = (92, 186, 92)  # one pixel of our paddle: mask (10, 5)
    frame[35 + 2 * 40, 2 * 70] = (236, 236, 236)  # the ball: mask (40, 70)
    frame[35 + 2 * 40 + 1, 2 * 70 + 1] = (236, 236, 236)  # odd row/col: dropped by the downsampling
    frame[10, 10] = (236, 236, 236)  # the score area above row 35: cropped away
    frame[200, 10] = (236, 236, 236)  # below row 194: cropped away
    frame[35 + 2 * 79, 2 * 79] = (213, 130, 74)  # opponent colour in the last kept pixel: (79, 79)

    mask = preprocess(frame).reshape(80, 80)

    expected = np.zeros((80, 80), dtype=np.int8)
    expected[10, 5] = expected[40, 70] = expected[79, 79] = 1
    np.testing.assert_array_equal(mask, expected)


def test_only_red_channel_decides():
    frame = blank_frame()
    frame[35, 0] = (144, 255, 255)  # background red, other channels changed: still background
    assert preprocess(frame).sum() == 0


def test_sparse_difference_equals_dense():
    rng = np.random.default_rng(3)
    for _ in range(20):
        a = (rng.random(D) < 0.01).astype(np.int8)
        b = (rng.random(D) < 0.01).astype(np.int8)
        indices, values = sparse_difference(a, b)
        assert indices.dtype == np.int16 and values.dtype == np.int8
        assert set(np.unique(values)) <= {-1, 1}
        np.testing.assert_array_equal(to_dense(indices, values), dense_difference(a, b))


def test_identical_frames_give_empty_difference():
    mask = preprocess(blank_frame())
    indices, values = sparse_difference(mask, mask)
    assert len(indices) == 0 and len(values) == 0


class PaletteScreens:
    """Hand-made palette-index screens and the RGB frames they stand for."""

    COLOURS = {0: BACKGROUND, 4: OTHER_BACKGROUND, 8: (92, 186, 92), 12: (236, 236, 236), 16: (213, 130, 74)}

    def __init__(self):
        self.screen = np.zeros((210, 160), dtype=np.uint8)

    def rgb(self) -> np.ndarray:
        frame = np.zeros((210, 160, 3), dtype=np.uint8)
        for index, colour in self.COLOURS.items():
            frame[self.screen == index] = colour
        return frame


def test_palette_differ_equals_the_plain_functions():
    from pgpong.frames import PaletteDiffer

    screens = PaletteScreens()
    differ = PaletteDiffer(screens.rgb)
    screens.screen[35 + 2 * 3, 2 * 4] = 8  # paddle pixel on the first frame
    differ.incoming[:] = screens.screen
    indices, values = differ.start()
    assert len(indices) == len(values) == 0  # the first input is all zeros
    previous = preprocess(screens.rgb())
    rng = np.random.default_rng(4)
    for step in range(60):
        if step % 3 == 0:  # changes the mask cannot see: odd columns, odd rows, other background, colour swaps
            screens.screen[35 + 2 * rng.integers(80), 2 * rng.integers(80) + 1] = rng.choice([8, 12])
            screens.screen[36 + 2 * rng.integers(79), 2 * rng.integers(80)] = 12
            screens.screen[35 + 2 * rng.integers(80), 2 * rng.integers(80)] = 4
            screens.screen[screens.screen == 8] = 16
        else:  # pixels appear and disappear
            rows, cols = 35 + 2 * rng.integers(80, size=5), 2 * rng.integers(80, size=5)
            screens.screen[rows, cols] = rng.choice(list(PaletteScreens.COLOURS), size=5)
        differ.incoming[:] = screens.screen
        indices, values = differ.difference()
        current = preprocess(screens.rgb())
        expected = sparse_difference(current, previous)
        previous = current
        np.testing.assert_array_equal(indices, expected[0])
        np.testing.assert_array_equal(values, expected[1])
        assert values.dtype == np.int8
    learned = differ.foreground[list(PaletteScreens.COLOURS)]
    np.testing.assert_array_equal(learned, [0, 0, 1, 1, 1])  # each colour learned once, correctly
    assert (differ.foreground == PaletteDiffer.UNKNOWN).sum() == 256 - 5
