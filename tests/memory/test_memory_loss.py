"""The loss working set (simgrid.memory.activations.loss_working_bytes), its place in the analytic estimate,
and Megatron-Core's bucket views (simgrid.memory.buffers): expected values worked out by hand from shapes."""

from __future__ import annotations

import dataclasses

import pytest

from simgrid.errors import LayoutError
from simgrid.layout import Layout
from simgrid.memory import activation_memory_bytes, comm_buffer_bytes, loss_working_bytes, recompute_working_bytes
from simgrid.model import get_model

LLAMA3_8B = dataclasses.replace(get_model("llama3-8b"), seq_length=8192)  # V = 128256


def test_unfused_cross_entropy_holds_two_fp32_logit_tensors_beyond_the_saved_one() -> None:
    """torchtitan's F.cross_entropy(pred.float()) at b 2, s 8192, V 128256: 2 x 4 bytes per logit (the
    backward's nll_loss and log_softmax gradients; the forward's bf16 pred + fp32 copy is 6 bytes)."""
    layout = Layout(dp=8, zero=3, zero_impl="fsdp2", micro_batch_size=2, global_batch_size=16, cross_entropy="unfused")
    assert loss_working_bytes(LLAMA3_8B, layout) == 2 * 8192 * 128256 * 8


def test_fused_cross_entropy_holds_one_16bit_logit_tensor_and_none_in_fp32() -> None:
    """Megatron-Core's in-place kernel: only the caller's 16-bit logits (tp splits the vocabulary, cp the
    sequence); in fp32 training .float() is the same tensor."""
    layout = Layout(tp=2, cp=2, micro_batch_size=1, global_batch_size=1)
    assert loss_working_bytes(LLAMA3_8B, layout) == 1 * 4096 * 64128 * 2
    assert loss_working_bytes(LLAMA3_8B, dataclasses.replace(layout, precision="fp32")) == 0
    fp32_unfused = dataclasses.replace(layout, precision="fp32", cross_entropy="unfused")
    assert loss_working_bytes(LLAMA3_8B, fp32_unfused) == 4096 * 64128 * 8


def test_estimate_adds_the_loss_working_set_where_it_exceeds_the_recompute_one() -> None:
    """One rank holds the whole model: its activations grow by the loss working set (the larger of the two
    moments; the recompute working set under selective-op is smaller than 2 fp32 logit tensors)."""
    base = Layout(micro_batch_size=2, global_batch_size=2, recompute="selective-op", flash_attention=True)
    fused = activation_memory_bytes(LLAMA3_8B, base)[0]
    unfused = activation_memory_bytes(LLAMA3_8B, dataclasses.replace(base, cross_entropy="unfused"))[0]
    assert recompute_working_bytes(LLAMA3_8B, base) < 2 * 8192 * 128256 * 2
    assert unfused - fused == 2 * 8192 * 128256 * (8 - 2)


def test_only_the_pipeline_rank_holding_the_head_pays_the_loss() -> None:
    """1F1B with pp 2: rank 0 is unchanged by the loss implementation, rank 1 (the head) gains the difference."""
    layout = Layout(pp=2, micro_batch_size=1, global_batch_size=4)
    fused = activation_memory_bytes(LLAMA3_8B, layout)
    unfused = activation_memory_bytes(LLAMA3_8B, dataclasses.replace(layout, cross_entropy="unfused"))
    assert unfused[0] == fused[0]
    assert unfused[1] - fused[1] == 8192 * 128256 * (8 - 2)


def test_cross_entropy_setting_is_validated() -> None:
    with pytest.raises(LayoutError, match="cross_entropy = 'liger' is not one of fused, unfused"):
        Layout(cross_entropy="liger")  # type: ignore[arg-type]


def test_megatron_buckets_are_views_into_the_grad_buffer() -> None:
    """Megatron-Core (param_and_grad_buffer.py, core_r0.8.0): a bucket's grad_data is a view of the one
    contiguous grad buffer, so with ZeRO 0-1 no bucket bytes come on top of the gradients; PyTorch DDP-style
    buckets keep their two 25 MiB buffers."""
    model = get_model("llama3-8b")
    for zero in (0, 1):
        ddp = comm_buffer_bytes(model, Layout(dp=4, zero=zero, global_batch_size=4))
        assert ddp["dp-buckets"] == 2 * 25 * 2**20
        megatron = comm_buffer_bytes(model, Layout(dp=4, zero=zero, global_batch_size=4, bucket_policy="megatron"))
        assert "dp-buckets" not in megatron
