"""Model states: the ZeRO paper's Table 1, optimizer kinds, offload, and per-block / per-stage sums."""

from __future__ import annotations

import dataclasses
from decimal import Decimal

import pytest

from simgrid.errors import LayoutError
from simgrid.layout import Layout
from simgrid.memory import (
    block_state_bytes,
    model_state_bytes,
    model_states_for_params,
    stage_state_bytes,
    state_bytes_per_param,
)
from simgrid.model import get_model, param_count, stage_blocks, stages_of_rank

# Rajbhandari et al. 2020 (ZeRO) Table 1, copied from shared/reference/zero_table1.csv:
# (P, Nd, stage 1 GB, stage 2 GB, stage 3 GB), GB = 1e9 bytes, printed values.
ZERO_TABLE1 = [
    ("7.5e9", 1, "120", "120", "120"), ("7.5e9", 4, "52.5", "41.3", "30"), ("7.5e9", 16, "35.6", "21.6", "7.5"),
    ("7.5e9", 64, "31.4", "16.6", "1.88"), ("7.5e9", 256, "30.4", "15.4", "0.47"),
    ("7.5e9", 1024, "30.1", "15.1", "0.12"),
    ("128e9", 1, "2048", "2048", "2048"), ("128e9", 4, "896", "704", "512"), ("128e9", 16, "608", "368", "128"),
    ("128e9", 64, "536", "284", "32"), ("128e9", 256, "518", "263", "8"), ("128e9", 1024, "513", "257", "2"),
    ("1e12", 1, "16000", "16000", "16000"), ("1e12", 4, "7000", "5500", "4000"),
    ("1e12", 16, "4750", "2875", "1000"), ("1e12", 64, "4187", "2218", "250"),
    ("1e12", 256, "4046", "2054", "62.5"), ("1e12", 1024, "4011", "2013", "15.6"),
]


@pytest.mark.parametrize(("params", "dp", "s1", "s2", "s3"), ZERO_TABLE1)
def test_every_cell_of_zero_table1(params: str, dp: int, s1: str, s2: str, s3: str) -> None:
    """Mixed-precision Adam (K = 12) under ZeRO 1/2/3 matches each cell within one unit of its last digit.

    The table rounds some cells and truncates others (4187.5 prints as 4187), hence one unit, not half.
    """
    for stage, printed in ((1, s1), (2, s2), (3, s3)):
        layout = Layout(dp=dp, zero=stage)
        got_gb = model_states_for_params(float(params), layout).total_bytes / 1e9
        unit = float(Decimal(1).scaleb(Decimal(printed).as_tuple().exponent))  # type: ignore[arg-type]
        assert abs(got_gb - float(printed)) < unit, (stage, got_gb, printed)


