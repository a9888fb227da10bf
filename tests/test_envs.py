"""pgpong's seeded environment against Gymnasium's own AtariEnv: the same frames,
rewards and ends for the same actions; sticky actions and frameskip as ALE does them."""

import gymnasium as gym
import numpy as np
import pytest

from pgpong.envs import DOWN, UP, SeededAtari, UnknownEnvironment, check_env_id, make_env, make_gymnasium_env


def play(env, actions):
    frames, rewards, ends = [], [], []
    for a in actions:
        obs, r, term, trunc, _ = env.step(a)
        frames.append(obs.copy())
        rewards.append(r)
        ends.append((term, trunc))
        if term or trunc:
            break
    return frames, rewards, ends


def assert_same_play(ours, theirs, actions):
    a, b = play(ours, actions), play(theirs, actions)
    assert len(a[0]) == len(b[0])
    for x, y in zip(a[0], b[0], strict=True):
        np.testing.assert_array_equal(x, y)
    assert a[1] == b[1] and a[2] == b[2]
    return a


@pytest.mark.parametrize("env_id", ["ALE/Pong-v5", "PongNoFrameskip-v4"])
def test_same_frames_as_gymnasium_without_sticky_actions(env_id):
    actions = np.random.default_rng(0).choice([UP, DOWN], size=800)
    ours = SeededAtari(env_id)
    ours.sticky = 0.0  # Gymnasium's stickiness cannot be seeded per episode; compare without it
    theirs = (
        make_gymnasium_env(env_id)
        if env_id.startswith("PongNo")
        else gym.make(env_id, repeat_action_probability=0.0, disable_env_checker=True)
    )
    for match in range(2):  # the second match checks that our snapshot reset equals ALE's reset
        np.testing.assert_array_equal(ours.reset(seed=match)[0], theirs.reset(seed=match if match == 0 else None)[0])
        frames, rewards, _ = assert_same_play(ours, theirs, actions)
        assert any(rewards) and len(frames) == 800


def test_full_stickiness_holds_the_first_action():
    ours = SeededAtari("ALE/Pong-v5")
    ours.sticky = 1.0  # every frame keeps the previous action: NOOP from the reset on
    theirs = gym.make("ALE/Pong-v5", repeat_action_probability=0.0, disable_env_checker=True)
    ours.reset(seed=1), theirs.reset(seed=1)
    a, _, _ = play(ours, [UP, DOWN] * 150)
    b, _, _ = play(theirs, [0] * 300)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


class RecordingALE:
    def __init__(self, ale):
        self.ale, self.acted = ale, []

    def act(self, action):
        self.acted.append(action)
        return self.ale.act(action)

    def __getattr__(self, name):
        return getattr(self.ale, name)


def test_sticky_actions_per_frame_at_the_spec_rate():
    env = SeededAtari("ALE/Pong-v5")
    assert env.sticky == 0.25 and env.frameskip == 4
    env.ale = recorder = RecordingALE(env.ale)
    env.reset(seed=7)
    wanted = [UP, DOWN] * 1500  # alternate, so every stuck frame shows
    steps = 0
    for a in wanted:
        steps += 1
        if env.step(a)[2]:
            break
    actions = env.ale.getMinimalActionSet()
    acts = recorder.acted
    assert len(acts) == 4 * steps
    # Every frame: it keeps the previous frame's action with probability 0.25, else takes
    # the wanted one. So a step plays j frames of the previous action, then only the wanted one.
    stuck = []
    held = actions[0]  # NOOP after a reset
    for t in range(steps):
        frames = acts[4 * t : 4 * t + 4]
        j = next((i for i, f in enumerate(frames) if f != held), 4)
        assert all(f == actions[wanted[t]] for f in frames[j:]), (t, frames)
        stuck.append(j)
        held = frames[-1]
    n = len(stuck)
    # P(j >= k) = 0.25**k: each further stuck frame is a new draw
    for k, expected in ((1, 0.25), (2, 0.0625), (3, 0.015625)):
        share = sum(j >= k for j in stuck) / n
        assert abs(share - expected) < 4 * (expected * (1 - expected) / n) ** 0.5 + 1e-3, (k, share)


