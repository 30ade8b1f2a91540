"""The deadlock report of a dry run: why each stuck rank is stuck, and a step x rank grid.

Grid rows are issue steps (op indices), columns are ranks, cells are abbreviated ops
(:func:`simgrid.ir.text.short_op`). ``>>`` marks the op a rank is stuck at (a WAIT) and ``*`` the
unfinished communication op it waits for. Big programs show at most :data:`MAX_COLUMNS` ranks (the
stuck ones and their partners first) and only the rows around the marks, with ``...`` for gaps.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import Protocol

from simgrid.ir.ops import Collective, Recv, Send, stream_of
from simgrid.ir.program import Program
from simgrid.ir.text import format_op, short_op


class StuckRun(Protocol):
    """What the report reads of a dry run that stopped (:class:`simgrid.ir.dryrun._Run` provides it); a
    protocol, so the report depends on the dry run's state and not on the dry run module."""

    @property
    def program(self) -> Program:
        """The program being run."""

    @property
    def pc(self) -> Sequence[int]:
        """Per rank: index of the next op to issue."""

    @property
    def blocked_on(self) -> Sequence[int | None]:
        """Per rank: index of the op its WAIT is waiting for, if blocked."""

    @property
    def queues(self) -> Sequence[Mapping[str, deque[int]]]:
        """Per rank, per stream: issued ops not yet completed, in issue order."""

    @property
    def ends(self) -> Sequence[Sequence[float]]:
        """Per rank, per op: completion time, negative while not completed."""

    @property
    def coll_slot(self) -> Mapping[tuple[int, int], tuple[str, int]]:
        """(rank, op index) -> (group, sequence number) of each issued collective."""

    @property
    def coll_arrived(self) -> Mapping[tuple[str, int], list[tuple[int, int]]]:
        """(group, sequence number) -> (rank, op index) of the members that reached that collective."""


MAX_COLUMNS = 8
"""Ranks shown side by side in the grid."""
MAX_ROWS = 60
"""Grid rows shown (gaps between shown rows are elided)."""
MAX_REASONS = 16
"""Stuck ranks explained one by one."""
CONTEXT_BEFORE, CONTEXT_AFTER = 3, 1
"""Rows shown above and below each marked op."""
CELL_WIDTH = 22
"""Characters of an abbreviated op."""


def deadlock_report(run: StuckRun, stuck: list[int], pending: list[tuple[int, int]]) -> str:
    """The full error message for a dry run that cannot finish."""
    program = run.program
    waits_for: dict[int, int] = {}
    for rank in stuck:
        target = run.blocked_on[rank]
        if target is not None:
            waits_for[rank] = target
    if stuck:
        head = (
            f"dry run: deadlock: no rank can make progress; {len(stuck)} of {program.world_size} rank(s) are "
            f"stuck and {len(pending)} communication op(s) never complete."
        )
    else:
        head = (
            f"dry run: every rank issued all its ops but {len(pending)} communication op(s) never complete "
            "(a send, receive or collective without its partner)."
        )
    lines = [head]
    for explained, rank in enumerate(stuck):
        if explained == MAX_REASONS:
            lines.append(f"  ... and {len(stuck) - MAX_REASONS} more stuck rank(s)")
            break
        index = run.pc[rank]
        target = waits_for.get(rank)
        waited = program.ranks[rank][target] if target is not None else None
        lines.append(
            f"  rank {rank} is stuck at op {index} `{format_op(program.ranks[rank][index])}`, waiting for op "
            f"{target} `{format_op(waited) if waited is not None else '?'}`: {_why_pending(run, rank, target)}"
        )
    if not stuck:
        for rank, index in pending[:MAX_REASONS]:
            lines.append(
                f"  rank {rank} op {index} `{format_op(program.ranks[rank][index])}`: {_why_pending(run, rank, index)}"
            )
    lines.append("")
    lines.append(_grid(run, stuck, waits_for, pending))
    lines.append(
        "Hint: sends and receives rendezvous (gloo has no buffering), so each pair of ranks must meet its "
        "transfers in the same order, and every member of a group must reach the same collectives."
    )
    return "\n".join(lines)


