"""`pgpong train | play | plot | weights | bench | study`: the command line. This module
builds the parser and runs a command; each command lives in a module of its own
(train.py, play.py, pictures.py, bench.py, study.py), and what they share in common.py."""

from __future__ import annotations

import errno
import os
import signal
import sys
from collections.abc import Sequence

from pgpong import __version__
from pgpong.cli import bench, pictures, play, study, train
from pgpong.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_SIGINT,
    EXIT_SIGTERM,
    Parser,
    bad_input,
    did_you_mean,
    fail,
    raise_terminated,
    terminated,
)
from pgpong.errors import clipped

EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, as a shell reports a command whose reader went away

COMMANDS = {
    "train": train.run,
    "play": play.run,
    "plot": pictures.plot,
    "weights": pictures.weights,
    "bench": bench.run,
    "study": study.run,
}


def build_parser() -> Parser:
    parser = Parser(prog="pgpong", description="Policy-gradient Pong from pixels, on Ray.")
    parser.add_argument("--version", action="version", version=f"pgpong {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    train.add_parser(sub)
    play.add_parser(sub)
    pictures.add_parsers(sub)
    bench.add_parser(sub)
    study.add_parser(sub)
    parser.command_parsers = sub.choices
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # Ctrl-C from here on ends below, not in a traceback; while this module and its
    # imports load (numpy among them), pgpong.__main__.entry takes it.
    signal.signal(signal.SIGTERM, raise_terminated)
    try:
        try:
            return _run(argv)
        finally:
            sys.stdout.flush()  # here, where a reader gone away can still be told apart
    except KeyboardInterrupt:
        print("\npgpong: interrupted", file=sys.stderr, flush=True)
        return EXIT_SIGTERM if terminated() else EXIT_SIGINT
    except BrokenPipeError:  # `pgpong ... | head`: the reader has what it wanted; stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (nothing more to flush at exit)
        return EXIT_BROKEN_PIPE


def _run(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    words = list(sys.argv[1:] if argv is None else argv)
    if words and not words[0].startswith("-") and words[0] not in COMMANDS:
        parser.error(f"no command {words[0]!r}{did_you_mean(words[0], COMMANDS)} (the commands: {', '.join(COMMANDS)})")
    first = next((k for k, w in enumerate(words) if not w.startswith("-")), len(words))
    asks_help = [w for w in words[:first] if w == "-h" or (len(w) > 2 and "--help".startswith(w))]
    if asks_help and first < len(words):  # pgpong --help train: train's help, as git's --help COMMAND
        return _run([words[first], "--help"])
    own = ("--help", "--version")  # and argparse's abbreviations of them, and -h
    early = [w for w in words[:first] if w != "-h" and not (len(w) > 2 and any(o.startswith(w) for o in own))]
    if early:  # pgpong --seed 3 train
        flag = early[0]
        parser.error(f"{flag} must follow a command: pgpong COMMAND {flag} ...")
    args, unknown = parser.parse_known_args(words)
    if unknown:  # told by the command's own parser, so that its --help is the one named
        command = parser.command_parsers[args.command]
        flag = unknown[0].split("=", 1)[0]
        hint = did_you_mean(flag, command._option_string_actions) if flag.startswith("--") and flag != "--" else ""
        command.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")
    try:
        return COMMANDS[args.command](args)
    except bad_input() as exc:
        return fail(str(exc), EXIT_BAD_INPUT)
    except OSError as exc:  # a path given longer than the system takes, wherever it is first looked at
        if exc.errno != errno.ENAMETOOLONG:
            raise
        name = str(exc.filename)
        shown = clipped(name) if len(name) > 60 else name
        return fail(f"{shown}: a file name longer than this system takes", EXIT_BAD_INPUT)


if __name__ == "__main__":
    sys.exit(main())
