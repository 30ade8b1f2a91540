"""Load GPU, node and cluster profiles from TOML (by name on the search path, or by file path).

File shapes (units in key names; see hardware_profiles/ for complete examples)::

    kind = "gpu"            # memory_GiB, hbm_bandwidth_GBps, hbm_efficiency, kernel_overhead_us,
    name = "..."            # comm_compute_slowdown, [peak_tflops] fp32/tf32/bf16/fp16/fp8,
    description = "..."     # [matmul] max_efficiency(_fp8)/min_dim/relative/tile_m/tile_n/stream_k, [sources],
                            # fused_attention_efficiency, sustained_clock_fraction, chip_speed_spread,
                            # p2p_compute_slowdown, copy_engine_compute_slowdown (optional)

    kind = "node"           # gpu = "<gpu name or path>" or an inline [gpu] table, gpus_per_node,
                            # intra_fabric, [intra_link], gpus_per_pcie_switch, [pcie_link],
                            # host_memory_GiB, host_adam_params_per_s, nics_per_node,
                            # nic_bandwidth_Gbps (Gb/s, as datasheets say), nic_latency_us, nic_efficiency,
                            # [intra_busbw_curve] ranks/bytes/busbw_GBps (optional)

    kind = "cluster"        # node = "<node name or path>" or an inline [node] (which may inline
                            # [node.gpu]), [network], max_nodes (optional), [measured] (optional)

Inline tables need no ``kind``; references are resolved on the search path (a value ending in
``.toml`` or containing a slash is a path, relative to the referring file). References only point
downwards (cluster -> node -> gpu), so cycles cannot occur.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from simgrid.errors import ProfileError
from simgrid.hardware.attention import ATTENTION_KERNELS, AttentionKernelTable
from simgrid.hardware.busbw_curve import BusbwCurve
from simgrid.hardware.measured import CollectiveRow, ComputeRow, MeasuredTables, P2PRow
from simgrid.hardware.reader import TableReader
from simgrid.hardware.rules import FieldError
from simgrid.hardware.search import display_path, find_profile, read_toml
from simgrid.hardware.specs import (
    DTYPES,
    Cluster,
    ClusterSpec,
    GPUSpec,
    LinkSpec,
    MatmulEfficiency,
    NetworkSpec,
    NodeSpec,
)

_BITS_PER_BYTE = 8
_NIC_KEYS = {"bandwidth_GBps": "nic_bandwidth_Gbps", "latency_us": "nic_latency_us", "efficiency": "nic_efficiency"}


def _looks_like_path(reference: str | Path) -> bool:
    text = str(reference)
    return isinstance(reference, Path) or text.endswith(".toml") or "/" in text or "\\" in text


def _profile_file(reference: str | Path, kind: str, *, base: Path | None = None, referrer: str = "") -> Path:
    """The file for a name or path; relative paths in a profile are relative to that profile's folder.

    Only the path's existence is checked here; :func:`read_toml` refuses what is not a regular UTF-8 file.
    """
    lead = f"{referrer}: " if referrer else ""
    if not _looks_like_path(reference):
        try:
            return find_profile(str(reference), kind, referrer=referrer)
        except ProfileError:
            if str(reference) and _is_directory(Path(str(reference))):
                raise ProfileError(f"{lead}{reference!r} is a directory, not a {kind} profile; name a .toml file "
                                   "inside it or a profile name (see `simgrid profiles`)") from None
            raise
    path = Path(reference).expanduser()
    if base is not None and not path.is_absolute():
        path = base / path
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError) as exc:
        reason = "does not exist" if isinstance(exc, FileNotFoundError) else \
            f"cannot be used: {getattr(exc, 'strerror', None) or exc}"
        raise ProfileError(f"{lead}profile file {display_path(path)} {reason}") from None
    if stat.S_ISDIR(mode):
        raise ProfileError(f"{lead}{display_path(path)} is a directory, not a {kind} profile file; name a .toml "
                           "file inside it or a profile name (see `simgrid profiles`)")
    return path


def _is_directory(path: Path) -> bool:
    try:
        return path.is_dir()
    except (OSError, ValueError):
        return False


def _top_reader(path: Path, kind: str) -> TableReader:
    """Reader for a whole profile file, after checking its ``kind``."""
    reader = TableReader(read_toml(path), file=path)
    found = reader.text("kind")
    if found != kind:
        loader = {"gpu": "load_gpu", "node": "load_node", "cluster": "load_cluster_spec"}.get(found)
        hint = f"; load it with {loader}" if loader else "; kind must be one of 'gpu', 'node', 'cluster'"
        raise reader.error("kind", found, f"but a {kind} profile was expected{hint}")
    return reader


def _check_inline_kind(reader: TableReader, kind: str) -> None:
    if reader.has("kind") and reader.text("kind") != kind:
        raise reader.error("kind", reader.data["kind"], f"must be {kind!r} (or omitted) in an inline table")


def _link(reader: TableReader) -> LinkSpec:
    link = reader.build(
        LinkSpec,
        bandwidth_GBps=reader.number("bandwidth_GBps"),
        latency_us=reader.number("latency_us"),
        efficiency=reader.number("efficiency"),
    )
    reader.finish()
    return link


def _matmul(reader: TableReader) -> MatmulEfficiency:
    kwargs: dict[str, object] = {"max_efficiency": reader.number("max_efficiency")}
    if reader.has("min_dim") or reader.has("relative"):
        kwargs["min_dim"] = reader.number_list("min_dim", integers=True)
        kwargs["relative"] = reader.number_list("relative")
    for key in ("tile_m", "tile_n"):
        if reader.has(key):
            kwargs[key] = reader.integer(key)
    if reader.has("stream_k"):
        kwargs["stream_k"] = reader.boolean("stream_k")
    if reader.has("max_efficiency_fp8"):
        kwargs["max_efficiency_fp8"] = reader.number("max_efficiency_fp8")
    reader.finish()
    return reader.build(MatmulEfficiency, **kwargs)


def _attention_tables(reader: TableReader) -> tuple[dict[str, AttentionKernelTable], str | None]:
    """``[fused_attention]``: ``default`` names the kernel ``auto`` uses; one sub-table per kernel family."""
    default = reader.text("default") if reader.has("default") else None
    tables: dict[str, AttentionKernelTable] = {}
    for name in [k for k in reader.data if k != "default"]:
        if name not in ATTENTION_KERNELS:
            raise reader.error(name, reader.data[name], "is not a known kernel; use one of " + ", ".join(ATTENTION_KERNELS))
        sub = reader.table(name)
        table = sub.build(AttentionKernelTable, name=name, seq_len=sub.number_list("seq_len", integers=True),
                          head_dim=sub.number_list("head_dim", integers=True),
                          fwd_causal_tflops=sub.number_grid("fwd_causal_tflops"),
                          fwd_tflops=sub.number_grid("fwd_tflops"), bwd_tflops=sub.number_grid("bwd_tflops"),
                          bwd_causal_tflops=(sub.number_grid("bwd_causal_tflops")
                                             if sub.has("bwd_causal_tflops") else None))
        sub.finish()
        tables[name] = table
    reader.finish()
    return tables, default


def _peak_tflops(reader: TableReader) -> dict[str, float]:
    peak = {dtype: reader.number(dtype) for dtype in DTYPES if reader.has(dtype)}
    reader.finish()
    return peak


def _gpu(reader: TableReader) -> GPUSpec:
    fields = {
        "name": reader.text("name"),
        "description": reader.text("description"),
        "memory_GiB": reader.number("memory_GiB"),
        "hbm_bandwidth_GBps": reader.number("hbm_bandwidth_GBps"),
        "hbm_efficiency": reader.number("hbm_efficiency"),
        "peak_tflops": _peak_tflops(reader.table("peak_tflops")),
        "matmul": _matmul(reader.table("matmul")),
        "fused_attention_efficiency": reader.optional_number("fused_attention_efficiency"),
        "sustained_clock_fraction": reader.number("sustained_clock_fraction", 1.0),
        "chip_speed_spread": reader.number("chip_speed_spread", 0.0),
        "kernel_overhead_us": reader.number("kernel_overhead_us"),
        "comm_compute_slowdown": reader.number("comm_compute_slowdown"),
        "p2p_compute_slowdown": reader.optional_number("p2p_compute_slowdown"),
        "copy_engine_compute_slowdown": reader.optional_number("copy_engine_compute_slowdown"),
    }
    if reader.has("sm_count"):
        fields["sm_count"] = reader.integer("sm_count")
    if reader.has("fused_attention"):
        fields["fused_attention"], fields["attention_kernel"] = _attention_tables(reader.table("fused_attention"))
    fields["sources"] = reader.sources()
    reader.finish()
    try:
        return GPUSpec(**fields)  # type: ignore[arg-type]
    except FieldError as exc:  # the default kernel lives in [fused_attention] as `default`
        renamed = {"attention_kernel": "fused_attention.default"}
        raise reader.located(exc, renamed) from None


def _node(reader: TableReader) -> NodeSpec:
    gpu_value = reader.raw("gpu")
    if isinstance(gpu_value, dict):
        gpu_reader = reader.table("gpu")
        _check_inline_kind(gpu_reader, "gpu")
        gpu = _gpu(gpu_reader)
    elif isinstance(gpu_value, str):
        gpu = load_gpu(_profile_file(gpu_value, "gpu", base=reader.file.parent,
                                     referrer=f"{display_path(reader.file)}: {reader.prefix}gpu = {gpu_value!r}"))
    else:
        raise reader.error("gpu", gpu_value, "must be a GPU profile name, a path, or an inline [gpu] table")
    nic_fields = {
        "bandwidth_GBps": reader.number("nic_bandwidth_Gbps") / _BITS_PER_BYTE,
        "latency_us": reader.number("nic_latency_us"),
        "efficiency": reader.number("nic_efficiency"),
    }
    try:
        nic_link = LinkSpec(**nic_fields)
    except FieldError as exc:
        if exc.field == "bandwidth_GBps":
            exc = FieldError(exc.field, reader.data["nic_bandwidth_Gbps"], exc.rule)
        raise reader.located(exc, _NIC_KEYS) from None
    fields = {
        "name": reader.text("name"),
        "description": reader.text("description"),
        "gpu": gpu,
        "gpus_per_node": reader.integer("gpus_per_node"),
        "intra_fabric": reader.text("intra_fabric"),
        "intra_link": _link(reader.table("intra_link")),
        "gpus_per_pcie_switch": reader.integer("gpus_per_pcie_switch"),
        "pcie_link": _link(reader.table("pcie_link")),
        "host_memory_GiB": reader.number("host_memory_GiB"),
        "host_adam_params_per_s": reader.number("host_adam_params_per_s"),
        "nics_per_node": reader.integer("nics_per_node"),
        "nic_link": nic_link,
        "nvlink_sharp": reader.boolean("nvlink_sharp", False),
        "cpu_vendor": reader.text("cpu_vendor", "intel"),
        "gpu_arch": reader.text("gpu_arch", "ampere"),
        "intra_busbw_curve": (_busbw_curve(reader.table("intra_busbw_curve"))
                              if reader.has("intra_busbw_curve") else None),
    }
    fields["sources"] = reader.sources()
    reader.finish()
    return reader.build(NodeSpec, **fields)


def _busbw_curve(reader: TableReader) -> BusbwCurve:
    curve = reader.build(BusbwCurve, ranks=reader.integer("ranks"),
                         bytes=reader.number_list("bytes", integers=True),
                         busbw_GBps=reader.number_list("busbw_GBps"))
    reader.finish()
    return curve


def _network(reader: TableReader) -> NetworkSpec:
    network = reader.build(
        NetworkSpec,
        kind=reader.text("kind"),
        topology=reader.text("topology"),
        oversubscription=reader.number("oversubscription"),
        switch_latency_us=reader.number("switch_latency_us"),
        efficiency=reader.number("efficiency"),
    )
    reader.finish()
    return network


def _measured(reader: TableReader) -> MeasuredTables:
    collectives = []
    for row in reader.table_list("collectives"):
        collectives.append(row.build(CollectiveRow, kind=row.text("kind"), group_size=row.integer("group_size"),
                                     bytes=row.integer("bytes"), time_us=row.number("time_us")))
        row.finish()
    p2p = []
    for row in reader.table_list("p2p"):
        p2p.append(row.build(P2PRow, bytes=row.integer("bytes"), time_us=row.number("time_us")))
        row.finish()
    compute = []
    for row in reader.table_list("compute"):
        compute.append(row.build(ComputeRow, key=row.text("key"), time_us=row.number("time_us")))
        row.finish()
    bandwidth = reader.optional_number("memory_bandwidth_GBps")
    reader.finish()
    return reader.build(MeasuredTables, collectives=tuple(collectives), p2p=tuple(p2p), compute=tuple(compute),
                        memory_bandwidth_GBps=bandwidth)


def _cluster(reader: TableReader) -> ClusterSpec:
    node_value = reader.raw("node")
    if isinstance(node_value, dict):
        node_reader = reader.table("node")
        _check_inline_kind(node_reader, "node")
        node = _node(node_reader)
    elif isinstance(node_value, str):
        node = load_node(_profile_file(node_value, "node", base=reader.file.parent,
                                       referrer=f"{display_path(reader.file)}: {reader.prefix}node = {node_value!r}"))
    else:
        raise reader.error("node", node_value, "must be a node profile name, a path, or an inline [node] table")
    fields = {
        "name": reader.text("name"),
        "description": reader.text("description"),
        "node": node,
        "network": _network(reader.table("network")),
        "max_nodes": reader.integer("max_nodes") if reader.has("max_nodes") else None,
        "measured": _measured(reader.table("measured")) if reader.has("measured") else None,
    }
    fields["sources"] = reader.sources()
    reader.finish()
    return reader.build(ClusterSpec, **fields)


def load_gpu(name_or_path: str | Path) -> GPUSpec:
    """A GPU profile by name (search path) or by file path."""
    return _gpu(_top_reader(_profile_file(name_or_path, "gpu"), "gpu"))


def load_node(name_or_path: str | Path) -> NodeSpec:
    """A node profile by name or path; its GPU is resolved by name or read inline."""
    return _node(_top_reader(_profile_file(name_or_path, "node"), "node"))


def load_cluster_spec(name_or_path: str | Path) -> ClusterSpec:
    """A cluster profile (not yet sized) by name or path."""
    return _cluster(_top_reader(_profile_file(name_or_path, "cluster"), "cluster"))


def load_cluster(name_or_path: str | Path, *, gpus: int) -> Cluster:
    """A cluster profile sized for a run of ``gpus`` GPUs (``ceil(gpus / gpus_per_node)`` nodes)."""
    return load_cluster_spec(name_or_path).sized(gpus)
