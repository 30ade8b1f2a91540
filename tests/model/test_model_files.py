"""Model files and fields: wrong types and absurd sizes are refused with the field, the value and the rule."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from simgrid.errors import ModelError
from simgrid.model import get_model, model_from_params
from simgrid.model.spec import MAX_SIZES, ModelSpec, load_model_file

TINY = get_model("tiny-gpt").to_dict()


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("gated_mlp", "no", r"gated_mlp = 'no' must be true or false"),
        ("bias", 2, r"bias = 2 must be true or false"),
        ("tied_embeddings", None, r"tied_embeddings = None must be true or false"),
        ("norm", {}, r"norm = \{\}; use 'layernorm' or 'rmsnorm'"),
        ("name", 7, r"model name = 7 must be a string"),
        ("num_layers", 10**9, r"num_layers = 1000000000 is above the limit of 10,000"),
        ("seq_length", 10**400, r"seq_length = <an integer of about 401 digits> must|seq_length = <an integer of "
                                r"about 401 digits> is above"),
        ("hidden_size", 1.5, r"hidden_size = 1\.5 must be a positive integer"),
    ],
)
def test_wrongly_typed_or_absurd_fields_are_refused(field: str, value: Any, message: str) -> None:
    """The issue's accepted-as-valid examples ("no", 2, null for booleans) and sizes past the limits."""
    with pytest.raises(ModelError, match=message) as info:
        ModelSpec.from_dict({**TINY, field: value})
    assert len(str(info.value)) < 300


def test_every_preset_is_within_the_limits() -> None:
    """The limits sit far above real models: the largest preset uses a fraction of each."""
    from simgrid.model import list_models

    for model in list_models():
        for field, limit in MAX_SIZES.items():
            value = getattr(model, field)
            assert value is None or value <= limit // 8, (model.name, field)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (json.dumps({**TINY, "name": "caf\u00e9"}, ensure_ascii=False).encode("latin-1"), "not UTF-8 text"),
        (json.dumps(TINY).encode("utf-16"), r"not UTF-8 text \(it looks like UTF-16\)"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply to read"),
        (json.dumps(TINY).replace('"num_layers": 4', '"num_layers": ' + "7" * 5000).encode(),
         "an integer has more than 4,300 digits"),
        (b"[1, 2]", "expected a JSON object with ModelSpec fields, got list"),
        (json.dumps({**TINY, "layers": 3}).encode(), r"unknown field\(s\) \['layers'\]"),
    ],
)
def test_model_files_that_cannot_be_read(tmp_path: Path, body: bytes, message: str) -> None:
    """Encodings, nesting, huge integers, the wrong top level, unknown keys: one line naming the file."""
    path = tmp_path / "m.json"
    path.write_bytes(body)
    with pytest.raises(ModelError, match=rf"model file .*m\.json.*{message}") as info:
        load_model_file(path)
    assert "\n" not in str(info.value)


def test_model_path_that_is_a_directory_or_fifo(tmp_path: Path) -> None:
    """A directory named m.json and a FIFO (which must not block) are refused as not being files."""
    (tmp_path / "d.json").mkdir()
    with pytest.raises(ModelError, match=r"d\.json is a directory, not a file"):
        load_model_file(tmp_path / "d.json")
    os.mkfifo(tmp_path / "f.json")
    with pytest.raises(ModelError, match=r"f\.json is not a regular file"):
        load_model_file(tmp_path / "f.json")


def test_params_beyond_the_largest_shape_are_refused() -> None:
    """--params 1e30 is refused in microseconds with the largest count that can be sized."""
    with pytest.raises(ModelError, match=r"--params = 1e\+30 is above the largest model this can size "
                                         r"\(7\.9e\+13 parameters: 10,000 layers of width 25,600\)"):
        model_from_params(1e30)
    assert model_from_params(7e13).num_layers <= MAX_SIZES["num_layers"]
