"""NeMo's apex DistributedFusedAdam sync under Megatron-Core's schedules (``zero_impl = "apex"``): per-layer padded
buckets, the interleaved schedule's per-chunk parameter gathers (chunks 0 and 1 at the start, chunk c + 1 at forward
iteration c * pp - pipeline_rank) and gradient reduce-scatters (pipeline_rank backward iterations after the chunk's
last), the hook chain without interleaving, bytes conserved, and Megatron-Core layouts left as they were."""

from __future__ import annotations

import dataclasses

import pytest
from schedule_helpers import TINY, context, flat, tiny_with_layers

from simgrid.ir.dryrun import dry_run
from simgrid.ir.ops import Collective, Compute, Wait
from simgrid.ir.validate import validate_program
from simgrid.layout.spec import Layout
from simgrid.schedules import build_program
from simgrid.schedules.buckets import apex_padded_params, apex_state_bucket_params, grad_buckets
from simgrid.schedules.build import build_roles
from simgrid.schedules.lower.apex_sync import add_apex_grad_sync, add_apex_param_sync
from simgrid.schedules.lower.compute import compute_steps
from simgrid.schedules.lower.data_parallel import add_overlapped_grad_sync
from simgrid.schedules.lower.param_gather import add_overlapped_param_gather

PP, VPP, MICRO = 2, 3, 4
INTERLEAVED = dict(dp=2, pp=PP, vpp=VPP, zero=1, zero_impl="apex", schedule="interleaved-1f1b",
                   global_batch_size=2 * MICRO, bucket_size_MB=0.01, overlap_param_gather=True)
MODEL = tiny_with_layers(PP * VPP)  # one layer per model chunk


def _handles(ops: list, cls: type, purpose: str) -> list[str]:
    return [op.handle for op in ops if isinstance(op, cls) and (cls is Wait or op.purpose == purpose)
            and op.handle.startswith(purpose)]


def test_state_bucket_size_and_padding_follow_apex() -> None:
    """bucket_cap_mb MiB of bf16 gradients, each of the dp shards rounded down to 64 elements (128 bytes); a layer
    moves whole state buckets: 220 MB at dp 16 is 16 shards of int(220 MiB / 2 B / 16) = 7208960 elements."""
    layout = Layout(dp=16, zero=1, zero_impl="apex", bucket_size_MB=220)
    assert apex_state_bucket_params(layout) == 16 * 7208960
    # 220.001 MiB is 7208992 elements a shard, rounded down to 7208960; 220.003 MiB 7209058, down to 7209024
    assert apex_state_bucket_params(dataclasses.replace(layout, bucket_size_MB=220.001)) == 16 * 7208960
    assert apex_state_bucket_params(dataclasses.replace(layout, bucket_size_MB=220.003)) == 16 * 7209024
    size = apex_state_bucket_params(layout)
    assert [apex_padded_params(n, layout) for n in (1, size, size + 1)] == [size, size, 2 * size]


def test_one_bucket_per_layer_embedding_with_first_head_with_last() -> None:
    """Without pipelining: one bucket per transformer layer, last layer first; the embedding joins layer 0's bucket
    and the head the last layer's; each bucket's bytes are whole state buckets."""
    layout = Layout(dp=2, zero=1, zero_impl="apex", bucket_size_MB=0.01)
    buckets = grad_buckets(TINY, layout, 0)
    last = 2 * TINY.num_layers + 1
    assert [b.blocks for b in buckets] == [(last, last - 1, last - 2), *[(2 + 2 * i, 1 + 2 * i) for i in
                                                                          range(TINY.num_layers - 2, 0, -1)], (2, 1, 0)]
    state = apex_state_bucket_params(layout) * 2  # bf16 gradients
    assert all(b.bytes % state == 0 and b.bytes > 0 for b in buckets)


def _forward_and_backward_steps(role: list) -> tuple[list, list]:
    forwards = [s for s in role if s.action is not None and s.action.kind == "F"]
    backwards = [s for s in role if s.action is not None and s.action.kind == "B"]
    return forwards, backwards


