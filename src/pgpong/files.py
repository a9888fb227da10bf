"""Files and names from outside: a file opened only if it is a regular one (a pipe or a
device is refused before it is read), a path given on a command line, and the name
nearest a mistyped one."""

from __future__ import annotations

import argparse
import difflib
import itertools
import os
import stat
from pathlib import Path
from typing import IO, Any


def given_path(text: str) -> Path:
    """A path argument's value (argparse's type): an empty one is a mistake, not the current directory."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path")
    return Path(text)


def open_regular(path: Path, binary: bool = False) -> IO[Any]:
    """`path` opened to read, or OSError if it is not a regular file: a pipe would wait
    for a writer for ever, a device might never end (so it is opened without waiting,
    and looked at first). Text is UTF-8, its line ends kept for the csv module."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError("it is not a regular file")
    return open(fd, "rb") if binary else open(fd, newline="", encoding="utf-8")


def closest(word: str, choices: Any) -> str | None:
    """The one of `choices` (strings) closest to a mistyped `word`, if any is close."""
    found = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return found[0] if found else None


def missing(path: Path, what: str = "no such file or directory") -> str:
    """'PATH: WHAT', and '; did you mean ...?' when a name beside it is close to its last part."""
    try:
        if path.is_symlink():
            return f"{path}: a broken symbolic link (to {os.readlink(path)})"
        names = [entry.name for entry in itertools.islice(path.parent.iterdir(), 10_000)] if path.name else []
    except OSError:
        names = []
    near = closest(path.name, [name for name in names if name != path.name])
    return f"{path}: {what}" + (f"; did you mean {path.parent / near}?" if near else "")
