"""Spec dataclasses: GEMM efficiency curve, peak rates, validation and cluster sizing."""

from __future__ import annotations

import dataclasses
import math
from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simgrid.errors import ProfileError
from simgrid.hardware import (
    Cluster,
    FieldError,
    GPUSpec,
    LinkSpec,
    MatmulEfficiency,
    NetworkSpec,
    load_cluster,
    load_cluster_spec,
    load_gpu,
    slowest_chip_factor,
)

# Two-point curve chosen so log2 interpolation is easy by hand: log2(256)=8, log2(1024)=10.
CURVE = MatmulEfficiency(max_efficiency=0.5, min_dim=(256, 1024), relative=(0.5, 1.0))


def test_efficiency_interpolates_linearly_in_log2_of_smallest_dim() -> None:
    """512 is halfway between 256 and 1024 in log2, so relative = 0.75 and efficiency = 0.5 * 0.75."""
    assert CURVE.efficiency(4096, 512, 8192) == pytest.approx(0.375)
    # 2^9.5: three quarters of the way from log2 = 8 to 10, so relative = 0.5 + 0.5 * (9.5 - 8) / 2 = 0.875.
    assert CURVE.relative_at(2**9.5) == pytest.approx(0.875)


def test_efficiency_is_clamped_at_both_ends_of_the_curve() -> None:
    """Below the first point the first value holds, above the last point the last value holds."""
    assert CURVE.efficiency(64, 8192, 8192) == pytest.approx(0.25)
    assert CURVE.efficiency(1, 1, 1) == pytest.approx(0.25)
    assert CURVE.efficiency(65536, 65536, 4096) == pytest.approx(0.5)


def test_no_gemm_gets_max_efficiency() -> None:
    """(0, 0, 0) means no GEMM; it reports max_efficiency so callers need no special case."""
    assert CURVE.efficiency(0, 0, 0) == 0.5


def test_negative_gemm_dimension_is_rejected() -> None:
    """A negative dimension is a caller bug reported with the shape."""
    with pytest.raises(ProfileError, match=r"\(-1, 2, 3\) has a negative dimension"):
        CURVE.efficiency(-1, 2, 3)


def test_legacy_curve_of_the_v100_profile_matches_the_h800_sweep() -> None:
    """Profiles without a tile keep the smallest-dimension curve: K=1024 drops by 628/758 and the curve
    clamps at 386/758 below K=256 (H800 sweep, hardware.md)."""
    v100 = load_gpu("v100-sxm2-32gb")
    top = v100.matmul.max_efficiency
    assert v100.matmul.efficiency(8192, 8192, 8192) == pytest.approx(top)
    assert v100.matmul.efficiency(8192, 8192, 1024) == pytest.approx(top * 628 / 758, abs=1e-3)
    assert v100.matmul.efficiency(8192, 8192, 64) == pytest.approx(top * 386 / 758, abs=1e-3)


def test_tile_sides_come_together_and_sm_count_is_positive() -> None:
    """A tile needs both sides; a GPU's SM count and sustained-clock fraction are range-checked."""
    with pytest.raises(FieldError, match=r"MatmulEfficiency\.tile_n = 0 must be given together with tile_m"):
        MatmulEfficiency(max_efficiency=0.8, tile_m=128)
    gpu = load_gpu("h100-sxm")
    with pytest.raises(FieldError, match=r"GPUSpec\.sm_count = 0 must be an integer >= 1"):
        GPUSpec(**{**gpu.__dict__, "sm_count": 0})
    with pytest.raises(FieldError, match=r"GPUSpec\.sustained_clock_fraction = 1\.2 must be in \(0, 1\]"):
        GPUSpec(**{**gpu.__dict__, "sustained_clock_fraction": 1.2})
    with pytest.raises(FieldError, match=r"GPUSpec\.attention_kernel = 'fa9' must name a fused_attention table"):
        GPUSpec(**{**gpu.__dict__, "attention_kernel": "fa9"})


