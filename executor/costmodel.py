"""A cost model of *this* machine read from a calibrated profile's measured tables, for ``simulate_program``.

The engine's formulas (roofline compute, ring collectives) describe GPUs; a 2-core CPU running a tiny model
through a Python interpreter is dominated by per-call overheads. :class:`MeasuredCostModel` answers the
engine's :class:`simgrid.engine.costmodel.CostModel` questions from tables measured by
:mod:`executor.calibrate` instead:

* compute ops by signature (``F:blocks=1-2:flops=1310720``, :func:`compute_key`), timed in situ with the
  other rank busy; ops never measured fall back to the fitted ``flops / peak + bytes / bandwidth +
  kernels * overhead`` of the profile's "GPU";
* collectives by kind, group size and bytes (linear interpolation, as :class:`MeasuredTables` does);
  a folded op (``count > 1``) costs ``count`` calls of ``bytes / count``;
* send/recv by bytes; host copies at the measured memory bandwidth.

Host work of the executor's interpreter that has no compute op of its own (issuing a collective, the
completion callback at its WAIT, ALLOC/FREE bookkeeping, the per-op dispatch loop) runs on the same host
thread as compute, so it delays the compute stream. The engine only delays the compute stream through
compute ops, so :func:`fold_host_work` adds each such op's measured host time to a neighbouring compute op
of the same rank (issue work to the compute op before it, because the collective cannot start before it
is issued; completion and memory work to the compute op after it), encoded in the op's ``kernels``
field at :data:`HOST_UNIT_S` per extra "kernel". :class:`MeasuredCostModel` charges those units back.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from simgrid.errors import SimulationError
from simgrid.hardware import ClusterSpec
from simgrid.hardware.measured import MeasuredTables
from simgrid.ir.ops import Alloc, Collective, Compute, Free, Op, Recv, Send, Transfer, Wait
from simgrid.ir.program import Program

if TYPE_CHECKING:
    from simgrid.engine.costmodel import PhaseLike
    from simgrid.topology.link import Link

HOST_UNIT_S = 1e-6
"""Seconds of interpreter host work one extra ``kernels`` unit stands for (1 us: finer than timer noise)."""
HOST_PREFIX = "HOST:"
"""Key prefix of host-work rows in the measured compute table."""
LOOP_KEY = "HOST:loop"
"""Key of the interpreter's per-op dispatch-loop overhead (polling pending work, progress reports)."""


def compute_key(op: Compute) -> str:
    """Signature of a compute op in the measured table (stage and micro-batch do not change its cost)."""
    return f"{op.kind}:blocks={op.block_start}-{op.block_end}:flops={op.flops:.0f}"


def host_keys(op: Op, comm: Op | None = None) -> list[str]:
    """Measured-table keys of the host work of a non-compute op, most specific first.

    ``comm`` is the communication op a WAIT completes (its callback depends on what was communicated).
    """
    if isinstance(op, Collective):
        return [f"{HOST_PREFIX}issue:{op.kind}:{op.purpose}:{op.bytes}", f"{HOST_PREFIX}issue:{op.kind}:{op.purpose}",
                f"{HOST_PREFIX}issue:{op.kind}"]
    if isinstance(op, (Send, Recv)):
        name = "send" if isinstance(op, Send) else "recv"
        return [f"{HOST_PREFIX}issue:{name}:{op.bytes}", f"{HOST_PREFIX}issue:{name}"]
    if isinstance(op, Transfer):
        return [f"{HOST_PREFIX}issue:transfer:{op.direction}"]
    if isinstance(op, Wait):
        if isinstance(comm, Collective):
            return [f"{HOST_PREFIX}wait:{comm.kind}:{comm.purpose}:{comm.bytes}",
                    f"{HOST_PREFIX}wait:{comm.kind}:{comm.purpose}", f"{HOST_PREFIX}wait:{comm.kind}"]
        if isinstance(comm, (Send, Recv)):
            name = "send" if isinstance(comm, Send) else "recv"
            return [f"{HOST_PREFIX}wait:{name}:{comm.bytes}", f"{HOST_PREFIX}wait:{name}"]
        return [f"{HOST_PREFIX}wait:transfer"]
    if isinstance(op, Alloc):
        return [f"{HOST_PREFIX}alloc"]
    if isinstance(op, Free):
        return [f"{HOST_PREFIX}free:{op.name.split(':')[0]}", f"{HOST_PREFIX}free"]
    return []


def lookup_us(table: Mapping[str, float], keys: Sequence[str]) -> float:
    """The first key of ``keys`` present in ``table`` (microseconds), else 0: unmeasured host work is free."""
    for key in keys:
        if key in table:
            return table[key]
    return 0.0


