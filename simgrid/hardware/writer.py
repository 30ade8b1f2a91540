"""Write specs back to TOML: a self-contained profile that loads back to an equal spec.

Calibration (issue 5) measures a machine and calls :func:`write_profile` with a :class:`ClusterSpec`
carrying :class:`MeasuredTables`; the file inlines its node and GPU so it can be copied anywhere (e.g.
into ``~/.config/simgrid/profiles``). Only the standard library reads TOML (tomllib), so this module
writes the small subset of TOML the profiles use by hand: scalars, arrays of numbers, tables and arrays
of tables.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path

from simgrid.errors import ProfileError
from simgrid.hardware.specs import ClusterSpec, GPUSpec, LinkSpec, NodeSpec

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _string(text: str) -> str:
    """A TOML basic string; control characters become escapes."""
    out = []
    for char in text:
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04X}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def _key(key: str) -> str:
    return key if _BARE_KEY.match(key) else _string(key)


def _value(value: object) -> str:
    """One TOML value; floats keep full precision (repr round-trips) and ``inf`` stays ``inf``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            raise ProfileError("cannot write nan to a profile")
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_value(item) for item in value) + "]"
    raise ProfileError(f"cannot write {type(value).__name__} value {value!r} to a profile")


class _Document:
    """Accumulates TOML lines table by table."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def pairs(self, items: Mapping[str, object]) -> None:
        self.lines.extend(f"{_key(k)} = {_value(v)}" for k, v in items.items() if v is not None)

    def table(self, path: str, items: Mapping[str, object], *, array: bool = False) -> None:
        header = ".".join(_key(part) for part in path.split("."))
        self.lines.append("")
        self.lines.append(f"[[{header}]]" if array else f"[{header}]")
        self.pairs(items)

    def text(self) -> str:
        return "\n".join(self.lines).lstrip("\n") + "\n"


def _link_items(link: LinkSpec) -> dict[str, object]:
    return {"bandwidth_GBps": float(link.bandwidth_GBps), "latency_us": float(link.latency_us),
            "efficiency": float(link.efficiency)}


def _gpu(doc: _Document, gpu: GPUSpec, prefix: str, *, top: bool) -> None:
    head = {"kind": "gpu"} if top else {}
    items = {**head, "name": gpu.name, "description": gpu.description, "memory_GiB": float(gpu.memory_GiB),
             "hbm_bandwidth_GBps": float(gpu.hbm_bandwidth_GBps), "hbm_efficiency": float(gpu.hbm_efficiency),
             "kernel_overhead_us": float(gpu.kernel_overhead_us),
             "comm_compute_slowdown": float(gpu.comm_compute_slowdown),
             "p2p_compute_slowdown": gpu.p2p_compute_slowdown,  # None: not written
             "copy_engine_compute_slowdown": gpu.copy_engine_compute_slowdown,  # None: not written
             "fused_attention_efficiency": gpu.fused_attention_efficiency,  # None: not written
             "sustained_clock_fraction": float(gpu.sustained_clock_fraction),
             "chip_speed_spread": float(gpu.chip_speed_spread), "sm_count": gpu.sm_count}
    if top:
        doc.pairs(items)
    else:
        doc.table(prefix.rstrip("."), items)
    doc.table(prefix + "peak_tflops", {k: float(v) for k, v in gpu.peak_tflops.items()})
    matmul: dict[str, object] = {"max_efficiency": float(gpu.matmul.max_efficiency), "min_dim": gpu.matmul.min_dim,
                                 "relative": tuple(float(r) for r in gpu.matmul.relative)}
    if gpu.matmul.tiled:
        matmul.update(tile_m=gpu.matmul.tile_m, tile_n=gpu.matmul.tile_n)
    if gpu.matmul.stream_k:
        matmul["stream_k"] = True
    if gpu.matmul.max_efficiency_fp8 is not None:
        matmul["max_efficiency_fp8"] = float(gpu.matmul.max_efficiency_fp8)
    doc.table(prefix + "matmul", matmul)
    if gpu.fused_attention:
        doc.table(prefix + "fused_attention", {"default": gpu.attention_kernel})  # None: not written
        for name, table in gpu.fused_attention.items():
            doc.table(prefix + f"fused_attention.{name}", {
                "seq_len": table.seq_len, "head_dim": table.head_dim,
                "fwd_causal_tflops": table.fwd_causal_tflops, "fwd_tflops": table.fwd_tflops,
                "bwd_tflops": table.bwd_tflops, "bwd_causal_tflops": table.bwd_causal_tflops})  # None: not written
    if gpu.sources:
        doc.table(prefix + "sources", dict(gpu.sources))


def _node(doc: _Document, node: NodeSpec, prefix: str, *, top: bool) -> None:
    head = {"kind": "node"} if top else {}
    items = {**head, "name": node.name, "description": node.description, "gpus_per_node": node.gpus_per_node,
             "intra_fabric": node.intra_fabric, "gpus_per_pcie_switch": node.gpus_per_pcie_switch,
             "host_memory_GiB": float(node.host_memory_GiB),
             "host_adam_params_per_s": float(node.host_adam_params_per_s), "nics_per_node": node.nics_per_node,
             # Gb/s as datasheets state NIC rates; * 8 is exact in binary floating point, so it round-trips.
             "nic_bandwidth_Gbps": float(node.nic_link.bandwidth_GBps) * 8,
             "nic_latency_us": float(node.nic_link.latency_us), "nic_efficiency": float(node.nic_link.efficiency),
             "nvlink_sharp": node.nvlink_sharp, "cpu_vendor": node.cpu_vendor, "gpu_arch": node.gpu_arch}
    if top:
        doc.pairs(items)
    else:
        doc.table(prefix.rstrip("."), items)
    doc.table(prefix + "intra_link", _link_items(node.intra_link))
    doc.table(prefix + "pcie_link", _link_items(node.pcie_link))
    curve = node.intra_busbw_curve
    if curve is not None:
        doc.table(prefix + "intra_busbw_curve", {"ranks": curve.ranks, "bytes": curve.bytes,
                                                 "busbw_GBps": curve.busbw_GBps})
    if node.sources:
        doc.table(prefix + "sources", dict(node.sources))
    _gpu(doc, node.gpu, prefix + "gpu.", top=False)


def _cluster(doc: _Document, cluster: ClusterSpec) -> None:
    doc.pairs({"kind": "cluster", "name": cluster.name, "description": cluster.description,
               "max_nodes": cluster.max_nodes})
    net = cluster.network
    doc.table("network", {"kind": net.kind, "topology": net.topology,
                          "oversubscription": float(net.oversubscription),
                          "switch_latency_us": float(net.switch_latency_us), "efficiency": float(net.efficiency)})
    if cluster.sources:
        doc.table("sources", dict(cluster.sources))
    _node(doc, cluster.node, "node.", top=False)
    measured = cluster.measured
    if measured is None:
        return
    bandwidth = measured.memory_bandwidth_GBps
    doc.table("measured", {"memory_bandwidth_GBps": None if bandwidth is None else float(bandwidth)})
    for c in measured.collectives:
        doc.table("measured.collectives", {"kind": c.kind, "group_size": c.group_size, "bytes": c.bytes,
                                           "time_us": float(c.time_us)}, array=True)
    for p in measured.p2p:
        doc.table("measured.p2p", {"bytes": p.bytes, "time_us": float(p.time_us)}, array=True)
    for r in measured.compute:
        doc.table("measured.compute", {"key": r.key, "time_us": float(r.time_us)}, array=True)


def to_toml(spec: ClusterSpec | NodeSpec | GPUSpec) -> str:
    """A self-contained profile (node and GPU inlined, measured tables included) for ``spec``."""
    doc = _Document()
    if isinstance(spec, ClusterSpec):
        _cluster(doc, spec)
    elif isinstance(spec, NodeSpec):
        _node(doc, spec, "", top=True)
    elif isinstance(spec, GPUSpec):
        _gpu(doc, spec, "", top=True)
    else:
        raise ProfileError(f"to_toml expects a ClusterSpec, NodeSpec or GPUSpec, not {type(spec).__name__}")
    return doc.text()


def write_profile(spec: ClusterSpec | NodeSpec | GPUSpec, path: str | Path) -> Path:
    """Write :func:`to_toml` of ``spec`` to ``path`` atomically (parent folders created); returns the path.

    The file appears complete or not at all (a temporary file in the folder, then a rename), so a failed
    calibration never leaves a truncated profile for ``validate`` to read.
    """
    from simgrid.io.atomic import atomic_write_text

    target = Path(path)
    text = to_toml(spec)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ProfileError(f"{target}: cannot create the folder {target.parent}: {exc.strerror or exc}") from None
    atomic_write_text(target, text, flag="profile", error=ProfileError)
    return target