def test_curve_must_be_ascending_with_matching_lengths() -> None:
    """Malformed curves are rejected with the field named."""
    with pytest.raises(ProfileError, match=r"MatmulEfficiency.min_dim = \[512, 256\] must be strictly ascending"):
        MatmulEfficiency(max_efficiency=0.8, min_dim=(512, 256), relative=(0.5, 1.0))
    with pytest.raises(ProfileError, match=r"MatmulEfficiency.relative = \[1.0\] must have 2 values"):
        MatmulEfficiency(max_efficiency=0.8, min_dim=(256, 512), relative=(1.0,))
    with pytest.raises(ProfileError, match=r"MatmulEfficiency.max_efficiency = 1.2 must be in \(0, 1\]"):
        MatmulEfficiency(max_efficiency=1.2)


def test_peak_flops_converts_tflops_and_names_missing_dtypes() -> None:
    """peak_flops is in FLOP/s; V100 has no bf16, and the error lists what it has."""
    assert load_gpu("a100-80gb-sxm").peak_flops("bf16") == pytest.approx(312e12)
    with pytest.raises(ProfileError, match=r"'v100-sxm2-32gb' has no peak rate for dtype 'bf16' \(it has: fp16, fp32\)"):
        load_gpu("v100-sxm2-32gb").peak_flops("bf16")


def test_memory_bytes_uses_binary_gibibytes() -> None:
    """80 GiB = 80 * 2^30 bytes."""
    assert load_gpu("a100-80gb-sxm").memory_bytes == 80 * 2**30


def test_link_allows_infinite_bandwidth_and_zero_latency_but_not_negative() -> None:
    """The ideal cluster needs inf/0; a negative or nan bandwidth is an error naming the field."""
    ideal = LinkSpec(bandwidth_GBps=math.inf, latency_us=0.0, efficiency=1.0)
    assert ideal.effective_bandwidth_GBps == math.inf
    with pytest.raises(ProfileError, match=r"LinkSpec.bandwidth_GBps = -3.0 must be > 0"):
        LinkSpec(bandwidth_GBps=-3.0, latency_us=1.0, efficiency=0.9)
    with pytest.raises(ProfileError, match=r"LinkSpec.bandwidth_GBps = nan must be a number, not nan"):
        LinkSpec(bandwidth_GBps=math.nan, latency_us=1.0, efficiency=0.9)
    with pytest.raises(ProfileError, match=r"LinkSpec.latency_us = inf must be >= 0 and finite"):
        LinkSpec(bandwidth_GBps=1.0, latency_us=math.inf, efficiency=0.9)


def test_network_rejects_oversubscription_below_one_and_unknown_topology() -> None:
    """Oversubscription < 1 and unknown enum values are errors listing the rule."""
    good = {"kind": "roce", "topology": "fat-tree", "oversubscription": 2.0, "switch_latency_us": 1.0, "efficiency": 0.9}
    NetworkSpec(**good)  # type: ignore[arg-type]
    with pytest.raises(ProfileError, match=r"oversubscription = 0.5 must be >= 1"):
        NetworkSpec(**{**good, "oversubscription": 0.5})  # type: ignore[arg-type]
    with pytest.raises(ProfileError, match=r"topology = 'torus' must be one of 'rail-optimized-fat-tree'"):
        NetworkSpec(**{**good, "topology": "torus"})  # type: ignore[arg-type]


def test_specs_are_frozen_and_hashable() -> None:
    """Specs can be cache keys; their tables cannot be mutated."""
    gpu = load_gpu("h100-sxm")
    assert hash(gpu) == hash(load_gpu("h100-sxm"))
    with pytest.raises(TypeError):
        gpu.peak_tflops["bf16"] = 1.0  # type: ignore[index]
    assert isinstance(gpu, GPUSpec)


