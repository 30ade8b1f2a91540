"""Interop with ``torch.distributed.pipelining`` schedules, and our own per-rank op CSV (no torch import).

torch's grammar (``_Action.__repr__`` / ``_Action.from_str`` in ``torch/distributed/pipelining/schedules.py``,
torch 2.13): ``{stage}{type}{microbatch}`` where ``type`` is ``F`` (forward), ``I`` (input-grad
backward), ``W`` (weight-grad backward), ``B`` (full backward), the pipeline transfers ``SEND_F``,
``RECV_F``, ``SEND_B``, ``RECV_B``, or the stage-level ``UNSHARD``, ``RESHARD``, ``REDUCE_GRAD`` (written
without a micro-batch): ``1F0``, ``0I3``, ``2W1``, ``1B2``, ``3SEND_F1``, ``1UNSHARD``. The stage is the
global stage index; a transfer is named by the stage that *executes* it (``SEND_F`` by the sending stage,
``RECV_F`` by the receiving stage). The CSV (``PipelineScheduleMulti._load_csv`` / ``_dump_csv``) has
one row per pipeline rank, one action per cell, written with :mod:`csv`'s default dialect; an empty cell
is an idle step. The ``compute_only`` format holds only F/I/W/B; ``compute_comms`` (loaded by
``_PipelineScheduleRuntime``) also holds the transfers. torch's ``OVERLAP_F_B`` cells (``(0F1;1B0)OVERLAP_F_B``)
are not supported here.

Our own op CSV (:func:`to_csv` / :func:`from_csv`) has the same shape, one rank per row, but each cell is
a full op in its text form (:mod:`simgrid.ir.text`), so a program's op lists round-trip exactly. A rank
with no ops is an empty row.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from simgrid.errors import ProgramError
from simgrid.ir.ops import Compute, Op, Recv, Send
from simgrid.ir.program import Program
from simgrid.ir.text import format_ranks, parse_op

COMPUTE_ACTION_KINDS = ("F", "I", "W", "B")
"""Action types of a compute-only schedule (the IR's compute kinds of the same letters)."""
COMM_ACTION_KINDS = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")
"""Pipeline transfer action types."""
STAGE_ACTION_KINDS = ("UNSHARD", "RESHARD", "REDUCE_GRAD")
"""Per-stage actions torch writes without a micro-batch."""
ACTION_KINDS = COMPUTE_ACTION_KINDS + COMM_ACTION_KINDS + STAGE_ACTION_KINDS

# Same alternatives as torch's _action_regex, but matched against the whole cell.
_ACTION_RE = re.compile(r"(\d+)(F|I|B|W|UNSHARD|RESHARD|REDUCE_GRAD|SEND_F|RECV_F|SEND_B|RECV_B)(\d*)")


@dataclass(frozen=True, order=True)
class Action:
    """One cell of a torch pipeline schedule: stage, action type and micro-batch."""

    stage: int
    """Global stage index (torch's ``stage_index``)."""
    kind: str
    """Action type, one of :data:`ACTION_KINDS`."""
    microbatch: int = -1
    """Micro-batch index; -1 (the IR's "per step" value) for stage-level actions (UNSHARD, RESHARD,
    REDUCE_GRAD), which torch writes without one."""

    def __post_init__(self) -> None:
        if self.kind not in ACTION_KINDS:
            raise ProgramError(f"action kind {self.kind!r} is not one of {', '.join(ACTION_KINDS)}")
        if self.stage < 0:
            raise ProgramError(f"action stage = {self.stage} must be >= 0")
        needs_mb = self.kind not in STAGE_ACTION_KINDS
        if needs_mb and self.microbatch < 0:
            raise ProgramError(f"action {self.kind} needs a micro-batch >= 0, got {self.microbatch!r}")
        if not needs_mb and self.microbatch != -1:
            raise ProgramError(f"action {self.kind} takes no micro-batch, got {self.microbatch!r}")

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{'' if self.microbatch == -1 else self.microbatch}"

    @classmethod
    def parse(cls, text: str, where: str = "") -> Action:
        """Parse ``1F0``, ``3SEND_B2``, ``0UNSHARD`` ...; ``where`` prefixes error messages."""
        m = _ACTION_RE.fullmatch(text.strip())
        if not m:
            raise ProgramError(
                f"{where}bad pipeline action {_shown(text)}; expected [stage][type][microbatch] such as 1F0, 0I3, "
                f"2W1, 1B2 or 3SEND_F1, with type one of {', '.join(ACTION_KINDS)}"
            )
        if len(m[1]) > 9 or len(m[3]) > 9:  # 10^9 stages or micro-batches: a corrupted file, not a schedule
            raise ProgramError(f"{where}bad pipeline action {_shown(text)}: stage and micro-batch must have at most "
                               "9 digits")
        try:
            return cls(int(m[1]), m[2], int(m[3]) if m[3] else -1)
        except ProgramError as exc:
            raise ProgramError(f"{where}bad pipeline action {_shown(text)}: {exc}") from None


def pipeline_ranks(program: Program) -> list[int]:
    """One global rank per pipeline rank: data-parallel replica 0, tensor-parallel rank 0 (all without a layout)."""
    mesh = program.mesh
    if mesh is None:
        return list(range(program.world_size))
    return [mesh.rank(pp=p, dp=0, tp=0) for p in range(mesh.layout.pp)]


def _collapse(actions: list[Action], action: Action) -> None:
    # Layer-granular programs split one action into several ops; they form one torch action.
    if not actions or actions[-1] != action:
        actions.append(action)


def compute_actions(program: Program) -> list[list[Action]]:
    """Per pipeline rank, its compute order as torch actions.

    Consecutive F/I/W/B ops of the same (stage, kind, micro-batch) collapse into one action; recompute
    (R) ops are not actions (they belong to the following backward) and neither is the optimizer step,
    so neither breaks a run of ops of one action.
    """
    out: list[list[Action]] = []
    for rank in pipeline_ranks(program):
        actions: list[Action] = []
        for op in program.ranks[rank]:
            if isinstance(op, Compute) and op.kind in COMPUTE_ACTION_KINDS:
                _collapse(actions, Action(op.stage, op.kind, op.microbatch))
        out.append(actions)
    return out


def comm_actions(program: Program) -> list[list[Action]]:
    """Per pipeline rank, compute actions plus pipeline transfers (torch's ``compute_comms`` format).

    A SEND becomes ``{src_stage}SEND_{dir}{mb}`` and a RECV ``{dst_stage}RECV_{dir}{mb}``, as torch names
    the transfer by the stage that executes it; consecutive identical actions collapse.
    """
    out: list[list[Action]] = []
    for rank in pipeline_ranks(program):
        actions: list[Action] = []
        for op in program.ranks[rank]:
            if isinstance(op, Compute) and op.kind in COMPUTE_ACTION_KINDS:
                _collapse(actions, Action(op.stage, op.kind, op.microbatch))
            elif isinstance(op, Send):
                _collapse(actions, Action(op.key.src_stage, f"SEND_{op.key.direction}", op.key.microbatch))
            elif isinstance(op, Recv):
                _collapse(actions, Action(op.key.dst_stage, f"RECV_{op.key.direction}", op.key.microbatch))
        out.append(actions)
    return out


def _write_rows(rows: Sequence[Sequence[str]]) -> str:
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer)  # default dialect, as torch's _dump_csv uses
    for row in rows:
        writer.writerow(row)
    return buffer.getvalue()


