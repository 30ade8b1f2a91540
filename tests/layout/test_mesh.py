"""Rank <-> (pp, dp, tp) mapping and process groups."""

from __future__ import annotations

import itertools

import pytest

from simgrid.errors import LayoutError
from simgrid.layout import Layout, Mesh


def test_tp_is_fastest_then_dp_then_pp() -> None:
    """Consecutive ranks form a TP group; dp strides by tp; pp strides by tp * dp."""
    mesh = Mesh(Layout(dp=2, tp=4, pp=2, global_batch_size=4))
    assert mesh.rank(pp=0, dp=0, tp=1) == 1
    assert mesh.rank(pp=0, dp=1, tp=0) == 4
    assert mesh.rank(pp=1, dp=0, tp=0) == 8
    assert mesh.tp_group(5) == (4, 5, 6, 7)
    assert mesh.dp_group(5) == (1, 5)
    assert mesh.pp_group(5) == (5, 13)


def test_coords_and_rank_are_inverse() -> None:
    """Every rank maps to unique coordinates and back."""
    lay = Layout(dp=3, tp=2, pp=2, global_batch_size=6)
    mesh = Mesh(lay)
    seen = set()
    for r in range(lay.world_size):
        c = mesh.coords(r)
        assert mesh.rank(pp=c.pp, dp=c.dp, tp=c.tp) == r
        seen.add((c.pp, c.dp, c.tp))
    assert seen == set(itertools.product(range(2), range(3), range(2)))


def test_groups_partition_the_world() -> None:
    """tp, dp and pp groups each partition the ranks; world holds all."""
    lay = Layout(dp=2, tp=2, pp=2, global_batch_size=4)
    groups = Mesh(lay).groups()
    assert groups["world"] == tuple(range(8))
    for prefix, size in (("tp/", 2), ("dp/", 2), ("pp/", 2)):
        members = [g for name, g in groups.items() if name.startswith(prefix)]
        assert all(len(g) == size for g in members)
        assert sorted(r for g in members for r in g) == list(range(8))


def test_out_of_range_rank_is_an_error() -> None:
    """Asking for a rank outside the world names the world size."""
    with pytest.raises(LayoutError, match="outside the world of 2 ranks"):
        Mesh(Layout(dp=2)).coords(2)
