"""Megatron-Core DDP's ``grad_data *= 1 / dp`` before each bucket's collective, folded into the compute op before it."""

from __future__ import annotations

import pytest
from schedule_helpers import TINY

import simgrid.schedules.build as build
from simgrid.ir.ops import Collective, Compute
from simgrid.layout.spec import Layout
from simgrid.model import block_params_on_rank
from simgrid.schedules import build_program
from simgrid.schedules.buckets import grad_buckets


def _pair(layout: Layout, monkeypatch: pytest.MonkeyPatch, rank: int = 0) -> tuple[tuple, tuple]:
    """The rank's ops with the scaling pass and without it (the pass replaced by the identity)."""
    scaled = build_program(TINY, layout).ranks[rank]
    with monkeypatch.context() as m:
        m.setattr(build, "add_grad_scaling", lambda ctx, role: role)
        plain = build_program(TINY, layout).ranks[rank]
    return scaled, plain


def _bucket_colls(ops: tuple) -> list[tuple[int, Collective]]:
    return [(i, op) for i, op in enumerate(ops) if isinstance(op, Collective) and op.purpose in ("dp-grad", "zero-grad")]


@pytest.mark.parametrize("zero", [0, 1])
def test_each_bucket_adds_one_read_and_write_of_its_gradients_to_the_op_before_its_collective(
        zero: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """dp 4, Megatron buckets, bf16 gradients: the op issued right before each bucket's all-reduce (ZeRO 0) or
    reduce-scatter (ZeRO 1) gains 2 x (bucket parameters x 2 bytes) of HBM traffic and one kernel; every other op
    is unchanged."""
    layout = Layout(dp=4, zero=zero, global_batch_size=4, bucket_policy="megatron")
    scaled, plain = _pair(layout, monkeypatch)
    assert len(scaled) == len(plain)
    colls = _bucket_colls(scaled)
    assert colls
    buckets = {f"s0:bucket{b.index}": b for b in grad_buckets(TINY, layout, 0)}
    changed = set()
    for index, coll in colls:
        before = max(i for i in range(index) if isinstance(scaled[i], Compute))
        params = sum(block_params_on_rank(TINY, layout, b) for b in buckets[coll.label].blocks)
        changed.add(before)
        assert scaled[before].hbm_bytes == pytest.approx(plain[before].hbm_bytes + 2 * params * 2)
        assert scaled[before].kernels == plain[before].kernels + 1
    assert all(scaled[i] == plain[i] for i in range(len(plain)) if i not in changed)


def test_interleaved_delayed_launch_scales_every_bucket_of_the_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under Megatron's delayed grad reduce a chunk's buckets start together after one backward: that backward's last
    compute op carries all of their scaling kernels."""
    layout = Layout(dp=2, zero=1, pp=2, vpp=2, schedule="interleaved-1f1b", global_batch_size=8,
                    bucket_policy="megatron")
    for rank in (0, 2):  # pp rank 0 and 1 at dp 0
        scaled, plain = _pair(layout, monkeypatch, rank)
        colls = _bucket_colls(scaled)
        assert colls
        extra_bytes = sum(s.hbm_bytes - p.hbm_bytes for s, p in zip(scaled, plain, strict=True)
                          if isinstance(s, Compute))
        extra_kernels = sum(s.kernels - p.kernels for s, p in zip(scaled, plain, strict=True) if isinstance(s, Compute))
        assert extra_bytes == pytest.approx(2 * sum(c.bytes for _, c in colls))
        assert extra_kernels == len(colls)


@pytest.mark.parametrize("settings", [
    dict(dp=4, zero=1, global_batch_size=4),  # PyTorch DDP's buckets: divided in its comm hook, not here
    dict(dp=1, cp=2, zero=1, global_batch_size=1, bucket_policy="megatron"),  # factor 1 / dp = 1: no kernel
    dict(dp=4, zero=1, global_batch_size=4, zero_impl="apex"),  # apex DistributedFusedAdam's own sync
])
def test_no_scaling_kernel_where_megatron_core_does_not_scale(settings: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only Megatron-Core's DDP with dp > 1 scales its buckets."""
    scaled, plain = _pair(Layout(**settings), monkeypatch)  # type: ignore[arg-type]
    assert scaled == plain
