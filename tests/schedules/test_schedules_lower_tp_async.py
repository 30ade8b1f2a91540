"""Megatron-LM's asynchronous tensor-parallel backward communication (``tp_async_grad_comm``): the column linear's
input-gradient collective beside its weight-gradient GEMM, the sequence-parallel re-gather beside its
input-gradient GEMM, totals kept, nothing changed without the field, and the step never shorter than what
any stream is busy."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import pytest
from schedule_helpers import TINY, context, flat, tp_ops_of

from simgrid import simulate
from simgrid.ir.dryrun import dry_run
from simgrid.ir.ops import Collective, Compute, Op, Wait
from simgrid.ir.validate import validate_program
from simgrid.layout.spec import Layout
from simgrid.model.gemms import block_gemms
from simgrid.schedules import build_program
from simgrid.schedules.lower.compute import add_recompute, compute_steps
from simgrid.schedules.lower.tensor_parallel import add_tensor_parallel
from simgrid.schedules.lower.tp_async import add_async_tensor_parallel, add_te_overlapped_tensor_parallel
from simgrid.schedules.lower.tp_overlap import add_replaced_tensor_parallel, overlapped_ops


def _role(granularity: str = "block", asynchronous: bool = True, **layout: object) -> list[Op]:
    ctx = context(granularity, tp_async_grad_comm=asynchronous, **layout)  # type: ignore[arg-type]
    role = add_recompute(ctx, compute_steps(ctx, 0))
    return flat((add_async_tensor_parallel if asynchronous else add_tensor_parallel)(ctx, role, 0))


_between = tp_ops_of


def _shape(o: Op) -> str:
    if isinstance(o, Collective):
        return o.kind
    return type(o).__name__


def test_input_grad_all_reduce_runs_beside_the_weight_gradient_gemm() -> None:
    """Without sequence parallelism (Megatron-LM 2021-09 on): rest of the backward, the QKV input-gradient
    GEMM, then the all-reduce issued, the QKV weight-gradient GEMM, and only then its WAIT."""
    ops = _between(_role(tp=2), "B", 1)  # block 1: attention
    assert [_shape(o) for o in ops] == ["Compute", "Compute", "all_reduce", "Compute", "Wait"]
    wq = block_gemms(TINY, Layout(tp=2), 1).bwd_weight[-1]
    iq = block_gemms(TINY, Layout(tp=2), 1).bwd_input[-1]
    assert ops[1].gemms == (iq,) and ops[3].gemms == (wq,)  # type: ignore[union-attr]


def test_sequence_parallel_regather_beside_dgrad_and_scatter_beside_wgrad() -> None:
    """With sequence parallelism: the row-parallel output-gradient all-gather stays synchronous; the input
    re-gather flies over the input-gradient GEMM, the reduce-scatter over the weight-gradient GEMM."""
    ops = _between(_role(tp=2, sequence_parallel=True), "B", 2)  # block 2: MLP
    assert [_shape(o) for o in ops] == ["all_gather", "Wait", "Compute", "all_gather", "Compute", "Wait",
                                        "reduce_scatter", "Compute", "Wait"]


def test_head_is_covered_and_embedding_is_not() -> None:
    """The 2022 code's ``parallel_lm_logits`` uses the async function too; the embedding has no column linear."""
    ops = _role(tp=2)
    head = 2 * TINY.num_layers + 1
    assert [_shape(o) for o in _between(ops, "B", head)] == ["Compute", "Compute", "all_reduce", "Compute", "Wait"]
    assert not any(isinstance(o, Collective) for o in _between(ops, "B", 0))


def test_forward_recompute_and_weight_ops_keep_synchronous_collectives() -> None:
    """F and a full recompute's R keep each collective followed at once by its WAIT."""
    ops = _role(tp=2, recompute="full")
    for kind in ("F", "R"):
        shapes = [_shape(o) for o in _between(ops, kind, 1)]
        assert shapes == ["Compute", "all_reduce", "Wait"]


def test_split_backward_exposes_the_input_grad_collective() -> None:
    """An I op has no weight-gradient GEMM beside: its reduce-scatter is issued and waited at once; W has none."""
    ops = _role(tp=2, sequence_parallel=True, pp=2, schedule="zb-h1", global_batch_size=4)
    block = next(o for o in ops if isinstance(o, Compute) and o.kind == "I").block_start
    i_ops = _between(ops, "I", block)
    assert [_shape(o) for o in i_ops[-2:]] == ["reduce_scatter", "Wait"]
    assert not any(isinstance(o, Collective) for o in _between(ops, "W", 3))


