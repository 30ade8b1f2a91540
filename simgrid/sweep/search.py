"""Branch and bound over layouts: simulate in order of a lower bound, stop when no layout can still make
the best K.

Every layout gets an admissible lower bound on its step time (:meth:`~simgrid.sweep.bounds.BoundModel.quick`,
a few microseconds to a millisecond). Layouts are then taken in increasing bound order, in batches: a
worker checks memory, computes the tighter bound (:meth:`~simgrid.sweep.bounds.BoundModel.dag`) and
simulates the layout unless that bound already exceeds the K-th best step time known when the batch was
sent. Once the next layout's bound exceeds the K-th best step time, so does every later one's: the search
stops. The best K are therefore exactly those of simulating every layout, and the same whatever the
backend or the number of workers (each batch depends only on the results of the batches before it).

Recompute variants: of layouts equal but for recompute, one with more recompute is skipped once one with
less is known to fit (recompute only adds work; :func:`simgrid.sweep.runner.cheapest_recompute`). Its
bound is never below its cheaper sibling's, and ties are broken towards less recompute, so the sibling is
always decided first, or in the same batch, in which case the costlier one waits for the next.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from simgrid.layout import Layout
from simgrid.sweep.evaluate import Outcome, Task

RECOMPUTE_COST = {"none": 0, "selective": 1, "selective-op": 1, "full": 2}


@dataclass
class SearchOutcome:
    """What the search did with every layout it was given."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    """Simulated layouts' result rows (unordered)."""
    failures: list[tuple[Layout, str]] = field(default_factory=list)
    """Layouts whose estimate or simulation raised, with the message."""
    memory_reasons: Counter[str] = field(default_factory=Counter)
    """Layouts that do not fit, by dominant memory category."""
    dominated: int = 0
    """Layouts skipped because the same layout with less recompute fits."""
    bounded: int = 0
    """Layouts skipped because their lower bound exceeds the K-th best step time."""
    batches: int = 0
    """Batches sent to the backend."""


def _work(layout: Layout) -> int:
    """A proxy for the size of a layout's program on one pipeline rank."""
    return layout.pp * layout.vpp * layout.num_microbatches


class _Top:
    """The K smallest step times of fitting simulated layouts (K = 0: keep none, threshold infinite)."""

    def __init__(self, k: int | None) -> None:
        self.k = k
        self.times: list[float] = []

    def add(self, row: dict[str, Any]) -> None:
        if self.k and row.get("fits", True):
            self.times.append(float(row["step_time_s"]))
            self.times.sort()
            del self.times[self.k:]

    @property
    def threshold(self) -> float:
        """A layout whose bound exceeds this cannot enter the best K."""
        if not self.k or len(self.times) < self.k:
            return float("inf")
        return self.times[-1]


def branch_and_bound(layouts: Sequence[Layout], bounds: Sequence[float] | None, evaluate: Callable[[list[Task]], list[Outcome]],
                     *, keep: int | None, batch_size: int, prune_recompute: bool = True,
                     on_progress: Callable[[int, int], None] | None = None) -> SearchOutcome:
    """Decide every layout (see the module docstring); ``bounds`` None simulates everything that fits.

    ``keep``: K, the number of best layouts that must be exact (None or 0: no bound pruning).
    ``on_progress(decided, failed)`` is called after each batch with the counts so far.
    """
    out = SearchOutcome()
    use_bounds = bounds is not None and bool(keep)
    bound_of = list(bounds) if bounds is not None else [0.0] * len(layouts)
    queue = deque(sorted(range(len(layouts)),
                         key=lambda i: (bound_of[i], RECOMPUTE_COST.get(layouts[i].recompute, 3), i)))
    top = _Top(keep if use_bounds else None)
    fits: set[Layout] = set()  # layouts (recompute set to none) known to fit with some recompute policy
    decided = 0

    def sibling(layout: Layout) -> Layout | None:
        return dataclasses.replace(layout, recompute="none") if prune_recompute else None

    while queue:
        threshold = top.threshold
        batch: list[int] = []
        deferred: list[int] = []  # a cheaper recompute sibling is in this batch: decide after it
        in_batch: set[Layout] = set()
        stop = False
        while queue and len(batch) < batch_size:
            index = queue.popleft()
            if use_bounds and bound_of[index] > threshold:
                queue.appendleft(index)
                stop = True
                break
            key = sibling(layouts[index])
            if key is not None and key in fits:
                out.dominated += 1
                decided += 1
            elif key is not None and key in in_batch:
                deferred.append(index)
            else:
                if key is not None:
                    in_batch.add(key)
                batch.append(index)
        queue.extendleft(reversed(deferred))  # they come before the rest in bound order
        if stop and not batch:
            out.bounded += len(queue)
            decided += len(queue)
            queue.clear()
        if batch:
            sent = threshold if use_bounds and threshold != float("inf") else None
            # Send the biggest programs first (actions on a rank: pp * vpp * micro-batches), so a long
            # simulation does not start last while the other workers sit idle at the batch's end; the
            # outcomes come back in batch order whatever the sending order.
            first = sorted(range(len(batch)), key=lambda j: -_work(layouts[batch[j]]))
            sent_outcomes = evaluate([Task(layouts[batch[j]], sent) for j in first])
            outcomes: list[Outcome] = [None] * len(batch)  # type: ignore[list-item]
            for j, outcome in zip(first, sent_outcomes, strict=True):
                outcomes[j] = outcome
            out.batches += 1
            for index, outcome in zip(batch, outcomes, strict=True):
                layout = layouts[index]
                decided += 1
                key = sibling(layout)
                if outcome.kind == "row" and outcome.row is not None:
                    out.rows.append(outcome.row)
                    top.add(outcome.row)
                    if key is not None:
                        fits.add(key)
                elif outcome.kind == "memory":
                    out.memory_reasons[outcome.detail] += 1
                elif outcome.kind == "bound":
                    out.bounded += 1
                    if key is not None:
                        fits.add(key)  # the memory check came first: it fits
                else:
                    out.failures.append((layout, outcome.detail or "unknown error"))
        if on_progress is not None:
            on_progress(decided, len(out.failures))
    return out
