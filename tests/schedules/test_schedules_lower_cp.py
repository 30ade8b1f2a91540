"""Context-parallel lowering: K/V collectives around attention, groups per rank, gradient sync over dp * cp."""

from __future__ import annotations

from simgrid.ir.ops import Collective, Compute, Recv, Send
from simgrid.ir.validate import validate_program
from simgrid.layout import Layout, Mesh
from simgrid.model import block_cost, get_model
from simgrid.schedules import build_program
from simgrid.simulation import simulate

TINY = get_model("tiny-gpt")  # 4 layers, seq 32: attention blocks 1, 3, 5, 7
LAYOUT = Layout(dp=2, tp=2, pp=2, cp=2, global_batch_size=4, zero=1)


def _cp_ops(ops: tuple, kind: str, block: int) -> list[Collective]:
    """The CP collectives issued for compute op ``kind`` of ``block`` (stage 0, first micro-batch), in order."""
    prefix = f"cp:s0:m0:{kind}:b{block}:"
    return [op for op in ops if type(op) is Collective and op.purpose == "cp" and op.handle.startswith(prefix)]


def test_program_validates_and_runs_the_kv_collectives_around_attention_only() -> None:
    """Forward: one K/V all-gather before each attention F; backward: re-gather before and reduce-scatter
    after each attention B; the MLP has none. Sizes come from the model's cp collectives."""
    program = build_program(TINY, LAYOUT)
    validate_program(program)
    ops = program.ranks[0]
    kv = block_cost(TINY, LAYOUT, 1).cp_comm[0].bytes
    assert [(c.kind, c.bytes) for c in _cp_ops(ops, "F", 1)] == [("all_gather", kv)]
    assert [c.kind for c in _cp_ops(ops, "B", 1)] == ["all_gather", "reduce_scatter"]
    assert _cp_ops(ops, "F", 2) == []
    f_index = next(i for i, op in enumerate(ops) if type(op) is Compute and op.kind == "F" and op.block_start == 1
                   and op.microbatch == 0)
    gather = _cp_ops(ops, "F", 1)[0]
    assert ops.index(gather) == f_index - 2  # the gather and its WAIT come right before the core's op


def test_every_rank_uses_its_own_cp_tp_and_pipeline_peers() -> None:
    """Instantiated ranks name their own groups and send to the next stage's rank with the same cp index."""
    program = build_program(TINY, LAYOUT)
    mesh = Mesh(LAYOUT)
    for rank in range(LAYOUT.world_size):
        c = mesh.coords(rank)
        ops = program.ranks[rank]
        groups = {op.group for op in ops if type(op) is Collective}
        assert Mesh.cp_group_name(c) in groups and Mesh.tp_group_name(c) in groups
        assert all(rank in program.groups[g] for g in groups)
        peers = {op.peer for op in ops if type(op) in (Send, Recv)}
        assert peers == {mesh.rank(pp=1 - c.pp, dp=c.dp, cp=c.cp, tp=c.tp)}


def test_gradients_sync_over_data_and_context_parallel_ranks() -> None:
    """The ZeRO-1 gradient reduce-scatter runs on the dp group, which holds dp * cp = 4 ranks."""
    program = build_program(TINY, LAYOUT)
    grads = [op for op in program.ranks[0] if type(op) is Collective and op.purpose in ("dp-grad", "zero-grad")]
    assert grads and {len(program.groups[op.group]) for op in grads} == {4}


def test_symmetric_mode_matches_full_mode_and_reports_exposed_cp_time() -> None:
    """One representative per pipeline rank predicts the same step as simulating all 16 ranks, and the
    synchronous K/V gathers show up as exposed cp communication."""
    sym = simulate(TINY, "dgx-a100-hdr", LAYOUT, mode="symmetric")
    full = simulate(TINY, "dgx-a100-hdr", LAYOUT, mode="full")
    assert sym.metrics.step_time_s == full.metrics.step_time_s
    assert sym.metrics.exposed_comm_s["cp"] > 0
    assert simulate(TINY, "dgx-a100-hdr", Layout(dp=2, tp=2, pp=2, global_batch_size=4)).metrics.exposed_comm_s["cp"] == 0