@pytest.mark.parametrize("granularity", ["block", "stage"])
@pytest.mark.parametrize("sp", [False, True])
def test_same_flops_bytes_kernels_and_collectives(granularity: str, sp: bool) -> None:
    """Splitting the backward moves work, never adds or drops it: FLOPs, memory bytes, kernel launches and
    the bytes of each collective kind are those of the synchronous lowering."""

    def totals(ops: list[Op]) -> tuple[float, float, int, dict[str, int]]:
        comp = [o for o in ops if isinstance(o, Compute)]
        colls: dict[str, int] = {}
        for o in ops:
            if isinstance(o, Collective):
                colls[o.kind] = colls.get(o.kind, 0) + o.bytes
        return sum(o.flops for o in comp), sum(o.hbm_bytes for o in comp), sum(o.kernels for o in comp), colls

    sync = totals(_role(granularity, asynchronous=False, tp=4, sequence_parallel=sp))
    asyn = totals(_role(granularity, asynchronous=True, tp=4, sequence_parallel=sp))
    assert asyn[0] == pytest.approx(sync[0])
    assert asyn[1] == pytest.approx(sync[1])
    assert asyn[2] == sync[2]
    assert asyn[3] == sync[3]


def _waited_at_once(ops: tuple[Op, ...] | list[Op]) -> bool:
    """Whether every tensor-parallel collective is followed at once by its own WAIT."""
    return all(isinstance(nxt, Wait) and nxt.handle == o.handle
               for o, nxt in pairwise(ops) if isinstance(o, Collective) and o.purpose == "tp")


@pytest.mark.parametrize("sp", [False, True])
def test_without_the_field_collectives_stay_synchronous_and_backwards_whole(sp: bool) -> None:
    """tp_async_grad_comm = False (the default): one compute op per backward block, each TP collective waited
    at once; with the field the build routes through the async pass (some collective is not waited at once)."""
    layout: dict[str, Any] = {"tp": 2, "sequence_parallel": sp, "pp": 2, "global_batch_size": 4}
    plain = build_program(TINY, Layout(**layout)).ranks[0]
    assert Layout(**layout).tp_async_grad_comm is False
    assert _waited_at_once(plain)
    ctx = context("block", **layout)
    bare = [o for o in flat(compute_steps(ctx, 0)) if isinstance(o, Compute)]
    assert sum(isinstance(o, Compute) and o.kind in ("F", "B", "I", "W") for o in plain) == len(bare)
    assert not _waited_at_once(build_program(TINY, Layout(tp_async_grad_comm=True, **layout)).ranks[0])


def test_tp_one_makes_the_field_a_no_op() -> None:
    """Megatron-LM enables the async path only with a tensor-parallel group (``... and world_size > 1``)."""
    assert build_program(TINY, Layout(dp=2)).ranks[0] == build_program(TINY, Layout(dp=2, tp_async_grad_comm=True)).ranks[0]


@pytest.mark.parametrize(
    ("granularity", "layout"),
    [
        ("block", {"tp": 2}),
        ("block", {"tp": 2, "sequence_parallel": True, "recompute": "selective"}),
        ("stage", {"tp": 4, "pp": 2, "global_batch_size": 4, "recompute": "full"}),
        ("block", {"tp": 2, "pp": 2, "schedule": "zb-h1", "global_batch_size": 4}),
        ("block", {"tp": 2, "cp": 2, "sequence_parallel": True}),
        ("stage", {"tp": 2, "dp": 2, "zero": 1}),
        ("block", {"tp": 2, "pp": 2, "vpp": 2, "schedule": "interleaved-1f1b", "global_batch_size": 8}),
    ],
)
def test_programs_validate_and_run_dry(granularity: str, layout: dict[str, object]) -> None:
    """Whole programs with the field: every collective matched over its group, no deadlock."""
    program = build_program(TINY, Layout(tp_async_grad_comm=True, **layout),  # type: ignore[arg-type]
                            granularity=granularity)  # type: ignore[arg-type]
    validate_program(program)
    dry_run(program)


