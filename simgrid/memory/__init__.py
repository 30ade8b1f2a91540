"""Analytic memory model: model states under ZeRO/offload, activations per schedule, buffers, fit verdict."""

from simgrid.memory.activations import (
    activation_memory_bytes,
    inflight_microbatches,
    loss_working_bytes,
    recompute_working_bytes,
    stage_activation_bytes,
)
from simgrid.memory.buffers import comm_buffer_bytes
from simgrid.memory.estimate import GPULike, MemoryEstimate, StageMemory, estimate_memory, stage_memory
from simgrid.memory.headroom import DEFAULT_HEADROOM, MemoryHeadroom
from simgrid.memory.states import (
    OPTIMIZER_STATE_BYTES,
    ModelStates,
    StateBytesPerParam,
    block_state_bytes,
    model_state_bytes,
    model_states_for_params,
    stage_block_groups,
    stage_state_bytes,
    state_bytes_per_param,
)
from simgrid.memory.suggest import LayoutSuggestion, suggest_layouts

__all__ = [
    "DEFAULT_HEADROOM",
    "OPTIMIZER_STATE_BYTES",
    "GPULike",
    "LayoutSuggestion",
    "MemoryEstimate",
    "MemoryHeadroom",
    "ModelStates",
    "StageMemory",
    "StateBytesPerParam",
    "activation_memory_bytes",
    "block_state_bytes",
    "comm_buffer_bytes",
    "estimate_memory",
    "inflight_microbatches",
    "loss_working_bytes",
    "model_state_bytes",
    "model_states_for_params",
    "recompute_working_bytes",
    "stage_activation_bytes",
    "stage_block_groups",
    "stage_memory",
    "stage_state_bytes",
    "state_bytes_per_param",
    "suggest_layouts",
]
