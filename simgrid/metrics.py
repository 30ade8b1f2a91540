"""Metrics of one training step, derived from a :class:`~simgrid.trace.Trace`.

Definitions (every average over ranks weights a traced rank by the number of ranks it stands for,
``trace.multiplicity(rank)``, so symmetric and full simulations give the same numbers):

* ``step_time_s``: the trace's makespan (latest end of any op, steps start at 0).
* ``tokens_per_s``: ``global_batch * seq_length / step_time_s``.
* ``tflops_per_gpu`` (MFU numerator): model FLOPs per iteration without recompute
  (:func:`simgrid.model.model_flops_per_iteration`: 6N + attention, Megatron SC'21 eq. 3 form)
  / step time / world size / 1e12.
* ``hw_tflops_per_gpu`` (HFU numerator, what Megatron SC'21 Table 1 reports): FLOPs of every executed
  compute op, recompute included, summed over all ranks / step time / world size / 1e12.
* ``mfu``, ``hfu``: those rates over the GPU's dense peak at the layout's dtype.
* ``bubble_fraction``: the pipeline window is ``[t0, t1]``, from the first start to the last end of any
  F/B/I/W/R op on any rank (the optimizer and the gradient sync after the last backward lie outside).
  For each rank, *busy* is its F/B/I/W/R time and *exposed* its exposed-communication time (below)
  inside the window; ``bubble = 1 - sum(busy + exposed) / (ranks * (t1 - t0))``. So bubble, exposed
  communication and useful compute partition the window; with free communication, equal stage times
  and no recompute it is the textbook (p-1)/(m+p-1) for GPipe/1F1B and (p-1)/(v*m+p-1) interleaved.
* ``exposed_comm_s`` by kind (tp, pp, dp): per rank, the time its compute stream sat blocked in a WAIT
  *while the awaited communication was running* (waiting for a peer to issue its side is idle time,
  not communication), summed per kind, then averaged over ranks. Kinds follow
  :data:`simgrid.trace.PURPOSE_TO_COMM_KIND` (SEND/RECV and the tied-embedding sync are pp).
* link utilisation (flow mode): bytes a link carried / (its bandwidth x step time).

A trace from :func:`simgrid.simulate` carries the run it measures in ``meta`` (``model``, ``layout``,
``cluster``, ``metrics_inputs``), so :func:`metrics_from_trace` recomputes the same :class:`Metrics` from
a saved file.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from simgrid.errors import SimgridError
from simgrid.memory.headroom import DEFAULT_HEADROOM, MemoryHeadroom
from simgrid.trace import PIPELINE_KINDS as PIPELINE_KINDS  # re-exported: the metrics module documented it
from simgrid.trace import Trace, TraceAggregates

if TYPE_CHECKING:
    from simgrid.layout import Layout
    from simgrid.model.spec import ModelSpec

COMM_KINDS = ("tp", "cp", "ep", "pp", "dp")


@dataclass(frozen=True, kw_only=True)
class Metrics:
    """Headline numbers of one simulated (or measured) step."""

    step_time_s: float
    """Time of one training step."""
    tokens_per_s: float
    """Training tokens processed per second over the whole cluster."""
    tflops_per_gpu: float
    """Model TFLOP/s per GPU (no recompute): the MFU numerator."""
    hw_tflops_per_gpu: float
    """Executed TFLOP/s per GPU (recompute included): the HFU numerator."""
    mfu: float
    """Model FLOPs utilisation: ``tflops_per_gpu`` over the GPU's peak."""
    hfu: float
    """Hardware FLOPs utilisation: ``hw_tflops_per_gpu`` over the GPU's peak."""
    bubble_fraction: float
    """Idle fraction of the pipeline ranks' compute stream in the pipeline window (module docstring)."""
    exposed_comm_s: Mapping[str, float]
    """Seconds per rank the compute stream waited on running communication, by kind tp/pp/dp."""
    peak_memory_bytes: int
    """Largest per-rank device memory peak."""
    memory_capacity_bytes: int
    """Device memory of one GPU."""
    fits: bool
    """Every rank's peak is within capacity less ``memory_reserved_bytes``."""
    world_size: int
    """Number of GPUs."""
    link_utilisation: Mapping[str, float] = field(default_factory=dict)
    """Flow mode: fraction of each link's bandwidth used over the step."""
    memory_reserved_bytes: int = 0
    """Device memory kept free of tensors for the CUDA context and allocator fragmentation
    (:mod:`simgrid.memory.headroom`)."""
    memory_verdict: str = "fits"
    """``fits``, ``tight`` (fits by less than 5% of capacity) or ``does not fit``."""

    def to_json_dict(self) -> dict[str, Any]:
        """The issue's JSON keys (seconds, bytes)."""
        return {
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s,
            "tflops_per_gpu": self.tflops_per_gpu,
            "hw_tflops_per_gpu": self.hw_tflops_per_gpu,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "bubble_fraction": self.bubble_fraction,
            "peak_memory_bytes": self.peak_memory_bytes,
            "memory_capacity_bytes": self.memory_capacity_bytes,
            "fits": self.fits,
            "memory_reserved_bytes": self.memory_reserved_bytes,
            "memory_verdict": self.memory_verdict,
            "exposed_comm_s": {k: self.exposed_comm_s.get(k, 0.0) for k in COMM_KINDS},
            "world_size": self.world_size,
        }


