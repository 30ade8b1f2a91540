"""Memory a GPU cannot give to tensors, and the fit verdict that keeps it free.

A process on a GPU never gets the whole capacity for its tensors:

* the CUDA context (driver state and the kernels loaded into it) takes about 300 MB per process with
  CUDA's lazy module loading (11.7 and later) and over 1000 MB before it (PyTorch maintainer's
  measurement in pytorch/pytorch#107667, 2023; 200-700 MB on older stacks in #28113, 300-400 MB in
  #20532). We reserve 512 MiB: the lazy-loading figure with room for the cuBLAS/NCCL workspaces a
  training process also creates.
* the caching allocator fragments memory: blocks freed at one size cannot serve a request of another.
  GMLake (Guo et al., ASPLOS 2024, abstract) recovered 9.2 GB on average, up to 25 GB, of PyTorch's
  caching-allocator footprint on an A100-80GB across eight LLMs trained with recomputation, offloading,
  distributed training and low-rank adaptation, so we reserve 9.2 / 80 = 11.5% of capacity. The ZeRO paper (Rajbhandari et al. 2020, section 3.2)
  reports out-of-memory with over 30% of memory free in extreme cases, so this is no upper bound.

``fits`` means the peak stays within ``capacity - reserve``; ``tight`` means it does, but within
:data:`TIGHT_FRACTION` of capacity of that limit (a different allocator pattern, a longer sequence or a
larger NCCL buffer would push it over). Both parts of the reserve are settings (:class:`MemoryHeadroom`,
CLI ``--headroom-gib``) because both depend on the software stack.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from simgrid.errors import LayoutError

Verdict = Literal["fits", "tight", "does not fit"]

CUDA_CONTEXT_BYTES = 512 * 2**20
"""Per-process CUDA context and library workspaces (pytorch/pytorch#107667: ~300 MB with lazy loading)."""
FRAGMENTATION_FRACTION = 9.2 / 80
"""Share of capacity lost to allocator fragmentation (GMLake, ASPLOS 2024: 9.2 GB recovered on average of 80 GB)."""
TIGHT_FRACTION = 0.05
"""A fit within this share of capacity of the usable limit is reported as tight (a reporting choice)."""


@dataclass(frozen=True, kw_only=True)
class MemoryHeadroom:
    """What to keep free of tensors on each GPU (module docstring for the sources of the defaults)."""

    cuda_context_bytes: int = CUDA_CONTEXT_BYTES
    """Bytes the CUDA context and library workspaces take, whatever the capacity."""
    fragmentation_fraction: float = FRAGMENTATION_FRACTION
    """Share of capacity the caching allocator loses to fragmentation."""
    tight_fraction: float = TIGHT_FRACTION
    """Share of capacity below the usable limit within which a fit is called tight."""

    def __post_init__(self) -> None:
        if not isinstance(self.cuda_context_bytes, int) or self.cuda_context_bytes < 0:
            raise LayoutError(f"memory headroom: cuda_context_bytes = {self.cuda_context_bytes!r} must be an integer >= 0")
        for name in ("fragmentation_fraction", "tight_fraction"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0 <= value < 1:
                raise LayoutError(f"memory headroom: {name} = {value!r} must be a fraction in [0, 1)")

    @classmethod
    def fixed(cls, reserve_bytes: int) -> MemoryHeadroom:
        """A reserve of exactly ``reserve_bytes`` per GPU (``0``: compare with the whole capacity)."""
        return cls(cuda_context_bytes=int(reserve_bytes), fragmentation_fraction=0.0)

    def reserved_bytes(self, capacity_bytes: int) -> int:
        """Bytes of a GPU of ``capacity_bytes`` kept free of tensors."""
        return self.cuda_context_bytes + int(self.fragmentation_fraction * capacity_bytes)

    def usable_bytes(self, capacity_bytes: int) -> int:
        """Bytes tensors may use: capacity less the reserve (never below 0)."""
        return max(0, capacity_bytes - self.reserved_bytes(capacity_bytes))

    def verdict(self, peak_bytes: int, capacity_bytes: int) -> Verdict:
        """``fits``, ``tight`` (fits, near the usable limit) or ``does not fit``."""
        usable = self.usable_bytes(capacity_bytes)
        if peak_bytes > usable:
            return "does not fit"
        return "tight" if usable - peak_bytes < self.tight_fraction * capacity_bytes else "fits"

    def describe(self, capacity_bytes: int) -> str:
        """``"9.70 GiB reserved (CUDA context 0.50 GiB + 11.5% fragmentation)"``."""
        gib = 2**30
        parts = [f"CUDA context {self.cuda_context_bytes / gib:.2f} GiB"]
        if self.fragmentation_fraction:
            parts.append(f"{self.fragmentation_fraction:.1%} fragmentation")
        return f"{self.reserved_bytes(capacity_bytes) / gib:.2f} GiB reserved ({' + '.join(parts)})"


DEFAULT_HEADROOM = MemoryHeadroom()
"""The reserve every fit verdict uses unless told otherwise."""
