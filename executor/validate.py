"""Predicted vs measured: run a layout for real, simulate the very same Program, compare.

The measured step time is the median of the steps after the first (warm-up), each the time from a common
barrier to the latest rank's last op (see :attr:`executor.runner.RunResult.measured_step_s`). The predicted step time is the engine's makespan of the same
Program on a (calibrated) cluster profile; a profile with measured tables is costed by
:class:`executor.costmodel.MeasuredCostModel` (measured op times, interpreter host work, measured
compute slowdown under communication) instead of the engine's GPU formulas. Per op kind, both traces are summarised as the mean over ranks
of the summed durations of that kind's rows (compute kinds, collective kinds, SEND/RECV).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from executor.calibrate import PROBE_KEY, measure_probe
from executor.costmodel import MeasuredCostModel
from executor.devicefit import has_device_rows
from executor.launch import LaunchConfig
from executor.reference import reference_training
from executor.runner import RunResult, refuse_fp8, run_program
from simgrid.hardware import load_cluster
from simgrid.layout.spec import Layout
from simgrid.model.spec import ModelSpec
from simgrid.schedules import build_program
from simgrid.trace import Trace

NUMERICS_TOLERANCE = 1e-5
"""Relative error (all weights together) and loss tolerance for ``numerics_match``."""


@dataclass(kw_only=True)
class ValidationReport:
    """Prediction and measurement of one layout."""

    predicted_step_s: float
    """Engine makespan of one step."""
    measured_step_s: float
    """Median measured step (warm-up excluded)."""
    numerics_match: bool
    """Losses and updated weights agreed with the single-process reference."""
    weights_error: float
    """Global relative error of the weights after the run vs the reference."""
    host_speed: float = 1.0
    """Speed of the host around the run relative to calibration (host-speed probe; 1 = as calibrated)."""
    per_kind: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Op kind -> (predicted, measured) seconds per rank per step."""
    predicted: Trace = field(default_factory=Trace)
    """The engine's trace."""
    measured: Trace = field(default_factory=Trace)
    """The executor's trace (last step)."""

    @property
    def error(self) -> float:
        """Relative error of the prediction: ``(predicted - measured) / measured``."""
        return (self.predicted_step_s - self.measured_step_s) / self.measured_step_s

    def to_json_dict(self) -> dict[str, Any]:
        """The ``--json`` output of ``simgrid-exec validate``."""
        return {"predicted_step_s": self.predicted_step_s, "measured_step_s": self.measured_step_s,
                "error": self.error, "numerics_match": self.numerics_match, "weights_error": self.weights_error,
                "host_speed": self.host_speed,
                "per_kind": {k: {"predicted_s": p, "measured_s": m} for k, (p, m) in sorted(self.per_kind.items())}}


def per_kind_seconds(trace: Trace) -> dict[str, float]:
    """Mean over ranks of the summed duration of each op kind (WAIT rows excluded)."""
    totals: dict[str, float] = defaultdict(float)
    ranks = trace.ranks() or [0]
    for row in trace.rows:
        if row.kind != "WAIT":
            totals[row.kind] += row.end_s - row.start_s
    return {k: v / len(ranks) for k, v in totals.items()}


def weights_relative_error(run: RunResult, reference: dict[str, Any]) -> float:
    """``||run - reference|| / ||reference||`` over all weights concatenated."""
    num = sum(float((run.weights[k] - v).pow(2).sum()) for k, v in reference.items())
    den = sum(float(v.pow(2).sum()) for v in reference.values())
    return float((num / den) ** 0.5)


def fp32(layout: Layout) -> Layout:
    """The layout computed in fp32, as the executor does (the engine then costs fp32 bytes too)."""
    import dataclasses

    refuse_fp8(layout)
    return layout if layout.precision == "fp32" else dataclasses.replace(layout, precision="fp32")


