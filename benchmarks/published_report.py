"""Results of benchmarks/published.py and how they are printed (docs/validation.md: validation_doc.py)."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from modern_devset import DevResult, dev_groups, dev_table, summary_table
from published_data import (
    CLUSTER,
    KORTHIKANTI_TABLE5,
    MEGATRON_MAE_TARGET,
    PRECISION,
    ROW_TOLERANCE,
)

REPO_ROOT = Path(__file__).resolve().parent.parent


# -- results -----------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class RowResult:
    """One simulated row: the published figure, the prediction and the verdict."""

    table: str
    """``megatron`` or ``korthikanti-full`` / ``korthikanti-selective-sp``."""
    row: str
    """Row id (model preset name)."""
    config: str
    """Short layout description."""
    published: float
    """Published value (TFLOP/s per GPU or iteration seconds)."""
    predicted: float
    """Simulated value in the same unit."""
    within: bool | None
    """Inside the row target; ``None`` when the verdict depends on an unverified input."""
    metrics: dict[str, Any] = field(default_factory=dict)
    """The simulation's JSON metrics (step time, MFU, bubble, exposed communication ...)."""
    note: str = ""
    """Why the verdict is undecided, or the alternative configuration's prediction."""
    wall_s: float = 0.0
    """Wall seconds the simulation took."""

    @property
    def rel_err(self) -> float:
        """(predicted - published) / published."""
        return (self.predicted - self.published) / self.published


@dataclass(frozen=True, kw_only=True)
class LayerTiming:
    """Korthikanti Table 4: one 22B layer, published vs predicted forward and backward milliseconds."""

    config: str
    """Table 4 configuration name."""
    published_fwd_ms: float
    """Published forward time of one layer."""
    published_bwd_ms: float
    """Published backward time (recompute included) of one layer."""
    predicted_fwd_ms: float
    """Simulated forward time of one layer (tensor-parallel communication included)."""
    predicted_bwd_ms: float
    """Simulated backward time of one layer (recompute and communication included)."""


@dataclass(frozen=True, kw_only=True)
class ZeroCell:
    """One cell of ZeRO Table 1: model-state GB per device."""

    params: float
    """Model parameters."""
    dp: int
    """Data-parallel degree N_d."""
    stage: int
    """ZeRO stage 1-3."""
    published: str
    """The cell as printed."""
    predicted_gb: float
    """GB (1e9 bytes) from :func:`simgrid.memory.model_states_for_params`."""
    match: str | None
    """``rounded`` or ``truncated`` when the prediction reproduces the printed cell, else ``None``."""


def rel_error(predicted: float, published: float) -> float:
    """Signed relative error of a prediction."""
    return (predicted - published) / published


def within_target(predicted: float, published: float, tolerance: float = ROW_TOLERANCE) -> bool:
    """``|predicted - published| <= tolerance * published``."""
    return abs(rel_error(predicted, published)) <= tolerance


def mean_abs_error(results: Iterable[RowResult]) -> float:
    """Mean absolute relative error of the rows (nan when empty)."""
    errors = [abs(r.rel_err) for r in results]
    return sum(errors) / len(errors) if errors else math.nan


def matches_published(value: float, printed: str) -> str | None:
    """``rounded`` / ``truncated`` when ``value`` shown at the printed precision gives ``printed``.

    ZeRO Table 1 rounds some cells (7.5B at N_d = 4: 41.25 -> 41.3) and truncates others (1T at
    N_d = 64: 4187.5 -> 4187, 2218.75 -> 2218), so both readings of the printed digits are accepted;
    anything else (a different formula) is a miss.
    """
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    target = float(printed)
    unit = 10.0**-decimals
    # A tiny slack absorbs binary floating point (30.1 * 10 is 300.99999...) and the byte ceil of a shard.
    # Half up, as printed tables do (Python's round() would turn 41.25 into 41.2).
    if abs(math.floor(value / unit + 0.5) * unit - target) < unit / 1000:
        return "rounded"
    if abs(math.floor(value / unit + 1e-9) * unit - target) < unit / 1000:
        return "truncated"
    return None


# -- tables ------------------------------------------------------------------------------------------------
def _verdict(within: bool | None) -> str:
    return "undecided" if within is None else ("within" if within else "OUTSIDE")


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(lines)


