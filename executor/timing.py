"""One timer interface for both devices: host clock on CPU, CUDA events on GPU.

A *mark* is taken when an op starts or ends; marks are resolved to seconds from the step's origin only at
the end of the step (:meth:`HostTimer.resolve`, then :meth:`HostTimer.seconds`), so CUDA events never force
a synchronisation in the middle of a schedule: the host keeps queueing kernels ahead of the GPU, and an
event's time is when the GPU reached that point of the stream.
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

    def resolve(self) -> None:
        """Make every mark taken so far readable (nothing to do for host marks)."""

    def seconds(self, mark: Any) -> float:
        """Seconds from the step origin to ``mark``."""
        return float(mark) - self.origin


class CudaTimer(HostTimer):
    """CUDA events on the current stream for compute; host values for communication completions.

    The host origin and the origin event are taken together after a device synchronisation, so host
    marks (communication completions observed by polling) and event marks share one time axis to within
    the launch latency of the origin event.
    """

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

    def resolve(self) -> None:
        """One device synchronisation: every event recorded so far has completed afterwards."""
        torch.cuda.synchronize()

    def seconds(self, mark: Any) -> float:
        if isinstance(mark, float):
            return mark - self.origin
        mark.synchronize()  # free after resolve(); keeps a single read correct without it
        return float(self._origin_event.elapsed_time(mark)) / 1000.0


def make_timer(device: torch.device) -> HostTimer:
    """The timer for a device."""
    return CudaTimer() if device.type == "cuda" else HostTimer()