def actions_to_csv(actions: Sequence[Sequence[Action]]) -> str:
    """torch's schedule CSV for per-rank action lists (one row per pipeline rank)."""
    return _write_rows([[str(a) for a in row] for row in actions])


def to_torch_csv(program: Program, format: Literal["compute_only", "compute_comms"] = "compute_only") -> str:
    """The program's pipeline order as the CSV torch's ``_load_csv(path, format)`` reads."""
    if format == "compute_only":
        return actions_to_csv(compute_actions(program))
    if format == "compute_comms":
        return actions_to_csv(comm_actions(program))
    raise ProgramError(f"to_torch_csv: format = {format!r}; use 'compute_only' or 'compute_comms'")


def _read_rows(text: str, source: str) -> list[list[str]]:
    try:
        return list(csv.reader(io.StringIO(text, newline="")))
    except csv.Error as exc:  # e.g. a cell longer than csv's field limit (128 KiB), a NUL byte
        raise ProgramError(f"{source}: not a readable CSV ({exc})") from None


def _shown(text: str) -> str:
    shown = repr(text)
    return shown if len(shown) <= 80 else f"{shown[:50]}...{shown[-20:]} ({len(text):,} characters)"


def actions_from_csv(text: str, source: str = "<csv>") -> list[list[Action]]:
    """Parse torch's schedule CSV: per rank (row), its actions; empty cells (idle steps) are skipped."""
    out: list[list[Action]] = []
    for rank, row in enumerate(_read_rows(text, source)):
        actions: list[Action] = []
        for column, cell in enumerate(row):
            if cell.strip():
                actions.append(Action.parse(cell, f"{source}: rank {rank} (row {rank + 1}), column {column + 1}: "))
        out.append(actions)
    return out


def to_csv(program: Program) -> str:
    """Our op CSV: one row per rank (every rank), one op text per cell."""
    return _write_rows(format_ranks(program.ranks))


def from_csv(text: str, source: str = "<csv>") -> tuple[tuple[Op, ...], ...]:
    """Per-rank op lists from :func:`to_csv` output (pass them as ``Program(ranks=...)``)."""
    ranks: list[tuple[Op, ...]] = []
    memo: dict[str, Op] = {}
    for rank, row in enumerate(_read_rows(text, source)):
        ops: list[Op] = []
        for index, cell in enumerate(row):
            op = memo.get(cell)
            if op is None:
                where = f"{source}: rank {rank} (row {rank + 1}), op {index} (column {index + 1}): "
                op = memo[cell] = parse_op(cell, where)
            ops.append(op)
        ranks.append(tuple(ops))
    return tuple(ranks)
