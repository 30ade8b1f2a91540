"""The one-line deadlock report both engines (SimPy and the fast loop) raise, worded the same."""

from __future__ import annotations

from collections.abc import Sequence

SHOWN_RANKS = 3
"""Blocked ranks named in the report; the rest are counted."""


def blocked_at(waiting_on: str | None, *, started: bool, ptr: int, n: int) -> str:
    """Where one rank is stuck: the WAIT it blocks on (its op text), or its position in its op list."""
    if waiting_on is None:
        return f"op {ptr} of {n}"
    what = f"WAIT on {waiting_on}"
    if not started:
        what += " (never started: a peer did not issue the matching op)"
    return what


def deadlock_message(now: float, shown: Sequence[tuple[int, str]], stuck: int, pending: int) -> str:
    """``shown``: (rank, :func:`blocked_at`) of the first :data:`SHOWN_RANKS` stuck ranks; ``stuck``: how many
    ranks are stuck in all; ``pending``: communication ops issued but never matched."""
    parts = [f"rank {rank} blocked at {what}" for rank, what in shown]
    if stuck > len(shown):
        parts.append(f"and {stuck - len(shown)} more rank(s)")
    if not stuck:
        parts.append(f"{pending} communication op(s) were issued but never matched by their peers")
    return (f"simulation deadlocked at t = {now:.6g} s: " + "; ".join(parts)
            + "; run simgrid.ir.dry_run on the program for a step-by-rank grid of the cycle")