@pytest.mark.parametrize("pp_rank", range(PP))
def test_interleaved_param_gathers_follow_megatron_param_sync_func(pp_rank: int) -> None:
    """Prologue: the first bucket (the optimizer's), wait, the rest of chunk 0, wait, chunk 1. Chunk c + 1 (1 < c + 1
    < vpp) is issued before forward iteration c * pp - pipeline_rank, after waiting for chunk c; the last chunk is
    waited for before its first forward (Megatron-LM 338af514 schedules.py lines 620-623, 671-686)."""
    ctx = context(model=MODEL, **INTERLEAVED)
    role = build_roles(ctx)[pp_rank]
    stages = ctx.stages_of(pp_rank)
    gathers = {s: [f"zero-param:s{s}:bucket{b.index}" for b in reversed(ctx.buckets(s))] for s in stages}
    prologue = role[0].ops
    first = gathers[stages[0]][:1]
    assert _handles(prologue, Collective, "zero-param") == first + gathers[stages[0]][1:] + gathers[stages[1]]
    assert _handles(prologue, Wait, "zero-param") == first + gathers[stages[0]][1:]
    forwards, _ = _forward_and_backward_steps(role)
    for c in range(1, VPP - 1):
        step = forwards[c * PP - pp_rank]
        assert _handles(step.ops, Wait, "zero-param") == gathers[stages[c]]
        assert _handles(step.ops, Collective, "zero-param") == gathers[stages[c + 1]]
        syncs = [i for i, op in enumerate(step.ops) if isinstance(op, Collective | Wait) and "zero-param" in op.handle]
        assert max(syncs) < min(i for i, op in enumerate(step.ops) if isinstance(op, Compute))  # before the forward
    last_first_forward = next(s for s in forwards if s.action.stage == stages[-1])
    assert _handles(last_first_forward.ops, Wait, "zero-param") == gathers[stages[-1]]
    issued = [h for s in role for h in _handles(s.ops, Collective, "zero-param")]
    assert sorted(issued) == sorted(h for s in stages for h in gathers[s])  # each bucket once


