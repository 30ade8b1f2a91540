"""MoE memory: expert states sharded by ep/etp and ZeRO over edp, routed-token activations, dispatcher
buffers, and advice that offers expert parallelism."""

from __future__ import annotations

import dataclasses

import pytest

from simgrid.hardware import load_gpu
from simgrid.layout import Layout
from simgrid.memory import comm_buffer_bytes, estimate_memory, suggest_layouts
from simgrid.memory.states import stage_state_bytes
from simgrid.model import block_cost, get_model
from simgrid.model.moe import dispatcher_buffer_bytes

MIXTRAL = get_model("mixtral-8x7b")


def _params(layout: Layout) -> tuple[int, int]:
    """(dense, expert) parameters of one rank of mixtral-8x7b under ``layout`` (pp = 1: every block)."""
    costs = [block_cost(MIXTRAL, layout, b) for b in range(2 * MIXTRAL.num_layers + 2)]
    experts = sum(c.expert_param_count for c in costs)
    return sum(c.param_count for c in costs) - experts, experts


def test_expert_weights_split_over_ep_and_etp() -> None:
    """ep 8 holds one of 8 experts per layer; etp 2 halves each; the dense part does not change."""
    dense1, experts1 = _params(Layout(dp=8, global_batch_size=8))
    dense8, experts8 = _params(Layout(dp=8, ep=8, global_batch_size=8))
    _, experts4x2 = _params(Layout(dp=8, ep=4, etp=2, global_batch_size=8))
    assert dense8 == dense1 and experts8 * 8 == experts1 and experts4x2 * 8 == experts1


def test_zero1_shards_expert_optimizer_states_over_edp() -> None:
    """Adam, bf16, ZeRO-1, dp 8, ep 2 (edp 4): 2 + 2 bytes per held parameter, and 12 bytes per dense parameter
    over 8 ranks plus per expert parameter over the 4 ranks holding the same experts."""
    lay = Layout(dp=8, ep=2, zero=1, global_batch_size=8)
    dense, experts = _params(lay)
    states = stage_state_bytes(MIXTRAL, lay, 0)
    assert states.weights_bytes == states.grads_bytes == 2 * (dense + experts)
    assert states.optimizer_bytes == pytest.approx(12 * dense / 8 + 12 * experts / 4, abs=4 * 65)


def test_activations_grow_with_the_routed_tokens() -> None:
    """The experts' saved tensors scale with the routed token count: a 1.5x load imbalance on the busiest rank
    raises the MoE activations, while the attention's stay."""
    lay = Layout(dp=8, ep=8, global_batch_size=8)
    skewed = dataclasses.replace(MIXTRAL, moe=dataclasses.replace(MIXTRAL.moe, load_imbalance=1.5))  # type: ignore[arg-type]
    assert block_cost(skewed, lay, 2).activation_bytes > block_cost(MIXTRAL, lay, 2).activation_bytes
    assert block_cost(skewed, lay, 1).activation_bytes == block_cost(MIXTRAL, lay, 1).activation_bytes


def test_dispatcher_and_expert_bucket_buffers() -> None:
    """ep 4 on 8 ranks (edp 2): the dispatcher's buffers and two expert-gradient buckets are counted."""
    lay = Layout(dp=8, ep=4, zero=1, global_batch_size=8)
    buffers = comm_buffer_bytes(MIXTRAL, lay)
    assert buffers["ep-dispatch"] == dispatcher_buffer_bytes(MIXTRAL, lay) > 0
    assert buffers["edp-buckets"] == 2 * 25 * 2**20
    assert "ep-dispatch" not in comm_buffer_bytes(MIXTRAL, Layout(dp=8, global_batch_size=8))


def test_advice_offers_expert_parallelism() -> None:
    """Mixtral 8x7B on 8 H100s with data parallelism alone needs ~300 GiB per GPU; the advice that keeps the
    8 GPUs spreads the experts (ep 8)."""
    lay = Layout(dp=8, zero=1, global_batch_size=8)
    gpu = load_gpu("h100-sxm")
    assert estimate_memory(MIXTRAL, lay, gpu).fits is False
    advice = suggest_layouts(MIXTRAL, lay, gpu, max_gpus=8)
    assert advice and "ep=8" in advice[0].description
    assert all(s.layout.world_size <= 8 for s in advice)
