"""Layout enumeration: which layouts the search generates, which it drops, and the constraint rules."""

from __future__ import annotations

import dataclasses

import pytest

from simgrid.errors import LayoutError
from simgrid.layout import Layout, check_layout
from simgrid.model.spec import ModelSpec
from simgrid.sweep import SweepConstraints, enumerate_layout_space, enumerate_layouts

# 4 heads and 4 layers keep the space small enough to reason about by hand.
SMALL = ModelSpec(name="small", num_layers=4, hidden_size=64, num_heads=4, vocab_size=128, seq_length=64)
EIGHT_LAYERS = ModelSpec(name="eight", num_layers=8, hidden_size=64, num_heads=4, vocab_size=128, seq_length=64)


def test_every_enumerated_layout_is_valid_unique_and_uses_all_gpus() -> None:
    """Each layout passes check_layout, has dp*tp*pp = gpus, and appears once."""
    layouts = enumerate_layouts(SMALL, 4, gpus=8, global_batch=16)
    assert layouts
    for layout in layouts:
        check_layout(SMALL, layout)
        assert layout.world_size == 8
        assert layout.gbs == 16
    assert len(set(layouts)) == len(layouts)


def test_degree_pairs_match_hand_derivation() -> None:
    """tp: powers of two <= 4 GPUs/node dividing 4 heads; pp divides 8/tp and the 4 layers."""
    layouts = enumerate_layouts(SMALL, 4, gpus=8, global_batch=16)
    pairs = {(lay.tp, lay.pp) for lay in layouts}
    assert pairs == {(1, 1), (1, 2), (1, 4), (2, 1), (2, 2), (2, 4), (4, 1), (4, 2)}


def test_tp_stays_inside_a_node_unless_allowed() -> None:
    """With 2 GPUs per node tp <= 2; allowing tp across nodes admits tp = 4 (which divides 4 heads)."""
    inside = {lay.tp for lay in enumerate_layouts(SMALL, 2, gpus=8, global_batch=16)}
    across = {
        lay.tp
        for lay in enumerate_layouts(
            SMALL, 2, gpus=8, global_batch=16, constraints=SweepConstraints(allow_tp_across_nodes=True)
        )
    }
    assert inside == {1, 2}
    assert across == {1, 2, 4}


def test_fixed_degrees_count_exactly() -> None:
    """tp=2, pp=2 (dp=2), gbs 16, 1F1B, zero 0-3, recompute none/full, mbs up to 8.

    By hand: mbs divides 16/2 = 8 -> {1, 2, 4, 8}; ZeRO-2/3 are refused with pp > 1, so zero in {0, 1}:
    valid = 2 zero x 4 mbs x 2 recompute = 16, and the 16 zero-2/3 candidates are dropped as invalid.
    """
    constraints = SweepConstraints(tp=2, pp=2, schedules=("1f1b",), recompute=("none", "full"))
    space = enumerate_layout_space(SMALL, 4, gpus=8, global_batch=16, constraints=constraints)
    assert len(space.layouts) == 16
    assert space.invalid == 16
    assert space.tried == 32
    assert {lay.zero for lay in space.layouts} == {0, 1}
    assert {lay.micro_batch_size for lay in space.layouts} == {1, 2, 4, 8}
    (reason,) = space.invalid_reasons
    assert "ZeRO" in reason and "N" in reason  # numbers are blanked so equal rules group together


def test_interleaved_vpp_must_divide_layers_and_microbatches_fill_equal_rounds() -> None:
    """8 layers, pp = 2: vpp in {2, 4} (pp*vpp | 8); m = 24/(mbs*dp) must split into max(1, m // pp)
    equal rounds (torch's flexible interleaving: m <= pp or, e.g., a multiple of pp)."""
    constraints = SweepConstraints(
        tp=1, pp=2, schedules=("interleaved-1f1b",), zero_stages=(0,), recompute=("none",), max_mbs=12
    )
    space = enumerate_layout_space(EIGHT_LAYERS, 8, gpus=4, global_batch=24, constraints=constraints)
    got = {(lay.vpp, lay.micro_batch_size) for lay in space.layouts}
    # dp = 2, so m = 12/mbs: mbs 1 -> 12, 2 -> 6, 3 -> 4, 4 -> 3 (1 round of 3 is fine),
    # 6 -> 2, 12 -> 1; m = 3 with pp = 2 is one round, so every mbs is valid here.
    assert got == {(v, m) for v in (2, 4) for m in (1, 2, 3, 4, 6, 12)}
    assert all(lay.schedule == "interleaved-1f1b" for lay in space.layouts)
    odd = enumerate_layout_space(EIGHT_LAYERS, 8, gpus=4, global_batch=10, constraints=constraints)
    # m = 5 over pp = 2 would be two rounds of unequal size: refused.
    assert {lay.micro_batch_size for lay in odd.layouts} == {5}
    assert any("rounds of equal size" in r for r in odd.invalid_reasons)


