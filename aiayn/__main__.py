"""`python -m aiayn` and the `aiayn` command (pyproject's [project.scripts])."""

import sys


def run() -> int:
    """The `aiayn` command. A Ctrl-C in its first seconds, while Python imports it and before the command can
    catch anything, ends in one line and exit 130, as one later does, not in Python's traceback of the import."""
    try:
        from aiayn.cli import main

        return main()
    except KeyboardInterrupt:
        print("aiayn: interrupted (Ctrl-C)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(run())
