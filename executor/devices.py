"""The device a rank runs on: backend choice, synchronisation, memory peaks, its name, its datasheet profile.

Everything that differs between a CPU and a CUDA run and is not timing (:mod:`executor.timing`) or dtype
(:mod:`executor.precision`) is one small function here, selected by the device, so the callers (runner,
calibration, benchmarks) stay the same on both and the CPU tests exercise them.
"""

from __future__ import annotations

import platform
import subprocess
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

from simgrid.errors import SimgridError


def cuda_available() -> bool:
    """Whether a CUDA device is usable here."""
    return bool(torch.cuda.is_available())


def default_backend(world_size: int = 1) -> str:
    """``nccl`` when there is a CUDA GPU for each of ``world_size`` local ranks and torch has NCCL, else ``gloo``
    (NCCL refuses two ranks on one GPU)."""
    if cuda_available() and dist.is_nccl_available() and torch.cuda.device_count() >= world_size:
        return "nccl"
    return "gloo"


def default_device() -> torch.device:
    """The first CUDA device when there is one, else the CPU."""
    return torch.device("cuda", 0) if cuda_available() else torch.device("cpu")


def synchronize(device: torch.device) -> None:
    """Wait until every kernel queued on ``device`` has finished (nothing to wait for on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak_memory(device: torch.device) -> None:
    """Restart the allocator's peak counter of ``device`` (CUDA only)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_bytes(device: torch.device) -> int:
    """Peak bytes the caching allocator handed out on ``device`` since the last reset (0 on the CPU)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return 0


def device_name(device: torch.device) -> str:
    """``torch.cuda.get_device_name`` on CUDA (e.g. ``NVIDIA H100 80GB HBM3``), else the host's processor."""
    if device.type == "cuda":
        return str(torch.cuda.get_device_name(device))
    return f"CPU {platform.processor() or platform.machine()}"


@dataclass(frozen=True, kw_only=True)
class Datasheet:
    """The shipped profiles that describe a device model from its datasheet."""

    gpu: str
    """GPU profile name (``hardware_profiles/gpus``)."""
    cluster: str
    """A cluster profile built of that GPU (sized to one GPU for single-device predictions)."""


DATASHEETS: tuple[tuple[tuple[str, ...], tuple[str, ...], Datasheet], ...] = (
    (("H100",), ("PCIE", "NVL"), Datasheet(gpu="h100-sxm", cluster="dgx-h100-ndr")),
    (("H200",), ("NVL",), Datasheet(gpu="h200-sxm", cluster="hgx-h200-ndr")),
    (("A100", "80GB"), ("PCIE",), Datasheet(gpu="a100-80gb-sxm", cluster="dgx-a100-hdr")),
    (("A100", "40GB"), ("PCIE",), Datasheet(gpu="a100-40gb-sxm", cluster="dgx-a100-40gb-hdr")),
    (("B200",), (), Datasheet(gpu="b200", cluster="hgx-b200")),
    (("RTX 4090",), (), Datasheet(gpu="rtx-4090", cluster="rtx4090-10gbe")),
    (("V100", "32GB"), ("PCIE",), Datasheet(gpu="v100-sxm2-32gb", cluster="dgx1-v100-edr")),
)
"""(words the CUDA device name must contain, words it must not, the profiles): the SXM parts have shipped
profiles; a PCIe or NVL part has other clocks, power and memory and gets none (give one explicitly)."""


def datasheet_for(name: str) -> Datasheet | None:
    """The shipped datasheet profiles of a CUDA device name, or None when none describes it."""
    upper = name.upper().replace("-", " ")
    for needed, excluded, sheet in DATASHEETS:
        if all(word in upper for word in needed) and not any(word in upper for word in excluded):
            return sheet
    return None


def require_datasheet(name: str, override: str | None = None) -> Datasheet:
    """:func:`datasheet_for`, with ``override`` (a cluster profile name or path) taking precedence; error if none."""
    if override:
        from simgrid.hardware import load_cluster_spec

        return Datasheet(gpu=load_cluster_spec(override).node.gpu.name, cluster=override)
    sheet = datasheet_for(name)
    if sheet is None:
        raise SimgridError(
            f"no shipped datasheet profile describes the device {name!r} (known: H100/H200 SXM, A100 SXM, B200, "
            "RTX 4090, V100 SXM2); pass a cluster profile of this GPU with --datasheet NAME_OR_PATH"
        )
    return sheet


def environment(device: torch.device) -> dict[str, str]:
    """Versions and properties to record beside a GPU measurement (docs/gpu_validation.md lists them)."""
    env = {"device": device_name(device), "python": sys.version.split()[0], "torch": str(torch.__version__),
           "platform": platform.platform()}
    if device.type != "cuda":
        return env
    props = torch.cuda.get_device_properties(device)
    env.update({
        "cuda_runtime": str(torch.version.cuda),
        "cudnn": str(torch.backends.cudnn.version()),
        "nccl": _nccl_version(),
        "compute_capability": f"{props.major}.{props.minor}",
        "multiprocessors": str(props.multi_processor_count),
        "memory_GiB": f"{props.total_memory / 2**30:.1f}",
        "driver": _nvidia_smi("driver_version"),
        "clocks_max_MHz": _nvidia_smi("clocks.max.sm"),
        "power_limit_W": _nvidia_smi("power.limit"),
    })
    return env


def _nccl_version() -> str:
    """NCCL's version as ``2.21.5`` (torch returns a tuple; some builds an integer), or ``absent``."""
    if not dist.is_nccl_available():
        return "absent"
    version = torch.cuda.nccl.version()
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def _nvidia_smi(field: str) -> str:
    """One ``nvidia-smi --query-gpu`` field of the first GPU, or ``unknown`` (no nvidia-smi, or it failed)."""
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else "unknown"