@pytest.mark.parametrize("sp", [False, True])
def test_overlap_shortens_the_step_but_never_below_any_streams_busy_time(sp: bool) -> None:
    """The collectives now overlap GEMMs, so the step is no longer than the synchronous one; and the step still
    covers the busy time of the compute stream and of every communication stream of every rank."""
    layout = {"tp": 8, "micro_batch_size": 2, "global_batch_size": 2, "sequence_parallel": sp}
    sync = simulate("gpt3-1.3b", "dgx-a100-hdr", Layout(**layout), granularity="block")  # type: ignore[arg-type]
    asyn = simulate("gpt3-1.3b", "dgx-a100-hdr", Layout(tp_async_grad_comm=True, **layout),  # type: ignore[arg-type]
                    granularity="block")
    assert asyn.metrics.step_time_s < sync.metrics.step_time_s
    busy: dict[tuple[int, str], float] = {}
    for row in asyn.trace.rows_of(0):
        busy[(row.rank, row.stream)] = busy.get((row.rank, row.stream), 0.0) + row.end_s - row.start_s
    assert any(stream != "compute" for _, stream in busy)
    assert max(busy.values()) <= asyn.metrics.step_time_s * (1 + 1e-9)


def _te_role(granularity: str, te_head: bool) -> list[Op]:
    ctx = context(granularity, tp=2, sequence_parallel=True, tp_comm_overlap=True)  # type: ignore[arg-type]
    role = add_recompute(ctx, compute_steps(ctx, 0))
    if te_head:
        return flat(add_te_overlapped_tensor_parallel(ctx, role, 0))
    return flat(add_replaced_tensor_parallel(ctx, role, 0, overlapped_ops))  # the head wrapped synchronously


def test_te_overlap_runs_the_heads_backward_collectives_beside_its_gemms() -> None:
    """Under tp_comm_overlap Megatron-Core's output layer (its own ColumnParallelLinear, layers.py lines 441-485 at
    f2e5db4): the input re-gather flies over the input-gradient GEMM, the input-gradient reduce-scatter over the
    weight-gradient GEMM; TE's layers and the embedding keep tp_overlap's ops."""
    head = 2 * TINY.num_layers + 1
    te, plain = _te_role("block", True), _te_role("block", False)
    assert [_shape(o) for o in _between(plain, "B", head)] == ["all_gather", "Wait", "Compute", "reduce_scatter", "Wait"]
    ops = _between(te, "B", head)
    assert [_shape(o) for o in ops] == ["Compute", "all_gather", "Compute", "Wait", "reduce_scatter", "Compute", "Wait"]
    gemms = block_gemms(TINY, Layout(tp=2, sequence_parallel=True), head)
    assert ops[2].gemms == (gemms.bwd_input[-1],) and ops[5].gemms == (gemms.bwd_weight[-1],)  # type: ignore[union-attr]
    whole = next(o for o in _between(plain, "B", head) if isinstance(o, Compute))
    parts = [o for o in ops if isinstance(o, Compute)]
    assert sum(o.flops for o in parts) == pytest.approx(whole.flops)
    assert sum(o.hbm_bytes for o in parts) == pytest.approx(whole.hbm_bytes)
    for block in range(head):
        for kind in ("F", "B"):
            assert _between(te, kind, block) == _between(plain, kind, block)
    assert _between(te, "F", head) == _between(plain, "F", head)


def test_te_overlap_head_at_stage_granularity_issues_the_scatter_before_the_weight_gradient() -> None:
    """One B op for the whole stage: the head's part (run first in the backward) waits its reduce-scatter only
    after the weight-gradient GEMM; the layers keep their userbuffers collectives."""
    ops = [o for o in _te_role("stage", True) if not isinstance(o, Compute) or o.kind == "B"]
    scatter = next(i for i, o in enumerate(ops) if isinstance(o, Collective) and o.kind == "reduce_scatter"
                   and ":m0:B:" in o.handle)
    wait = next(i for i, o in enumerate(ops) if isinstance(o, Wait) and o.handle == ops[scatter].handle)  # type: ignore[union-attr]
    assert any(isinstance(o, Compute) for o in ops[scatter + 1: wait])
    assert any(isinstance(o, Collective) and o.kernel == "userbuffers" for o in ops)
