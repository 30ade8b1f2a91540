"""Context parallelism in the layout and the mesh: sizes, rules, rank order and process groups."""

from __future__ import annotations

import pytest

from simgrid.errors import LayoutError
from simgrid.layout import Layout, Mesh, check_layout
from simgrid.model import get_model
from simgrid.schedules.build import mesh_groups

TINY = get_model("tiny-gpt")  # seq 32, 4 heads


def test_cp_multiplies_the_world_but_not_the_micro_batches() -> None:
    """dp 2, tp 2, pp 2, cp 2 is 16 GPUs; the micro-batch count still follows dp only; gradients sync
    (and ZeRO shards) over dp * cp = 4 ranks."""
    lay = Layout(dp=2, tp=2, pp=2, cp=2, global_batch_size=8)
    assert lay.world_size == 16
    assert lay.num_microbatches == 4
    assert lay.grad_sync_size == 4


@pytest.mark.parametrize(
    ("model_seq", "kwargs", "message"),
    [
        (30, {"cp": 4}, r"cp = 4 splits each sequence into 2 \* cp = 8 chunks .* sequence length 30 is not a multiple of 8"),
        (32, {"cp": 2, "tp": 4, "sequence_parallel": True, "dp": 1},
         None),
        (24, {"cp": 4, "tp": 4, "sequence_parallel": True},
         r"sequence parallel needs tp = 4 to divide the sequence length 24 / cp 4 = 6"),
    ],
)
def test_model_dependent_cp_rules(model_seq: int, kwargs: dict[str, object], message: str | None) -> None:
    """Two chunks per CP rank must tile the sequence; sequence parallelism splits the rank's own part."""
    model = TINY.with_seq_length(model_seq)
    layout = Layout(**kwargs)  # type: ignore[arg-type]
    if message is None:
        check_layout(model, layout)
    else:
        with pytest.raises(LayoutError, match=message):
            check_layout(model, layout)


def test_parameter_server_with_cp_is_refused_with_the_fix() -> None:
    """The parameter server would also have to sum context-parallel partial gradients: refused, named."""
    with pytest.raises(LayoutError, match=r"parameter-server' with cp = 2 .* use dp_mode 'allreduce'"):
        Layout(dp=2, cp=2, dp_mode="parameter-server", global_batch_size=2)


def test_rank_order_is_tp_then_cp_then_dp_then_pp() -> None:
    """Megatron-LM's order: rank = tp + TP * (cp + CP * (dp + DP * pp)), checked against that formula."""
    lay = Layout(dp=2, tp=2, pp=2, cp=3, global_batch_size=2)
    mesh = Mesh(lay)
    for pp in range(2):
        for dp in range(2):
            for cp in range(3):
                for tp in range(2):
                    rank = tp + 2 * (cp + 3 * (dp + 2 * pp))
                    assert mesh.rank(pp=pp, dp=dp, cp=cp, tp=tp) == rank
                    c = mesh.coords(rank)
                    assert (c.pp, c.dp, c.cp, c.tp) == (pp, dp, cp, tp)


def test_groups_with_cp() -> None:
    """Rank 5 of dp 2, tp 2, pp 2, cp 2 sits at (pp 0, dp 1, cp 0, tp 1): its TP pair is (4, 5), its CP pair
    (5, 7), its pipeline (5, 13), and its data-parallel group spans both replicas and both sequence parts."""
    mesh = Mesh(Layout(dp=2, tp=2, pp=2, cp=2, global_batch_size=2))
    assert mesh.tp_group(5) == (4, 5)
    assert mesh.cp_group(5) == (5, 7)
    assert mesh.pp_group(5) == (5, 13)
    assert sorted(mesh.dp_group(5)) == [1, 3, 5, 7]
    c = mesh.coords(7)
    assert (Mesh.tp_group_name(c), Mesh.cp_group_name(c), Mesh.pp_group_name(c), Mesh.dp_group_name(c)) == (
        "tp/pp0-dp1-cp1", "cp/pp0-dp1-tp1", "pp/dp1-tp1-cp1", "dp/pp0-tp1")


def test_without_cp_group_names_are_unchanged() -> None:
    """cp = 1 keeps the three-axis names, so every existing program and trace reads the same."""
    mesh = Mesh(Layout(dp=2, tp=2, pp=2, global_batch_size=2))
    assert not any(name.startswith("cp/") or "-cp" in name for name in mesh.groups())
    assert mesh.coords(5).cp is None


@pytest.mark.parametrize("degrees", [(2, 2, 2, 2), (1, 2, 1, 4), (3, 1, 2, 2), (2, 4, 1, 1)])
def test_the_program_builders_group_table_matches_the_mesh(degrees: tuple[int, int, int, int]) -> None:
    """build's closed-form group table (fast at 16k ranks) equals the mesh's rank-by-rank walk."""
    dp, tp, pp, cp = degrees
    lay = Layout(dp=dp, tp=tp, pp=pp, cp=cp, global_batch_size=dp * pp)
    assert mesh_groups(lay) == Mesh(lay).groups()
