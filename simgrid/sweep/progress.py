"""Progress of long searches on stderr: a tqdm bar on a terminal, a plain line every few seconds elsewhere.

A redirected search (a log file, CI, ``nohup``) gets no control characters but is not silent either: one
line per :data:`LINE_INTERVAL_S` seconds with the count, the rate and the time left, as tqdm formats them.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

LINE_INTERVAL_S = 5.0
"""Seconds between two plain progress lines when the stream is not a terminal."""


class ProgressBar:
    """Progress of ``total`` items: ``advance`` (relative) or ``update_to`` (absolute) as they finish.

    ``enabled`` False silences it; ``None`` (default) shows a bar on a terminal and plain lines elsewhere.
    """

    def __init__(self, total: int, *, label: str = "layouts", stream: TextIO | None = None,
                 enabled: bool | None = None, interval_s: float = LINE_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total = max(0, total)
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = (enabled is None or enabled) and self.total > 0
        self.done = 0
        self.failed = 0
        self.interval_s = interval_s
        self._clock = clock
        self._start = clock()
        self._last_line = self._start
        self._lines = 0
        self._bar: Any = None
        if self.enabled and _is_tty(self.stream):
            from tqdm import tqdm

            self._bar = tqdm(total=self.total, desc=label, unit="layout", file=self.stream, leave=True,
                             dynamic_ncols=True, mininterval=0.1)

    def advance(self, count: int = 1, *, failed: bool = False) -> None:
        """Mark ``count`` more items finished (``failed`` ones are also counted apart)."""
        self.update_to(self.done + count, self.failed + (count if failed else 0))

    def update_to(self, done: int, failed: int | None = None) -> None:
        """Set the number of finished (and failed) items."""
        done = min(self.total, max(done, self.done))
        step = done - self.done
        self.done = done
        if failed is not None:
            self.failed = failed
        if not self.enabled:
            return
        if self._bar is not None:
            if self.failed:
                self._bar.set_postfix_str(f"{self.failed} failed", refresh=False)
            self._bar.update(step)
            return
        now = self._clock()
        if now - self._last_line >= self.interval_s:
            self._last_line = now
            self._line(now)

    def render(self, elapsed_s: float) -> str:
        """The progress text after ``elapsed_s`` seconds: ``120/500 layouts, 3.2/s, ETA 01:58``."""
        from tqdm import tqdm

        text = tqdm.format_meter(self.done, self.total, elapsed_s, unit="",
                                 bar_format="{n_fmt}/{total_fmt} " + self.label + ", {rate_noinv_fmt}, elapsed "
                                            "{elapsed}, ETA {remaining}")
        return text + (f" ({self.failed} failed)" if self.failed else "")

    def close(self) -> None:
        """Finish the bar (or print a last line if plain lines were printed)."""
        if not self.enabled:
            return
        self.enabled = False
        if self._bar is not None:
            self._bar.close()
        elif self._lines:
            self._line(self._clock())

    def _line(self, now: float) -> None:
        self._lines += 1
        self.stream.write(f"simgrid: {self.render(now - self._start)}\n")
        self.stream.flush()


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