def fold_host_work(program: Program, table: Mapping[str, float]) -> Program:
    """``program`` with each rank's interpreter host work added to its compute ops' ``kernels``.

    ``table`` maps keys (:func:`host_keys`, :data:`LOOP_KEY`) to microseconds. Every op pays the dispatch
    loop; issue work goes to the previous compute op of the rank, completion and memory work to the next
    (a rank's first issues go to its first compute op, its last WAITs to its last compute op).
    """
    loop_us = table.get(LOOP_KEY, 0.0)
    ranks = []
    for ops in program.ranks:
        compute_at = [i for i, op in enumerate(ops) if isinstance(op, Compute)]
        if not compute_at:
            ranks.append(ops)
            continue
        extra_us = dict.fromkeys(compute_at, 0.0)
        issued: dict[str, Op] = {}
        previous = None
        for i, op in enumerate(ops):
            if isinstance(op, Compute):
                previous = i
                extra_us[i] += loop_us
                continue
            comm = issued.get(op.handle) if isinstance(op, Wait) else None
            if isinstance(op, (Collective, Send, Recv, Transfer)):
                issued[op.handle] = op
            host_us = loop_us + lookup_us(table, host_keys(op, comm))
            after = next((j for j in compute_at if j > i), None)
            if isinstance(op, (Collective, Send, Recv, Transfer)):
                target = previous if previous is not None else after
            else:
                target = after if after is not None else previous
            assert target is not None  # the rank has at least one compute op
            extra_us[target] += host_us
        new_ops = list(ops)
        for i, us in extra_us.items():
            op = ops[i]
            assert isinstance(op, Compute)
            new_ops[i] = dataclasses.replace(op, kernels=op.kernels + round(us * 1e-6 / HOST_UNIT_S))
        ranks.append(tuple(new_ops))
    return dataclasses.replace(program, ranks=tuple(ranks))


class MeasuredCostModel:
    """:class:`simgrid.engine.costmodel.CostModel` from a calibrated profile's measured tables (fast mode)."""

    def __init__(self, spec: ClusterSpec, base_kernels: Mapping[str, int]) -> None:
        """``base_kernels``: compute key -> the op's own ``kernels`` before :func:`fold_host_work`."""
        if spec.measured is None:
            raise SimulationError(f"profile {spec.name!r} has no measured tables; run `simgrid-exec calibrate`")
        self.spec = spec
        self.tables: MeasuredTables = spec.measured
        self.base_kernels = dict(base_kernels)
        gpu = spec.node.gpu
        self.comm_compute_slowdown = float(gpu.comm_compute_slowdown)
        self.compute_us = {row.key: row.time_us for row in self.tables.compute}
        self._peak_flops = gpu.peak_flops("fp32")
        self._bandwidth_Bps = gpu.hbm_bandwidth_GBps * 1e9
        self._overhead_s = gpu.kernel_overhead_us * 1e-6

    @classmethod
    def for_program(cls, spec: ClusterSpec, program: Program) -> tuple[MeasuredCostModel, Program]:
        """The cost model and the host-folded program to simulate with it."""
        base: dict[str, int] = {}
        for ops in program.ranks:
            for op in ops:
                if isinstance(op, Compute):
                    base.setdefault(compute_key(op), op.kernels)
        model = cls(spec, base)
        host = {k: v for k, v in model.compute_us.items() if k.startswith(HOST_PREFIX)}
        return model, fold_host_work(program, host)

    def compute_s(self, op: Compute, speed: float) -> float:
        key = compute_key(op)
        base = self.base_kernels.get(key, op.kernels)
        host_s = max(0, op.kernels - base) * HOST_UNIT_S
        measured = self.compute_us.get(key)
        if measured is not None:
            own_s = measured * 1e-6
        else:  # the fitted formula of the profile (simgrid.costs.compute's roofline, efficiency 1)
            own_s = op.flops / self._peak_flops + op.hbm_bytes / self._bandwidth_Bps + base * self._overhead_s
        # ``speed`` is the host speed relative to calibration: the interpreter's host work slows down alike.
        return (own_s + host_s) / speed

    def collective_s(self, op: Collective, ranks: tuple[int, ...]) -> float:
        if len(ranks) <= 1:
            return 0.0
        count = max(1, op.count)
        us = self.tables.collective_time_us(op.kind, len(ranks), op.bytes / count)
        if us is None:
            raise SimulationError(f"profile {self.spec.name!r} measured no {op.kind} over {len(ranks)} ranks; "
                                  f"recalibrate with `simgrid-exec calibrate --ranks {len(ranks)}`")
        return count * us * 1e-6

    def p2p_s(self, nbytes: int, src: int, dst: int) -> float:
        us = self.tables.p2p_time_us(nbytes)
        if us is None:
            raise SimulationError(f"profile {self.spec.name!r} has no send/recv table; run `simgrid-exec calibrate`")
        return us * 1e-6

    def transfer_s(self, op: Transfer, rank: int) -> float:
        bandwidth = self.tables.memory_bandwidth_GBps or self.spec.node.pcie_link.bandwidth_GBps
        return op.bytes / (bandwidth * 1e9)

    def phases(self, op: Collective, ranks: tuple[int, ...]) -> Sequence[PhaseLike]:
        raise SimulationError("MeasuredCostModel supports comm_model='fast' only (tables hold whole-call times)")

    def route(self, src: int, dst: int) -> tuple[Link, ...]:
        raise SimulationError("MeasuredCostModel supports comm_model='fast' only (no link routes)")


TRIM_FRACTION = 0.1
"""Share of samples dropped at each end before averaging (see :func:`mean_rows`)."""


def mean_rows(samples: Sequence[tuple[str, float]]) -> dict[str, float]:
    """Key -> trimmed mean of the seconds measured for it, in microseconds.

    A mean, not the median: a step is the sum of hundreds of op times, and the median of such a sum
    tends to the sum of the op *means* (central limit theorem); summing medians under-predicted steps by
    20-30% here. Trimmed (:data:`TRIM_FRACTION` at each end): on a shared 2-core host a few samples hit by
    another process's burst are 10-50x the typical time and would dominate a plain mean of ~20 samples.
    """
    by_key: dict[str, list[float]] = {}
    for key, seconds in samples:
        by_key.setdefault(key, []).append(seconds)
    out = {}
    for key, values in by_key.items():
        values.sort()
        cut = int(len(values) * TRIM_FRACTION)
        out[key] = statistics.fmean(values[cut: len(values) - cut]) * 1e6
    return out
