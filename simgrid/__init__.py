"""simgrid: predict the step time, utilisation, communication and memory of distributed LLM training.

Import name ``simgrid`` (distribution ``llm-simgrid``; see README.md for why). The top-level names are
loaded lazily so that ``import simgrid.ir`` stays free of SimPy and pandas.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: Public name -> module that defines it.
_EXPORTS = {
    "simulate": "simgrid.simulation",
    "SimulationResult": "simgrid.simulation",
    "build_program": "simgrid.schedules",
    "Layout": "simgrid.layout",
    "Mesh": "simgrid.layout",
    "ModelSpec": "simgrid.model",
    "get_model": "simgrid.model",
    "list_models": "simgrid.model",
    "param_count": "simgrid.model",
    "estimate_memory": "simgrid.memory",
    "load_cluster": "simgrid.hardware",
    "load_gpu": "simgrid.hardware",
    "list_profiles": "simgrid.hardware",
    "Program": "simgrid.ir",
    "load_program": "simgrid.ir",
    "save_program": "simgrid.ir",
    "validate_program": "simgrid.ir",
    "Trace": "simgrid.trace",
    "SimgridError": "simgrid.errors",
}

__all__ = [
    "Layout",
    "Mesh",
    "ModelSpec",
    "Program",
    "SimgridError",
    "SimulationResult",
    "Trace",
    "__version__",
    "build_program",
    "estimate_memory",
    "get_model",
    "list_models",
    "list_profiles",
    "load_cluster",
    "load_gpu",
    "load_program",
    "param_count",
    "save_program",
    "simulate",
    "validate_program",
]

if TYPE_CHECKING:
    from simgrid.errors import SimgridError
    from simgrid.hardware import list_profiles, load_cluster, load_gpu
    from simgrid.ir import Program, load_program, save_program, validate_program
    from simgrid.layout import Layout, Mesh
    from simgrid.memory import estimate_memory
    from simgrid.model import ModelSpec, get_model, list_models, param_count
    from simgrid.schedules import build_program
    from simgrid.simulation import SimulationResult, simulate
    from simgrid.trace import Trace


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'simgrid' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
