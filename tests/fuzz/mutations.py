"""Helpers of the CLI fuzz test: real inputs, field-by-field mutation, TOML writing, and a bounded CLI call."""

from __future__ import annotations

import contextlib
import copy
import io
import signal
import tomllib
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import strategies as st
from script_modules import load_benchmark

REPO = Path(__file__).resolve().parents[2]
PROFILES = REPO / "hardware_profiles"
DELETE = object()
"""Mutation value meaning: remove the field."""


_CORPUS = load_benchmark("fuzz_corpus", "fuzz_corpus_for_fuzz_tests")
Raw = _CORPUS.Raw
"""A TOML literal written verbatim (``nan``, a 5,000-digit integer, deep brackets): the corpus's class, which
its writer recognises."""


def to_toml(data: dict[str, Any], prefix: str = "") -> str:
    """TOML text (benchmarks/fuzz_corpus.py's writer); a value TOML has no type for, such as the ``None``
    hypothesis draws, is written as its quoted ``str()`` instead of refused."""
    text: str = _CORPUS.to_toml(data, prefix, unknown="quote")
    return text


def leaves(data: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Paths of every scalar (and list) field of nested dicts, ``sources`` tables excluded."""
    found: list[tuple[Any, ...]] = []
    for key, value in data.items():
        if key == "sources":
            continue
        if isinstance(value, dict):
            found += leaves(value, (*path, key))
        else:
            found.append((*path, key))
    return found


def replaced(data: Any, path: tuple[Any, ...], value: Any) -> Any:
    """A deep copy of ``data`` with the field at ``path`` set to ``value`` (or removed for DELETE)."""
    out = copy.deepcopy(data)
    node = out
    for key in path[:-1]:
        node = node[key]
    if value is DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return out


#: Values a careless edit puts into a field: wrong types, extremes, NaN and infinities, huge integers.
values = st.one_of(
    st.integers(min_value=-(10**20), max_value=10**20),
    st.sampled_from([0, -1, 10**40, 2**63, 10**300]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([5e-324, 1e308, -0.0]),
    st.text(max_size=12),
    st.booleans(),
    st.none(),
    st.lists(st.integers(min_value=-5, max_value=5), max_size=3),
    st.just({}),
    st.just(DELETE),
)
toml_extras = st.sampled_from([Raw("nan"), Raw("inf"), Raw("1" * 5000), Raw("[" * 3000 + "]" * 3000),
                               Raw("{ a = { b = 1 } }")])


def real_profiles() -> dict[str, dict[str, Any]]:
    """A GPU, a node and a cluster profile as shipped."""
    return {
        "gpu": tomllib.loads((PROFILES / "gpus" / "a100-80gb-sxm.toml").read_text()),
        "node": tomllib.loads((PROFILES / "nodes" / "dgx-a100.toml").read_text()),
        "cluster": tomllib.loads((PROFILES / "clusters" / "dgx-a100-hdr.toml").read_text()),
    }


@dataclass
class Outcome:
    """What one CLI call did."""

    code: int
    stdout: str
    stderr: str


class Hang(Exception):
    """The call ran past its time limit."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Interrupt the block with :class:`Hang` after ``seconds`` (SIGALRM: main thread, POSIX)."""
    def fire(signum: int, frame: Any) -> None:
        raise Hang(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_cli(argv: list[str], seconds: float = 10.0) -> Outcome:
    """``simgrid argv`` in this process; a traceback (any exception escaping ``main``) fails the caller."""
    from simgrid.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            with time_limit(seconds):
                code = main(argv)
        except SystemExit as exc:  # argparse errors: exit 2 with usage
            code = int(exc.code or 0)
        except Hang:
            raise
        except BaseException as exc:  # what a user would see as a traceback
            raise AssertionError(f"simgrid {' '.join(argv)[:200]} raised:\n{traceback.format_exc()}") from exc
    return Outcome(code, out.getvalue(), err.getvalue())


def error_lines(stderr: str) -> list[str]:
    """stderr without progress and warning lines (``simulating ...``, ``simgrid: warning: ...``)."""
    return [line for line in stderr.splitlines() if line.strip()
            and not line.startswith(("simulating ", "simulated ", "wrote ", "simgrid: warning:"))]