def validate_layout(model: ModelSpec, layout: Layout, *, profile: str | Path, steps: int = 4, seed: int = 0,
                    config: LaunchConfig | None = None, correct_host_speed: bool = False) -> ValidationReport:
    """Run ``steps`` real steps of (model, layout), simulate its Program on ``profile``, compare.

    With a calibrated profile the host-speed probe runs around the real run and is reported
    (:attr:`ValidationReport.host_speed`); ``correct_host_speed`` also divides the predicted op times by it
    (off by default: on a machine with bursty background load the probe missed the bursts that hit the
    run and made predictions worse, see docs/executor_accuracy.md).
    """
    from simgrid.engine.run import simulate_program

    layout = fp32(layout)
    program = build_program(model, layout)
    cluster = load_cluster(profile, gpus=layout.world_size)
    measured_tables = cluster.spec.measured
    calibrated_probe = measured_tables.compute_time_us(PROBE_KEY) if measured_tables is not None else None
    probe_before = measure_probe(layout.world_size) if calibrated_probe is not None else 0.0
    run = run_program(program, steps=steps, seed=seed, config=config)
    host_speed = 1.0
    if calibrated_probe is not None:
        # Other load on the machine between calibration and this run slows every op of the interpreter alike;
        # the probe (a fixed workload, not this run) measures by how much, just before and after the run.
        now_s = (probe_before + measure_probe(layout.world_size)) / 2
        host_speed = min(5.0, max(0.2, calibrated_probe * 1e-6 / now_s))
    ref = reference_training(model, layout, seed=seed, steps=steps)
    weights_error = weights_relative_error(run, ref.weights)
    losses_ok = all(abs(a - b) <= NUMERICS_TOLERANCE * abs(b) for a, b in zip(run.losses, ref.losses, strict=True))
    if measured_tables is not None and measured_tables.compute and not has_device_rows(measured_tables):
        # Calibrated on this machine: cost ops from the measured tables, interpreter host work included.
        # (A GPU calibration's tables hold micro-benchmarks, not ops: its fitted roofline prices the ops.)
        cost, simulated = MeasuredCostModel.for_program(cluster.spec, program)
        speeds = {r: host_speed if correct_host_speed else 1.0 for r in range(layout.world_size)}
        engine = simulate_program(simulated, cluster, mode="full", cost_model=cost, speed_factors=speeds)
    else:
        engine = simulate_program(program, cluster, mode="full")
    predicted_kinds = per_kind_seconds(engine.trace)
    measured_kinds = per_kind_seconds(run.trace)
    kinds = sorted(set(predicted_kinds) | set(measured_kinds))
    return ValidationReport(
        predicted_step_s=float(engine.makespan_s), measured_step_s=run.measured_step_s,
        numerics_match=losses_ok and weights_error <= NUMERICS_TOLERANCE, weights_error=weights_error,
        host_speed=host_speed,
        per_kind={k: (predicted_kinds.get(k, 0.0), measured_kinds.get(k, 0.0)) for k in kinds},
        predicted=engine.trace, measured=run.trace,
    )


def format_report(name: str, report: ValidationReport) -> str:
    """Human-readable predicted-vs-measured table of one layout."""
    lines = [f"{name}: predicted {report.predicted_step_s * 1e3:.2f} ms, measured "
             f"{report.measured_step_s * 1e3:.2f} ms (median after the warm-up step), error {report.error:+.1%}, numerics "
             f"{'match' if report.numerics_match else 'MISMATCH'} (weights rel. error {report.weights_error:.1e})",
             f"  {'op kind':<16}{'predicted ms':>14}{'measured ms':>14}{'error':>9}"]
    for kind, (pred, meas) in report.per_kind.items():
        err = f"{(pred - meas) / meas:+.0%}" if meas > 0 else "n/a"
        lines.append(f"  {kind:<16}{pred * 1e3:>14.3f}{meas * 1e3:>14.3f}{err:>9}")
    return "\n".join(lines)
