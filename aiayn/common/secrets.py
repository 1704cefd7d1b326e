"""Secrets are masked before anything is printed, logged or written: W&B API keys and passwords.

Masked: the password of any URL (`scheme://user:PASSWORD@host`), the value after a key-like name
(`WANDB_API_KEY=…`, `api_key: …`, `password=…`, `token=…`), and the values of the environment
variables that hold secrets (WANDB_API_KEY and any `*_API_KEY`, `*_TOKEN`, `*_PASSWORD`,
`*_SECRET`) wherever they appear verbatim. Everything becomes `***`.
"""

from __future__ import annotations

import logging
import os
import re

MASK = "***"
_URL_PASSWORD = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]+:)[^\s@]*@")
_NAMED = re.compile(r"(?i)(\b[\w.-]*(?:api[_-]?key|password|passwd|secret|token)['\"]?\s*[=:]\s*['\"]?)[^\s'\",;&]+")
_SECRET_ENV = re.compile(r"(?i)^(WANDB_API_KEY|.*_API_KEY|.*_TOKEN|.*_PASSWORD|.*_SECRET)$")
_MIN_LEN = 6  # shorter env values (e.g. "1") would mask ordinary text


def secret_values() -> list[str]:
    """Secret values from the environment, longest first (so one is never masked by a part of another)."""
    values = {v for k, v in os.environ.items() if _SECRET_ENV.match(k) and len(v) >= _MIN_LEN}
    return sorted(values, key=len, reverse=True)


def redact(text: str) -> str:
    for value in secret_values():
        text = text.replace(value, MASK)
    text = _URL_PASSWORD.sub(rf"\1{MASK}@", text)
    return _NAMED.sub(rf"\1{MASK}", text)


def redact_obj(obj):
    """`obj` (JSON-like: dicts, lists, strings, numbers) with every string redacted."""
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, dict):
        return {redact_obj(k): redact_obj(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact_obj(v) for v in obj]
    return obj


class RedactFilter(logging.Filter):
    """A logging filter that masks secrets in each record's final message."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = redact(message)
        if masked != message:
            record.msg, record.args = masked, None
        return True
