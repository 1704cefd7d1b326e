"""The one exception type for mistakes a user can fix (bad config, file, flag), and how it is shown."""

from __future__ import annotations

import sys


class UserError(Exception):
    """A problem the user caused and can fix.

    The message is one line that names the problem and the fix; the CLI prints it
    as ``aiayn: error: <message>`` and exits with status 2.
    """


def print_error(error: Exception | str, file=None) -> int:
    """Print `aiayn: error: <message>` (secrets masked) as one line, control characters escaped (a name from a file
    may hold a newline, a NUL or a terminal's escape sequences: they are shown, never sent); return the exit status,
    2."""
    from aiayn.common.secrets import redact

    print(f"aiayn: error: {visible(redact(str(error)))}", file=file or sys.stderr)
    return 2


def visible(text: str) -> str:
    """`text` with every control character (C0, DEL, C1) as its escape (\\n, \\x1b, \\x00): one line, printed as is."""
    return "".join(c if c.isprintable() or c == " " else c.encode("unicode_escape").decode("ascii") for c in text)