def test_cluster_sizing_rounds_up_to_whole_nodes() -> None:
    """1024 GPUs on 8-GPU DGX nodes = 128 nodes; 12 GPUs = 2 nodes with 4 on the last."""
    cluster = load_cluster("dgx-a100-hdr", gpus=1024)
    assert (cluster.num_gpus, cluster.num_nodes, cluster.gpus_per_node) == (1024, 128, 8)
    assert cluster.gpu.name == "a100-80gb-sxm" and cluster.node.name == "dgx-a100"
    assert cluster.network.kind == "infiniband-hdr"
    partial = load_cluster("dgx-a100-hdr", gpus=12)
    assert partial.num_nodes == 2
    assert [partial.gpus_on_node(i) for i in range(2)] == [8, 4]


def test_run_smaller_than_a_node_uses_one_node_with_those_gpus() -> None:
    """gpus=2 on an 8-GPU node: one node, two GPUs on it."""
    cluster = load_cluster("dgx-h100-ndr", gpus=2)
    assert (cluster.num_nodes, cluster.gpus_per_node) == (1, 2)


def test_cluster_over_max_nodes_names_the_cluster_and_limit() -> None:
    """rtx4090-10gbe has at most 48 nodes of 4 GPUs = 192 GPUs."""
    assert load_cluster("rtx4090-10gbe", gpus=192).num_nodes == 48
    with pytest.raises(ProfileError, match=r"cluster 'rtx4090-10gbe' has at most 48 nodes x 4 GPUs = 192 GPUs; "
                                           r"gpus = 193 is too many"):
        load_cluster("rtx4090-10gbe", gpus=193)


def test_cluster_needs_at_least_one_gpu() -> None:
    """gpus = 0 is rejected with the value."""
    with pytest.raises(ProfileError, match=r"gpus = 0 must be an integer >= 1"):
        Cluster(spec=load_cluster_spec("ideal"), num_gpus=0)


@given(
    dims=st.lists(st.integers(min_value=1, max_value=1 << 20), min_size=1, max_size=6, unique=True).map(sorted),
    data=st.data(),
)
def test_curve_passes_through_its_points_and_stays_within_their_range(dims: list[int], data: st.DataObject) -> None:
    """At each point the curve equals that point's value; anywhere else it lies between neighbouring values."""
    values = data.draw(st.lists(st.floats(min_value=0.01, max_value=1.0), min_size=len(dims), max_size=len(dims)))
    curve = MatmulEfficiency(max_efficiency=1.0, min_dim=tuple(dims), relative=tuple(values))
    for dim, value in zip(dims, values, strict=True):
        assert curve.efficiency(dim, dim + 1, dim + 2) == pytest.approx(value)
    probe = data.draw(st.integers(min_value=1, max_value=1 << 21))
    assert min(values) - 1e-12 <= curve.efficiency(probe, probe, probe) <= max(values) + 1e-12


def test_cluster_accepts_numpy_integers_but_not_floats() -> None:
    """Sweeps pass numpy ints; 8.0 GPUs is a mistake."""
    import numpy as np

    cluster = load_cluster("dgx-a100-hdr", gpus=np.int64(16))  # type: ignore[arg-type]
    assert cluster.num_nodes == 2 and type(cluster.num_gpus) is int
    with pytest.raises(ProfileError, match=r"gpus = 8\.0 must be an integer >= 1"):
        load_cluster("dgx-a100-hdr", gpus=8.0)  # type: ignore[arg-type]


def test_sized_cluster_survives_pickling() -> None:
    """Sweeps send clusters to worker processes; the copy is equal and hashes the same."""
    import pickle

    cluster = load_cluster("dgx-h100-ndr", gpus=64)
    copy = pickle.loads(pickle.dumps(cluster))
    assert copy == cluster and hash(copy.spec) == hash(cluster.spec)


def test_slowest_chip_factor_is_one_for_one_gpu_and_falls_with_more() -> None:
    """Uniform chips over mean +- spread/2: the expected minimum of N draws is mean - spread/2 (N-1)/(N+1);
    one GPU is the mean chip, 8 GPUs of a 4.5% node lose 2.25% x 7/9 = 1.75%, many GPUs approach 2.25%."""
    assert slowest_chip_factor(0.045, 1) == 1.0
    assert slowest_chip_factor(0.0, 1024) == 1.0
    assert slowest_chip_factor(0.045, 8) == pytest.approx(1 - 0.0175)
    assert slowest_chip_factor(0.045, 3) == pytest.approx(1 - 0.0225 / 2)
    factors = [slowest_chip_factor(0.045, n) for n in (1, 2, 4, 8, 64, 1024, 10**6)]
    assert all(a > b for a, b in pairwise(factors))
    assert factors[-1] > 1 - 0.0225


