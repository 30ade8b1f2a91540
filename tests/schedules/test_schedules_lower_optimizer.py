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
from simgrid.schedules.buckets import apex_padded_params, apex_state_bucket_params
from simgrid.schedules.lower.context import LoweringContext
from simgrid.schedules.lower.param_gather import fp8_shard_cast


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


# -- Layout.optimizer_impl: fused (default) against torch's foreach step --------------------------------------
def _step(model: object, **fields: object) -> Compute:
    layout = Layout(dp=2, global_batch_size=2, **fields)  # type: ignore[arg-type]
    (opt,) = _opt_ops(build_program(model, layout).ranks[0])  # type: ignore[arg-type]
    return opt


def test_fused_step_has_no_host_time() -> None:
    """The default fused step is GPU-bound: no host time, the fused kernel's bytes."""
    assert _step(TINY, zero=3, zero_impl="fsdp2").host_s == 0.0


def test_foreach_on_fsdp2_dtensors_pays_host_time_per_parameter_tensor() -> None:
    """FSDP2 + foreach: host time = parameter tensors x the per-tensor cost from torchtitan PR 355, and the
    foreach passes' extra bytes (80 - 28 per parameter, torch's _multi_tensor_adam)."""
    from simgrid.schedules.lower.optimizer import FOREACH_DTENSOR_HOST_S_PER_TENSOR

    fused = _step(TINY, zero=3, zero_impl="fsdp2")
    foreach = _step(TINY, zero=3, zero_impl="fsdp2", optimizer_impl="foreach")
    # tiny-gpt (LayerNorm with bias, learned positions, biases, tied): word + position embedding, per layer
    # attention (2 norm + 4 weights + 4 biases) and MLP (2 norm + 2 weights + 2 biases), final norm (2).
    assert foreach.host_s == pytest.approx((2 + 4 * (10 + 6) + 2) * FOREACH_DTENSOR_HOST_S_PER_TENSOR)
    params = foreach.flops / 14
    assert foreach.hbm_bytes - fused.hbm_bytes == pytest.approx(52 * params)


def test_llama3_8b_holds_the_291_tensors_the_constant_was_derived_on() -> None:
    """torchtitan's Llama 3 8B: 32 x 9 layer tensors + embedding, final norm, output = 291."""
    from simgrid.model import get_model
    from simgrid.schedules.lower.optimizer import FOREACH_DTENSOR_HOST_S_PER_TENSOR

    opt = _step(get_model("llama3-8b"), zero=3, zero_impl="fsdp2", optimizer_impl="foreach", flash_attention=True)
    assert opt.host_s / FOREACH_DTENSOR_HOST_S_PER_TENSOR == pytest.approx(291)


def test_foreach_host_time_constant_follows_pr355_step_times() -> None:
    """(8192/2627 - 8192/2717 s + the fused kernel's 28 B x 1.0e9 / 2039 GB/s) / 291 tensors = 0.40 ms."""
    from simgrid.schedules.lower.optimizer import FOREACH_DTENSOR_HOST_S_PER_TENSOR

    expected = (0.10330 + 0.013784) / 291
    assert expected == pytest.approx(FOREACH_DTENSOR_HOST_S_PER_TENSOR, rel=1e-3)


@pytest.mark.parametrize("fields", [{"zero": 1}, {"zero": 3, "zero_impl": "deepspeed"},
                                    {"zero": 1, "offload_optimizer": True}])
def test_foreach_on_plain_tensors_or_offloaded_is_not_host_bound(fields: dict[str, object]) -> None:
    """Only FSDP2's DTensors make the foreach step host-bound; an offloaded step runs on the host anyway."""
    assert _step(TINY, optimizer_impl="foreach", **fields).host_s == 0.0


def test_fp8_params_cast_the_shard_to_one_byte_in_the_optimizer_step() -> None:
    """Layout.fp8_params: the fp8 weights' copy back from the fp32 master is NeMo's cast_to_fp8 of the shard, so
    it writes 1 byte instead of 2 per fp8 weight of the shard; one launch per fp8 state bucket plus the five
    scale / amax bookkeeping launches."""
    layout = Layout(dp=2, zero=1, zero_impl="apex", bucket_size_MB=0.01, fp8_recipe="delayed")
    fp8w = Layout(dp=2, zero=1, zero_impl="apex", bucket_size_MB=0.01, fp8_recipe="delayed", fp8_params=True)
    (plain,) = _opt_ops(build_program(TINY, layout).ranks[0])
    (got,) = _opt_ops(build_program(TINY, fp8w).ranks[0])
    layer = 64 * (3 * 64 + 64) + 64 * (256 + 256)  # tiny-gpt's four TE weights of one layer
    assert got.hbm_bytes == plain.hbm_bytes - 4 * layer // 2 * (2 - 1)
    per_layer = apex_padded_params(layer, fp8w) // apex_state_bucket_params(fp8w)
    assert plain.kernels == 1 and got.kernels == 1 + 4 * per_layer + 5
    ctx = LoweringContext(model=TINY, layout=fp8w, granularity="block")
    assert fp8_shard_cast(ctx, 0) == (4 * layer // 2, 4 * per_layer)
