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
``_PipelineScheduleRuntime``) also holds the transfers and one ``REDUCE_GRAD`` per stage after its last
backward: that is where torch's runtime divides the accumulated gradients by the micro-batch count, so a
``compute_comms`` file without it trains with gradients m times too large. torch's compound cell
``(0F1;1B0)OVERLAP_F_B`` (``ScheduleDualPipeV``: a forward and a backward issued as one unit, which the
runtime performs one after the other unless a custom function overlaps them) is an :class:`Action` with
``sub_actions``. Idle steps are kept by :func:`cells_from_csv`, so a torch dump re-exports byte for byte.

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
OVERLAP_F_B = "OVERLAP_F_B"
"""torch's compound action: a forward and a backward of different stages issued as one unit."""
ACTION_KINDS = COMPUTE_ACTION_KINDS + COMM_ACTION_KINDS + STAGE_ACTION_KINDS
"""Action types of a single cell (:data:`OVERLAP_F_B` is the one compound type)."""

# Same alternatives as torch's _action_regex, but matched against the whole cell.
_ACTION_RE = re.compile(r"(\d+)(F|I|B|W|UNSHARD|RESHARD|REDUCE_GRAD|SEND_F|RECV_F|SEND_B|RECV_B)(\d*)")
_COMPOUND_RE = re.compile(r"\(([^()]*)\)OVERLAP_F_B")


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
    sub_actions: tuple[Action, ...] = ()
    """``OVERLAP_F_B`` only: the compute actions issued together (stage and micro-batch are then -1)."""

    def __post_init__(self) -> None:
        if self.kind not in ACTION_KINDS and self.kind != OVERLAP_F_B:
            raise ProgramError(f"action kind {self.kind!r} is not one of {', '.join(ACTION_KINDS)}, {OVERLAP_F_B}")
        if self.kind == OVERLAP_F_B or self.sub_actions:
            self._check_compound()
            return
        if self.stage < 0:
            raise ProgramError(f"action stage = {self.stage} must be >= 0")
        needs_mb = self.kind not in STAGE_ACTION_KINDS
        if needs_mb and self.microbatch < 0:
            raise ProgramError(f"action {self.kind} needs a micro-batch >= 0, got {self.microbatch!r}")
        if not needs_mb and self.microbatch != -1:
            raise ProgramError(f"action {self.kind} takes no micro-batch, got {self.microbatch!r}")

    def _check_compound(self) -> None:
        if self.kind != OVERLAP_F_B or not self.sub_actions:
            raise ProgramError(f"only {OVERLAP_F_B} has sub-actions; got kind {self.kind!r} with "
                               f"{len(self.sub_actions)} sub-action(s)")
        if (self.stage, self.microbatch) != (-1, -1):
            raise ProgramError(f"{OVERLAP_F_B} names its stages in its sub-actions; stage and micro-batch must "
                               f"be -1, got {self.stage} and {self.microbatch}")
        bad = [str(a) for a in self.sub_actions if a.kind not in COMPUTE_ACTION_KINDS]
        if bad:
            raise ProgramError(f"{OVERLAP_F_B} groups compute actions (F, I, W, B) only, got {', '.join(bad)}")

    @property
    def leaves(self) -> tuple[Action, ...]:
        """The compute actions this action performs: its sub-actions, or itself."""
        return self.sub_actions or (self,)

    def __str__(self) -> str:
        if self.sub_actions:
            return f"({';'.join(str(a) for a in self.sub_actions)}){self.kind}"
        return f"{self.stage}{self.kind}{'' if self.microbatch == -1 else self.microbatch}"

    @classmethod
    def overlap(cls, *actions: Action) -> Action:
        """torch's ``OVERLAP_F_B`` unit of ``actions`` (performed in the order given)."""
        return cls(-1, OVERLAP_F_B, -1, tuple(actions))

    @classmethod
    def parse(cls, text: str, where: str = "") -> Action:
        """Parse ``1F0``, ``3SEND_B2``, ``0UNSHARD``, ``(0F1;1B0)OVERLAP_F_B`` ...; ``where`` prefixes errors."""
        compound = _COMPOUND_RE.fullmatch(text.strip())
        if compound:
            parts = [part for part in compound[1].split(";") if part.strip()]
            try:
                return cls.overlap(*(cls.parse(part) for part in parts))
            except ProgramError as exc:
                raise ProgramError(f"{where}bad pipeline action {text!r}: {exc}") from None
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
    """Per pipeline rank, compute actions plus pipeline transfers and gradient reduction (torch's
    ``compute_comms`` format).

    A SEND becomes ``{src_stage}SEND_{dir}{mb}`` and a RECV ``{dst_stage}RECV_{dir}{mb}``, as torch names
    the transfer by the stage that executes it; consecutive identical actions collapse. Each stage gets
    ``{stage}REDUCE_GRAD`` after its last backward (B or W) and that backward's own SEND_B, where torch's
    lowering (``_add_reduce_grad`` then ``_add_send_recv``) puts it: the runtime divides the stage's
    gradients by the micro-batch count there.
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
        out.append(with_reduce_grad(actions))
    return out


def with_reduce_grad(actions: Sequence[Action]) -> list[Action]:
    """``actions`` with ``{stage}REDUCE_GRAD`` after each stage's last backward (B or W, also inside an
    ``OVERLAP_F_B``) and the SEND_B that directly follows it; actions already holding one are returned as is."""
    if any(a.kind == "REDUCE_GRAD" for a in actions):
        return list(actions)
    last: dict[int, int] = {}
    for index, action in enumerate(actions):
        for leaf in action.leaves:
            if leaf.kind in ("B", "W"):
                last[leaf.stage] = index
    after: dict[int, list[int]] = {}
    for stage, index in last.items():
        leaf = next(a for a in actions[index].leaves if a.stage == stage and a.kind in ("B", "W"))
        while (index + 1 < len(actions) and actions[index + 1].kind == "SEND_B"
               and actions[index + 1].microbatch == leaf.microbatch and actions[index + 1].stage == stage):
            index += 1
        after.setdefault(index, []).append(stage)
    out: list[Action] = []
    for index, action in enumerate(actions):
        out.append(action)
        out += [Action(stage, "REDUCE_GRAD") for stage in sorted(after.get(index, []))]
    return out


def _write_rows(rows: Sequence[Sequence[str]]) -> str:
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer)  # default dialect, as torch's _dump_csv uses
    for row in rows:
        writer.writerow(row)
    return buffer.getvalue()


def actions_to_csv(actions: Sequence[Sequence[Action | None]]) -> str:
    """torch's schedule CSV for per-rank action lists (one row per pipeline rank; ``None`` is an idle step,
    an empty cell)."""
    return _write_rows([["" if a is None else str(a) for a in row] for row in actions])


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


def cells_from_csv(text: str, source: str = "<csv>") -> list[list[Action | None]]:
    """Parse torch's schedule CSV cell by cell: per rank (row), its actions with ``None`` for each idle
    step (empty cell), so that :func:`actions_to_csv` writes torch's own dump back byte for byte."""
    out: list[list[Action | None]] = []
    for rank, row in enumerate(_read_rows(text, source)):
        out.append([
            Action.parse(cell, f"{source}: rank {rank} (row {rank + 1}), column {column + 1}: ") if cell.strip()
            else None
            for column, cell in enumerate(row)
        ])
    return out


def actions_from_csv(text: str, source: str = "<csv>") -> list[list[Action]]:
    """Parse torch's schedule CSV: per rank (row), its actions; empty cells (idle steps) are skipped."""
    return [[a for a in row if a is not None] for row in cells_from_csv(text, source)]


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
