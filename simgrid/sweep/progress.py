"""A plain-text progress bar on stderr for long sweeps (no dependency beyond the standard library)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

BAR_WIDTH = 30
"""Characters in the bar itself."""
MIN_REDRAW_S = 0.1
"""Redraw at most ten times a second so a fast sweep does not spend its time printing."""


class ProgressBar:
    """``[#######.......]  120/500 layouts  3.2/s  ETA 1m58s`` redrawn in place with a carriage return.

    Silent when ``enabled`` is false or, by default, when the stream is not a terminal (logs and pipes
    get no control characters).
    """

    def __init__(self, total: int, *, label: str = "layouts", stream: TextIO | None = None,
                 enabled: bool | None = None) -> None:
        self.total = max(0, total)
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            enabled = _is_tty(self.stream)
        self.enabled = enabled and self.total > 0
        self.done = 0
        self.failed = 0
        self._start = time.perf_counter()
        self._last_draw = 0.0

    def advance(self, count: int = 1, *, failed: bool = False) -> None:
        """Mark ``count`` more items finished (``failed`` ones are counted separately in the text)."""
        self.done = min(self.total, self.done + count)
        if failed:
            self.failed += count
        now = time.perf_counter()
        if self.enabled and (now - self._last_draw >= MIN_REDRAW_S or self.done == self.total):
            self._last_draw = now
            self.stream.write("\r" + self.render(now - self._start))
            self.stream.flush()

    def render(self, elapsed_s: float) -> str:
        """The bar's text after ``elapsed_s`` seconds (no carriage return)."""
        fraction = self.done / self.total if self.total else 1.0
        filled = round(fraction * BAR_WIDTH)
        rate = self.done / elapsed_s if elapsed_s > 0 else 0.0
        eta = (self.total - self.done) / rate if rate > 0 else float("nan")
        text = (
            f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {self.done:>{len(str(self.total))}}/{self.total} "
            f"{self.label}  {rate:.1f}/s  ETA {format_duration(eta)}"
        )
        if self.failed:
            text += f"  ({self.failed} failed)"
        return text

    def close(self) -> None:
        """End the line so later output starts on a fresh one."""
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()
            self.enabled = False


def format_duration(seconds: float) -> str:
    """``"42s"``, ``"3m05s"``, ``"1h02m"``; ``"?"`` when unknown."""
    if seconds != seconds or seconds == float("inf"):
        return "?"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def _is_tty(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if callable(isatty) else False
    except ValueError:  # a closed stream
        return False
