"""ClusterCostModel: a GPU op with host issue time lasts max(GPU time, host time); the duration cache keys on it."""

from __future__ import annotations

import dataclasses

import pytest

from simgrid.engine.costmodel import ClusterCostModel, DurationCache
from simgrid.errors import SimgridError
from simgrid.hardware import load_cluster
from simgrid.ir import Compute

_OPT = Compute(kind="OPT", stage=-1, microbatch=-1, chunk=0, block_start=0, block_end=4, flops=14e6,
               hbm_bytes=46e6)


@pytest.fixture(scope="module")
def cost() -> ClusterCostModel:
    return ClusterCostModel(load_cluster("dgx-a100-hdr", gpus=8))


def test_host_time_below_gpu_time_changes_nothing(cost: ClusterCostModel) -> None:
    """The GPU is the bound when the host issues faster than the kernels run."""
    gpu = cost.compute_s(_OPT, 1.0)
    assert cost.compute_s(dataclasses.replace(_OPT, host_s=gpu / 2), 1.0) == gpu


def test_host_time_above_gpu_time_is_the_duration(cost: ClusterCostModel) -> None:
    """A host-bound op ends when the host has issued its last kernel."""
    gpu = cost.compute_s(_OPT, 1.0)
    assert cost.compute_s(dataclasses.replace(_OPT, host_s=10 * gpu), 1.0) == pytest.approx(10 * gpu)


def test_gpu_speed_factor_does_not_scale_host_time(cost: ClusterCostModel) -> None:
    """A slow GPU (speed 0.5) doubles the GPU time, not the host's dispatch time."""
    gpu = cost.compute_s(_OPT, 1.0)
    host_bound = dataclasses.replace(_OPT, host_s=10 * gpu)
    assert cost.compute_s(host_bound, 0.5) == pytest.approx(10 * gpu)
    assert cost.compute_s(dataclasses.replace(_OPT, host_s=1.5 * gpu), 0.5) == pytest.approx(2 * gpu)


def test_negative_host_time_is_an_error(cost: ClusterCostModel) -> None:
    """A negative host time is refused with a message naming the field."""
    with pytest.raises(SimgridError, match=r"host_s = -1\.0"):
        cost.compute_s(dataclasses.replace(_OPT, host_s=-1.0), 1.0)


def test_duration_cache_does_not_share_a_time_between_different_host_times(cost: ClusterCostModel) -> None:
    """Two ops equal but for host_s get their own durations from the cache."""
    cache = DurationCache(cost, {})
    gpu = cache.compute(_OPT)
    assert cache.compute(dataclasses.replace(_OPT, host_s=10 * gpu)) == pytest.approx(10 * gpu)
