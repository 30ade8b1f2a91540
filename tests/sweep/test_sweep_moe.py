"""Layout search over expert parallelism: ep and etp are dimensions of the space for MoE models only."""

from __future__ import annotations

import pytest

from simgrid.errors import LayoutError
from simgrid.model import get_model
from simgrid.sweep import SweepConstraints, enumerate_layouts
from simgrid.sweep.runner import describe_layout

FAST = SweepConstraints(zero_stages=(0,), recompute=("none",), max_mbs=1, schedules=("1f1b",),
                        sequence_parallel=(True,))


def test_moe_search_covers_ep_and_etp() -> None:
    """Mixtral (8 experts) on 8 GPUs: ep 1, 2, 4, 8 all appear; etp is 1 or tp; ep * etp divides tp * dp."""
    layouts = enumerate_layouts(get_model("mixtral-8x7b"), 8, gpus=8, global_batch=8, constraints=FAST)
    assert {lay.ep for lay in layouts} == {1, 2, 4, 8}
    assert all(lay.expert_tp in (1, lay.tp) for lay in layouts)
    assert all((lay.tp * lay.dp) % (lay.ep * lay.expert_tp) == 0 for lay in layouts)
    assert any(lay.tp == 2 and lay.expert_tp == 2 for lay in layouts)
    assert any(lay.tp == 2 and lay.expert_tp == 1 and lay.ep == 4 for lay in layouts)


def test_dense_models_are_not_searched_over_experts() -> None:
    """A dense model keeps ep = 1 and etp unset: the space is what it was."""
    layouts = enumerate_layouts(get_model("tiny-gpt"), 8, gpus=8, global_batch=8, constraints=FAST)
    assert layouts and all(lay.ep == 1 and lay.etp is None for lay in layouts)


def test_constraints_fix_the_expert_degrees() -> None:
    """expert_parallel=(2,), expert_tensor_parallel=(1,) leave only those degrees; the description names them."""
    c = SweepConstraints(zero_stages=(0,), recompute=("none",), max_mbs=1, schedules=("1f1b",),
                         sequence_parallel=(True,), expert_parallel=(2,), expert_tensor_parallel=(1,))
    layouts = enumerate_layouts(get_model("mixtral-8x7b"), 8, gpus=8, global_batch=8, constraints=c)
    assert layouts and {(lay.ep, lay.expert_tp) for lay in layouts} == {(2, 1)}
    assert "ep=2 etp=1" in describe_layout(layouts[0])
    assert "expert_parallel=2" in c.describe()


def test_bad_expert_constraint_is_named() -> None:
    """An empty or non-positive degree list fails with the constraint's name."""
    with pytest.raises(LayoutError, match="expert_parallel = \\(0,\\) must be a non-empty tuple"):
        SweepConstraints(expert_parallel=(0,))
