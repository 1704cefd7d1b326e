"""The one exception type for mistakes a user can fix (bad config, file, flag)."""


class UserError(Exception):
    """A problem the user caused and can fix.

    The message is one line that names the problem and the fix; the CLI prints it
    as ``aiayn: error: <message>`` and exits with status 2.
    """
