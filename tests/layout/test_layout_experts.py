"""Expert parallelism in the layout: ep/etp rules with their fixes, and MoE parallel folding's rank groups."""

from __future__ import annotations

import pytest

from simgrid.errors import LayoutError
from simgrid.layout import Layout, check_layout
from simgrid.layout.experts import expert_coords, expert_groups, expert_rank
from simgrid.model import get_model


def test_etp_defaults_to_tp_and_edp_is_what_is_left() -> None:
    """etp unset means tp (Megatron-Core's default); edp = tp cp dp / (ep etp)."""
    lay = Layout(tp=2, dp=8, ep=4, sequence_parallel=True, global_batch_size=8)
    assert lay.expert_tp == 2 and lay.edp == 2
    assert Layout(tp=2, dp=8, ep=8, etp=1, global_batch_size=8).edp == 2


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"dp": 2, "ep": 4}, r"ep \* etp = 4 \* 1 must divide tp \* cp \* dp = 1 \* 1 \* 2 = 2"),
        ({"tp": 2, "dp": 2, "ep": 4, "sequence_parallel": True}, r"ep \* etp = 4 \* 2 must divide"),
        ({"ep": 0}, "ep = 0 must be a positive integer"),
        ({"etp": 0}, "etp = 0 must be a positive integer"),
    ],
)
def test_model_independent_expert_rules(kwargs: dict[str, object], match: str) -> None:
    """Degrees that cannot fold onto a stage's ranks fail on construction, naming the fix."""
    with pytest.raises(LayoutError, match=match):
        Layout(global_batch_size=8, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("model", "kwargs", "match"),
    [
        ("llama2-7b", {"dp": 2, "ep": 2}, "ep = 2, etp = None split experts, but 'llama2-7b' is a dense model"),
        ("mixtral-8x7b", {"dp": 16, "ep": 16}, "ep = 16 does not divide the 8 experts"),
        ("mixtral-8x7b", {"tp": 2, "dp": 2}, "needs sequence parallelism"),
        ("qwen2-57b-a14b", {"dp": 4, "ep": 4, "zero": 2}, "zero = 2 is not modelled for MoE models"),
        ("mixtral-8x7b", {"dp": 2, "dp_mode": "parameter-server"}, "parameter-server' is not modelled for MoE"),
        ("qwen3-30b-a3b", {"dp": 2, "etp": 2, "ep": 1}, None),
    ],
)
def test_model_dependent_expert_rules(model: str, kwargs: dict[str, object], match: str | None) -> None:
    """check_layout refuses expert degrees the model cannot take, and says how to fix them."""
    lay = Layout(global_batch_size=16, **kwargs)  # type: ignore[arg-type]
    if match is None:
        check_layout(get_model(model), lay)
        return
    with pytest.raises(LayoutError, match=match):
        check_layout(get_model(model), lay)


def test_expert_mesh_folds_onto_the_stage_ranks() -> None:
    """etp fastest, then ep, then edp, over the tp x cp x dp ranks of each stage; same pipeline."""
    lay = Layout(tp=2, dp=4, pp=2, ep=2, etp=2, sequence_parallel=True, global_batch_size=8)
    c = expert_coords(lay, 13)  # stage 1, index 5 = etp 1 + 2 * (ep 0 + 2 * edp 1)
    assert (c.pp, c.edp, c.ep, c.etp) == (1, 1, 0, 1)
    assert all(expert_rank(lay, expert_coords(lay, r)) == r for r in range(lay.world_size))
    groups = expert_groups(lay)
    assert groups["ep/pp1-edp1-etp1"] == (13, 15)
    assert groups["etp/pp0-edp0-ep1"] == (2, 3)
    assert groups["edp/pp0-ep1-etp0"] == (2, 6)
    for prefix, size in (("ep/", 2), ("etp/", 2), ("edp/", 2)):
        members = [g for name, g in groups.items() if name.startswith(prefix)]
        assert all(len(g) == size for g in members)
        assert sorted(r for g in members for r in g) == list(range(16))
