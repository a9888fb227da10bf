"""The one module that knows Gymnasium and ale-py."""

from __future__ import annotations

import warnings

import gymnasium as gym

UP, DOWN = 2, 3  # ALE calls them RIGHT and LEFT; in Pong they move the paddle up and down


class UnknownEnvironment(ValueError):
    """The environment id is not registered with Gymnasium."""


def _register() -> None:
    import ale_py

    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)  # no banner on every start
    gym.register_envs(ale_py)


def check_env_id(env_id: str) -> None:
    """Raise UnknownEnvironment with a helpful message if env_id cannot be made."""
    _register()
    try:
        gym.spec(env_id)
    except gym.error.Error as exc:
        pong = sorted(i for i in gym.registry if "Pong" in i and "ram" not in i)
        raise UnknownEnvironment(
            f"unknown environment id {env_id!r} ({exc}); Pong ids: {', '.join(pong)}"
        ) from None


def make_env(env_id: str, max_episode_steps: int | None = None, endless: bool = False) -> gym.Env:
    """Create the environment once; episodes reset it with their own seed.

    endless=True keeps starting new matches inside one episode until
    max_episode_steps: a long episode on demand, for memory measurements.
    """
    _register()
    with warnings.catch_warnings():
        # Pong-v0 is 'out of date' for Gymnasium, but it is the 2016 setting we support.
        warnings.simplefilter("ignore")
        if not endless:
            return gym.make(env_id, max_episode_steps=max_episode_steps, disable_env_checker=True)
        env = _EndlessMatches(gym.make(env_id, disable_env_checker=True))
        return gym.wrappers.TimeLimit(env, max_episode_steps) if max_episode_steps else env


class _EndlessMatches(gym.Wrapper):
    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if terminated:
            obs, info = self.env.reset()
        return obs, reward, False, truncated, info
