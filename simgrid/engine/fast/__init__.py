"""The fast engine: the SimPy interpreter's rules in a plain event loop, for the fast communication model.

:func:`simulate_step` runs a program and returns only the step's aggregates (:class:`StepSummary`), which
is what a layout search reads; :func:`simgrid.engine.simulate_program` uses the same loop (``engine=
"auto"`` or ``"fast"``) and keeps every trace row. Both are checked against the SimPy interpreter by
``tests/engine/test_fast_equivalence.py``.
"""

from simgrid.engine.fast.loop import FastLoop, UnsupportedProgram
from simgrid.engine.fast.step import simulate_step
from simgrid.engine.fast.summary import StepSummary, summary_metrics

__all__ = ["FastLoop", "StepSummary", "UnsupportedProgram", "simulate_step", "summary_metrics"]
