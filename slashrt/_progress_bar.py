"""A progress bar for long runs (records done so far): drawn on a terminal, structlog lines otherwise.

Not to be confused with progress *tracking* (`slashrt.progress`: frontiers, pointstamps)."""

from __future__ import annotations

import sys
import time

import structlog

__all__ = ["ProgressBar"]

log = structlog.get_logger("slashrt.progress_bar")


class ProgressBar:
    """Call with the number of records done so far; draws at most every `interval` seconds."""

    def __init__(self, total: int, *, label: str = "records", stream=None, interval: float | None = None):
        self.total = max(total, 1)
        self.label = label
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval = interval if interval is not None else (0.2 if self.tty else 2.0)
        self.started = time.perf_counter()
        self._last = float("-inf")  # the first call always draws

    def __call__(self, done: int) -> None:
        now = time.perf_counter()
        if now - self._last < self.interval and done < self.total:
            return
        self._last = now
        rate = done / max(now - self.started, 1e-9)
        if self.tty:
            width = 30
            filled = int(width * done / self.total)
            self.stream.write(
                f"\r[{'#' * filled}{'.' * (width - filled)}] {100 * done / self.total:5.1f}% "
                f"{done:,}/{self.total:,} {self.label} {rate / 1e6:6.1f} M/s"
            )
            if done >= self.total:
                self.stream.write("\n")
            self.stream.flush()
        else:
            log.info("progress", done=done, total=self.total, percent=round(100 * done / self.total, 1), per_s=int(rate))
