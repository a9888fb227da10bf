"""The one module that knows Gymnasium and ale-py."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from time import perf_counter
from typing import Any, cast

import gymnasium as gym
import numpy as np

from pgpong.errors import PgpongError, clipped
from pgpong.frames import SCREEN, D, PaletteDiffer

UP, DOWN = 2, 3  # ALE calls them RIGHT and LEFT; in Pong they move the paddle up and down


class UnknownEnvironment(PgpongError, ValueError):
    """The environment id is not registered with Gymnasium."""


def _register() -> None:
    import ale_py

    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)  # no banner on every start
    gym.register_envs(ale_py)


def check_env_id(env_id: str) -> None:
    """Raise UnknownEnvironment with a helpful message if env_id cannot be made."""
    _register()
    pong = sorted(i for i in gym.registry if "Pong" in i and "-ram" not in i)
    if len(env_id) > 100:  # (no id is so long: a damaged file's, not to be echoed whole)
        raise UnknownEnvironment(f"unknown environment id {clipped(env_id, repr)}; Pong ids: {', '.join(pong)}")
    try:
        spec = gym.spec(env_id)
    except gym.error.Error as exc:
        raise UnknownEnvironment(f"unknown environment id {env_id!r} ({exc}); Pong ids: {', '.join(pong)}") from None
    if "ale_py" not in str(spec.entry_point) or spec.kwargs.get("obs_type", "rgb") != "rgb":
        raise UnknownEnvironment(
            f"environment id {env_id!r} is not an RGB Atari (ALE) environment; Pong ids: {', '.join(pong)}"
        )
    if spec.kwargs.get("game") != "pong":
        raise UnknownEnvironment(
            f"environment id {env_id!r} is not Pong: pgpong's two actions and input are Pong's; "
            f"Pong ids: {', '.join(pong)}"
        )


def emulator_settings(env_id: str) -> dict[str, Any]:
    """How Gymnasium's id drives ALE: frameskip (an int, or a (low, high) range),
    repeat_action_probability and max_num_frames_per_episode, from its registration."""
    _register()
    kwargs = gym.spec(env_id).kwargs
    return {
        "frameskip": kwargs.get("frameskip", 4),
        "repeat_action_probability": float(kwargs.get("repeat_action_probability", 0.25)),
        "max_num_frames_per_episode": kwargs.get("max_num_frames_per_episode"),
    }


def make_env(
    env_id: str, max_episode_steps: int | None = None, endless: bool = False, observation: str = "difference"
) -> SeededAtari:
    """The environment pgpong plays: created once, reset with each episode's seed,
    observing the network's input of docs/ALGORITHM.md section 2 as (indices, values), or with
    observation="rgb" the RGB frames themselves (for the original algorithm).

    endless=True keeps starting new matches inside one episode until
    max_episode_steps: a long episode on demand, for memory measurements.
    """
    return SeededAtari(env_id, max_episode_steps, observation=observation, endless=endless)


def make_gymnasium_env(env_id: str) -> gym.Env:
    """The environment exactly as Gymnasium makes it (the reference for speed and frames)."""
    _register()
    with warnings.catch_warnings():
        # Pong-v0 is 'out of date' for Gymnasium, but it is the 2016 setting we support.
        warnings.simplefilter("ignore")
        return gym.make(env_id, disable_env_checker=True)


class SeededAtari(gym.Env):
    """An ALE environment id, played as Gymnasium's AtariEnv plays it, with cheap seeded resets.

    Gymnasium reseeds ALE by reloading the ROM (about 150 ms on this machine, a
    quarter of a losing match's time). Instead, ALE runs with sticky actions off;
    the stickiness (each frame keeps the previous action with probability
    repeat_action_probability, as ALE does) and any random frameskip are drawn
    from the episode's own generator; and every match starts from a snapshot of
    the freshly reset emulator. An episode then depends on its seed alone.

    observation="rgb" gives Gymnasium's 210x160x3 frames, in one buffer overwritten
    by the next step. observation="difference" gives the network's input, the
    sparse difference of consecutive masks (intp indices, int8 values; empty after
    a reset), computed from ALE's palette-index screen, which is 30 times cheaper to
    fetch than the RGB one (frames.PaletteDiffer). `step_with` hands that screen and
    the previous one to a compiled function instead (the training loop's: input,
    record and network in one call). `observe_seconds` adds up the time spent
    turning screens into observations (or in that function), for the benchmark.

    endless=True starts a new match from the start snapshot when one ends, with the
    same generator, and never terminates: only max_episode_steps ends the episode.
    """

    metadata = {"render_modes": []}

    def __init__(
        self, env_id: str, max_episode_steps: int | None = None, observation: str = "rgb", endless: bool = False
    ):
        settings = emulator_settings(env_id)
        self.sticky = settings["repeat_action_probability"]
        self.frameskip = settings["frameskip"]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self._atari: Any = gym.make(env_id, repeat_action_probability=0.0, disable_env_checker=True).unwrapped
        self.ale: Any = getattr(self._atari, "ale")  # noqa: B009 - AtariEnv's attribute, untyped in gymnasium
        self.action_space = self._atari.action_space
        self.observation_space = self._atari.observation_space
        self.max_episode_steps = max_episode_steps
        self.endless = endless
        self._actions = self.ale.getMinimalActionSet()
        self._rgb: np.ndarray = np.empty((*SCREEN, 3), dtype=np.uint8)
        self._differ = PaletteDiffer(self._rgb_screen) if observation == "difference" else None
        self.observe_seconds = 0.0
        if self._differ:
            self.observation_space = gym.spaces.Tuple(
                (gym.spaces.Sequence(gym.spaces.Discrete(D)), gym.spaces.Sequence(gym.spaces.Discrete(3, start=-1)))
            )
        self._atari.reset(seed=0)  # loads the ROM, once
        # The snapshot holds the emulator but not the screen it last drew: keep that too.
        self._start = self.ale.cloneState()
        if self._differ:  # learn the start screen's colours while ALE still shows it
            self._start_screen = self.ale.getScreen()
            np.copyto(self._differ.incoming, self._start_screen)
            self._differ.start()
        else:
            self._start_screen = self._rgb_screen().copy()
        self._start_rgb = self._rgb_screen().copy()
        self._rng = np.random.default_rng(0)
        self._uniforms = np.empty(0)
        self._next_uniform = 0
        self._steps = 0
        self._held = self._actions[0]  # NOOP, as after ALE's own reset
        self._at_start = True

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
            self._uniforms, self._next_uniform = np.empty(0), 0
        self._steps = 0
        return self._restart(), {}

    def step(self, action: int):
        reward, terminated, truncated = self._advance(action)
        if not self._differ:
            if not self._at_start:  # (else an endless episode's new match: _rgb holds its start)
                self._rgb_screen()
            return self._rgb, float(reward), terminated, truncated, {}
        return self._observe(self._differ.difference), float(reward), terminated, truncated, {}

    def step_with(self, action: int, kernel: Callable, *args) -> tuple[Any, int, bool, bool]:
        """Play `action` like step(), then return kernel(new screen, previous screen,
        palette table, *args) (see PaletteDiffer.difference_with) in place of the
        observation, with the reward and the two flags."""
        reward, terminated, truncated = self._advance(action)
        differ = cast(PaletteDiffer, self._differ)
        return self._observe(differ.difference_with, kernel, *args), reward, terminated, truncated

    def _observe(self, observe: Callable, *args) -> Any:
        """observe(*args) once the new screen is in the differ's incoming buffer (after a
        restart, the start screen: the snapshot does not hold the screen ALE last drew)."""
        began = perf_counter()
        differ = cast(PaletteDiffer, self._differ)
        if self._at_start:
            np.copyto(differ.incoming, self._start_screen)
        else:
            self.ale.getScreen(differ.incoming)
        result = observe(*args)
        self.observe_seconds += perf_counter() - began
        return result

    def _advance(self, action: int) -> tuple[int, bool, bool]:
        """Play one step's frames, each keeping the previous action with probability
        `sticky` (drawn from the episode's generator); the reward and the two flags."""
        skip = self.frameskip if isinstance(self.frameskip, int) else int(self._rng.integers(*self.frameskip))
        wanted, held, act = self._actions[action], self._held, self.ale.act
        reward = 0
        for _ in range(skip):
            if self._uniform() >= self.sticky:  # else the previous action sticks for this frame
                held = wanted
            reward += act(held)
        self._held, self._at_start = held, False
        self._steps += 1
        terminated = self.ale.game_over(with_truncation=False)  # False: ALE's frame cap is truncation, below
        truncated = self.ale.game_truncated() or self._steps == self.max_episode_steps
        if terminated and self.endless:  # the next observation is a start's: empty
            self._restart()
            terminated = False
        return reward, terminated, truncated

    def _restart(self):
        """Back to the start snapshot, and the start's observation (the generator goes
        on: reset() reseeds it)."""
        self.ale.restoreState(self._start)
        self._held = self._actions[0]
        self._at_start = True
        if not self._differ:
            np.copyto(self._rgb, self._start_screen)
            return self._rgb
        np.copyto(self._differ.incoming, self._start_screen)
        return self._differ.start()

    def rgb(self) -> np.ndarray:
        """The screen as a person sees it now (210x160x3), for recordings: a copy."""
        # After a reset ALE still shows the previous match's last screen: the snapshot
        # does not hold the screen, so the start screen is kept aside.
        return self._start_rgb.copy() if self._at_start else self._rgb_screen().copy()

    def frames_per_step(self) -> float:
        """Emulator frames per agent step (the mean, for a random frameskip)."""
        if isinstance(self.frameskip, int):
            return float(self.frameskip)
        low, high = self.frameskip
        return (low + high - 1) / 2

    def _rgb_screen(self) -> np.ndarray:
        self.ale.getScreenRGB(self._rgb)
        return self._rgb

    def _uniform(self) -> float:
        if self._next_uniform == len(self._uniforms):
            self._uniforms, self._next_uniform = self._rng.random(4096), 0
        u = self._uniforms[self._next_uniform]
        self._next_uniform += 1
        return u

    def close(self) -> None:
        self._atari.close()