def pipeline_window(trace: Trace) -> tuple[float, float]:
    """``(t0, t1)``: first start and last end of any F/B/I/W/R op; ``(0, 0)`` without one."""
    return trace.aggregates().window_s


def bubble_fraction(trace: Trace) -> float:
    """Idle fraction of the compute stream in the pipeline window (see the module docstring)."""
    return _bubble(trace.aggregates())


def exposed_comm_by_kind(trace: Trace) -> dict[str, float]:
    """Mean seconds per rank blocked on running communication, by kind tp/pp/dp (see module docstring)."""
    return _exposed(trace.aggregates())


def executed_flops(trace: Trace) -> float:
    """FLOPs of every executed compute op over all ranks (traced ranks scaled by their multiplicity)."""
    return trace.aggregates().executed_flops


def _bubble(agg: TraceAggregates) -> float:
    t0, t1 = agg.window_s
    span = t1 - t0
    if span <= 0:
        return 0.0
    weights = agg.weights
    used = _with_exposed_waits(agg.busy_s, agg.waits, t0, t1)
    total_weight = sum(weights[r] for r in used)
    busy = sum(weights[r] * t for r, t in used.items())
    return max(0.0, 1.0 - busy / (total_weight * span))


def _with_exposed_waits(busy_s: Mapping[int, float], waits: Sequence[float], t0: float, t1: float) -> dict[int, float]:
    """Each rank's busy seconds plus the exposed part of its WAITs inside ``[t0, t1]``, added one by one in
    row order (a rank without busy seconds is left out)."""
    import numpy as np

    used = dict(busy_s)
    if not waits:
        return used
    # The exposed part is the tail of the wait: [end - exposed, end], clipped to the window. Vectorised
    # over a million waits of a full-mode step. ``np.add.at`` is unbuffered and adds in index order, so each
    # rank's total gets its waits one by one in row order: the sums are those of adding wait by wait.
    flat = np.asarray(waits, dtype=np.float64).reshape(-1, 3)  # a view of the array's buffer
    end = flat[:, 1]
    lo = end - flat[:, 2]
    np.maximum(lo, t0, out=lo)
    hi = np.minimum(end, t1)
    keep = hi > lo
    hi -= lo  # the exposed part (in place: a full-mode step has a million waits)
    del lo
    ranks = flat[:, 0].astype(np.int32)
    size = max(int(ranks.max()), max(used)) + 1
    has_busy = np.zeros(size, dtype=bool)
    has_busy[list(used)] = True
    keep &= has_busy[ranks]
    part, ranks = hi[keep], ranks[keep]
    del hi, keep
    if not len(ranks):
        return used
    totals = np.zeros(size, dtype=np.float64)
    totals[list(used)] = list(used.values())
    np.add.at(totals, ranks, part)
    for r in np.unique(ranks).tolist():
        used[r] = float(totals[r])
    return used


def _exposed(agg: TraceAggregates) -> dict[str, float]:
    total_weight = sum(agg.weights.values())
    if not total_weight:
        return dict.fromkeys(COMM_KINDS, 0.0)
    return {k: agg.exposed_s.get(k, 0.0) / total_weight for k in COMM_KINDS}


def metric_notes(metrics: Metrics, layout: Layout) -> list[str]:
    """Explanations a reader of the numbers needs (today: why HFU can be below MFU)."""
    notes = []
    if metrics.hfu < metrics.mfu:
        why = ("the FlashAttention kernel skips the score tiles the causal mask hides (Dao 2023, section 3.1.1), "
               "so the hardware executes fewer FLOPs than the model-FLOPs count, which keeps the full s x s "
               "attention core (Megatron SC'21 eq. 3)") if layout.flash_attention else (
               "the hardware executed fewer FLOPs than the model-FLOPs count")
        notes.append(f"HFU {metrics.hfu:.1%} is below MFU {metrics.mfu:.1%}: {why}")
    return notes


