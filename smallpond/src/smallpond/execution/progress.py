"""A one-line progress bar per stage (stderr). On a terminal it redraws in place; otherwise it
prints a single line when the stage ends."""
from __future__ import annotations

import sys
import time


class StageProgress:
    def __init__(self, index: int, nstages: int, name: str, total: int, cached: int, enabled: bool) -> None:
        self.label = f"[{index}/{nstages}] {name}"
        self.total, self.done, self.cached = total, cached, cached
        self.rows = 0
        self.enabled = enabled
        self.tty = enabled and sys.stderr.isatty()
        self.t0 = time.time()
        self._draw()

    def update(self, rows: int = 0) -> None:
        self.done += 1
        self.rows += rows
        self._draw()

    def _line(self) -> str:
        width = 24
        filled = width * self.done // max(1, self.total)
        bar = "#" * filled + "." * (width - filled)
        extra = f" ({self.cached} cached)" if self.cached else ""
        return (f"{self.label:<34} [{bar}] {self.done}/{self.total} tasks{extra} "
                f"{self.rows:,} rows {time.time() - self.t0:.1f}s")

    def _draw(self) -> None:
        if self.tty:
            sys.stderr.write("\r" + self._line())
            sys.stderr.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        sys.stderr.write(("\r" if self.tty else "") + self._line() + "\n")
        sys.stderr.flush()