def test_uneven_stages_only_when_allowed() -> None:
    """pp * vpp must divide the layers by default; allow_uneven_stages admits 8 layers on pp*vpp = 6."""
    base = {"tp": 1, "pp": 2, "schedules": ("interleaved-1f1b",), "zero_stages": (0,), "recompute": ("none",)}
    even = enumerate_layouts(EIGHT_LAYERS, 8, gpus=4, global_batch=16, constraints=SweepConstraints(**base))
    uneven = enumerate_layouts(
        EIGHT_LAYERS, 8, gpus=4, global_batch=16, constraints=SweepConstraints(allow_uneven_stages=True, **base)
    )
    assert {lay.vpp for lay in even} == {2, 4}
    assert {lay.vpp for lay in uneven} == {2, 3, 4}
    assert {lay.pp for lay in enumerate_layouts(SMALL, 8, gpus=8, global_batch=8)} == {1, 2, 4}


def test_pp1_uses_no_schedule_and_dp1_tries_only_zero0() -> None:
    """pp = 1 layouts have schedule 'none'; a single replica (dp = 1) is only tried with ZeRO 0."""
    layouts = enumerate_layouts(SMALL, 8, gpus=4, global_batch=8)
    assert all(lay.schedule == "none" for lay in layouts if lay.pp == 1)
    assert all(lay.schedule != "none" for lay in layouts if lay.pp > 1)
    assert {lay.zero for lay in layouts if lay.dp == 1} == {0}
    assert {lay.zero for lay in layouts if lay.dp > 1 and lay.pp == 1} == {0, 1, 2, 3}


def test_micro_batch_sizes_divide_the_per_replica_batch_and_respect_the_cap() -> None:
    """mbs divides gbs/dp and is at most max_mbs."""
    layouts = enumerate_layouts(SMALL, 4, gpus=4, global_batch=48, constraints=SweepConstraints(max_mbs=4))
    for lay in layouts:
        assert (48 // lay.dp) % lay.micro_batch_size == 0
        assert lay.micro_batch_size <= 4
    assert {lay.micro_batch_size for lay in layouts if lay.dp == 4} == {1, 2, 3, 4}


def test_global_batch_not_divisible_by_dp_is_dropped_with_its_reason() -> None:
    """gbs 6 on 4 GPUs: dp = 4 does not divide 6, so tp=1 pp=1 is invalid and counted."""
    space = enumerate_layout_space(SMALL, 4, gpus=4, global_batch=6)
    assert all(lay.dp in (1, 2) for lay in space.layouts)
    assert any("not divisible" in r for r in space.invalid_reasons)


def test_each_invalid_reason_keeps_its_first_candidates_message_with_numbers() -> None:
    """gbs 6 on 4 GPUs: the blanked reason groups the candidates; the example names dp = 4 and gbs 6."""
    space = enumerate_layout_space(SMALL, 4, gpus=4, global_batch=6)
    (key,) = (r for r in space.invalid_reasons if "not divisible" in r)
    assert "global_batch_size = N" in key
    assert "global_batch_size = 6 is not divisible by micro_batch_size * dp = 1 * 4" in space.invalid_examples[key]
    assert set(space.invalid_examples) == set(space.invalid_reasons)


def test_sequence_parallel_is_only_tried_with_tensor_parallelism() -> None:
    """sequence_parallel=(False, True) doubles the tp > 1 layouts only."""
    both = SweepConstraints(sequence_parallel=(False, True))
    layouts = enumerate_layouts(SMALL, 4, gpus=4, global_batch=8, constraints=both)
    assert not any(lay.sequence_parallel for lay in layouts if lay.tp == 1)
    assert any(lay.sequence_parallel for lay in layouts if lay.tp > 1)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_tp": 0}, "max_tp = 0 must be a positive integer"),
        ({"schedules": ("none",)}, "schedules has \\['none'\\]"),
        ({"zero_stages": (4,)}, "zero_stages has \\[4\\]"),
        ({"recompute": ()}, "recompute = \\(\\) must be a non-empty tuple"),
        ({"tp": 8, "max_tp": 4}, "tp = 8 and max_tp = 4 contradict"),
        ({"micro_batch_sizes": (0,)}, "micro_batch_sizes = \\(0,\\)"),
    ],
)
def test_bad_constraints_name_the_field(kwargs: dict[str, object], match: str) -> None:
    """Invalid constraints raise LayoutError naming the field and value."""
    with pytest.raises(LayoutError, match=match):
        SweepConstraints(**kwargs)  # type: ignore[arg-type]


def test_bad_gpu_count_is_an_error() -> None:
    """gpus must be a positive integer."""
    with pytest.raises(LayoutError, match="gpus = 0 must be a positive integer"):
        enumerate_layouts(SMALL, 4, gpus=0, global_batch=8)


def test_describe_lists_only_changed_constraints() -> None:
    """describe() is 'defaults' for defaults and name=value for changes."""
    assert SweepConstraints().describe() == "defaults"
    assert SweepConstraints(tp=8, recompute=("full",)).describe() == "tp=8, recompute=full"