def test_zero_formulas_by_stage() -> None:
    """Stage 0: 16P; 1: 4P + 12P/Nd; 2: 2P + 14P/Nd; 3: 16P/Nd (ZeRO section 5)."""
    P, nd = 1_000_000, 8
    totals = [model_states_for_params(P, Layout(dp=nd, zero=z)).total_bytes for z in range(4)]
    assert totals == [16 * P, 4 * P + 12 * P // nd, 2 * P + 14 * P // nd, 16 * P // nd]


@pytest.mark.parametrize(
    ("optimizer", "precision", "expected"),
    [
        ("adam", "bf16", (2, 2, 12)),  # ZeRO K = 12: master + m + v
        ("adam", "fp32", (4, 4, 8)),
        ("adam-8bit", "bf16", (2, 2, 6)),  # Dettmers 2022: fp32 master + two 1-byte moments
        ("adam-8bit", "fp32", (4, 4, 2)),
        ("sgd", "fp16", (2, 2, 8)),  # master + momentum
        ("sgd", "fp32", (4, 4, 4)),
    ],
)
def test_bytes_per_parameter_by_optimizer(optimizer: str, precision: str, expected: tuple[int, int, int]) -> None:
    """Weights, gradients and optimizer bytes per parameter for each optimizer and precision."""
    per = state_bytes_per_param(Layout(optimizer=optimizer, precision=precision))  # type: ignore[arg-type]
    assert (per.weights, per.grads, per.optimizer) == expected
    assert per.host == 0


def test_offload_moves_optimizer_and_master_to_host() -> None:
    """ZeRO-Offload: GPU keeps 2 + 2 bytes/param; host keeps 12 (master, m, v) + 4 (fp32 grads), sharded by ZeRO."""
    P = 1_000_000
    on_gpu = model_states_for_params(P, Layout(offload_optimizer=True))
    assert (on_gpu.weights_bytes, on_gpu.grads_bytes, on_gpu.optimizer_bytes, on_gpu.host_bytes) == (
        2 * P, 2 * P, 0, 16 * P)
    sharded = model_states_for_params(P, Layout(dp=4, zero=2, offload_optimizer=True))
    assert (sharded.total_bytes, sharded.host_bytes) == (2 * P + 2 * P // 4, 16 * P // 4)
    fp32 = model_states_for_params(P, Layout(offload_optimizer=True, precision="fp32"))
    assert (fp32.total_bytes, fp32.host_bytes) == (8 * P, (8 + 4 + 4) * P)


def test_block_states_sum_to_stage_and_worst_stage() -> None:
    """Per-block states (what the program builder allocates) add up to the stage; the worst rank is the max."""
    m = get_model("gpt3-175b")
    layout = Layout(tp=8, pp=8, dp=2, zero=1, global_batch_size=32)
    for rank in range(8):
        blocks = [b for s in stages_of_rank(layout, rank) for b in stage_blocks(m, layout, s)]
        summed = sum(block_state_bytes(m, layout, b).total_bytes for b in blocks)
        assert stage_state_bytes(m, layout, rank).total_bytes == summed
    worst = max(stage_state_bytes(m, layout, r).total_bytes for r in range(8))
    assert model_state_bytes(m, layout).total_bytes == worst


def test_single_gpu_states_are_16_bytes_per_parameter() -> None:
    """llama2-7b with mixed-precision Adam on one GPU: 16 bytes x 6.74e9 = 107.8 GB."""
    m = get_model("llama2-7b")
    states = model_state_bytes(m, Layout())
    assert states.total_bytes == 16 * param_count(m)
    assert states.total_bytes / 1e9 == pytest.approx(107.8, abs=0.1)


def test_negative_parameter_count_is_rejected() -> None:
    """A negative count is a LayoutError naming the count."""
    with pytest.raises(LayoutError, match="parameter count -1"):
        model_states_for_params(-1, Layout())


@pytest.mark.parametrize(("zero", "dp", "per_param"), [(0, 1, "18"), (1, 8, "7.5"), (1, 48, "6.25")])
def test_fp32_reduce_dtype_is_megatron_bf16_fp32_grads(zero: int, dp: int, per_param: str) -> None:
    """``reduce_dtype = "fp32"`` with ZeRO 0/1 is Megatron-LM's bf16 fp32 ``main_grad``: the bytes per parameter of
    Megatron's distributed-optimizer doc table ("bf16 param, fp32 grads": 18 without, 6 + 12/d with the
    distributed optimizer), i.e. 4-byte gradients where the default keeps 2 (ZeRO Table 1 unchanged)."""
    layout = Layout(dp=dp, zero=zero, global_batch_size=dp, reduce_dtype="fp32")
    per = state_bytes_per_param(layout)
    assert (per.weights, per.grads, per.optimizer) == (2, 4, 12)
    assert state_bytes_per_param(Layout(dp=dp, zero=zero, global_batch_size=dp)).grads == 2
    params = 10**9
    states = model_states_for_params(params, layout)
    assert Decimal(states.total_bytes) / params == Decimal(per_param)


def test_fp32_reduce_dtype_shards_fp32_grads_under_zero2_and_leaves_zero3_states_alone() -> None:
    """ZeRO-2 shards the 4-byte gradients over dp; ZeRO-3 (FSDP2's fp32 reduce) keeps its stored gradient
    shards in the parameter dtype, so its model states do not change."""
    params = 8 * 10**9
    zero2 = model_states_for_params(params, Layout(dp=8, zero=2, global_batch_size=8, reduce_dtype="fp32"))
    assert zero2.grads_bytes == params * 4 // 8
    fsdp = Layout(dp=8, zero=3, zero_impl="fsdp2", global_batch_size=8)
    fsdp_fp32 = Layout(dp=8, zero=3, zero_impl="fsdp2", global_batch_size=8, reduce_dtype="fp32")
    assert model_states_for_params(params, fsdp_fp32) == model_states_for_params(params, fsdp)


def test_fp32_reduce_dtype_in_fp32_training_changes_nothing() -> None:
    """fp32 training already keeps fp32 gradients: ``reduce_dtype = "fp32"`` is a no-op there."""
    plain = Layout(dp=4, zero=1, global_batch_size=4, precision="fp32")
    assert state_bytes_per_param(plain) == state_bytes_per_param(Layout(dp=4, zero=1, global_batch_size=4,
                                                                         precision="fp32", reduce_dtype="fp32"))


def test_fp8_caches_each_te_linear_weight_and_its_transpose() -> None:
    """Under fp8 each dense transformer sub-block holds its two TE linears' fp8 weights and transposes (2 bytes per
    parameter, whole on every rank even under ZeRO); the embedding and the head (16-bit) hold none."""
    from simgrid.model.fp8_kernels import fp8_weight_params

    model = get_model("llama2-7b")
    plain = Layout(tp=2, dp=2, zero=1, global_batch_size=4)
    fp8 = Layout(tp=2, dp=2, zero=1, global_batch_size=4, fp8_recipe="current")
    h, qkv, ffn = 4096, 3 * 4096 // 2, 11008 // 2
    assert fp8_weight_params(model, fp8, "attn") == h * qkv + (h // 2) * h
    assert fp8_weight_params(model, fp8, "mlp") == h * 2 * ffn + ffn * h
    for block, kind in ((1, "attn"), (2, "mlp")):
        extra = block_state_bytes(model, fp8, block).weights_bytes - block_state_bytes(model, plain, block).weights_bytes
        assert extra == 2 * fp8_weight_params(model, fp8, kind)
    for block in (0, 2 * model.num_layers + 1):
        assert block_state_bytes(model, fp8, block) == block_state_bytes(model, plain, block)


def test_fp8_params_hold_one_byte_weights_and_only_the_transpose_cache() -> None:
    """Layout.fp8_params: each TE linear weight is a 1-byte Float8Tensor (no bf16 copy) plus its 1-byte transpose
    cache: 2 bytes per parameter instead of 2 (bf16) + 2 (fp8 copy and transpose), i.e. 2 bytes less; gradients
    and optimizer states unchanged, the embedding and the head untouched."""
    from simgrid.model.fp8_kernels import fp8_weight_params

    model = get_model("llama2-7b")
    fp8 = Layout(tp=2, dp=2, zero=1, zero_impl="apex", global_batch_size=4, fp8_recipe="delayed")
    fp8w = dataclasses.replace(fp8, fp8_params=True)
    for block, kind in ((1, "attn"), (2, "mlp")):
        before, after = block_state_bytes(model, fp8, block), block_state_bytes(model, fp8w, block)
        assert before.weights_bytes - after.weights_bytes == 2 * fp8_weight_params(model, fp8, kind)
        assert (before.grads_bytes, before.optimizer_bytes) == (after.grads_bytes, after.optimizer_bytes)
    for block in (0, 2 * model.num_layers + 1):
        assert block_state_bytes(model, fp8w, block) == block_state_bytes(model, fp8, block)


def test_fp8_caches_every_local_expert_weight_and_the_shared_expert() -> None:
    """A MoE sub-block under fp8 holds the fp8 copy and transpose of its E / ep local experts' fc1 and fc2 weights
    (TE GroupedLinear's per-expert workspaces) and its shared expert's linears: 2 bytes per parameter; the router
    (16-bit) holds none. Qwen2-57B-A14B, ep 8: 8 of 64 experts (h 3584, width 2560, SwiGLU), shared 20480 / tp 2."""
    from simgrid.model.fp8_kernels import fp8_moe_weight_params

    model = get_model("qwen2-57b-a14b")
    plain = Layout(tp=2, ep=8, etp=1, dp=4, zero=1, sequence_parallel=True, global_batch_size=4)
    fp8 = dataclasses.replace(plain, fp8_recipe="delayed")
    h = 3584
    expected = 8 * h * (2 * 2560 + 2560) + h * (2 * 20480 // 2 + 20480 // 2)
    assert fp8_moe_weight_params(model, fp8) == expected
    extra = block_state_bytes(model, fp8, 2).weights_bytes - block_state_bytes(model, plain, 2).weights_bytes
    assert extra == 2 * expected
