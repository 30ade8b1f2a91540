"""Layers per pipeline stage, including uneven splits (Llama 3's first/last stage rule)."""

from __future__ import annotations

import pytest

from simgrid.errors import LayoutError
from simgrid.layout import Layout
from simgrid.model import get_model, stage_blocks, stage_layer_counts, stage_of_block
from simgrid.model.spec import ModelSpec


def _model(layers: int) -> ModelSpec:
    return ModelSpec(name="m", num_layers=layers, hidden_size=64, num_heads=4, vocab_size=128, seq_length=16)


def test_even_split_gives_equal_stages() -> None:
    """96 layers on 8 stages: 12 each."""
    assert stage_layer_counts(get_model("gpt3-175b"), Layout(pp=8, global_batch_size=8)) == (12,) * 8


def test_llama3_405b_on_16_stages_drops_a_layer_from_first_and_last() -> None:
    """126 layers on 16 stages: 7 on the first and last (they carry embedding and head), 8 elsewhere."""
    counts = stage_layer_counts(get_model("llama3-405b"), Layout(pp=16, global_batch_size=16))
    assert counts == (7,) + (8,) * 14 + (7,)


@pytest.mark.parametrize(("layers", "stages"), [(10, 4), (9, 2), (13, 6), (5, 5), (31, 8)])
def test_uneven_splits_cover_every_layer_once(layers: int, stages: int) -> None:
    """Stages tile the layers contiguously; sizes differ by at most one; the ends are never larger."""
    model = _model(layers)
    layout = Layout(pp=stages, global_batch_size=stages)
    counts = stage_layer_counts(model, layout)
    assert sum(counts) == layers and max(counts) - min(counts) <= 1
    deficit = max(counts) * stages - layers
    assert counts[0] == min(counts)
    if deficit >= 2:
        assert counts[-1] == min(counts)
    blocks = [b for s in range(stages) for b in stage_blocks(model, layout, s)]
    assert blocks == list(range(2 * layers + 2))
    for s in range(stages):
        for b in stage_blocks(model, layout, s):
            assert stage_of_block(model, layout, b) == s


def test_more_stages_than_layers_is_an_error() -> None:
    """Every stage needs a layer."""
    with pytest.raises(LayoutError, match="6 stages exceed the 4 layers"):
        stage_layer_counts(_model(4), Layout(pp=6, global_batch_size=6))