def test_same_seed_same_match_different_seed_different_match():
    env = SeededAtari("ALE/Pong-v5")
    actions = np.random.default_rng(1).choice([UP, DOWN], size=300)
    env.reset(seed=3)
    first = play(env, actions)[0]
    env.reset(seed=4)
    other = play(env, actions)[0]
    env.reset(seed=3)
    again = play(env, actions)[0]
    assert all(np.array_equal(x, y) for x, y in zip(first, again, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(first, other, strict=True))


def test_pong_v0_has_random_frameskip_2_to_4():
    env = SeededAtari("Pong-v0")
    env.reset(seed=0)
    skips = set()
    for _ in range(200):
        before = env.ale.getEpisodeFrameNumber()
        env.step(UP)
        skips.add(env.ale.getEpisodeFrameNumber() - before)
    assert skips == {2, 3, 4}


def test_time_limit_truncates():
    env = SeededAtari("ALE/Pong-v5", max_episode_steps=10)
    env.reset(seed=0)
    ends = [env.step(UP)[3] for _ in range(10)]
    assert ends == [False] * 9 + [True]


def test_endless_episode_starts_a_new_match_where_one_ends():
    actions = np.random.default_rng(3).choice([UP, DOWN], size=3000)
    one, endless = SeededAtari("ALE/Pong-v5", observation="difference"), make_env("ALE/Pong-v5", 3000, endless=True)
    one.reset(seed=8)
    endless.reset(seed=8)
    steps = 0
    for action in actions:
        steps += 1
        a, reward_a, terminated, _, _ = one.step(action)
        b, reward_b, endless_terminated, truncated, _ = endless.step(action)
        assert (reward_a, endless_terminated, truncated) == (reward_b, False, False)
        if terminated:
            break
        np.testing.assert_array_equal(a[0], b[0])
    assert terminated and steps > 500
    assert len(b[0]) == 0  # the next match's first input, as after a reset
    one.reset(seed=8)
    np.testing.assert_array_equal(endless.rgb(), one.rgb())  # the start screen
    moved = sum(len(endless.step(action)[0][0]) > 0 for action in actions[:50])
    assert moved > 40  # and the new match goes on


@pytest.mark.parametrize("env_id", ["Pong-v9", "CartPole-v1", "ALE/Pong-ram-v5"])
def test_non_pong_pixel_ids_are_refused(env_id):
    with pytest.raises(UnknownEnvironment):
        check_env_id(env_id)


@pytest.mark.parametrize("env_id", ["ALE/Pong-v5", "Pong-v0", "PongNoFrameskip-v4"])
def test_difference_observations_equal_preprocessed_rgb_frames(env_id):
    from pgpong.frames import preprocess, sparse_difference

    rgb, ours = SeededAtari(env_id, observation="rgb"), SeededAtari(env_id, observation="difference")
    actions = np.random.default_rng(2).choice([UP, DOWN], size=1500)
    moved = 0
    for seed in (0, 1):
        previous = preprocess(rgb.reset(seed=seed)[0])
        indices, values = ours.reset(seed=seed)[0]
        assert len(indices) == len(values) == 0  # the first input is all zeros
        for action in actions:
            a, ra, ta, _, _ = rgb.step(action)
            (indices, values), rb, tb, _, _ = ours.step(action)
            current = preprocess(a)
            expected = sparse_difference(current, previous)
            previous = current
            np.testing.assert_array_equal(indices, expected[0])
            np.testing.assert_array_equal(values, expected[1])
            assert (ra, ta) == (rb, tb)
            moved += len(indices) > 0
            if ta:
                break
    assert moved > 1000  # the ball and paddles really moved
    assert values.dtype == np.int8 and ours.observe_seconds > 0
