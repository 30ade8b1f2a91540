"""Step end: optimizer op, offload transfers, tied-embedding sync; and the whole build's metadata."""

from __future__ import annotations

import math

import pytest
from schedule_helpers import TINY

from simgrid.ir.ops import Collective, Compute, Transfer, Wait
from simgrid.layout.spec import Layout
from simgrid.model import block_params_on_rank
from simgrid.model.params import word_embedding_params
from simgrid.schedules import build_program


def _opt_ops(ops: tuple) -> list[Compute]:
    return [op for op in ops if isinstance(op, Compute) and op.kind == "OPT"]


@pytest.mark.parametrize(("optimizer", "per_param"), [("adam", 14), ("sgd", 4), ("adam-8bit", 18)])
def test_optimizer_flops_per_parameter_of_the_rank_shard(optimizer: str, per_param: int) -> None:
    """OPT covers the rank's parameters (1/dp of them under ZeRO >= 1) at the cited FLOPs/parameter."""
    layout = Layout(dp=4, zero=1, optimizer=optimizer, global_batch_size=4)  # type: ignore[arg-type]
    (opt,) = _opt_ops(build_program(TINY, layout).ranks[0])
    params = sum(block_params_on_rank(TINY, layout, b) for b in range(10))
    assert opt.flops == per_param * math.ceil(params / 4)
    assert (opt.stage, opt.microbatch, opt.block_start, opt.block_end, opt.device) == (-1, -1, 0, 10, "gpu")


def test_one_optimizer_op_per_local_chunk() -> None:
    """Interleaved pp = 2, vpp = 2: each rank steps its two chunks."""
    layout = Layout(pp=2, vpp=2, schedule="interleaved-1f1b", global_batch_size=2)
    model = TINY
    opts = _opt_ops(build_program(model, layout).ranks[1])
    assert [(op.chunk, op.block_start, op.block_end) for op in opts] == [(0, 3, 5), (1, 7, 10)]


def test_offload_moves_grads_down_steps_on_the_host_and_moves_params_up() -> None:
    """ZeRO-Offload (Ren et al. 2021): D2H grads, WAIT, OPT on cpu, H2D params, WAIT, in that order."""
    layout = Layout(dp=2, zero=1, offload_optimizer=True, global_batch_size=2)
    ops = build_program(TINY, layout).ranks[0]
    start = next(i for i, op in enumerate(ops) if isinstance(op, Transfer))
    kinds = [type(op).__name__ + (f":{op.direction}" if isinstance(op, Transfer) else "")
             + (f":{op.device}" if isinstance(op, Compute) else "") for op in ops[start:start + 5]]
    assert kinds == ["Transfer:d2h", "Wait", "Compute:cpu", "Transfer:h2d", "Wait"]
    params = math.ceil(sum(block_params_on_rank(TINY, layout, b) for b in range(10)) / 2)
    assert ops[start].bytes == 2 * params and ops[start + 3].bytes == 2 * params


def test_tied_embedding_gradient_is_all_reduced_between_first_and_last_stage() -> None:
    """pp = 2, tied: ranks of stage 0 and stage 1 with equal (dp, tp) form embed/dp<d>-tp<t>."""
    layout = Layout(pp=2, dp=2, tp=2, global_batch_size=4)
    program = build_program(TINY, layout)
    assert program.groups["embed/dp1-tp0"] == (2, 6)
    for rank in range(8):
        (coll,) = [op for op in program.ranks[rank] if isinstance(op, Collective) and op.purpose == "embed-grad"]
        assert rank in program.groups[coll.group]
        assert coll.bytes == 2 * word_embedding_params(TINY, 2)
        ops = program.ranks[rank]
        assert ops[ops.index(coll) + 1] == Wait(handle=coll.handle)
        assert ops.index(coll) < ops.index(_opt_ops(ops)[0])
    fp32 = build_program(TINY, Layout(pp=2, dp=2, tp=2, global_batch_size=4, zero=1, reduce_dtype="fp32"))
    (coll,) = [op for op in fp32.ranks[0] if isinstance(op, Collective) and op.purpose == "embed-grad"]
    assert coll.bytes == 4 * word_embedding_params(TINY, 2)  # Megatron all-reduces the fp32 main_grad


@pytest.mark.parametrize(
    "layout",
    [Layout(pp=2, vpp=2, schedule="zbv", global_batch_size=3), Layout(global_batch_size=2)],
)
def test_no_embedding_sync_when_one_rank_holds_both_ends(layout: Layout) -> None:
    """ZBV puts stage 0 and the last stage on rank 0; pp = 1 has a single copy: no embed group."""
    program = build_program(TINY, layout)
    assert not [g for g in program.groups if g.startswith("embed/")]


def test_program_metadata_names_schedule_granularity_and_microbatches() -> None:
    """meta records how the program was generated."""
    program = build_program(TINY, Layout(pp=2, global_batch_size=4), granularity="stage")
    assert dict(program.meta) == {"generator": "simgrid.schedules.build_program", "granularity": "stage",
                                  "num_microbatches": 4, "schedule": "1f1b"}


def test_fp32_main_grads_skip_the_gradient_copy_in_the_optimizer_traffic() -> None:
    """Megatron-LM's mixed-precision Adam step moves 52 bytes per parameter with 16-bit gradients (copy to the
    fp32 main grad, unscale, norm, update, copy back); with fp32 main grads (``reduce_dtype = "fp32"``) the
    first copy (read 2 + write 4) is gone: 46 bytes."""
    from simgrid.schedules.lower.optimizer import optimizer_traffic_bytes_per_param

    assert optimizer_traffic_bytes_per_param(Layout(dp=2, zero=1)) == 52
    assert optimizer_traffic_bytes_per_param(Layout(dp=2, zero=1, reduce_dtype="fp32")) == 46
