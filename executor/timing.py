"""One timer interface for both devices: host clock on CPU, CUDA events on GPU.

A *mark* is taken when an op starts or ends; marks are resolved to seconds from the step's origin only at
the end of the step, so CUDA events never force a synchronisation in the middle of a schedule.
"""

from __future__ import annotations

import time
from typing import Any

import torch


class HostTimer:
    """``time.perf_counter`` marks (CPU runs: work is synchronous on the host)."""

    def __init__(self) -> None:
        self.origin = time.perf_counter()

    def start_step(self) -> None:
        """Set the origin of the step's times."""
        self.origin = time.perf_counter()

    def mark(self) -> Any:
        """A point in time."""
        return time.perf_counter()

    def from_host(self, seconds: float) -> Any:
        """A mark from a host ``perf_counter`` value (e.g. a communication completion)."""
        return seconds

    def seconds(self, mark: Any) -> float:
        """Seconds from the step origin to ``mark``."""
        return float(mark) - self.origin


class CudaTimer(HostTimer):
    """CUDA events on the current stream for compute; host values for communication completions."""

    def __init__(self) -> None:
        super().__init__()
        self._origin_event = torch.cuda.Event(enable_timing=True)

    def start_step(self) -> None:
        torch.cuda.synchronize()
        super().start_step()
        self._origin_event.record()

    def mark(self) -> Any:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, mark: Any) -> float:
        if isinstance(mark, float):
            return mark - self.origin
        mark.synchronize()
        return float(self._origin_event.elapsed_time(mark)) / 1000.0


def make_timer(device: torch.device) -> HostTimer:
    """The timer for a device."""
    return CudaTimer() if device.type == "cuda" else HostTimer()
