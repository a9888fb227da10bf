"""pgpong: policy-gradient Pong from pixels, played in parallel on Ray.

From Python (the command line `pgpong` calls the same functions)::

    import pgpong

    run = pgpong.train(iterations=3)            # a run: run.directory, run.progress, run.weights
    agent = pgpong.Agent.load()                 # the shipped agent; agent.act(frame) in any loop
    print(pgpong.evaluate_agent(agent))         # matches against the built-in player: a Summary
    pgpong.plot_learning_curve(run)             # matplotlib figures, drawn inline in a notebook
    pgpong.plot_weights(agent, units=40)

The names in __all__ are the public API; every module of the package is private.
They are loaded on first use, so `import pgpong` does not import Ray, Gymnasium or
numba. Every error pgpong raises on purpose derives from pgpong.PgpongError.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# Each public name and the module that defines it (loaded when the name is first used).
_HOME = {
    "train": "api",
    "evaluate_agent": "api",
    "plot_learning_curve": "api",
    "plot_weights": "api",
    "Run": "api",
    "Agent": "agent",
    "Summary": "evaluate",
    "BatchRow": "runlog",
    "Params": "policy",
    "PgpongError": "errors",
    "ConfigError": "config",
    "CheckpointError": "checkpoint",
    "UnknownEnvironment": "envs",
    "PlotError": "plot",
    "RecordingError": "record",
    "ClusterError": "cluster",
    "PoolError": "pool.base",
    "RunWriteError": "rundir",
    "TrainingDiverged": "trainer",
}
__all__ = [
    "__version__",
    "train",
    "evaluate_agent",
    "plot_learning_curve",
    "plot_weights",
    "Run",
    "Agent",
    "Summary",
    "BatchRow",
    "Params",
    "PgpongError",
    "ConfigError",
    "CheckpointError",
    "UnknownEnvironment",
    "PlotError",
    "RecordingError",
    "ClusterError",
    "PoolError",
    "RunWriteError",
    "TrainingDiverged",
]

if TYPE_CHECKING:
    from pgpong.agent import Agent
    from pgpong.api import Run, evaluate_agent, plot_learning_curve, plot_weights, train
    from pgpong.checkpoint import CheckpointError
    from pgpong.cluster import ClusterError
    from pgpong.config import ConfigError
    from pgpong.envs import UnknownEnvironment
    from pgpong.errors import PgpongError
    from pgpong.evaluate import Summary
    from pgpong.plot import PlotError
    from pgpong.policy import Params
    from pgpong.pool.base import PoolError
    from pgpong.record import RecordingError
    from pgpong.rundir import RunWriteError
    from pgpong.runlog import BatchRow
    from pgpong.trainer import TrainingDiverged


def __getattr__(name: str) -> Any:  # PEP 562: the public names, loaded on first use
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'pgpong' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"pgpong.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