def test_sized_cluster_runs_the_expected_slowest_chip_on_clock_bound_work_only() -> None:
    """The h100 profile quotes the 8-GPU mean (0.848) and a 4.5% spread: a 1-GPU run keeps the mean, an
    8-GPU run computes at 0.848 x 0.9825, more GPUs lower it further; HBM and launch figures are untouched,
    and the profile as written stays reachable as ``spec.node.gpu``."""
    spec = load_cluster_spec("dgx-h100-ndr")
    profile = spec.node.gpu
    assert (profile.sustained_clock_fraction, profile.chip_speed_spread) == (0.848, 0.045)
    assert spec.sized(1).gpu == profile
    eight = spec.sized(8).gpu
    assert eight.sustained_clock_fraction == pytest.approx(0.848 * (1 - 0.0175))
    assert (eight.hbm_efficiency, eight.kernel_overhead_us, eight.peak_tflops) == (
        profile.hbm_efficiency, profile.kernel_overhead_us, profile.peak_tflops)
    rates = [spec.sized(n).gpu.sustained_clock_fraction for n in (1, 2, 8, 64, 1024)]
    assert all(a > b for a, b in pairwise(rates))


@pytest.mark.parametrize("cluster", ["dgx-a100-hdr", "dgx-a100-40gb-hdr"])
def test_a100_clusters_wait_on_the_slowest_chip_of_the_measured_node_spread(cluster: str) -> None:
    """Both A100 profiles carry the 1.7% spread of one all-busy 8-GPU NDv4 node (SuperBench gemm-flops) on top of
    the single-GPU sustained rate 0.869: 8 GPUs lose 0.85% x 7/9, a Selene-sized run approaches 0.85%."""
    spec = load_cluster_spec(cluster)
    assert (spec.node.gpu.sustained_clock_fraction, spec.node.gpu.chip_speed_spread) == (0.869, 0.017)
    assert spec.sized(8).gpu.sustained_clock_fraction == pytest.approx(0.869 * (1 - 0.0085 * 7 / 9))
    assert spec.sized(3072).gpu.sustained_clock_fraction > 0.869 * (1 - 0.0085)
    assert spec.sized(8).gpu.hbm_efficiency == spec.node.gpu.hbm_efficiency


def test_slowest_of_is_spent_once_and_synchronous_gpus_narrows_the_draw() -> None:
    """The derated copy is one chip (spread 0), so a second application changes nothing; a cluster whose
    steps wait on 2 of its 16 GPUs (serving replicas) draws from 2, and the ideal GPU never changes."""
    spec = load_cluster_spec("dgx-h100-ndr")
    eight = spec.node.gpu.slowest_of(8)
    assert eight.chip_speed_spread == 0.0 and eight.slowest_of(64) == eight
    assert spec.sized(16, synchronous_gpus=2).gpu == spec.sized(2).gpu
    assert spec.sized(16, synchronous_gpus=2).num_gpus == 16
    assert load_cluster("ideal", gpus=1024).gpu == load_cluster_spec("ideal").node.gpu
    with pytest.raises(ProfileError, match=r"Cluster\.synchronous_gpus = 0 must be an integer >= 1"):
        spec.sized(16, synchronous_gpus=0)


def test_chip_speed_spread_is_validated_with_its_fix() -> None:
    """Out of [0, 1) is refused with the field, the value and what the number means."""
    gpu = load_cluster_spec("dgx-h100-ndr").node.gpu
    for bad in (-0.1, 1.5):
        with pytest.raises(FieldError, match=rf"GPUSpec\.chip_speed_spread = {bad} must be in \[0, 1\).*e\.g\. 0\.045"):
            dataclasses.replace(gpu, chip_speed_spread=bad)
