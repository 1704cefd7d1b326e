"""Text every layer reads and prints the same way: UTF-8 lines, and durations."""

from __future__ import annotations


class NotUTF8(ValueError):
    """Line `line` (1-based) is not valid UTF-8, for `reason`."""

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(f"line {line} is not valid UTF-8 ({reason})")
        self.line, self.reason = line, reason


def utf8_lines(raw: bytes) -> list[str]:
    """The lines of `raw`, one sentence a line: only line terminators stripped (a final newline does not start a
    line, a blank line in the middle is one); NotUTF8 names the first line that does not decode."""
    lines = raw.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    out = []
    for i, line in enumerate(lines, start=1):
        try:
            out.append(line.decode("utf-8").rstrip("\r"))
        except UnicodeDecodeError as e:
            raise NotUTF8(i, e.reason) from None
    return out


def clock(seconds: float | None, with_seconds: bool = True) -> str:
    """A duration as a progress line shows it: 1h02m03s (or 1h02m), 5m07s; "?" for none."""
    if seconds is None:
        return "?"
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    if h:
        return f"{h}h{m:02d}m{s:02d}s" if with_seconds else f"{h}h{m:02d}m"
    return f"{m}m{s:02d}s"
