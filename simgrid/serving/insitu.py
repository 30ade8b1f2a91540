"""Costs of generation measured inside real generation steps: the rows a calibrated profile adds for serving.

A decode step of a small model on a CPU host is not priced well by constants measured elsewhere: its
matrix work is tiny, so it is the host's per-op dispatch and the latency of every synchronous
hand-off. ``simgrid-exec calibrate`` (:mod:`executor.gencal`) therefore runs real greedy generation (other
prompt counts and lengths than any validated run) and stores, in the profile's measured compute table
under ``SERVE:`` keys:

* ``SERVE:launch``: host time per kernel the cost model counts (:func:`simgrid.model.block_kernels`),
  from decode steps' compute time (the step without its communication calls) less the matrix and
  memory terms (a decode step is mostly this host time);
* ``SERVE:gflop``: microseconds per GFLOP of matrix work (GEMMs and the attention core) of generation's
  forward passes, from prefill steps' compute time less their launches and memory terms. Training's
  fitted rate (forward and backward ops under autograd, per-op overheads folded in) is not this rate;
* ``SERVE:<kind>:<ranks>:<bytes>``: a tensor-parallel collective waited right after it is issued, timed
  from call to return inside the steps (peer skew and gloo's thread wake-ups included, which a
  barrier-aligned micro-benchmark misses), filed under the message size the cost model gives that call;
* ``SERVE:p2p:<bytes>``: a pipeline hand-off, from the sender's call to the receiver holding the data
  (a blocking send also waits for the receiver to post its receive), under the cost model's size.

:class:`InSituCosts` reads them back for :class:`simgrid.serving.IterationCostModel`; sizes between
rows are interpolated by the measured tables' rule (:mod:`simgrid.hardware.measured`). These are rows of
the compute table (free-form keys, as the executor's ``HOST:`` rows) rather than collective rows: a
synchronous in-situ time is several times a micro-benchmark's at the same size, and the two do not belong
in one series.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from simgrid.hardware import GPUSpec
from simgrid.hardware.measured import MeasuredTables, _interpolate

SERVE_PREFIX = "SERVE:"
"""Key prefix of generation's in-situ rows in a profile's measured compute table."""
LAUNCH_KEY = "SERVE:launch"
"""Key of the host time per counted kernel of a generation step (microseconds)."""
MATRIX_KEY = "SERVE:gflop"
"""Key of the time per GFLOP of generation's matrix work (microseconds)."""


def collective_key(kind: str, group_size: int, nbytes: int) -> str:
    """Key of an in-situ synchronous collective of ``kind`` over ``group_size`` ranks, ``nbytes`` per call."""
    return f"{SERVE_PREFIX}{kind}:{group_size}:{nbytes}"


def hop_key(nbytes: int) -> str:
    """Key of an in-situ pipeline hand-off of ``nbytes``."""
    return f"{SERVE_PREFIX}p2p:{nbytes}"


@dataclass(frozen=True, kw_only=True)
class InSituCosts:
    """Generation's in-situ rows of one profile; each lookup is ``None`` where nothing was measured."""

    launch_us: float | None = None
    """Host microseconds per counted kernel, or ``None``."""
    matrix_us_per_gflop: float | None = None
    """Microseconds per GFLOP of matrix work, or ``None``."""
    collectives: dict[tuple[str, int], list[tuple[int, float]]] = field(default_factory=dict)
    """(kind, group size) -> sorted (bytes per call, microseconds)."""
    hops: list[tuple[int, float]] = field(default_factory=list)
    """Sorted (bytes, microseconds) of pipeline hand-offs."""

    @classmethod
    def from_tables(cls, tables: MeasuredTables | None) -> InSituCosts | None:
        """The ``SERVE:`` rows of ``tables``, or ``None`` when it has none (an uncalibrated profile)."""
        if tables is None:
            return None
        launch: float | None = None
        matrix: float | None = None
        collectives: dict[tuple[str, int], list[tuple[int, float]]] = {}
        hops: list[tuple[int, float]] = []
        for row in tables.compute:
            if not row.key.startswith(SERVE_PREFIX):
                continue
            if row.key == LAUNCH_KEY:
                launch = row.time_us
                continue
            if row.key == MATRIX_KEY:
                matrix = row.time_us
                continue
            parts = row.key[len(SERVE_PREFIX):].split(":")
            if parts[0] == "p2p" and len(parts) == 2 and parts[1].isdigit():
                hops.append((int(parts[1]), row.time_us))
            elif len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
                collectives.setdefault((parts[0], int(parts[1])), []).append((int(parts[2]), row.time_us))
        if launch is None and matrix is None and not collectives and not hops:
            return None
        return cls(launch_us=launch, matrix_us_per_gflop=matrix,
                   collectives={k: sorted(v) for k, v in collectives.items()}, hops=sorted(hops))

    def rank_gpu(self, gpu: GPUSpec) -> GPUSpec:
        """``gpu`` with generation's measured rates: the matrix rate as its peak (every dtype: the
        calibration ran one) and the host time per kernel as its launch overhead."""
        changes: dict[str, object] = {}
        if self.matrix_us_per_gflop is not None and self.matrix_us_per_gflop > 0:
            tflops = 1e-3 / (self.matrix_us_per_gflop * 1e-6)  # 1 GFLOP / seconds, in TFLOP/s
            changes["peak_tflops"] = dict.fromkeys(gpu.peak_tflops, tflops)
        if self.launch_us is not None:
            changes["kernel_overhead_us"] = self.launch_us
        return dataclasses.replace(gpu, **changes) if changes else gpu  # type: ignore[arg-type]

    def collective_us(self, kind: str, group_size: int, nbytes: float) -> float | None:
        """Microseconds of one synchronous call moving ``nbytes``, interpolated; ``None`` if not measured."""
        points = self.collectives.get((kind, group_size))
        return _interpolate(points, nbytes) if points else None

    def hop_us(self, nbytes: float) -> float | None:
        """Microseconds of a pipeline hand-off of ``nbytes``, interpolated; ``None`` if not measured."""
        return _interpolate(self.hops, nbytes) if self.hops else None
