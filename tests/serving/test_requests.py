"""Requests: Poisson arrivals, length ranges, CSV traces, and refusals of unusable workloads."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest

from simgrid.serving import Request, ServingError, poisson_requests, read_trace, with_poisson_arrivals, write_trace
from simgrid.serving.requests import check_requests


def test_poisson_arrivals_have_the_requested_mean_gap() -> None:
    """20,000 exponential gaps at 5/s average 0.2 s (within 3%), arrive in order and are numbered."""
    reqs = poisson_requests(5.0, 20_000, prompt_tokens=100, output_tokens=10, seed=3)
    gaps = [b.arrival_s - a.arrival_s for a, b in itertools.pairwise(reqs)]
    assert all(g >= 0 for g in gaps)
    assert sum(gaps) / len(gaps) == pytest.approx(0.2, rel=0.03)
    assert [r.id for r in reqs[:3]] == [0, 1, 2]
    assert {(r.prompt_tokens, r.output_tokens) for r in reqs} == {(100, 10)}


def test_infinite_rate_sends_everything_at_time_zero() -> None:
    """rate = inf is the offline scenario: every request at t = 0."""
    assert {r.arrival_s for r in poisson_requests(math.inf, 5, prompt_tokens=1, output_tokens=1)} == {0.0}


def test_length_ranges_are_inclusive_and_reproducible() -> None:
    """LOW-HIGH draws stay in range, hit both ends over many draws, and repeat with the same seed."""
    a = poisson_requests(1.0, 2000, prompt_tokens=(10, 12), output_tokens=(1, 3), seed=7)
    b = poisson_requests(1.0, 2000, prompt_tokens=(10, 12), output_tokens=(1, 3), seed=7)
    assert a == b
    assert {r.prompt_tokens for r in a} == {10, 11, 12}
    assert {r.output_tokens for r in a} == {1, 2, 3}


@pytest.mark.parametrize("rate", [-1.0, 0.0, float("nan")])
def test_non_positive_rates_are_refused(rate: float) -> None:
    """A rate must be > 0 requests/s."""
    with pytest.raises(ServingError, match="must be > 0"):
        poisson_requests(rate, 3, prompt_tokens=1, output_tokens=1)


def test_empty_range_and_zero_count_are_refused() -> None:
    """A range with LOW > HIGH and a request count of 0 are errors naming the value."""
    with pytest.raises(ServingError, match="range 9-3 is empty"):
        poisson_requests(1.0, 3, prompt_tokens=(9, 3), output_tokens=1)
    with pytest.raises(ServingError, match="requests = 0 must be a positive"):
        poisson_requests(1.0, 0, prompt_tokens=1, output_tokens=1)


def test_trace_round_trip_sorts_by_arrival(tmp_path: Path) -> None:
    """A trace written and read back keeps every request; rows out of order are sorted and renumbered."""
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens,user\n2.5,10,3,a\n0.5,20,4,b\n")
    reqs = read_trace(path)
    assert reqs == [Request(id=0, arrival_s=0.5, prompt_tokens=20, output_tokens=4),
                    Request(id=1, arrival_s=2.5, prompt_tokens=10, output_tokens=3)]
    assert read_trace(write_trace(reqs, tmp_path / "u.csv")) == reqs


def test_poisson_replay_keeps_the_lengths() -> None:
    """Replaying a trace at a rate keeps each request's lengths in order and draws new arrival times."""
    trace = [Request(id=0, arrival_s=9.0, prompt_tokens=5, output_tokens=2),
             Request(id=1, arrival_s=9.5, prompt_tokens=7, output_tokens=3)]
    replay = with_poisson_arrivals(trace, 1.0, seed=1)
    assert [(r.prompt_tokens, r.output_tokens) for r in replay] == [(5, 2), (7, 3)]
    assert replay[0].arrival_s != 9.0


@pytest.mark.parametrize(("text", "message"), [
    ("", "no requests"),
    ("arrival_s,prompt_tokens,output_tokens\n", "no requests"),
    ("arrival_s,prompt_tokens\n0,1\n", "missing column\\(s\\) output_tokens"),
    ("arrival_s,prompt_tokens,output_tokens\n0,ten,1\n", "line 2: .*expected a number"),
    ("arrival_s,prompt_tokens,output_tokens\n-1,10,1\n", "line 2: arrival_s = -1.0 must be a finite time >= 0"),
    ("arrival_s,prompt_tokens,output_tokens\n0,10,0\n", "line 2: .*must both be >= 1"),
])
def test_bad_traces_are_refused_with_the_line(tmp_path: Path, text: str, message: str) -> None:
    """Empty traces, missing columns and bad values are one-line errors naming the file and line."""
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(ServingError, match=message):
        read_trace(path)


def test_missing_trace_file() -> None:
    """A trace path that does not exist is named."""
    with pytest.raises(ServingError, match="does not exist"):
        read_trace("/no/such/trace.csv")


def test_prompt_longer_than_the_context_is_refused() -> None:
    """A request needing more tokens than the model's context is an error naming it and the sizes."""
    reqs = [Request(id=0, arrival_s=0, prompt_tokens=4000, output_tokens=200)]
    with pytest.raises(ServingError, match="request 0 needs 4000 prompt \\+ 200 output = 4200 tokens, longer than "
                                           "the model's context of 4096"):
        check_requests(reqs, max_context=4096)
    with pytest.raises(ServingError, match="no requests to serve"):
        check_requests([], max_context=4096)
