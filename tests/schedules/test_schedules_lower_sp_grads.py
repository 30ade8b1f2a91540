"""Sequence parallelism: one TP all-reduce per stage of the partial norm / row-parallel bias / learned
position gradients (Megatron-LM ``_allreduce_layernorm_grads``), placed after the data-parallel gradient
sync and before the optimizer step."""

from __future__ import annotations

import dataclasses

from schedule_helpers import TINY

from simgrid.ir.ops import Collective, Compute, Wait
from simgrid.layout.mesh import Mesh
from simgrid.layout.spec import Layout
from simgrid.schedules.build import build_program

H, S = 64, 32
"""tiny-gpt: hidden 64, sequence 32, LayerNorm (weight + bias), biases, learned positions, 4 layers."""
PER_SUBLAYER = 2 * H + H  # the sub-block's LayerNorm weight and bias, plus its row-parallel output bias
HEAD = 2 * H  # final LayerNorm
EMBED = S * H  # learned position embedding


def _sp_ops(ops: tuple) -> list[tuple[int, Collective]]:
    return [(i, op) for i, op in enumerate(ops) if isinstance(op, Collective) and op.label.endswith(":sp-grads")]


def test_one_all_reduce_of_the_partial_gradients_per_stage_on_the_tp_group() -> None:
    """tp 2, pp 1: a single ALL_REDUCE labelled s0:sp-grads over the rank's TP group, with its WAIT,
    carrying positions + 8 sub-blocks x (norm + bias) + final norm, 2 bytes each in bf16."""
    assert (TINY.norm, TINY.position, TINY.bias, TINY.hidden_size, TINY.seq_length) == ("layernorm", "learned",
                                                                                         True, H, S)
    layout = Layout(tp=2, sequence_parallel=True, global_batch_size=2)
    program = build_program(TINY, layout)
    for rank in range(2):
        found = _sp_ops(program.ranks[rank])
        assert len(found) == 1
        _, op = found[0]
        assert (op.kind, op.purpose, op.label) == ("all_reduce", "tp", "s0:sp-grads")
        assert op.group == Mesh.tp_group_name(Mesh(layout).coords(rank))
        assert op.bytes == 2 * (EMBED + 2 * TINY.num_layers * PER_SUBLAYER + HEAD)
        assert Wait(handle=op.handle) in program.ranks[rank]


def test_sp_all_reduce_follows_backward_and_grad_sync_and_precedes_the_step() -> None:
    """With dp 2 (DDP buckets) the sp-grads all-reduce comes after the last backward and after every
    gradient all-reduce has been waited, and is waited before the optimizer step."""
    program = build_program(TINY, Layout(tp=2, dp=2, sequence_parallel=True, global_batch_size=4))
    ops = program.ranks[0]
    [(index, op)] = _sp_ops(ops)
    last_backward = max(i for i, o in enumerate(ops) if isinstance(o, Compute) and o.kind in ("B", "W"))
    grad_waits = [i for i, o in enumerate(ops) if isinstance(o, Wait) and o.handle.startswith("dp-grad:")]
    wait = ops.index(Wait(handle=op.handle))
    opt = next(i for i, o in enumerate(ops) if isinstance(o, Compute) and o.kind == "OPT")
    assert grad_waits and last_backward < index and max(grad_waits) < index < wait < opt


def test_each_pipeline_stage_syncs_only_its_own_partial_gradients() -> None:
    """pp 2 with 2 layers per stage: stage 0 holds the positions and two layers, stage 1 two layers and
    the final norm; each rank all-reduces its own stage's sum."""
    program = build_program(TINY, Layout(tp=2, pp=2, sequence_parallel=True, global_batch_size=4,
                                         schedule="1f1b"))
    first, last = _sp_ops(program.ranks[0]), _sp_ops(program.ranks[2])
    assert [op.label for _, op in first] == ["s0:sp-grads"] and [op.label for _, op in last] == ["s1:sp-grads"]
    assert first[0][1].bytes == 2 * (EMBED + 4 * PER_SUBLAYER)
    assert last[0][1].bytes == 2 * (4 * PER_SUBLAYER + HEAD)


def test_no_sp_all_reduce_without_sequence_parallelism() -> None:
    """Plain tensor parallelism computes these gradients on the whole sequence: nothing to sum."""
    assert _sp_ops(build_program(TINY, Layout(tp=2, global_batch_size=2)).ranks[0]) == []


def test_rmsnorm_without_biases_or_learned_positions_syncs_only_norm_weights() -> None:
    """A Llama-style block (RMSNorm weight only, no biases, rotary positions) contributes h per norm."""
    llama_like = dataclasses.replace(TINY, norm="rmsnorm", bias=False, position="rope")
    program = build_program(llama_like, Layout(tp=2, sequence_parallel=True, global_batch_size=2))
    [(_, op)] = _sp_ops(program.ranks[0])
    assert op.bytes == 2 * (2 * TINY.num_layers * H + H)
