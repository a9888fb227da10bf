"""What a person watches: a line redrawn in place on a terminal (rich) or in a Jupyter
notebook, and how wide the terminal is, so that lines printed there fit it."""

from __future__ import annotations

import contextlib
import os
import sys
import textwrap
from collections.abc import Callable
from typing import Any, TextIO

MIN_WIDTH = 30  # columns below which a message is left to the terminal to wrap


class LiveLine:
    """One line that redraws itself in place on a terminal (rich), showing `text()`;
    in a Jupyter notebook, a line of the cell's output that is updated in place
    (NotebookLine); elsewhere (a pipe, a file) it shows nothing. Lines printed through
    it go above it on a terminal, below it in a notebook."""

    def __init__(self, text: Callable[[], str], out: TextIO | None = None):
        self.text = text
        self.out = out or sys.stdout
        self._live: Any = None
        self._notebook = NotebookLine() if in_notebook(self.out) else None

    @staticmethod
    def wanted(out: TextIO) -> bool:
        return out.isatty() and os.environ.get("TERM") != "dumb"

    def refresh(self) -> None:
        """Show the text again now (a notebook's line is redrawn only when asked)."""
        if self._notebook is not None:
            self._notebook.show(self.text())

    def start(self) -> None:
        if self._notebook is not None:
            self._notebook.show(self.text())
            return
        if self._live is not None or not self.wanted(self.out):
            return
        from rich.console import Console
        from rich.live import Live
        from rich.text import Text

        console = Console(file=self.out, highlight=False)
        self._live = Live(
            get_renderable=lambda: Text(self.text(), no_wrap=True, overflow="ellipsis"),
            console=console,
            transient=True,
            refresh_per_second=4,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self._live.start()

    def print(self, line: str) -> None:
        if self._live is not None:
            self._live.console.print(line, markup=False, highlight=False, soft_wrap=True)
        else:
            print(line, file=self.out, flush=True)

    def stop(self) -> None:
        if self._notebook is not None:
            self._notebook.show("")
        if self._live is not None:
            self._live.stop()
            self._live = None

    def __enter__(self) -> LiveLine:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def in_notebook(out: TextIO) -> bool:
    """Whether `out` is a Jupyter kernel's output stream (a notebook cell's output)."""
    return type(out).__module__.startswith("ipykernel.") and "IPython" in sys.modules


class NotebookLine:
    """A line of plain text in a notebook cell's output, replaced in place each time it
    is shown (IPython's display with a display id: no escape codes, no widget library).
    It is made at its first showing; showing "" blanks it."""

    def __init__(self) -> None:
        self._handle: Any = None

    def show(self, text: str) -> None:
        from IPython.display import display

        shown = {"text/plain": text}
        if self._handle is None:
            if text:
                self._handle = display(shown, raw=True, display_id=True)
        else:
            self._handle.update(shown, raw=True)


def terminal_width(out: TextIO) -> int | None:
    """The columns of the terminal `out` writes to; None for a pipe, a file or a notebook (the whole line)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        return os.get_terminal_size(out.fileno()).columns if LiveLine.wanted(out) else None
    return None


def fitted(message: str, out: TextIO) -> str:
    """`message` as it should be printed to `out`: on a terminal narrower than one of
    its lines, that line broken between words, the rest indented. A line that begins
    with a space (a command to copy) is left whole, as is everything on a terminal too
    narrow to break it usefully."""
    width = terminal_width(out)
    if not width or width < MIN_WIDTH:
        return message
    return "\n".join(
        textwrap.fill(line, width - 1, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False)
        if len(line) >= width and not line[:1].isspace()
        else line
        for line in message.splitlines()
    )
