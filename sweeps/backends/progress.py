"""A sweep that talks while it trains: every `every` seconds, a line per pair under way in this driver (its step of
its budget, its last logged training loss, its pace and what is left at that pace), as fairseq's `--log-interval`
does for one run. Read from each run's own curve (logs/version_N/metrics.csv, which Lightning's CSV logger flushes
as it trains), so it asks nothing of the trainer processes."""

from __future__ import annotations

import csv
import logging
import threading
import time

from aiayn.common.text import clock
from aiayn.lightning_modules.run.rundir import RunDir

log = logging.getLogger("aiayn.sweeps.backends.queue")


def last_logged(run: RunDir) -> tuple[int, float | None] | None:
    """(step, training loss) of the newest line a run's newest attempt logged with a step; None before any."""
    versions = sorted(run.logs.glob("version_*/metrics.csv"), key=lambda p: int(p.parent.name.split("_")[-1]))
    if not versions:
        return None
    try:
        rows = list(csv.DictReader(versions[-1].read_text(encoding="utf-8", errors="replace").splitlines()))
    except (OSError, csv.Error):
        return None
    step, loss = None, None
    for row in rows:
        if (row.get("step") or "").strip().isdigit():
            step = int(row["step"]) + 1  # Lightning logs optimizer step s + 1 as s
            if (row.get("train/loss") or "").strip():
                loss = float(row["train/loss"])
    return None if step is None else (step, loss)


class Progress:
    """The pairs under way (`running`) and a thread that says where each is every `every` seconds (0: never)."""

    def __init__(self, every: float) -> None:
        self.every = every
        self.running: dict[tuple[str, int], tuple[RunDir, int, float, int | None]] = {}
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, row: str, seed: int, run: RunDir, steps: int) -> None:
        with self._lock:
            begun = last_logged(run)
            self.running[(row, seed)] = (run, steps, time.monotonic(), begun[0] if begun else None)

    def end(self, row: str, seed: int) -> None:
        with self._lock:
            self.running.pop((row, seed), None)

    def lines(self) -> list[str]:
        """A line per pair under way, now."""
        with self._lock:
            running = dict(self.running)
        out = []
        for (row, seed), (run, steps, since, first) in sorted(running.items()):
            seen = last_logged(run)
            if seen is None:
                out.append(f"  {row} seed {seed}: starting (no step logged yet)")
                continue
            step, loss = seen
            if first is None:  # nothing was logged when it started: its pace is counted from the first line seen
                with self._lock:
                    if (row, seed) in self.running:
                        self.running[(row, seed)] = (run, steps, time.monotonic(), step)
                first, since = step, time.monotonic()
            rate = (step - first) / (time.monotonic() - since) if step > first else None
            left = (
                "evaluating"
                if step >= steps
                else f"{rate:.2f} steps/s, {clock((steps - step) / rate)} of training left"
                if rate
                else "pace not known yet"
            )
            said = f", loss {loss:.3f}" if loss is not None else ""
            out.append(f"  {row} seed {seed}: step {step} of {steps}{said}; {left}")
        return out

    def __enter__(self) -> Progress:
        if self.every > 0:
            self._thread = threading.Thread(target=self._loop, name="aiayn-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._done.wait(self.every):
            lines = self.lines()
            if lines:
                log.info("under way (every %g s):\n%s", self.every, "\n".join(lines))
