import numpy as np

from pgpong.frames import D, dense_difference, preprocess, sparse_difference, to_dense

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


def test_frame_differ_equals_the_plain_functions_on_real_frames():
    from pgpong.envs import make_gymnasium_env
    from pgpong.frames import FrameDiffer

    env = make_gymnasium_env("ALE/Pong-v5")
    obs, _ = env.reset(seed=3)
    differ = FrameDiffer()
    differ.reset(differ.mask(obs))
    previous = preprocess(obs)
    rng = np.random.default_rng(0)
    nonzero_steps = 0
    for _ in range(300):
        indices, values = differ.difference(differ.mask(obs))
        current = preprocess(obs)
        ref_indices, ref_values = sparse_difference(current, previous)
        previous = current
        np.testing.assert_array_equal(indices, ref_indices)
        np.testing.assert_array_equal(values, ref_values)
        assert values.dtype == np.int8
        nonzero_steps += len(indices) > 0
        obs, *_ = env.step(int(rng.integers(2, 4)))
    assert nonzero_steps > 200  # the ball and paddles really moved
