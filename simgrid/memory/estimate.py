"""The analytic memory estimate of a run: per pipeline rank and for the worst rank, with a fit verdict.

Total per rank = model states (:mod:`~simgrid.memory.states`) + peak saved activations
(:mod:`~simgrid.memory.activations`) + communication buffers (:mod:`~simgrid.memory.buffers`). All
tensor-parallel and data-parallel ranks of one pipeline rank are identical, so the worst rank is the
worst pipeline rank. ``fits`` compares the total with the capacity less a reserve for the CUDA context
and allocator fragmentation (:mod:`~simgrid.memory.headroom`, sourced and configurable), and ``verdict``
says ``tight`` when it fits by less than 5% of capacity.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from simgrid.errors import LayoutError
from simgrid.layout.fp8_checks import check_fp8_gpu
from simgrid.layout.spec import Layout, check_layout
from simgrid.memory.activations import activation_memory_bytes
from simgrid.memory.buffers import comm_buffer_bytes
from simgrid.memory.headroom import DEFAULT_HEADROOM, MemoryHeadroom, Verdict
from simgrid.memory.states import stage_state_bytes
from simgrid.model.spec import ModelSpec


class GPULike(Protocol):
    """What the memory model needs from a GPU description (e.g. ``simgrid.hardware.GPUSpec``)."""

    @property
    def name(self) -> str: ...

    @property
    def memory_bytes(self) -> int: ...


@dataclass(frozen=True, kw_only=True)
class StageMemory:
    """Memory of one rank of one pipeline rank, bytes."""

    pp_rank: int
    """Pipeline rank."""
    weights_bytes: int
    """Working weights on the GPU."""
    grads_bytes: int
    """Gradients on the GPU."""
    optimizer_bytes: int
    """Optimizer states (with the fp32 master copy) on the GPU."""
    activations_bytes: int
    """Peak saved activations."""
    buffers_bytes: int
    """Communication buffers (see :mod:`simgrid.memory.buffers`)."""
    host_bytes: int
    """Host memory used by optimizer offload."""
    buffers: dict[str, int] = field(default_factory=dict)
    """Buffers by purpose."""

    @property
    def model_states_bytes(self) -> int:
        """Weights + gradients + optimizer states on the GPU."""
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes

    @property
    def total_bytes(self) -> int:
        """Everything on the GPU."""
        return self.model_states_bytes + self.activations_bytes + self.buffers_bytes


@dataclass(frozen=True, kw_only=True)
class MemoryEstimate:
    """Memory of a run's worst rank, the per-stage detail and the verdict against a GPU."""

    model_states_bytes: int
    """Weights + gradients + optimizer states on the worst rank's GPU."""
    activations_bytes: int
    """Peak saved activations on the worst rank."""
    buffers_bytes: int
    """Communication buffers on the worst rank."""
    total_bytes: int
    """Worst rank's GPU total."""
    breakdown: dict[str, int]
    """Worst rank by category: weights, grads, optimizer, activations, buffers."""
    per_stage: list[StageMemory]
    """One entry per pipeline rank."""
    worst_pp_rank: int
    """Pipeline rank with the largest total."""
    host_bytes: int
    """Host memory per rank kept by optimizer offload (0 without offload)."""
    capacity_bytes: int | None = None
    """GPU memory capacity; ``None`` when no GPU was given."""
    fits: bool | None = None
    """``total_bytes <= usable_bytes`` (capacity less the reserve); ``None`` when no GPU was given."""
    gpu_name: str | None = None
    """Name of the GPU compared against."""
    reserved_bytes: int | None = None
    """GPU memory kept free for the CUDA context and allocator fragmentation; ``None`` without a GPU."""
    verdict: Verdict | None = None
    """``fits``, ``tight`` (fits by less than 5% of capacity) or ``does not fit``; ``None`` without a GPU."""

    @property
    def usable_bytes(self) -> int | None:
        """Capacity less the reserve: what tensors may use."""
        if self.capacity_bytes is None or self.reserved_bytes is None:
            return None
        return max(0, self.capacity_bytes - self.reserved_bytes)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (bytes as integers), the ``simgrid memory --json`` contract."""
        return {
            "model_states_bytes": self.model_states_bytes,
            "activations_bytes": self.activations_bytes,
            "buffers_bytes": self.buffers_bytes,
            "total_bytes": self.total_bytes,
            "host_bytes": self.host_bytes,
            "breakdown": dict(self.breakdown),
            "worst_pp_rank": self.worst_pp_rank,
            "per_stage": [
                {"pp_rank": s.pp_rank, "weights_bytes": s.weights_bytes, "grads_bytes": s.grads_bytes,
                 "optimizer_bytes": s.optimizer_bytes, "activations_bytes": s.activations_bytes,
                 "buffers_bytes": s.buffers_bytes, "total_bytes": s.total_bytes, "host_bytes": s.host_bytes,
                 "buffers": dict(s.buffers)}
                for s in self.per_stage
            ],
            "gpu": self.gpu_name,
            "capacity_bytes": self.capacity_bytes,
            "reserved_bytes": self.reserved_bytes,
            "usable_bytes": self.usable_bytes,
            "fits": self.fits,
            "verdict": self.verdict,
        }


def stage_memory(model: ModelSpec, layout: Layout) -> list[StageMemory]:
    """Memory of every pipeline rank."""
    check_layout(model, layout)
    activations = activation_memory_bytes(model, layout)
    stages = []
    for pp_rank in range(layout.pp):
        states = stage_state_bytes(model, layout, pp_rank)
        buffers = comm_buffer_bytes(model, layout, pp_rank)
        stages.append(StageMemory(
            pp_rank=pp_rank, weights_bytes=states.weights_bytes, grads_bytes=states.grads_bytes,
            optimizer_bytes=states.optimizer_bytes, activations_bytes=activations[pp_rank],
            buffers_bytes=sum(buffers.values()), host_bytes=states.host_bytes, buffers=buffers,
        ))
    return stages


def estimate_memory(model: ModelSpec, layout: Layout, gpu: GPULike | None = None, *,
                    headroom: MemoryHeadroom = DEFAULT_HEADROOM) -> MemoryEstimate:
    """Analytic memory of the run; with ``gpu`` also its capacity and whether the worst rank fits in it
    with ``headroom`` kept free (``MemoryHeadroom.fixed(0)`` compares with the whole capacity). An fp8 layout on a
    GPU without fp8 tensor cores is an error (:func:`simgrid.layout.check_fp8_gpu`)."""
    check_fp8_gpu(layout.fp8_recipe, gpu)
    per_stage = stage_memory(model, layout)
    worst = max(per_stage, key=lambda s: s.total_bytes)
    capacity: int | None = None
    if gpu is not None:
        capacity = getattr(gpu, "memory_bytes", None)
        if not isinstance(capacity, (int, float)) or capacity <= 0:
            raise LayoutError(f"gpu {getattr(gpu, 'name', gpu)!r}: memory_bytes = {capacity!r} must be positive")
        capacity = int(capacity)
    return MemoryEstimate(
        model_states_bytes=worst.model_states_bytes,
        activations_bytes=worst.activations_bytes,
        buffers_bytes=worst.buffers_bytes,
        total_bytes=worst.total_bytes,
        breakdown={"weights": worst.weights_bytes, "grads": worst.grads_bytes, "optimizer": worst.optimizer_bytes,
                   "activations": worst.activations_bytes, "buffers": worst.buffers_bytes},
        per_stage=per_stage,
        worst_pp_rank=worst.pp_rank,
        host_bytes=max(s.host_bytes for s in per_stage),
        capacity_bytes=capacity,
        fits=None if capacity is None else worst.total_bytes <= headroom.usable_bytes(capacity),
        gpu_name=None if gpu is None else str(getattr(gpu, "name", "gpu")),
        reserved_bytes=None if capacity is None else headroom.reserved_bytes(capacity),
        verdict=None if capacity is None else headroom.verdict(worst.total_bytes, capacity),
    )
