"""PgpongError: the one base of the errors pgpong raises on purpose.

Each error type stays in the module that raises it (ConfigError in config.py,
CheckpointError in checkpoint.py, ...) and derives from PgpongError, so that a
script or a notebook can catch them all with one `except pgpong.PgpongError`. This
module imports nothing of pgpong, so every floor of the house may use it, and
OneLineParser with it: the argument parser of every command line pgpong has (`pgpong`,
`python -m pgpong.scaling`, `python -m pgpong.noise`), whose mistakes are one line too."""

from __future__ import annotations

import argparse
import re
from typing import NoReturn

EXIT_BAD_INPUT = 2  # the exit status of input that cannot be used


def shortened(message: str) -> str:
    """A message that echoes a number of thousands of digits keeps its first 20 and says how long it was."""
    return re.sub(r"\d{41,}", lambda m: f"{m[0][:20]}... ({len(m[0]):,} digits)", message)


def clipped(text: str, show=str) -> str:
    """A long name from outside, for a message: its first 40 characters (as `show`
    writes them) and how long it was."""
    return f"{show(text[:40])}... ({len(text):,} characters)"


class OneLineParser(argparse.ArgumentParser):
    """An argparse parser whose error is one line naming the mistake and where help is,
    with exit status 2 (argparse's own prints its usage first, several lines)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {shortened(message)} (see {self.prog} --help)\n")


class PgpongError(Exception):
    """An error pgpong raises on purpose: its message is one line saying what is wrong
    and, where it helps, what to do; the command line prints it as `pgpong: error:
    MESSAGE`. Bad input (a setting, a file, an environment id, a cluster address) raises
    one that is also a ValueError (ConfigError, CheckpointError, UnknownEnvironment,
    PlotError, RecordingError) or ClusterError; a run that cannot go on raises
    PoolError, RunWriteError or TrainingDiverged."""
