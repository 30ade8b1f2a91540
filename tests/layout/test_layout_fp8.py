"""``Layout.fp8_recipe``: Transformer Engine fp8 autocast is off by default, round-trips, takes only the three
recipes and needs 16-bit mixed precision (one-line errors naming the field, the value and the fix)."""

from __future__ import annotations

import pytest

from simgrid.errors import LayoutError
from simgrid.layout import Layout


def test_fp8_recipe_defaults_to_none_and_round_trips() -> None:
    assert Layout().fp8_recipe == "none"
    for recipe in ("delayed", "current"):
        layout = Layout(fp8_recipe=recipe)  # type: ignore[arg-type]
        assert Layout.from_dict(layout.to_dict()) == layout
    assert Layout(fp8_recipe="delayed", precision="fp16").precision == "fp16"


def test_unknown_fp8_recipe_names_the_choices() -> None:
    with pytest.raises(LayoutError, match=r"fp8_recipe = 'mxfp8' is not one of none, delayed, current"):
        Layout(fp8_recipe="mxfp8")  # type: ignore[arg-type]


def test_fp8_needs_sixteen_bit_precision() -> None:
    with pytest.raises(LayoutError) as err:
        Layout(fp8_recipe="current", precision="fp32")
    message = str(err.value)
    assert "fp8_recipe = 'current'" in message and "precision = 'fp32'" in message
    assert "use precision 'bf16' or fp8_recipe 'none'" in message and "\n" not in message
