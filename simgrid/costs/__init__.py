"""Cost models: compute time (roofline), collective time (NCCL's alpha-beta tuner model with the bandwidth
of the topology's bottleneck links: ring, tree, NVLS, PAT; protocols LL, LL128, Simple), point-to-point
and host transfers. Every formula cites its source in its module."""

from simgrid.costs.attention import attention_table, fused_attention_time_s
from simgrid.costs.collectives import (
    ALGORITHMS,
    NCCL_BASE_LATENCY_US,
    base_latency_s,
    bus_bandwidth_GBps,
    choose,
    choose_algorithm,
    collective_phases,
    collective_time_s,
    phase_cost,
)
from simgrid.costs.compute import (
    ADAM_FLOPS_PER_PARAM,
    compute_time_s,
    gemm_time_s,
    host_compute_time_s,
    host_optimizer_time_s,
    memory_time_s,
    overlap_slowdown,
)
from simgrid.costs.gemm import gemm_efficiency, gemm_shape_time_s, gemms_time_s
from simgrid.costs.p2p import p2p_time_s, route_time_s, transfer_time_s
from simgrid.costs.phases import Phase, TransferTriple

__all__ = [
    "ADAM_FLOPS_PER_PARAM",
    "ALGORITHMS",
    "NCCL_BASE_LATENCY_US",
    "Phase",
    "TransferTriple",
    "attention_table",
    "base_latency_s",
    "bus_bandwidth_GBps",
    "choose",
    "choose_algorithm",
    "collective_phases",
    "collective_time_s",
    "compute_time_s",
    "fused_attention_time_s",
    "gemm_efficiency",
    "gemm_shape_time_s",
    "gemm_time_s",
    "gemms_time_s",
    "host_compute_time_s",
    "host_optimizer_time_s",
    "memory_time_s",
    "overlap_slowdown",
    "p2p_time_s",
    "phase_cost",
    "route_time_s",
    "transfer_time_s",
]
