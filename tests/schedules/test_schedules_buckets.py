"""Gradient buckets: reverse block order, closed at the bucket size, sizes summing to the stage's grads."""

from __future__ import annotations

import pytest
from schedule_helpers import TINY

from simgrid.layout.spec import Layout
from simgrid.model import block_params_on_rank, get_model
from simgrid.schedules.buckets import grad_buckets

MIB = 1024 * 1024


@pytest.mark.parametrize("bucket_mb", [0.01, 1.0, 25.0])
def test_buckets_cover_the_stage_in_reverse_order_and_sum_to_its_grads(bucket_mb: float) -> None:
    """Blocks 9..5 of stage 1 (pp = 2), each once, descending; bytes = bf16 grads = 2 bytes/param."""
    layout = Layout(pp=2, dp=2, global_batch_size=4, bucket_size_MB=bucket_mb)
    buckets = grad_buckets(TINY, layout, 1)
    blocks = [b for bucket in buckets for b in bucket.blocks]
    assert blocks == [9, 8, 7, 6, 5]
    expected = sum(2 * block_params_on_rank(TINY, layout, b) for b in range(5, 10))
    assert sum(bucket.bytes for bucket in buckets) == expected
    assert [bucket.index for bucket in buckets] == list(range(len(buckets)))


def test_a_bucket_closes_as_soon_as_it_reaches_the_cap() -> None:
    """Every bucket but the last holds >= cap, and would be below it without its last block."""
    model = get_model("gpt2-small")
    layout = Layout(dp=2, bucket_size_MB=10.0)
    buckets = grad_buckets(model, layout, 0)
    cap = 10.0 * MIB
    assert len(buckets) > 2
    for bucket in buckets[:-1]:
        last = 2 * block_params_on_rank(model, layout, bucket.blocks[-1])
        assert bucket.bytes >= cap > bucket.bytes - last
    assert buckets[-1].blocks[-1] == 0


def test_tiny_cap_gives_one_block_per_bucket_and_huge_cap_one_bucket() -> None:
    """The extremes: a 1-byte cap closes after every block; a huge cap never closes early."""
    small = grad_buckets(TINY, Layout(dp=2, bucket_size_MB=1e-6), 0)
    assert [b.blocks for b in small] == [(b,) for b in range(9, -1, -1)]
    assert len(grad_buckets(TINY, Layout(dp=2, bucket_size_MB=1e6), 0)) == 1


def test_zero2_buckets_hold_unsharded_gradients() -> None:
    """ZeRO-2 reduce-scatters the full bucket, so its size does not shrink with dp."""
    plain = grad_buckets(TINY, Layout(dp=4), 0)
    zero2 = grad_buckets(TINY, Layout(dp=4, zero=2), 0)
    assert [b.bytes for b in plain] == [b.bytes for b in zero2]


def test_megatron_policy_caps_buckets_at_megatron_core_parameter_count() -> None:
    """Megatron-Core's default bucket, max(40e6, 1e6 * dp) parameters (core_r0.8.0), as gradient bytes on the
    first pipeline rank: 40e6 parameters up to dp 40, 1e6 more per rank beyond; bf16 grads = 2 bytes."""
    from simgrid.schedules.buckets import bucket_cap_bytes

    assert bucket_cap_bytes(TINY, Layout(dp=8, bucket_policy="megatron"), 0) == 40_000_000 * 2
    assert bucket_cap_bytes(TINY, Layout(dp=48, bucket_policy="megatron"), 0) == 48_000_000 * 2
    assert bucket_cap_bytes(TINY, Layout(dp=48, bucket_size_MB=3.0), 0) == 3.0 * MIB  # ddp: bucket_size_MB
    model = get_model("llama2-7b")
    layout = Layout(dp=48, bucket_policy="megatron")
    buckets = grad_buckets(model, layout, 0)
    assert len(buckets) > 1
    assert all(b.bytes >= 48_000_000 * 2 for b in buckets[:-1])  # each closed bucket reached the cap
    assert sum(b.bytes for b in buckets) == sum(
        block_params_on_rank(model, layout, blk) * 2 for b in buckets for blk in b.blocks)


def test_megatron_policy_does_not_bucket_later_pipeline_ranks_or_chunks() -> None:
    """Megatron-Core turns bucketing off on pipeline ranks > 0 and for model chunks after the first: one
    bucket holding the whole stage there, while the first rank's first chunk is bucketed."""
    model = get_model("llama2-7b")
    layout = Layout(dp=48, pp=2, vpp=2, schedule="interleaved-1f1b", global_batch_size=96,
                    bucket_policy="megatron")
    assert len(grad_buckets(model, layout, 0)) > 1  # rank 0, chunk 0
    for stage in (1, 2, 3):  # rank 1 chunk 0, rank 0 chunk 1, rank 1 chunk 1
        assert len(grad_buckets(model, layout, stage)) == 1
