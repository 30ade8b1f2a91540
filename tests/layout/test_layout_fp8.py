"""``Layout.fp8_recipe``: Transformer Engine fp8 autocast is off by default, round-trips, takes only the three
recipes and needs 16-bit mixed precision (one-line errors naming the field, the value and the fix)."""

from __future__ import annotations

import re

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


def test_fp8_params_default_off_and_round_trip() -> None:
    layout = Layout(dp=2, zero=1, zero_impl="apex", fp8_recipe="delayed", fp8_params=True)
    assert not Layout().fp8_params and Layout.from_dict(layout.to_dict()) == layout


@pytest.mark.parametrize(("fields", "message"), [
    ({"fp8_recipe": "none"}, "fp8_params = true needs fp8_recipe 'delayed' (NeMo's fp8 weights are Transformer "
                             "Engine DelayedScaling Float8Tensors) but fp8_recipe = 'none'"),
    ({"fp8_recipe": "current"}, "but fp8_recipe = 'current'; use --fp8 delayed or drop --fp8-params"),
    ({"zero_impl": "deepspeed"}, "fp8_params = true is modelled for NeMo's apex DistributedFusedAdam only but "
                                 "zero_impl = 'deepspeed'; use --zero 1 --zero-impl apex or drop --fp8-params"),
])
def test_fp8_params_need_delayed_fp8_and_apex(fields: dict[str, object], message: str) -> None:
    settings: dict[str, object] = {"dp": 2, "zero": 1, "zero_impl": "apex", "fp8_recipe": "delayed",
                                   "fp8_params": True, **fields}
    with pytest.raises(LayoutError, match=re.escape(message)) as raised:
        Layout(**settings)  # type: ignore[arg-type]
    assert str(raised.value).startswith("layout: fp8_params = true ") and "\n" not in str(raised.value)


def test_fp8_params_must_be_a_bool() -> None:
    with pytest.raises(LayoutError, match="fp8_params = 'yes' must be true or false"):
        Layout(fp8_params="yes")  # type: ignore[arg-type]
