"""Device helpers (executor/devices.py): backend choice, datasheet profiles by device name, memory peaks and
the environment record on a CPU; and a source check that the executor's CUDA path creates its tensors on
the device of the data they join (a CPU tensor there breaks NCCL runs, which CPU CI cannot run)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from executor import devices  # noqa: E402
from simgrid.errors import SimgridError  # noqa: E402
from simgrid.hardware import load_cluster_spec  # noqa: E402

pytestmark = [pytest.mark.torch]
CPU = torch.device("cpu")


@pytest.mark.parametrize(("name", "gpu", "cluster"), [
    ("NVIDIA H100 80GB HBM3", "h100-sxm", "dgx-h100-ndr"),
    ("NVIDIA H200", "h200-sxm", "hgx-h200-ndr"),
    ("NVIDIA A100-SXM4-80GB", "a100-80gb-sxm", "dgx-a100-hdr"),
    ("NVIDIA A100-SXM4-40GB", "a100-40gb-sxm", "dgx-a100-40gb-hdr"),
    ("NVIDIA B200", "b200", "hgx-b200"),
    ("NVIDIA GeForce RTX 4090", "rtx-4090", "rtx4090-10gbe"),
    ("Tesla V100-SXM2-32GB", "v100-sxm2-32gb", "dgx1-v100-edr"),
])
def test_device_names_pick_their_shipped_datasheet(name: str, gpu: str, cluster: str) -> None:
    """CUDA device names map to the SXM profiles; the cluster's GPU is that profile."""
    sheet = devices.datasheet_for(name)
    assert sheet is not None and (sheet.gpu, sheet.cluster) == (gpu, cluster)
    assert load_cluster_spec(sheet.cluster).node.gpu.name == gpu


@pytest.mark.parametrize("name", ["NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA A100 80GB PCIe", "NVIDIA L4",
                                  "CPU x86_64"])
def test_parts_without_a_profile_get_none_and_a_fix(name: str) -> None:
    """PCIe/NVL parts (other clocks and power) and unknown devices have no datasheet: the error says to pass
    one; an explicit profile is used as given."""
    assert devices.datasheet_for(name) is None
    with pytest.raises(SimgridError, match=r"no shipped datasheet profile.*pass a cluster profile.*--datasheet"):
        devices.require_datasheet(name)
    sheet = devices.require_datasheet(name, "dgx-h100-ndr")
    assert (sheet.gpu, sheet.cluster) == ("h100-sxm", "dgx-h100-ndr")


def test_cpu_runs_use_gloo_and_report_no_device_memory() -> None:
    """Without CUDA: gloo, the CPU device, no allocator peak; synchronising and resetting are no-ops."""
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the CPU defaults do not apply")
    assert devices.default_backend() == "gloo" and devices.default_device() == CPU
    devices.synchronize(CPU)
    devices.reset_peak_memory(CPU)
    assert devices.peak_memory_bytes(CPU) == 0


def test_environment_records_the_versions_docs_ask_for() -> None:
    """The CPU record names the device, python and torch (CUDA adds runtime, driver, NCCL, clocks)."""
    env = devices.environment(CPU)
    assert env["torch"] == str(torch.__version__) and env["device"].startswith("CPU") and env["python"]


# -- the CUDA path's tensor factories --------------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[2]
FACTORIES = {"zeros", "ones", "empty", "full", "randn", "rand", "randint", "arange", "tensor", "eye"}
CUDA_PATH = ("executor/state.py", "executor/blockrun.py", "executor/grads.py", "executor/comm.py",
             "executor/runner.py", "executor/cutplan.py", "executor/tp.py", *(
                 str(p.relative_to(ROOT)) for p in sorted((ROOT / "executor" / "handlers").glob("*.py"))))
"""Modules every step on a GPU runs through. CPU-only by design, and so not listed: weights and data (made on
the CPU from a seeded generator, identical on every rank, then moved), the rotary tables and CP positions
(moved with ``.to``), the gloo micro-benchmarks, the single-process reference."""
ALLOWED = {("executor/comm.py", "flatten")}
"""(module, function) that may create a tensor without a device: ``flatten`` of an empty list has no device
to take, and nothing is flattened from nothing on the CUDA path."""


def _device_less_factories(path: Path, root: Path = ROOT) -> list[str]:
    """``torch.<factory>(...)`` calls without ``device=`` outside :data:`ALLOWED` functions, as text."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: list[str] = []
    relative = str(path.relative_to(root))

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else function
            if (isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute)
                    and isinstance(child.func.value, ast.Name) and child.func.value.id == "torch"
                    and child.func.attr in FACTORIES and not any(k.arg == "device" for k in child.keywords)
                    and (relative, function) not in ALLOWED):
                found.append(f"{relative}:{child.lineno} torch.{child.func.attr}(...) in {function or 'module'}")
            visit(child, name)

    visit(tree, "")
    return found


def test_the_cuda_path_creates_tensors_on_a_device() -> None:
    """Every torch tensor factory in the modules a GPU step runs through names its device (or the code uses
    ``new_*``/``*_like`` of a device tensor); a CPU tensor there would meet CUDA tensors in a NCCL run."""
    offenders = [hit for module in CUDA_PATH for hit in _device_less_factories(ROOT / module)]
    assert not offenders, "pass device= (or use x.new_zeros / torch.zeros_like): " + "; ".join(offenders)


def test_the_factory_check_finds_a_device_less_call(tmp_path: Path) -> None:
    """On a made-up module: torch.zeros(3) is reported with its line and function; torch.zeros(3, device=d),
    x.new_zeros(3) and torch.zeros_like(x) are not."""
    module = tmp_path / "executor" / "m.py"
    module.parent.mkdir()
    module.write_text("import torch\ndef f(x, d):\n    a = torch.zeros(3, device=d)\n    b = x.new_zeros(3)\n"
                      "    c = torch.zeros_like(x)\n    return torch.zeros(3)\n")
    assert _device_less_factories(module, tmp_path) == ["executor/m.py:6 torch.zeros(...) in f"]