def megatron_table(results: Sequence[RowResult]) -> str:
    """Markdown table of SC'21 Table 1: published vs predicted TFLOP/s per GPU."""
    body = [
        (r.row, r.config, f"{r.published:.0f}", f"{r.predicted:.1f}", f"{r.rel_err:+.2%}",
         f"{r.metrics.get('mfu', 0):.1%}", f"{r.metrics.get('bubble_fraction', 0):.1%}",
         _exposed(r.metrics), _verdict(r.within))
        for r in results
    ]
    header = ("model", "layout", "published TFLOP/s", "predicted hw TFLOP/s", "error (+ = faster)", "predicted MFU",
              "bubble", "exposed comm tp/pp/dp (s)", "target 10%")
    return markdown_table(header, body)


def korthikanti_table(results: Sequence[RowResult]) -> str:
    """Markdown table of Korthikanti Table 5: published vs predicted iteration seconds."""
    body = [
        (r.row, r.config, f"{r.published:.2f}", f"{r.predicted:.2f}", f"{r.rel_err:+.2%}",
         f"{r.metrics.get('bubble_fraction', 0):.1%}", _exposed(r.metrics), _verdict(r.within), r.note)
        for r in results
    ]
    header = ("model", "layout", "published s", "predicted s", "error (- = faster)", "bubble", "exposed comm tp/pp/dp (s)",
              "target 10%", "note")
    return markdown_table(header, body)


def utilisation_table(results: Sequence[RowResult]) -> str:
    """Korthikanti Table 5 MFU/HFU (sequence parallel + selective rows) against the prediction."""
    by_name = {row.name: row for row in KORTHIKANTI_TABLE5}
    body = []
    for r in results:
        pub = by_name[r.row]
        body.append((r.row, f"{pub.mfu:.1%}", f"{r.metrics.get('mfu', 0):.1%}", f"{pub.hfu:.1%}",
                     f"{r.metrics.get('hfu', 0):.1%}"))
    return markdown_table(("model", "published MFU", "predicted MFU", "published HFU", "predicted HFU"), body)


def layer_table(timings: Sequence[LayerTiming]) -> str:
    """Markdown table of Korthikanti Table 4 (22B layer) published vs predicted."""
    body = [
        (t.config, f"{t.published_fwd_ms:.1f}", f"{t.predicted_fwd_ms:.1f}",
         f"{rel_error(t.predicted_fwd_ms, t.published_fwd_ms):+.1%}", f"{t.published_bwd_ms:.1f}",
         f"{t.predicted_bwd_ms:.1f}", f"{rel_error(t.predicted_bwd_ms, t.published_bwd_ms):+.1%}")
        for t in timings
    ]
    header = ("configuration", "published fwd ms", "predicted fwd ms", "error", "published bwd ms",
              "predicted bwd ms", "error")
    return markdown_table(header, body)


def zero_table(cells: Sequence[ZeroCell]) -> str:
    """Markdown table of ZeRO Table 1: printed cell vs computed GB and how they match."""
    body = [
        (f"{c.params:.3g}", str(c.dp), str(c.stage), c.published, f"{c.predicted_gb:.6g}", c.match or "MISMATCH")
        for c in cells
    ]
    return markdown_table(("params", "N_d", "stage", "published GB", "computed GB", "match"), body)


def _exposed(metrics: dict[str, Any]) -> str:
    exposed = metrics.get("exposed_comm_s", {})
    return "/".join(f"{exposed.get(k, 0.0):.2f}" for k in ("tp", "pp", "dp"))


def half_peak_tflops_a100() -> float:
    """Half of the SC'21 profile's dense 16-bit peak, TFLOP/s: the naive baseline for SC'21 Table 1."""
    from modern_data import HALF_PEAK

    from simgrid.hardware import load_cluster

    return HALF_PEAK * load_cluster(CLUSTER, gpus=8).gpu.peak_flops(PRECISION) / 1e12


