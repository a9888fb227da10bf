"""`python -m pgpong`, and the `pgpong` command (pyproject.toml): the command line, begun
so that Ctrl-C while it loads ends quietly too, as it does once a command runs."""

import sys


def entry() -> int:
    try:
        from pgpong.cli import main  # (numpy, the commands' modules: most of a second)
    except KeyboardInterrupt:
        print("\npgpong: interrupted", file=sys.stderr, flush=True)
        return 130  # as the command line's own handler says it (cli.common.EXIT_SIGINT)
    return main()


if __name__ == "__main__":
    sys.exit(entry())
