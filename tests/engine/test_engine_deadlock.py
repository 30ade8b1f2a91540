"""The deadlock report both engines share: which ranks it names, how it counts the rest, and the
report when no rank is stuck but issued communication was never matched."""

from __future__ import annotations

from simgrid.engine.deadlock import blocked_at, deadlock_message


def test_blocked_rank_is_described_by_its_wait_or_its_position() -> None:
    assert blocked_at("RECV peer=0", started=True, ptr=3, n=9) == "WAIT on RECV peer=0"
    assert blocked_at("RECV peer=0", started=False, ptr=3, n=9) == (
        "WAIT on RECV peer=0 (never started: a peer did not issue the matching op)")
    assert blocked_at(None, started=True, ptr=3, n=9) == "op 3 of 9"


def test_report_names_the_shown_ranks_and_counts_the_others() -> None:
    msg = deadlock_message(1.5, [(0, "op 1 of 2"), (1, "op 2 of 2")], stuck=5, pending=0)
    assert msg.startswith("simulation deadlocked at t = 1.5 s: rank 0 blocked at op 1 of 2; "
                          "rank 1 blocked at op 2 of 2; and 3 more rank(s); run simgrid.ir.dry_run")


def test_report_without_stuck_ranks_counts_unmatched_communication() -> None:
    msg = deadlock_message(0.0, [], stuck=0, pending=2)
    assert "2 communication op(s) were issued but never matched by their peers" in msg
