"""torch.distributed.pipelining interop: action grammar, compute-only/compute-comms CSV, our op CSV."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from ir_programs import c, gpipe_two_stages, hybrid_tp_pp, one_f_one_b_two_stages, program

from simgrid.errors import ProgramError
from simgrid.ir import (
    Action,
    actions_from_csv,
    actions_to_csv,
    cells_from_csv,
    comm_actions,
    compute_actions,
    from_csv,
    pipeline_ranks,
    to_csv,
    to_torch_csv,
    with_reduce_grad,
)
from simgrid.ir.torch_csv import ACTION_KINDS, STAGE_ACTION_KINDS


def test_action_text_follows_torch_grammar() -> None:
    """Actions print as {stage}{type}{microbatch}, stage-level actions without a micro-batch."""
    assert [str(a) for a in (Action(1, "F", 0), Action(0, "I", 3), Action(2, "W", 1), Action(1, "B", 2))] == [
        "1F0", "0I3", "2W1", "1B2",
    ]  # fmt: skip
    assert str(Action(3, "SEND_F", 1)) == "3SEND_F1"
    assert str(Action(0, "RECV_B", 12)) == "0RECV_B12"
    assert str(Action(1, "UNSHARD")) == "1UNSHARD"
    assert Action.parse(" 12RECV_B3 ") == Action(12, "RECV_B", 3)
    assert Action.parse("0REDUCE_GRAD") == Action(0, "REDUCE_GRAD", -1) == Action(0, "REDUCE_GRAD")


@given(
    st.sampled_from(ACTION_KINDS).flatmap(
        lambda kind: st.builds(
            Action,
            st.integers(0, 10**6),
            st.just(kind),
            st.just(-1) if kind in STAGE_ACTION_KINDS else st.integers(0, 10**6),
        )
    )
)
def test_action_parse_inverts_str(action: Action) -> None:
    """Action.parse(str(a)) == a for every action type."""
    assert Action.parse(str(action)) == action


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("F0", r"bad pipeline action 'F0'; expected \[stage\]\[type\]\[microbatch\]"),
        ("1X0", r"bad pipeline action '1X0'"),
        ("1F", r"action F needs a micro-batch"),
        ("1UNSHARD2", r"action UNSHARD takes no micro-batch"),
        ("1F0junk", r"bad pipeline action '1F0junk'"),
    ],
)
def test_bad_actions_are_rejected_with_the_grammar(text: str, match: str) -> None:
    """Malformed cells raise ProgramError showing the expected grammar (stricter than torch's prefix match)."""
    with pytest.raises(ProgramError, match=match):
        Action.parse(text)


def test_compute_actions_of_hand_built_1f1b() -> None:
    """The compute-only order is read off the program: sends, receives and waits are not actions."""
    assert [[str(a) for a in row] for row in compute_actions(one_f_one_b_two_stages())] == [
        ["0F0", "0F1", "0B0", "0F2", "0B1", "0B2"],
        ["1F0", "1B0", "1F1", "1B1", "1F2", "1B2"],
    ]


def test_layer_ops_collapse_and_recompute_and_optimizer_are_not_actions() -> None:
    """Consecutive ops of one (stage, kind, mb) form one action even across comm ops; R and OPT vanish."""
    f = "F stage=0 mb=0 chunk=0 blocks={} flops=1.0 hbm=0.0"
    r = "R stage=0 mb=0 chunk=0 blocks={} flops=1.0 hbm=0.0"
    b = "B stage=0 mb=0 chunk=0 blocks={} flops=1.0 hbm=0.0"
    ops = [
        f.format("0:1"), "BARRIER group=world bytes=0 purpose=sync handle=x", "WAIT handle=x", f.format("1:2"),
        r.format("1:2"), b.format("1:2"), r.format("0:1"), b.format("0:1"),
        "OPT stage=-1 mb=-1 chunk=0 blocks=0:2 flops=1.0 hbm=0.0",
    ]  # fmt: skip
    p = program([ops], {"world": (0,)})
    assert compute_actions(p) == [[Action(0, "F", 0), Action(0, "B", 0)]]


def test_pipeline_ranks_are_replica_0_tensor_rank_0() -> None:
    """With a layout, one rank per pipeline rank is exported: dp 0, tp 0 (ranks 0 and 2 for tp = 2)."""
    p = hybrid_tp_pp()
    assert pipeline_ranks(p) == [0, 2]
    assert [[str(a) for a in row] for row in comm_actions(p)] == [
        ["0F0", "0SEND_F0", "0RECV_B0", "0B0", "0REDUCE_GRAD"],
        ["1RECV_F0", "1F0", "1B0", "1SEND_B0", "1REDUCE_GRAD"],
    ]


def test_torch_csv_text_shape() -> None:
    """One row per pipeline rank, csv default dialect (CRLF), as torch's _dump_csv writes."""
    assert to_torch_csv(gpipe_two_stages()) == "0F0,0F1,0B0,0B1\r\n1F0,1F1,1B0,1B1\r\n"


def test_actions_from_csv_reads_our_export_and_skips_idle_cells() -> None:
    """Our parser reads what we write, and an empty cell (torch's idle step) is skipped."""
    p = one_f_one_b_two_stages()
    assert actions_from_csv(to_torch_csv(p)) == compute_actions(p)
    assert actions_from_csv(to_torch_csv(p, "compute_comms")) == comm_actions(p)
    assert actions_from_csv("0F0,,0B0\n1F0,1B0\n") == [
        [Action(0, "F", 0), Action(0, "B", 0)], [Action(1, "F", 0), Action(1, "B", 0)],
    ]  # fmt: skip


def test_actions_from_csv_error_names_rank_and_column() -> None:
    """A bad cell is reported with its rank (row) and column."""
    with pytest.raises(ProgramError, match=r"s\.csv: rank 1 \(row 2\), column 2: bad pipeline action '1Q0'"):
        actions_from_csv("0F0,0B0\n1F0,1Q0\n", "s.csv")


def test_to_torch_csv_rejects_unknown_format() -> None:
    """Only torch's two formats exist."""
    with pytest.raises(ProgramError, match=r"format = 'both'; use 'compute_only' or 'compute_comms'"):
        to_torch_csv(gpipe_two_stages(), "both")  # type: ignore[arg-type]


# -- our op CSV --------------------------------------------------------------------------------------
@pytest.mark.parametrize("build", [gpipe_two_stages, one_f_one_b_two_stages, hybrid_tp_pp])
def test_op_csv_round_trips_every_rank(build: object) -> None:
    """from_csv(to_csv(p)) gives back every rank's op list exactly."""
    p = build()  # type: ignore[operator]
    assert from_csv(to_csv(p)) == p.ranks


def test_op_csv_keeps_empty_ranks_and_quoted_text() -> None:
    """A rank without ops stays an (empty) row; op text with commas and quotes survives CSV quoting."""
    ops = ['FREE name="a, \\"b\\""', c("F", 0, 0)]
    p = program([[], ops, []])
    text = to_csv(p)
    assert from_csv(text) == p.ranks
    assert len(from_csv(text)) == 3


def test_op_csv_error_names_rank_and_op() -> None:
    """A bad op in the CSV is reported with its rank and op index."""
    with pytest.raises(ProgramError, match=r"ops\.csv: rank 0 \(row 1\), op 1 \(column 2\): cannot parse op 'NOPE'"):
        from_csv("FREE name=a,NOPE\n", "ops.csv")


# -- torch's own loader ------------------------------------------------------------------------------
def _torch_schedule(num_stages: int, pp: int, m: int) -> object:
    """A _PipelineScheduleRuntime with stand-in stages (the loader only reads their sizes)."""
    schedules = pytest.importorskip(
        "torch.distributed.pipelining.schedules", reason="torch is not installed (executor extra)"
    )
    stage = types.SimpleNamespace(num_stages=num_stages, group_size=pp, group_rank=0)
    return schedules._PipelineScheduleRuntime(stages=[stage], n_microbatches=m)


def _load_with_torch(csv_text: str, tmp_path: Path, num_stages: int, pp: int, m: int, fmt: str) -> object:
    path = tmp_path / f"schedule-{fmt}.csv"
    path.write_text(csv_text, newline="")
    schedule = _torch_schedule(num_stages, pp, m)
    schedule._load_csv(str(path), format=fmt)  # type: ignore[attr-defined]
    return schedule


def _strs(order: dict[int, list[object]]) -> list[list[str]]:
    return [[str(a) for a in order[rank] if a is not None] for rank in sorted(order)]


@pytest.mark.torch
@pytest.mark.parametrize(("build", "m"), [(gpipe_two_stages, 2), (one_f_one_b_two_stages, 3)])
def test_torch_loads_our_compute_only_csv(build: object, m: int, tmp_path: Path) -> None:
    """torch's _load_csv accepts our compute-only CSV (its validator checks F/B counts and order) and
    reads the same actions; its _dump_csv writes back the very same bytes."""
    p = build()  # type: ignore[operator]
    text = to_torch_csv(p)
    schedule = _load_with_torch(text, tmp_path, num_stages=2, pp=2, m=m, fmt="compute_only")
    assert _strs(schedule.pipeline_order) == [[str(a) for a in row] for row in compute_actions(p)]  # type: ignore[attr-defined]
    dumped = tmp_path / "dumped.csv"
    schedule._dump_csv(str(dumped), format="compute_only")  # type: ignore[attr-defined]
    assert dumped.read_bytes().decode() == text


@pytest.mark.torch
def test_torch_lowering_places_sends_where_our_hand_built_1f1b_does(tmp_path: Path) -> None:
    """torch lowers our compute-only 1F1B to SEND/RECV actions in the same positions as our program's
    own sends/receives (ignoring its FSDP/grad-reduce bookkeeping actions)."""
    p = one_f_one_b_two_stages()
    schedule = _load_with_torch(to_torch_csv(p), tmp_path, num_stages=2, pp=2, m=3, fmt="compute_only")
    lowered = _strs(schedule.pipeline_order_with_comms)  # type: ignore[attr-defined]
    bookkeeping = ("UNSHARD", "RESHARD", "REDUCE_GRAD")
    lowered_without = [[a for a in row if not a.endswith(bookkeeping)] for row in lowered]
    ours = [[str(a) for a in row] for row in comm_actions(p)]
    assert lowered_without == [[a for a in row if not a.endswith(bookkeeping)] for row in ours]
    # torch puts each stage's REDUCE_GRAD where we do: after the stage's last backward (and its SEND_B).
    assert [[a for a in row if not a.endswith(("UNSHARD", "RESHARD"))] for row in lowered] == ours


@pytest.mark.torch
def test_torch_loads_our_compute_comms_csv_and_we_read_torch_dumps(tmp_path: Path) -> None:
    """torch's runtime loads our compute_comms CSV unchanged; our parser reads torch's own dump of it,
    including the UNSHARD/RESHARD/REDUCE_GRAD actions torch adds when it lowers a compute-only CSV."""
    p = one_f_one_b_two_stages()
    schedule = _load_with_torch(to_torch_csv(p, "compute_comms"), tmp_path, 2, 2, 3, "compute_comms")
    assert _strs(schedule.pipeline_order_with_comms) == [[str(a) for a in row] for row in comm_actions(p)]  # type: ignore[attr-defined]
    lowered = _load_with_torch(to_torch_csv(p), tmp_path, 2, 2, 3, "compute_only")
    dumped = tmp_path / "with-comms.csv"
    lowered._dump_csv(str(dumped), format="compute_comms")  # type: ignore[attr-defined]
    ours = actions_from_csv(dumped.read_bytes().decode())
    assert [[str(a) for a in row] for row in ours] == _strs(lowered.pipeline_order_with_comms)  # type: ignore[attr-defined]
    assert Action(0, "UNSHARD") in ours[0]


def test_actions_to_csv_matches_to_torch_csv() -> None:
    """actions_to_csv writes any action lists in the same format."""
    p = gpipe_two_stages()
    assert actions_to_csv(compute_actions(p)) == to_torch_csv(p)


@pytest.mark.torch
@given(
    st.sampled_from(ACTION_KINDS).flatmap(
        lambda kind: st.builds(
            Action,
            st.integers(0, 10**4),
            st.just(kind),
            st.just(-1) if kind in STAGE_ACTION_KINDS else st.integers(0, 10**4),
        )
    )
)
def test_torch_reads_and_writes_our_action_text(action: Action) -> None:
    """torch's _Action.from_str reads our action text to the same stage/type/micro-batch, and its repr
    is our text again."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules", reason="torch is not installed")
    theirs = schedules._Action.from_str(str(action))
    assert theirs.stage_index == action.stage
    assert theirs.computation_type.value == action.kind
    assert theirs.microbatch_index == (None if action.microbatch == -1 else action.microbatch)
    assert Action.parse(repr(theirs)) == action


def test_compute_comms_has_one_reduce_grad_per_stage_after_its_last_backward() -> None:
    """torch's runtime divides gradients by the micro-batch count at REDUCE_GRAD, so the compute_comms
    export must carry one per stage, after the stage's last B (and its SEND_B), as torch's lowering does;
    the compute_only export must not (torch adds it itself and refuses non-compute cells there)."""
    p = one_f_one_b_two_stages()
    rows = [[str(a) for a in row] for row in comm_actions(p)]
    assert [row.count(f"{r}REDUCE_GRAD") for r, row in enumerate(rows)] == [1, 1]
    assert rows[0][-2:] == ["0B2", "0REDUCE_GRAD"]
    assert rows[1][-3:] == ["1B2", "1SEND_B2", "1REDUCE_GRAD"]
    assert "REDUCE_GRAD" not in to_torch_csv(p)
    assert to_torch_csv(p, "compute_comms").count("REDUCE_GRAD") == 2


def test_reduce_grad_follows_the_last_weight_gradient_and_overlapped_backwards() -> None:
    """With split backwards the last W closes the stage; a B inside an OVERLAP_F_B counts too; an order
    that already holds REDUCE_GRAD is left alone."""
    order = [Action(0, "I", 0), Action(0, "W", 0), Action(0, "I", 1), Action(0, "SEND_B", 1), Action(0, "W", 1)]
    assert [str(a) for a in with_reduce_grad(order)][-2:] == ["0W1", "0REDUCE_GRAD"]
    pair = Action.overlap(Action(1, "F", 0), Action(0, "B", 0))
    assert [str(a) for a in with_reduce_grad([Action(0, "F", 0), Action(1, "F", 1), pair])] == [
        "0F0", "1F1", "(1F0;0B0)OVERLAP_F_B", "0REDUCE_GRAD",
    ]
    done = [*with_reduce_grad(order)]
    assert with_reduce_grad(done) == done


def test_overlap_cells_follow_torch_grammar() -> None:
    """ScheduleDualPipeV's compound cell parses to its sub-actions and prints back the same; malformed
    ones name the problem."""
    pair = Action.parse("(0F1;3B0)OVERLAP_F_B")
    assert pair.leaves == (Action(0, "F", 1), Action(3, "B", 0))
    assert str(pair) == "(0F1;3B0)OVERLAP_F_B"
    assert Action(2, "W", 0).leaves == (Action(2, "W", 0),)
    with pytest.raises(ProgramError, match=r"groups compute actions \(F, I, W, B\) only, got 0SEND_F1"):
        Action.parse("(0F1;0SEND_F1)OVERLAP_F_B")
    with pytest.raises(ProgramError, match=r"only OVERLAP_F_B has sub-actions"):
        Action(-1, "OVERLAP_F_B", -1)


def test_import_keeps_idle_cells_so_torch_dumps_re_export_byte_for_byte() -> None:
    """cells_from_csv keeps torch's empty cells as None; actions_to_csv writes them back unchanged."""
    dump = ",0F0,,,0B0,0REDUCE_GRAD\r\n1F0,1B0,(1F1;0B1)OVERLAP_F_B\r\n"
    cells = cells_from_csv(dump)
    assert cells[0][:3] == [None, Action(0, "F", 0), None]
    assert actions_to_csv(cells) == dump
    assert actions_from_csv(dump)[0] == [Action(0, "F", 0), Action(0, "B", 0), Action(0, "REDUCE_GRAD")]
