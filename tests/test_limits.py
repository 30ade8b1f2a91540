"""Size limits: the op estimate bounds the built programs from above, and absurd requests are refused early."""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest

from simgrid import Layout, build_program, simulate
from simgrid.errors import LayoutError, SimgridError
from simgrid.limits import (
    MAX_OPS,
    MAX_WORLD_SIZE,
    check_program_size,
    check_schedule_size,
    estimate_ops_per_rank,
)
from simgrid.model import get_model

_LAYOUTS: list[dict[str, Any]] = [
    dict(tp=tp, pp=pp, dp=dp, schedule=schedule, vpp=vpp, zero=zero, recompute=recompute,
         sequence_parallel=tp > 1, global_batch_size=mb * dp)
    for (tp, pp, dp, schedule, vpp), zero, recompute, mb in itertools.product(
        [(1, 1, 2, "none", 1), (2, 2, 1, "1f1b", 1), (1, 2, 2, "interleaved-1f1b", 2), (2, 2, 1, "zb-h1", 1),
         (1, 2, 1, "zbv", 2), (2, 1, 2, "none", 1)],
        (0, 1), ("none", "full"), (2, 8))
]


@pytest.mark.parametrize("model_name", ["tiny-gpt", "small-gpt"])
@pytest.mark.parametrize("granularity", ["block", "stage"])
def test_estimate_is_never_below_the_built_program(model_name: str, granularity: str) -> None:
    """For 48 layouts per model and granularity (schedules, ZeRO, recompute, TP with SP, two micro-batch
    counts), every rank's op list is at most the estimate; at block granularity (where large programs come
    from) the estimate is also within 25x of it, so the limit does not refuse programs far below it."""
    model = get_model(model_name)
    for kwargs in _LAYOUTS:
        layout = Layout(**kwargs)
        program = build_program(model, layout, granularity=granularity)  # type: ignore[arg-type]
        built = max(len(program.ranks[r]) for r in range(layout.world_size))
        estimate = estimate_ops_per_rank(model, layout, granularity)
        assert built <= estimate, (kwargs, built, estimate)
        if granularity == "block":
            assert estimate <= 25 * built, (kwargs, built, estimate)


def test_world_size_above_the_limit_is_refused_on_construction() -> None:
    """Layout(dp = limit + 1) names the limit; the limit itself is accepted."""
    Layout(dp=MAX_WORLD_SIZE, global_batch_size=MAX_WORLD_SIZE)
    with pytest.raises(LayoutError, match=f"needs 131,073 GPUs; the limit is {MAX_WORLD_SIZE:,}"):
        Layout(dp=MAX_WORLD_SIZE + 1)
    with pytest.raises(LayoutError, match=r"needs 1e\+12 GPUs"):
        Layout(dp=10**12, global_batch_size=10**12)


def test_a_trillion_micro_batches_are_refused_in_milliseconds() -> None:
    """--gbs 10^12 on one GPU: refused before any op is built, naming the estimate, the limit and the levers."""
    start = time.perf_counter()
    with pytest.raises(LayoutError, match=r"about 2\.7e\+14 ops \(1e\+12 micro-batches x 1 ranks at block "
                                          r"granularity\); the limit is 20,000,000 ops.*--granularity stage"):
        build_program(get_model("tiny-gpt"), Layout(global_batch_size=10**12))
    assert time.perf_counter() - start < 1.0


def test_full_mode_counts_every_rank_and_symmetric_mode_one_per_stage() -> None:
    """gpt3-175b on 4096 GPUs at block granularity: symmetric mode is within the limit, full mode is not."""
    model = get_model("gpt3-175b")
    layout = Layout(tp=8, pp=8, dp=64, global_batch_size=4096)
    check_program_size(model, layout, "block", ranks=layout.pp)
    with pytest.raises(LayoutError, match=r"x 4,096 ranks.*or --mode symmetric"):
        check_program_size(model, layout, "block", ranks=layout.world_size)
    with pytest.raises(SimgridError, match="simulating every rank would hold about"):
        simulate(model, "dgx-a100-hdr", layout, mode="full", granularity="block")


def test_schedule_size_is_bounded() -> None:
    """A compute-only order of 10^12 micro-batches, or 10^9 pipeline ranks, is refused with the limit."""
    check_schedule_size(4, 2, 1000)
    with pytest.raises(LayoutError, match=f"the limit is {MAX_OPS:,}"):
        check_schedule_size(2, 1, 10**12)
    with pytest.raises(LayoutError, match="--pp 1000000000 needs 1e\\+09 GPUs"):
        check_schedule_size(10**9, 1, 8)
