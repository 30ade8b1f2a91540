"""Requests and where they come from: a Poisson process or a trace file.

A request is (arrival time, prompt length, output length); the output length is known to the simulator
(as in Vidur and in trace replays) but never to the scheduler. Poisson arrivals are the open-loop load
model of serving benchmarks (vLLM's ``benchmark_serving.py --request-rate``, Vidur's ``poisson`` request
generator): inter-arrival times are exponential with mean ``1 / rate``. ``rate = inf`` sends every request
at time 0 (the "infinite rate" offline throughput scenario of TensorRT-LLM's and vLLM's benchmarks).

Trace files are CSV with a header naming at least ``arrival_s``, ``prompt_tokens`` and ``output_tokens``
(other columns are ignored), one request per row; rows may come in any order.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from simgrid.serving.spec import ServingError

TRACE_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens")
"""Columns a trace file must have."""

Lengths = int | tuple[int, int]
"""A fixed token count, or an inclusive ``(low, high)`` range drawn uniformly per request."""


@dataclass(frozen=True, kw_only=True)
class Request:
    """One inference request."""

    id: int
    """Index in arrival order (0, 1, ...)."""
    arrival_s: float
    """When the request reaches the router, seconds from the start."""
    prompt_tokens: int
    """Tokens of the prompt (prefilled before the first output token)."""
    output_tokens: int
    """Tokens generated, the first one by the prefill iteration (>= 1)."""

    @property
    def total_tokens(self) -> int:
        """Context length when the request ends: prompt plus output."""
        return self.prompt_tokens + self.output_tokens


def _draw(rng: np.random.Generator, lengths: Lengths, count: int, name: str) -> list[int]:
    if isinstance(lengths, tuple):
        low, high = lengths
        _check_length(name, low)
        _check_length(name, high)
        if high < low:
            raise ServingError(f"{name} range {low}-{high} is empty; write LOW-HIGH with LOW <= HIGH")
        return [int(x) for x in rng.integers(low, high + 1, size=count)]
    _check_length(name, lengths)
    return [int(lengths)] * count


def _check_length(name: str, value: object) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ServingError(f"{name} = {value!r} must be a positive number of tokens")


def poisson_requests(rate_per_s: float, count: int, *, prompt_tokens: Lengths, output_tokens: Lengths,
                     seed: int = 0) -> list[Request]:
    """``count`` requests with exponential inter-arrival times of mean ``1 / rate_per_s`` (all at 0 for inf)."""
    if isinstance(rate_per_s, bool) or not isinstance(rate_per_s, (int, float)) or math.isnan(rate_per_s) \
            or rate_per_s <= 0:
        raise ServingError(f"rate = {rate_per_s!r} requests/s must be > 0 (or inf: every request at time 0)")
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ServingError(f"requests = {count!r} must be a positive number of requests")
    rng = np.random.default_rng(seed)
    if math.isinf(rate_per_s):
        arrivals = [0.0] * count
    else:
        arrivals = [float(t) for t in np.cumsum(rng.exponential(1.0 / rate_per_s, size=count))]
    prompts = _draw(rng, prompt_tokens, count, "prompt tokens")
    outputs = _draw(rng, output_tokens, count, "output tokens")
    return [Request(id=i, arrival_s=a, prompt_tokens=p, output_tokens=o)
            for i, (a, p, o) in enumerate(zip(arrivals, prompts, outputs, strict=True))]


def with_poisson_arrivals(requests: Sequence[Request], rate_per_s: float, *, seed: int = 0) -> list[Request]:
    """The lengths of ``requests`` (in order) with fresh Poisson arrivals at ``rate_per_s`` (Vidur replays a
    trace's lengths this way)."""
    if not requests:
        raise ServingError("workload: no requests to serve; give at least one")
    times = poisson_requests(rate_per_s, len(requests), prompt_tokens=1, output_tokens=1, seed=seed)
    return [Request(id=i, arrival_s=t.arrival_s, prompt_tokens=r.prompt_tokens, output_tokens=r.output_tokens)
            for i, (t, r) in enumerate(zip(times, requests, strict=True))]


def read_trace(path: str | Path) -> list[Request]:
    """Requests of a CSV trace (module docstring), sorted by arrival and numbered in that order."""
    from simgrid.io.inputs import read_input_text

    file = Path(path)
    text = read_input_text(file, what="trace", error=ServingError)  # a regular UTF-8 file (never a FIFO)
    try:
        rows = list(csv.DictReader(io.StringIO(text, newline="")))
        header = rows[0].keys() if rows else None
    except csv.Error as exc:
        raise ServingError(f"trace {file}: cannot be read as CSV ({exc})") from None
    from simgrid.limits import check_request_count

    check_request_count(len(rows), what=f"trace {file}")
    if header is None:
        raise ServingError(f"trace {file}: no requests; write a header {','.join(TRACE_COLUMNS)} and one row per request")
    missing = [c for c in TRACE_COLUMNS if c not in header]
    if missing:
        raise ServingError(f"trace {file}: missing column(s) {', '.join(missing)}; the header must name "
                           f"{', '.join(TRACE_COLUMNS)}")
    parsed = []
    for line, row in enumerate(rows, start=2):
        try:
            arrival = float(row["arrival_s"])
            prompt, output = int(row["prompt_tokens"]), int(row["output_tokens"])
        except (TypeError, ValueError):
            raise ServingError(f"trace {file}, line {line}: arrival_s = {row['arrival_s']!r}, prompt_tokens = "
                               f"{row['prompt_tokens']!r}, output_tokens = {row['output_tokens']!r}; expected a "
                               "number of seconds and two integers") from None
        if not math.isfinite(arrival) or arrival < 0:
            raise ServingError(f"trace {file}, line {line}: arrival_s = {arrival!r} must be a finite time >= 0")
        if prompt < 1 or output < 1:
            raise ServingError(f"trace {file}, line {line}: prompt_tokens = {prompt} and output_tokens = {output} "
                               "must both be >= 1")
        parsed.append((arrival, prompt, output))
    parsed.sort(key=lambda r: r[0])
    return [Request(id=i, arrival_s=a, prompt_tokens=p, output_tokens=o) for i, (a, p, o) in enumerate(parsed)]


def write_trace(requests: Iterable[Request], path: str | Path) -> Path:
    """Write ``requests`` as a CSV trace that :func:`read_trace` reads back."""
    out = Path(path)
    with out.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(TRACE_COLUMNS)
        for r in requests:
            writer.writerow((repr(r.arrival_s), r.prompt_tokens, r.output_tokens))
    return out


def check_requests(requests: Sequence[Request], *, max_context: int, source: str = "workload") -> None:
    """Refuse an empty workload and any request whose prompt plus output exceeds the model's context."""
    if not requests:
        raise ServingError(f"{source}: no requests to serve; give at least one")
    for r in requests:
        if r.total_tokens > max_context:
            raise ServingError(
                f"{source}: request {r.id} needs {r.prompt_tokens} prompt + {r.output_tokens} output = "
                f"{r.total_tokens} tokens, longer than the model's context of {max_context}; shorten it or "
                "raise the context (--seq)"
            )
