"""Hardware profiles: GPU, node and cluster specs, loaded from TOML files (``hardware_profiles/``).

Quick use::

    from simgrid.hardware import load_cluster
    cluster = load_cluster("dgx-a100-hdr", gpus=1024)   # 128 DGX A100 nodes
    cluster.gpu.peak_flops("bf16"), cluster.node.intra_link.bandwidth_GBps
"""

from simgrid.errors import ProfileError
from simgrid.hardware.loader import load_cluster, load_cluster_spec, load_gpu, load_node
from simgrid.hardware.measured import CollectiveRow, ComputeRow, MeasuredTables, P2PRow
from simgrid.hardware.rules import FieldError
from simgrid.hardware.search import ProfileInfo, ProfileWarning, list_profiles, profile_search_path
from simgrid.hardware.specs import (
    DTYPES,
    INTRA_FABRICS,
    NETWORK_KINDS,
    NETWORK_TOPOLOGIES,
    Cluster,
    ClusterSpec,
    GPUSpec,
    LinkSpec,
    MatmulEfficiency,
    NetworkSpec,
    NodeSpec,
    slowest_chip_factor,
)
from simgrid.hardware.writer import to_toml, write_profile

__all__ = [
    "DTYPES",
    "INTRA_FABRICS",
    "NETWORK_KINDS",
    "NETWORK_TOPOLOGIES",
    "Cluster",
    "ClusterSpec",
    "CollectiveRow",
    "ComputeRow",
    "FieldError",
    "GPUSpec",
    "LinkSpec",
    "MatmulEfficiency",
    "MeasuredTables",
    "NetworkSpec",
    "NodeSpec",
    "P2PRow",
    "ProfileError",
    "ProfileInfo",
    "ProfileWarning",
    "list_profiles",
    "load_cluster",
    "load_cluster_spec",
    "load_gpu",
    "load_node",
    "profile_search_path",
    "slowest_chip_factor",
    "to_toml",
    "write_profile",
]
