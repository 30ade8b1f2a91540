"""The one TOML writer with raw literals (benchmarks/fuzz_corpus.py) serves the corpus and the hypothesis fuzz
test (tests/fuzz/mutations.py); only what it does with a value TOML has no type for differs."""

from __future__ import annotations

import math
import tomllib

import pytest
from script_modules import load_benchmark

from tests.fuzz import mutations

CORPUS = load_benchmark("fuzz_corpus", "fuzz_corpus_toml_test")


def test_the_corpus_refuses_a_value_toml_cannot_hold_and_the_fuzz_test_quotes_it() -> None:
    """``None`` is a bug in a corpus case (TypeError), but a draw of the fuzz strategies (written as "None")."""
    with pytest.raises(TypeError):
        CORPUS.to_toml({"a": None})
    assert CORPUS.to_toml({"a": None, "t": {"b": [None]}}, unknown="quote") == '"a" = "None"\n\n["t"]\n"b" = ["None"]\n'
    assert mutations.to_toml({"a": None}) == '"a" = "None"\n'


def test_the_fuzz_writer_is_the_corpus_writer() -> None:
    """Raw literals pass verbatim, sub-tables and arrays of tables (which only the corpus copy wrote as
    ``[[...]]`` before) come out as TOML that loads back to the data."""
    data = {"name": "x", "gpu": {"peak": 1.5, "rows": [{"n": 1}, {"n": 2}]}, "bad": mutations.Raw("nan")}
    text = mutations.to_toml(data)
    assert '[["gpu"."rows"]]' in text and text == CORPUS.to_toml({**data, "bad": CORPUS.Raw("nan")})
    loaded = tomllib.loads(text)
    assert math.isnan(loaded.pop("bad")) and loaded == {"name": "x", "gpu": {"peak": 1.5, "rows": [{"n": 1}, {"n": 2}]}}
