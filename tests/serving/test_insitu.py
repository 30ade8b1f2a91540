"""Generation's in-situ rows (``SERVE:`` keys of a profile's measured compute table) read back and used by the
iteration cost model: the rank's matrix rate and launch cost, synchronous collectives and stage hand-offs
at the sizes the model gives its own events, with the tables' interpolation and fallbacks elsewhere."""

from __future__ import annotations

import dataclasses

import pytest

from simgrid.costs import collective_time_s
from simgrid.hardware import ClusterSpec, ComputeRow, MeasuredTables, load_cluster_spec
from simgrid.model import get_model
from simgrid.serving import IterationCostModel, ServingConfig, ServingLayout, chunk_shape, combine
from simgrid.serving.insitu import LAUNCH_KEY, MATRIX_KEY, InSituCosts, collective_key, hop_key
from simgrid.topology import Topology

ROWS = {
    LAUNCH_KEY: 20.0,  # us per counted kernel
    MATRIX_KEY: 1e4,  # us per GFLOP: 100 GFLOP/s
    collective_key("all_reduce", 2, 256): 500.0,
    collective_key("all_reduce", 2, 1024): 700.0,
    collective_key("all_gather", 2, 2048): 900.0,
    hop_key(16): 300.0,
    hop_key(4096): 1300.0,
    "HOST:loop": 3.0,  # the executor's own rows are not generation's
    "PROBE:host": 17000.0,
}


def _spec(rows: dict[str, float] = ROWS) -> ClusterSpec:
    base = load_cluster_spec("dgx-a100-hdr")
    return dataclasses.replace(base, measured=MeasuredTables(
        compute=tuple(ComputeRow(key=k, time_us=v) for k, v in rows.items())))


def _cost(layout: ServingLayout, spec: ClusterSpec | None = None) -> IterationCostModel:
    spec = spec or _spec()
    return IterationCostModel(get_model("tiny-gpt"), layout, ServingConfig(dtype="fp32"),
                              Topology(spec.sized(layout.world_size)))


def test_rows_are_read_back_by_kind_and_size() -> None:
    """Launch and matrix rows, collectives per (kind, ranks) and hand-offs by size; other rows ignored; a
    table without generation rows (or no table) gives None, so the formulas stay in charge."""
    got = InSituCosts.from_tables(_spec().measured)
    assert got is not None
    assert (got.launch_us, got.matrix_us_per_gflop) == (20.0, 1e4)
    assert got.collectives == {("all_reduce", 2): [(256, 500.0), (1024, 700.0)], ("all_gather", 2): [(2048, 900.0)]}
    assert got.hops == [(16, 300.0), (4096, 1300.0)]
    assert got.collective_us("all_reduce", 2, 512) == pytest.approx(500 + 200 * 256 / 768)
    assert got.collective_us("all_reduce", 2, 100) == 500.0  # below the smallest size: its time
    assert got.collective_us("all_reduce", 4, 512) is None
    assert InSituCosts.from_tables(_spec({"HOST:loop": 3.0}).measured) is None
    assert InSituCosts.from_tables(None) is None


def test_the_rank_runs_at_generations_rates() -> None:
    """The GPU the model prices with has the matrix rate as its peak (100 GFLOP/s) and the host time per
    kernel as its launch overhead; the launch part is the counted kernels times 20 us: tiny-gpt's 4 layers
    x (5 + 5), the embedding's 4 (gather, vocab-parallel mask build and zeroing, position add: inference draws
    no dropout), the final norm, output GEMM and the 2 sampler kernels = 48."""
    cost = _cost(ServingLayout(tp=2))
    assert cost.gpu.peak_flops("fp32") == pytest.approx(1e11)
    assert cost.gpu.kernel_overhead_us == 20.0
    decode = combine([chunk_shape(1, 10, sampled=True)] * 2)
    assert cost.kernels(0, decode) == 48
    assert cost.stage_parts(0, decode)["launch"] == pytest.approx(48 * 20e-6)


def test_tensor_parallel_calls_cost_their_in_situ_time_at_the_models_size() -> None:
    """A 2-sequence decode at tp 2: the embedding's and 8 layer all-reduces of 2 x 64 x 4 = 512 B each
    (interpolated between the 256 and 1024 B rows) and the all-gather of 2 x 256 fp32 logits (2048 B)."""
    cost = _cost(ServingLayout(tp=2))
    decode = combine([chunk_shape(1, 10, sampled=True)] * 2)
    assert cost.tp_calls(0, decode) == [("all_reduce", 512, 1), ("all_reduce", 8 * 512, 8), ("all_gather", 2048, 1)]
    per_call_us = 500 + 200 * 256 / 768
    assert cost.stage_parts(0, decode)["tp_comm"] == pytest.approx((9 * per_call_us + 900) * 1e-6)


def test_pipeline_hand_offs_cost_their_in_situ_time() -> None:
    """pp 2: 2 x 2 tokens x 64 x 4 B = 1024 B forward (interpolated between 16 and 4096 B), 16 B of token
    ids back (the 16 B row)."""
    cost = _cost(ServingLayout(pp=2))
    decode = combine([chunk_shape(1, 10, sampled=True)] * 2)
    assert (cost.hop_bytes(0, decode), cost.hop_bytes(1, decode)) == (1024, 16)
    forward_us = 300 + 1000 * (1024 - 16) / (4096 - 16)
    assert cost.time(decode).hop_s == pytest.approx((forward_us * 1e-6, 300e-6))


def test_unmeasured_group_sizes_fall_back_to_the_collective_cost_model() -> None:
    """Rows over 2 ranks do not price a 4-rank group: tp 4 uses the profile's collective costs as before."""
    cost = _cost(ServingLayout(tp=4))
    decode = combine([chunk_shape(1, 10, sampled=True)] * 2)
    topo, ranks = cost.topology, (0, 1, 2, 3)
    expected = (collective_time_s("all_reduce", 2 * 64 * 4, ranks, topo)
                + collective_time_s("all_reduce", 8 * 2 * 64 * 4, ranks, topo, count=8)
                + collective_time_s("all_gather", 2 * 256 * 4, ranks, topo))
    assert cost.stage_parts(0, decode)["tp_comm"] == pytest.approx(expected, rel=1e-12)


def test_a_profile_without_generation_rows_prices_as_before() -> None:
    """No ``SERVE:`` rows: the GPU keeps its datasheet peak and launch overhead (the sized cluster's GPU,
    i.e. the profile's at the expected slowest of the replica's chips)."""
    spec = load_cluster_spec("dgx-a100-hdr")
    cost = _cost(ServingLayout(tp=2), spec)
    assert cost.insitu is None
    assert cost.gpu == spec.sized(2).gpu
