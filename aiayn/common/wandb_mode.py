"""Which mode W&B logs in, by W&B's own conventions, and why (for the log line that says so).

1. `WANDB_MODE`, when set (online, offline, disabled; W&B's older `dryrun` and `run` too), as it is.
2. Otherwise online when W&B finds credentials: `WANDB_API_KEY`, the `~/.netrc` entry that
   `wandb login` writes (or the file `NETRC` names), or W&B's settings file. W&B's documented way to
   check without prompting is `wandb.login(prompt=False)`; it reads exactly those, in W&B's order.
3. Otherwise offline: nothing to log in with, and a run must not stop for a prompt. The log says so,
   with how to go online or upload later (`wandb sync`).

Used by training runs (lightning_modules/run/train.py) and by `aiayn report --wandb`.
"""

from __future__ import annotations

import os

from aiayn.common.errors import UserError

# WANDB_MODE values W&B accepts, and what each means here
MODES = {
    "online": "online",
    "run": "online",
    "offline": "offline",
    "dryrun": "offline",
    "disabled": "disabled",
    "shared": "online",
}


def check_mode() -> None:
    """A WANDB_MODE that W&B does not know is a UserError (checked without importing wandb)."""
    given = os.environ.get("WANDB_MODE", "").strip()
    if given and given not in MODES:
        raise UserError(f"WANDB_MODE={given} is not a W&B mode; set it to online, offline or disabled, or unset it")


def wandb_mode() -> tuple[str, str]:
    """(mode, why): the mode W&B runs in (online, offline or disabled) and a clause saying why."""
    check_mode()
    given = os.environ.get("WANDB_MODE", "").strip()
    if given:
        return MODES[given], f"WANDB_MODE={given}"
    import wandb  # lazily: only runs that log to W&B pay for the import

    try:
        logged_in = wandb.login(prompt=False, verify=False)
    except Exception as e:  # a malformed key (wandb.errors.AuthenticationError) or an unreadable settings file
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(
            f"W&B credentials are unusable ({reason}); fix WANDB_API_KEY or run `wandb login --relogin`"
        ) from None
    if logged_in:
        return "online", "W&B credentials found (WANDB_API_KEY, ~/.netrc from `wandb login`, or W&B's settings)"
    return "offline", (
        "no W&B credentials (no WANDB_MODE, WANDB_API_KEY or `wandb login`); to log online run `wandb login` or "
        "set WANDB_API_KEY, or upload this run later with `wandb sync`"
    )
