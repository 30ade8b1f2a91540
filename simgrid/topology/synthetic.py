"""Build a uniform cluster in Python, without profile files: for what-if studies and tests.

``synthetic_cluster(num_gpus=16, gpus_per_node=8, intra_GBps=300, nic_GBps=25)`` gives a cluster whose
every link has exactly the stated rate, latency and efficiency, so cost formulas can be checked by hand
("what if NVLink were twice as fast", "a ring over links of bandwidth B and latency a").
"""

from __future__ import annotations

from simgrid.hardware import (
    Cluster,
    ClusterSpec,
    GPUSpec,
    LinkSpec,
    MatmulEfficiency,
    MeasuredTables,
    NetworkSpec,
    NodeSpec,
)


def synthetic_cluster(
    *,
    num_gpus: int,
    gpus_per_node: int = 8,
    intra_fabric: str = "nvswitch",
    intra_GBps: float = 300.0,
    intra_latency_us: float = 0.0,
    pcie_GBps: float = 32.0,
    pcie_latency_us: float = 0.0,
    gpus_per_pcie_switch: int | None = None,
    nics_per_node: int | None = None,
    nic_GBps: float = 25.0,
    nic_latency_us: float = 0.0,
    network_kind: str = "infiniband-hdr",
    network_topology: str = "rail-optimized-fat-tree",
    oversubscription: float = 1.0,
    switch_latency_us: float = 0.0,
    link_efficiency: float = 1.0,
    bf16_tflops: float = 312.0,
    matmul_efficiency: float = 1.0,
    fused_attention_efficiency: float | None = None,
    hbm_GBps: float = 2039.0,
    hbm_efficiency: float = 1.0,
    kernel_overhead_us: float = 0.0,
    comm_compute_slowdown: float = 0.0,
    memory_GiB: float = 80.0,
    nvlink_sharp: bool = False,
    cpu_vendor: str = "intel",
    gpu_arch: str = "ampere",
    host_adam_params_per_s: float = 1e9,
    measured: MeasuredTables | None = None,
) -> Cluster:
    """A cluster with uniform, explicitly stated links (GB/s = 1e9 B/s per direction).

    Defaults: 8 GPUs per node on NVSwitch, one NIC per GPU on a rail-optimised non-blocking fabric,
    efficiency 1 and latency 0 everywhere, bf16 peak 312 TFLOP/s at 100% matmul efficiency, Intel hosts,
    an Ampere-class GPU as NCCL's tuner sees it, no NVLink SHARP.
    """
    gpu = GPUSpec(
        name="synthetic-gpu", description="synthetic", memory_GiB=memory_GiB, hbm_bandwidth_GBps=hbm_GBps,
        hbm_efficiency=hbm_efficiency, peak_tflops={"bf16": bf16_tflops},
        matmul=MatmulEfficiency(max_efficiency=matmul_efficiency), kernel_overhead_us=kernel_overhead_us,
        comm_compute_slowdown=comm_compute_slowdown, fused_attention_efficiency=fused_attention_efficiency,
    )

    def link(bandwidth: float, latency: float) -> LinkSpec:
        return LinkSpec(bandwidth_GBps=bandwidth, latency_us=latency, efficiency=link_efficiency)

    node = NodeSpec(
        name="synthetic-node", description="synthetic", gpu=gpu, gpus_per_node=gpus_per_node,
        intra_fabric=intra_fabric, intra_link=link(intra_GBps, intra_latency_us),
        gpus_per_pcie_switch=gpus_per_pcie_switch or gpus_per_node, pcie_link=link(pcie_GBps, pcie_latency_us),
        host_memory_GiB=1024.0, host_adam_params_per_s=host_adam_params_per_s,
        nics_per_node=nics_per_node or gpus_per_node, nic_link=link(nic_GBps, nic_latency_us),
        nvlink_sharp=nvlink_sharp, cpu_vendor=cpu_vendor, gpu_arch=gpu_arch,
    )
    network = NetworkSpec(kind=network_kind, topology=network_topology, oversubscription=oversubscription,
                          switch_latency_us=switch_latency_us, efficiency=1.0)
    spec = ClusterSpec(name="synthetic", description="synthetic", node=node, network=network, measured=measured)
    return spec.sized(num_gpus)
