"""The search prices a layout's fused attention with the layout's own kernel (``attention_kernel``), as
:func:`simgrid.simulate` does: its fast path and its lower bound take the cost model of that kernel."""

from __future__ import annotations

import math

from simgrid.layout import Layout
from simgrid.simulation import simulate
from simgrid.sweep import sweep_layouts


def test_search_rows_follow_the_layouts_attention_kernel() -> None:
    """On H100 (FlashAttention-2 and -3 tables), a fa2 layout and a fa3 layout each get simulate()'s step."""
    steps = {}
    for kernel in ("fa2", "fa3"):
        layout = Layout(dp=2, tp=4, micro_batch_size=2, global_batch_size=8, flash_attention=True,
                        attention_kernel=kernel)  # type: ignore[arg-type]
        result = sweep_layouts("gpt3-1.3b", "dgx-h100-ndr", 8, [layout], workers=1, progress=False,
                               exact_top=None)
        row = result.table.to_dict("records")[0]
        expected = simulate("gpt3-1.3b", "dgx-h100-ndr", layout, granularity="stage").metrics.step_time_s
        assert math.isclose(row["step_time_s"], expected, rel_tol=1e-9), kernel
        steps[kernel] = row["step_time_s"]
    assert steps["fa2"] > steps["fa3"]  # FlashAttention-2 is the slower kernel on H100