def test_context_parallel_degrees_are_searched_when_asked() -> None:
    """context_parallel (1, 2) on 4 GPUs: cp 2 layouts use dp * tp * pp * cp = 4 GPUs, and ZeRO stages are
    tried even at dp 1 when cp 2 gives the gradients two ranks to shard over; by default cp stays 1."""
    space = enumerate_layout_space(SMALL, 4, gpus=4, global_batch=4,
                                   constraints=SweepConstraints(context_parallel=(1, 2)))
    with_cp = [lay for lay in space.layouts if lay.cp == 2]
    assert with_cp and all(lay.world_size == 4 for lay in with_cp)
    assert any(lay.dp == 1 and lay.zero == 1 for lay in with_cp)
    assert {lay.cp for lay in enumerate_layouts(SMALL, 4, gpus=4, global_batch=4)} == {1}


def test_bad_context_parallel_constraint_names_the_field() -> None:
    """An empty or non-positive list of cp degrees is refused with the field's name."""
    with pytest.raises(LayoutError, match=r"context_parallel = \(\) must be a non-empty tuple"):
        SweepConstraints(context_parallel=())


def _without(layout: Layout, *fields: str) -> Layout:
    return dataclasses.replace(layout, **dict.fromkeys(fields, False))


def test_tp_comm_overlap_both_doubles_only_layouts_with_tp_and_sequence_parallelism() -> None:
    """tp_comm_overlap=(False, True) adds an overlapped twin of exactly the layouts with tp > 1 and sequence
    parallelism; every other layout appears once, with the overlap off (not dropped as invalid)."""
    base = dict(sequence_parallel=(False, True), zero_stages=(0, 1), max_mbs=2)
    off = enumerate_layout_space(SMALL, 4, gpus=4, global_batch=8, constraints=SweepConstraints(**base))
    both = enumerate_layout_space(SMALL, 4, gpus=4, global_batch=8,
                                  constraints=SweepConstraints(**base, tp_comm_overlap=(False, True)))
    applies = [lay for lay in off.layouts if lay.tp > 1 and lay.sequence_parallel]
    assert applies and len(applies) < len(off.layouts)
    assert len(both.layouts) == len(off.layouts) + len(applies)
    overlapped = [lay for lay in both.layouts if lay.tp_comm_overlap]
    assert sorted(map(str, (_without(lay, "tp_comm_overlap") for lay in overlapped))) == sorted(map(str, applies))
    assert both.invalid == off.invalid  # nothing invalid was built: the overlap is off where it cannot apply


def test_tp_comm_overlap_on_sets_it_where_valid_and_leaves_the_rest() -> None:
    """tp_comm_overlap=(True,) turns it on for every tp > 1 layout with sequence parallelism and keeps the
    others (tp 1, no SP) as they were, overlap off."""
    base = dict(sequence_parallel=(False, True), max_mbs=2)
    off = enumerate_layouts(SMALL, 4, gpus=4, global_batch=8, constraints=SweepConstraints(**base))
    on = enumerate_layouts(SMALL, 4, gpus=4, global_batch=8,
                           constraints=SweepConstraints(**base, tp_comm_overlap=(True,)))
    assert len(on) == len(off)
    for lay in on:
        assert lay.tp_comm_overlap == (lay.tp > 1 and lay.sequence_parallel)
    assert [_without(lay, "tp_comm_overlap") for lay in on] == off


def test_overlap_param_gather_is_tried_on_zero1_with_overlapped_grad_reduce_only() -> None:
    """overlap_param_gather=(False, True) doubles the ZeRO-1 layouts (dp > 1) only; with the recipe's
    overlap_grad_reduce off (Megatron's rule) nothing is doubled and every layout keeps it off."""
    base = dict(zero_stages=(0, 1, 2, 3), max_mbs=2)
    off = enumerate_layouts(SMALL, 4, gpus=4, global_batch=8, constraints=SweepConstraints(**base))
    both = enumerate_layouts(SMALL, 4, gpus=4, global_batch=8,
                             constraints=SweepConstraints(**base, overlap_param_gather=(False, True)))
    zero1 = [lay for lay in off if lay.zero == 1]
    assert zero1 and len(both) == len(off) + len(zero1)
    assert {lay.zero for lay in both if lay.overlap_param_gather} == {1}
    no_overlap = dict(base, recipe=(("overlap_grad_reduce", False),))
    plain = enumerate_layouts(SMALL, 4, gpus=4, global_batch=8, constraints=SweepConstraints(**no_overlap))
    tried = enumerate_layouts(SMALL, 4, gpus=4, global_batch=8,
                              constraints=SweepConstraints(**no_overlap, overlap_param_gather=(False, True)))
    assert tried == plain and not any(lay.overlap_param_gather for lay in tried)


@pytest.mark.parametrize("name", ["tp_comm_overlap", "overlap_param_gather"])
def test_bad_overlap_switch_constraints_name_the_field(name: str) -> None:
    """The switches take a non-empty tuple of booleans, like sequence_parallel."""
    with pytest.raises(LayoutError, match=rf"sweep constraint {name} has \[1\]"):
        SweepConstraints(**{name: (1,)})  # type: ignore[arg-type]
    with pytest.raises(LayoutError, match=rf"sweep constraint {name} = \(\) must be a non-empty tuple"):
        SweepConstraints(**{name: ()})  # type: ignore[arg-type]