@pytest.mark.parametrize("pp_rank", range(PP))
def test_interleaved_grad_sync_per_chunk_offset_by_pipeline_rank(pp_rank: int) -> None:
    """Chunk c's reduce-scatters are issued together after the backward pipeline_rank iterations after the chunk's
    last one (Megatron's iteration numbering: chunk c's last backward is iteration (m / pp - 1) * pp * vpp +
    (vpp - 1 - c) * pp + pp - 1), after the last backward when that is past the end (338af514 schedules.py 751-760,
    1073-1078)."""
    ctx = context(model=MODEL, **INTERLEAVED)
    role = build_roles(ctx)[pp_rank]
    _, backwards = _forward_and_backward_steps(role)
    total = MICRO * VPP
    assert len(backwards) == total
    for c, stage in enumerate(ctx.stages_of(pp_rank)):
        last = (MICRO // PP - 1) * PP * VPP + (VPP - 1 - c) * PP + PP - 1
        step = backwards[min(last + pp_rank, total - 1)]
        expected = [f"zero-grad:s{stage}:bucket{b.index}" for b in ctx.buckets(stage)]
        assert set(expected) <= set(_handles(step.ops, Collective, "zero-grad"))


def test_sequence_parallel_defers_the_first_layer_bucket_to_the_optimizer() -> None:
    """With sequence parallelism NeMo parks the norms (``_disable_overlap_grad_sync``) in the rank's first-layer
    bucket: its reduce-scatter is the last collective of the rank's last backward step, the other buckets of the
    first chunk are issued in the backward as their last gradients are in."""
    ctx = context(model=TINY, dp=2, tp=2, sequence_parallel=True, zero=1, zero_impl="apex", bucket_size_MB=0.01)
    role = build_roles(ctx)[0]
    _, backwards = _forward_and_backward_steps(role)
    handles = _handles(backwards[-1].ops, Collective, "zero-grad")
    buckets = ctx.buckets(0)
    assert handles[-1] == f"zero-grad:s0:bucket{buckets[-1].index}"
    ops = backwards[-1].ops
    first_rs = next(i for i, op in enumerate(ops) if isinstance(op, Collective) and op.purpose == "zero-grad")
    assert any(isinstance(op, Compute) and op.kind == "B" for op in ops[first_rs + 1:])  # overlapped


def test_1f1b_later_ranks_sync_after_their_cooldown() -> None:
    """Without interleaving only pipeline rank 0 syncs during its last backward; the other ranks issue every
    reduce-scatter after their last backward (338af514 schedules.py lines 1416-1417, 1441-1442, 1455-1459)."""
    ctx = context(model=TINY, dp=2, pp=2, schedule="1f1b", global_batch_size=8, zero=1, zero_impl="apex",
                  bucket_size_MB=0.01)
    roles = build_roles(ctx)
    _, backwards = _forward_and_backward_steps(roles[1])
    assert len(_handles(backwards[-1].ops, Collective, "zero-grad")) == len(ctx.buckets(ctx.stages_of(1)[0]))
    ops = backwards[-1].ops
    first_rs = next(i for i, op in enumerate(ops) if isinstance(op, Collective) and op.purpose == "zero-grad")
    assert not any(isinstance(op, Compute) for op in ops[first_rs:])
    _, backwards0 = _forward_and_backward_steps(roles[0])
    ops0 = backwards0[-1].ops
    first_rs0 = next(i for i, op in enumerate(ops0) if isinstance(op, Collective) and op.purpose == "zero-grad")
    assert any(isinstance(op, Compute) and op.kind == "B" for op in ops0[first_rs0 + 1:])


@pytest.mark.parametrize("granularity", ["block", "stage"])
@pytest.mark.parametrize("extra", [{}, {"pp": 2, "schedule": "1f1b", "global_batch_size": 8},
                                   {"model": MODEL, **INTERLEAVED}], ids=["dp", "1f1b", "interleaved"])
def test_bytes_conserved_each_bucket_once_program_valid(granularity: str, extra: dict[str, object]) -> None:
    """Every rank gathers and reduce-scatters each of its buckets exactly once per step, with the padded bytes
    (whole state buckets; at least the parameters' own), and the program validates and dry-runs (no handle left
    unwaited, no deadlock)."""
    settings = {"dp": 2, "zero": 1, "zero_impl": "apex", "bucket_size_MB": 0.01, "overlap_param_gather": True,
                **extra}
    model = settings.pop("model", TINY)
    layout = Layout(**settings)  # type: ignore[arg-type]
    program = build_program(model, layout, granularity=granularity)  # type: ignore[arg-type]
    validate_program(program)
    dry_run(program)
    ctx = context(model=model, **settings)
    for rank, ops in enumerate(program.ranks):
        stages = ctx.stages_of(ctx.mesh.coords(rank).pp)
        buckets = {f"s{s}:bucket{b.index}": (s, b) for s in stages for b in ctx.buckets(s)}
        for purpose in ("zero-param", "zero-grad"):
            colls = [op for op in ops if isinstance(op, Collective) and op.purpose == purpose]
            assert sorted(c.label for c in colls) == sorted(buckets)
        grads = {c.label: c.bytes for c in ops if isinstance(c, Collective) and c.purpose == "zero-grad"}
        assert grads == {label: b.bytes for label, (_, b) in buckets.items()}
        params = {c.label: c.bytes for c in ops if isinstance(c, Collective) and c.purpose == "zero-param"}
        for label, (_, bucket) in buckets.items():
            own = sum(ctx.cost(b).param_count for b in bucket.blocks)
            assert params[label] == apex_padded_params(own, layout) * layout.param_bytes >= own * layout.param_bytes


@pytest.mark.parametrize("settings", [
    {"dp": 2, "zero": 1, "bucket_size_MB": 0.02, "overlap_param_gather": True},
    {"dp": 2, "zero": 1, "pp": 2, "vpp": 2, "schedule": "interleaved-1f1b", "global_batch_size": 8,
     "bucket_policy": "megatron", "overlap_param_gather": True},
    {"dp": 2, "zero": 0, "pp": 2, "schedule": "1f1b", "global_batch_size": 8},
], ids=["zero1-ddp", "megatron-interleaved", "ddp-1f1b"])
def test_other_layouts_lower_as_before(settings: dict[str, object]) -> None:
    """Without zero_impl 'apex' the apex passes hand every role to Megatron-Core's passes unchanged."""
    ctx = context(**settings)
    for pp_rank in range(ctx.layout.pp):
        mine = add_apex_param_sync(ctx, add_apex_grad_sync(ctx, compute_steps(ctx, pp_rank), pp_rank), pp_rank)
        ref = add_overlapped_param_gather(ctx, add_overlapped_grad_sync(ctx, compute_steps(ctx, pp_rank), pp_rank),
                                          pp_rank)
        assert flat(mine) == flat(ref)
