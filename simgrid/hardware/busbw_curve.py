"""A published nccl-tests bus-bandwidth curve of a node's GPU fabric, by message size.

NCCL's tuner (and so :mod:`simgrid.costs`) prices a call as latency plus bytes over the large-message
bandwidth. Measured curves inside one NVSwitch node reach that bandwidth only from a few hundred MiB on:
at 1-64 MiB they sit 25-55% below it (Azure ND A100 v4 / H100 v5 / H200 v5 all_reduce_perf). A node
profile may carry one such curve for its intra-node fabric (``[intra_busbw_curve]``); the cost model
reads it as the fraction of the plateau a call reaches at a given number of bytes per rank
(:func:`simgrid.costs.busbw_curve.size_fraction`).
"""

from __future__ import annotations

from dataclasses import dataclass

from simgrid.hardware.rules import FieldError, check_int_at_least, check_positive, check_strictly_ascending

_OWNER = "BusbwCurve"


@dataclass(frozen=True, kw_only=True)
class BusbwCurve:
    """One nccl-tests all_reduce_perf curve (in-place busbw) measured on one node's GPUs."""

    ranks: int
    """GPUs in the measurement (nccl-tests ``-g``/ranks), e.g. 8."""
    bytes: tuple[int, ...]
    """Message sizes S (nccl-tests ``size`` column), strictly ascending."""
    busbw_GBps: tuple[float, ...]
    """Published bus bandwidth at each size, GB/s; must not decrease with size."""

    def __post_init__(self) -> None:
        check_int_at_least(_OWNER, "ranks", self.ranks, 2)
        object.__setattr__(self, "bytes", tuple(self.bytes))
        object.__setattr__(self, "busbw_GBps", tuple(float(b) for b in self.busbw_GBps))
        if len(self.bytes) < 2:
            raise FieldError("bytes", self.bytes, "must have at least two sizes (a curve)", owner=_OWNER)
        check_strictly_ascending(_OWNER, "bytes", self.bytes)
        if len(self.busbw_GBps) != len(self.bytes):
            raise FieldError("busbw_GBps", self.busbw_GBps,
                             f"must have {len(self.bytes)} values, one per entry of bytes", owner=_OWNER)
        for i, bw in enumerate(self.busbw_GBps):
            check_positive(_OWNER, f"busbw_GBps[{i}]", bw)
            if i and bw < self.busbw_GBps[i - 1]:
                raise FieldError(f"busbw_GBps[{i}]", bw, f"is below the previous size's {self.busbw_GBps[i - 1]:g}; "
                                 "a curve must not decrease with size", owner=_OWNER)