def _why_pending(run: StuckRun, rank: int, index: int | None) -> str:
    program = run.program
    if index is None:
        return "unknown op"
    op = program.ranks[rank][index]
    stream = stream_of(op)
    queue = run.queues[rank][stream]
    if queue and queue[0] != index:
        head = queue[0]
        return (
            f"it is queued on stream {stream} behind op {head} `{format_op(program.ranks[rank][head])}`, "
            "which has not completed"
        )
    if isinstance(op, Collective):
        group, seq = run.coll_slot[(rank, index)]
        arrived = {r for r, _ in run.coll_arrived.get((group, seq), [])}
        missing = [r for r in dict.fromkeys(program.groups[group]) if r not in arrived]
        return f"collective #{seq} on group {group!r} still needs rank(s) {_ranks(missing)} to reach it"
    if isinstance(op, (Send, Recv)):
        peer = op.peer
        want = Recv if isinstance(op, Send) else Send
        for j in range(run.pc[peer]):
            cand = program.ranks[peer][j]
            if isinstance(cand, want) and cand.peer == rank and cand.key == op.key and run.ends[peer][j] < 0:
                peer_queue = run.queues[peer][stream_of(cand)]
                blocker = peer_queue[0] if peer_queue and peer_queue[0] != j else None
                if blocker is None:
                    return f"rank {peer} issued the matching {want.__name__.upper()} as op {j}"
                return (
                    f"rank {peer} issued the matching {want.__name__.upper()} as op {j}, but it is queued "
                    f"behind op {blocker} `{format_op(program.ranks[peer][blocker])}` on its stream {stream_of(cand)}"
                )
        state = f"it is stuck at op {run.pc[peer]}" if run.pc[peer] < len(program.ranks[peer]) else "it has finished"
        return f"rank {peer} has not issued the matching {want.__name__.upper()} ({state})"
    return "it never completed"


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks[:12])) + (f", ... ({len(ranks)} in all)" if len(ranks) > 12 else "")


def _grid(run: StuckRun, stuck: list[int], waits_for: dict[int, int], pending: list[tuple[int, int]]) -> str:
    program = run.program
    marks: dict[tuple[int, int], str] = {}
    if not stuck:
        for rank, index in pending:
            marks[(rank, index)] = " *"
    for rank, target in waits_for.items():
        marks[(rank, target)] = " *"
    for rank in stuck:
        marks[(rank, run.pc[rank])] = ">>"
    columns = _choose_columns(run, stuck, waits_for, pending)
    marked_rows = sorted({i for (r, i) in marks if r in columns})
    rows: set[int] = set()
    longest = max((len(program.ranks[r]) for r in columns), default=0)
    for m in marked_rows:
        rows.update(range(max(0, m - CONTEXT_BEFORE), min(longest, m + CONTEXT_AFTER + 1)))
    if not rows:
        rows = set(range(min(longest, MAX_ROWS)))
    shown = sorted(rows)[:MAX_ROWS]
    step_width = len(f"step {max(shown, default=0)}")
    cells: dict[tuple[int, int], str] = {}
    for r in columns:
        for i in shown:
            if i < len(program.ranks[r]):
                mark = marks.get((r, i), "  ")
                cells[(r, i)] = f"{mark} {short_op(program.ranks[r][i], CELL_WIDTH)}"
    widths = {r: max([len(f"rank {r}")] + [len(cells.get((r, i), "")) for i in shown]) for r in columns}
    title = "step x rank grid (>> = op the rank is stuck at, * = the unfinished op it waits for)"
    if len(columns) < program.world_size:
        title += f"; showing ranks {_ranks(columns)} of {program.world_size}"
    header = " " * step_width + "  " + "  ".join(f"{'rank ' + str(r):<{widths[r]}}" for r in columns)
    out = [title, header.rstrip()]
    previous = None
    if shown and shown[0] > 0:
        out.append(" " * step_width + "  ...")
    for i in shown:
        if previous is not None and i != previous + 1:
            out.append(" " * step_width + "  ...")
        row = "  ".join(f"{cells.get((r, i), ''):<{widths[r]}}" for r in columns)
        out.append(f"{'step ' + str(i):<{step_width}}  {row}".rstrip())
        previous = i
    if shown and shown[-1] < longest - 1:
        out.append(" " * step_width + "  ...")
    return "\n".join(out)


def _choose_columns(
    run: StuckRun, stuck: list[int], waits_for: dict[int, int], pending: list[tuple[int, int]]
) -> list[int]:
    world = run.program.world_size
    if world <= MAX_COLUMNS:
        return list(range(world))
    chosen: dict[int, None] = {}
    for rank in stuck:
        chosen[rank] = None
        target = waits_for.get(rank)
        op = run.program.ranks[rank][target] if target is not None else None
        if isinstance(op, (Send, Recv)):
            chosen[op.peer] = None
    for rank, _ in pending:
        chosen[rank] = None
    picked = sorted(list(chosen)[:MAX_COLUMNS])
    return picked or list(range(MAX_COLUMNS))