def metrics_meta(*, model: ModelSpec, layout: Layout, cluster: str, peak_flops_per_gpu: float,
                 peak_memory_bytes: int, memory_capacity_bytes: int,
                 memory_headroom: MemoryHeadroom = DEFAULT_HEADROOM) -> dict[str, Any]:
    """What :func:`metrics_from_trace` needs, as trace metadata (JSON-ready)."""
    return {
        "model": model.to_dict(),
        "layout": layout.to_dict(),
        "cluster": cluster,
        "metrics_inputs": {"peak_flops_per_gpu": float(peak_flops_per_gpu),
                           "peak_memory_bytes": int(peak_memory_bytes),
                           "memory_capacity_bytes": int(memory_capacity_bytes),
                           "memory_headroom": dataclasses.asdict(memory_headroom)},
    }


def metrics_from_trace(trace: Trace) -> Metrics | None:
    """The step's :class:`Metrics` from a trace that carries its run (``meta`` written by
    :func:`metrics_meta`); ``None`` for a trace without one (e.g. hand-made rows)."""
    from simgrid.layout import Layout
    from simgrid.model.spec import ModelSpec

    model, layout, inputs = (trace.meta.get(key) for key in ("model", "layout", "metrics_inputs"))
    if not (isinstance(model, Mapping) and isinstance(layout, Mapping) and isinstance(inputs, Mapping)):
        return None
    try:
        return compute_metrics(
            trace, model=ModelSpec.from_dict(dict(model)), layout=Layout.from_dict(dict(layout)),
            peak_flops_per_gpu=float(inputs["peak_flops_per_gpu"]),
            peak_memory_bytes=int(inputs.get("peak_memory_bytes", 0)),
            memory_capacity_bytes=int(inputs.get("memory_capacity_bytes", 0)),
            memory_headroom=MemoryHeadroom(**inputs.get("memory_headroom", {})),
        )
    except (KeyError, TypeError, ValueError, SimgridError) as exc:
        from simgrid.trace import TraceError

        raise TraceError(f"trace meta 'metrics_inputs' is malformed ({exc}); expected peak_flops_per_gpu, "
                         "peak_memory_bytes and memory_capacity_bytes numbers as simgrid simulate writes") from None


def compute_metrics(trace: Trace, *, model: ModelSpec, layout: Layout, peak_flops_per_gpu: float,
                    peak_memory_bytes: int = 0, memory_capacity_bytes: int = 0,
                    link_utilisation: Mapping[str, float] | None = None,
                    memory_headroom: MemoryHeadroom = DEFAULT_HEADROOM) -> Metrics:
    """All :class:`Metrics` of one step from its trace, the model, the layout and the GPU peak (FLOP/s);
    the memory verdict keeps ``memory_headroom`` free of tensors."""
    return metrics_from_aggregates(trace.aggregates(), model=model, layout=layout,
                                   peak_flops_per_gpu=peak_flops_per_gpu, peak_memory_bytes=peak_memory_bytes,
                                   memory_capacity_bytes=memory_capacity_bytes, link_utilisation=link_utilisation,
                                   memory_headroom=memory_headroom)


def metrics_from_aggregates(agg: TraceAggregates, *, model: ModelSpec, layout: Layout, peak_flops_per_gpu: float,
                            peak_memory_bytes: int = 0, memory_capacity_bytes: int = 0,
                            link_utilisation: Mapping[str, float] | None = None,
                            memory_headroom: MemoryHeadroom = DEFAULT_HEADROOM) -> Metrics:
    """:func:`compute_metrics` from a trace's :class:`~simgrid.trace.TraceAggregates` (what it reads from
    the rows), e.g. those the fast engine keeps while it runs."""
    from simgrid.model import model_flops_per_iteration

    world = layout.world_size
    step = agg.makespan_s
    model_flops = model_flops_per_iteration(model, layout.gbs)
    hw_flops = agg.executed_flops
    per_gpu = (lambda flops: flops / step / world) if step > 0 else (lambda flops: 0.0)
    model_rate, hw_rate = per_gpu(model_flops), per_gpu(hw_flops)
    return Metrics(
        step_time_s=step,
        tokens_per_s=layout.gbs * model.seq_length / step if step > 0 else 0.0,
        tflops_per_gpu=model_rate / 1e12,
        hw_tflops_per_gpu=hw_rate / 1e12,
        mfu=model_rate / peak_flops_per_gpu,
        hfu=hw_rate / peak_flops_per_gpu,
        bubble_fraction=_bubble(agg),
        exposed_comm_s=_exposed(agg),
        peak_memory_bytes=int(peak_memory_bytes),
        memory_capacity_bytes=int(memory_capacity_bytes),
        fits=peak_memory_bytes <= memory_headroom.usable_bytes(memory_capacity_bytes),
        world_size=world,
        link_utilisation=dict(link_utilisation or {}),
        memory_reserved_bytes=memory_headroom.reserved_bytes(memory_capacity_bytes),
        memory_verdict=memory_headroom.verdict(peak_memory_bytes, memory_capacity_bytes),
    )