# -- the whole validation ----------------------------------------------------------------------------------
@dataclass(kw_only=True)
class Validation:
    """Everything one run of the script computed (a table is empty when not selected)."""

    megatron: list[RowResult] = field(default_factory=list)
    """SC'21 Table 1 rows."""
    korthikanti: list[RowResult] = field(default_factory=list)
    """Table 5 rows, both settings."""
    layers: list[LayerTiming] = field(default_factory=list)
    """Table 4 per-layer timings (not tuned on)."""
    zero: list[ZeroCell] = field(default_factory=list)
    """ZeRO Table 1 cells."""
    modern: list[DevResult] = field(default_factory=list)
    """Modern dev set rows (issue 12)."""

    def dev_groups(self) -> list[tuple[str, Any]]:
        """The modern dev set's summaries: whole dev set (SC'21 Table 1 + modern rows) and its parts."""
        return dev_groups(self.megatron, self.modern, half_peak_tflops_a100()) if self.modern else []

    def summary(self) -> dict[str, Any]:
        """Per-table counts, mean absolute errors and whether each issue target is met."""
        out: dict[str, Any] = {}
        if self.megatron:
            mae = mean_abs_error(self.megatron)
            inside = sum(bool(r.within) for r in self.megatron)
            out["megatron"] = {"rows": len(self.megatron), "within_10pct": inside, "mae": mae,
                               "target_met": inside == len(self.megatron) and mae <= MEGATRON_MAE_TARGET}
        if self.korthikanti:
            decided = [r for r in self.korthikanti if r.within is not None]
            inside = sum(bool(r.within) for r in decided)
            out["korthikanti"] = {"rows": len(self.korthikanti), "within_10pct": inside,
                                  "undecided": len(self.korthikanti) - len(decided),
                                  "mae": mean_abs_error(self.korthikanti), "target_met": inside == len(decided)}
        if self.layers:
            errs = [abs(rel_error(t.predicted_fwd_ms, t.published_fwd_ms)) for t in self.layers]
            errs += [abs(rel_error(t.predicted_bwd_ms, t.published_bwd_ms)) for t in self.layers]
            out["korthikanti_table4"] = {"cells": len(errs), "mae": sum(errs) / len(errs)}
        if self.zero:
            exact = sum(c.match is not None for c in self.zero)
            out["zero"] = {"cells": len(self.zero), "exact": exact, "target_met": exact == len(self.zero)}
        for name, group in self.dev_groups():
            out.setdefault("dev_set", {})[name] = {**asdict(group), "targets_met": group.targets_met}
        return out

    def to_json_dict(self) -> dict[str, Any]:
        """Everything as JSON-ready data."""
        def row(r: RowResult) -> dict[str, Any]:
            return {**asdict(r), "rel_err": r.rel_err}

        return {
            "summary": self.summary(),
            "megatron": [row(r) for r in self.megatron],
            "korthikanti": [row(r) for r in self.korthikanti],
            "korthikanti_table4": [asdict(t) for t in self.layers],
            "zero": [asdict(c) for c in self.zero],
            "modern": [{**asdict(r), "error": r.error, "baseline_error": r.baseline_error} for r in self.modern],
        }


def print_report(v: Validation, stream: Any = sys.stdout) -> None:
    """The tables and per-table summary on ``stream``."""
    summary = v.summary()
    if v.megatron:
        s = summary["megatron"]
        print("Megatron SC'21 Table 1 (TFLOP/s per GPU, recompute counted)\n" + megatron_table(v.megatron), file=stream)
        print(f"within 10%: {s['within_10pct']}/{s['rows']}, MAE {s['mae']:.1%} (target <= 5%): "
              f"{'MET' if s['target_met'] else 'NOT MET'}\n", file=stream)
    if v.korthikanti:
        s = summary["korthikanti"]
        print("Korthikanti 2022 Table 5 (iteration time)\n" + korthikanti_table(v.korthikanti), file=stream)
        print(f"within 10%: {s['within_10pct']}/{s['rows'] - s['undecided']} decided "
              f"({s['undecided']} undecided), MAE {s['mae']:.1%}: {'MET' if s['target_met'] else 'NOT MET'}\n",
              file=stream)
        selective = [r for r in v.korthikanti if r.table == "korthikanti-selective-sp"]
        if selective:
            print("Korthikanti 2022 Table 5 MFU / HFU (not tuned on)\n" + utilisation_table(selective) + "\n",
                  file=stream)
    if v.layers:
        print("Korthikanti 2022 Table 4, one 22B layer (not tuned on)\n" + layer_table(v.layers), file=stream)
        print(f"MAE over forward and backward cells: {summary['korthikanti_table4']['mae']:.1%}\n", file=stream)
    if v.zero:
        s = summary["zero"]
        print("ZeRO Table 1 (model-state GB per device)\n" + zero_table(v.zero), file=stream)
        print(f"exact to the printed rounding: {s['exact']}/{s['cells']}\n", file=stream)
    if v.modern:
        print("Modern dev set (tokens/s per GPU; + = simulator faster)\n" + dev_table(v.modern) + "\n", file=stream)
        print("Dev set summary\n" + summary_table(v.dev_groups()) + "\n", file=stream)
