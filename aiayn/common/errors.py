"""The one exception type for mistakes a user can fix (bad config, file, flag), and how it is shown."""

from __future__ import annotations

import sys


class UserError(Exception):
    """A problem the user caused and can fix.

    The message is one line that names the problem and the fix; the CLI prints it
    as ``aiayn: error: <message>`` and exits with status 2.
    """


def print_error(error: Exception | str, file=None) -> int:
    """Print `aiayn: error: <message>` (secrets masked) as one line; return the exit status, 2."""
    from aiayn.common.secrets import redact

    print(f"aiayn: error: {redact(str(error))}", file=file or sys.stderr)
    return 2
