"""What every command shares: exit statuses, one-line errors, SIGTERM as Ctrl-C, and
how to name this pgpong in a hint."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from pgpong.config import ConfigError
from pgpong.errors import EXIT_BAD_INPUT as EXIT_BAD_INPUT  # (in errors.py, with the parser it serves)
from pgpong.errors import OneLineParser, shortened
from pgpong.files import closest

EXIT_FAILED = 1
EXIT_SIGINT = 130
EXIT_SIGTERM = 143


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: stop like Ctrl-C, with exit status 143.

    Ray may re-raise it as a plain KeyboardInterrupt, so the handler also notes it."""


_terminated = False


def terminated() -> bool:
    """Whether SIGTERM has arrived."""
    return _terminated


def raise_terminated(signum, frame) -> None:
    global _terminated
    _terminated = True
    raise Terminated()


class Parser(OneLineParser):
    command_parsers: Mapping[str, argparse.ArgumentParser]  # (pgpong's own: its commands' parsers, by name)


def env_address() -> str | None:
    """$RAY_ADDRESS, for a command given no --address; a mistake in it is named as the
    variable's, not taken for a flag the user never typed."""
    from pgpong.cluster import ClusterError, parse_address

    text = os.environ.get("RAY_ADDRESS") or None
    if text is not None:
        try:
            parse_address(text)
        except ClusterError as exc:
            raise ConfigError(f"$RAY_ADDRESS: {exc} (unset it for a local Ray instance)") from None
    return text


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """'; did you mean X?' for the closest of `choices` to a word mistyped, else ''."""
    near = closest(word, choices)
    return f"; did you mean {near}?" if near else ""


def bad_input() -> tuple[type[Exception], ...]:
    """The exceptions that mean the user's input cannot be used (exit status 2)."""
    from pgpong.checkpoint import CheckpointError
    from pgpong.envs import UnknownEnvironment
    from pgpong.plot import PlotError
    from pgpong.record import RecordingError

    return ConfigError, CheckpointError, UnknownEnvironment, RecordingError, PlotError


def fail(message: str, status: int) -> int:
    print(f"pgpong: error: {shortened(message)}", file=sys.stderr, flush=True)
    return status


def note(text: str) -> None:
    print(f"pgpong: note: {text}", file=sys.stderr, flush=True)


def resume_command(run_dir: Path) -> str:
    return f"{pgpong_command()} train --run-dir {shlex.quote(str(run_dir))}"


def this_command_again() -> str:
    """The command line that ran this process, to run again in a shell."""
    return " ".join([pgpong_command(), *(shlex.quote(a) for a in sys.argv[1:])])


def pgpong_command() -> str:
    """How to run this pgpong again from here: plain `pgpong` when that is the one on
    PATH, else its path (after `make train` it lives in .venv/bin only)."""
    import shutil

    exe = Path(sys.argv[0])
    if exe.name != "pgpong":
        return f"{shlex.quote(sys.executable)} -m pgpong"
    found = shutil.which("pgpong")
    if found and Path(found).resolve() == exe.resolve():
        return "pgpong"
    try:
        return shlex.quote(str(exe.absolute().relative_to(Path.cwd())))
    except ValueError:
        return shlex.quote(str(exe.absolute()))
