"""Transformer Engine delayed scaling's amax all-reduce (simgrid.schedules.lower.amax_reduction): count and place per
micro-batch and chunk, group, bytes per buffer key, the asynchronous 09ba842 variant, and where it does not apply."""

from __future__ import annotations

import dataclasses

import pytest
from schedule_helpers import TINY

import simgrid.schedules.build as build
from simgrid.errors import LayoutError
from simgrid.ir.ops import Collective, Compute, Wait
from simgrid.layout.mesh import Mesh
from simgrid.layout.spec import Layout
from simgrid.schedules import build_program
from simgrid.schedules.lower.amax_reduction import amax_keys, reduces_amax

LAST_LAYER_BLOCK = 2 * TINY.num_layers  # tiny-gpt: 4 layers, blocks 1..8, head 9


def _layout(**changes: object) -> Layout:
    base: dict[str, object] = dict(dp=2, tp=2, pp=2, vpp=2, schedule="interleaved-1f1b", global_batch_size=8,
                                   sequence_parallel=True, fp8_recipe="delayed")
    base.update(changes)
    return Layout(**base)  # type: ignore[arg-type]


def _amax(ops: tuple) -> list[tuple[int, Collective]]:
    return [(i, op) for i, op in enumerate(ops) if isinstance(op, Collective) and op.purpose == "amax"]


def _layer_op(op: object, kinds: tuple[str, ...]) -> bool:
    return (isinstance(op, Compute) and op.kind in kinds and op.block_start <= LAST_LAYER_BLOCK
            and op.block_end > 1)


def test_one_synchronous_reduction_per_forward_and_backward_of_every_chunk_and_micro_batch() -> None:
    """pp 2, vpp 2, m 4: each rank reduces 2 x m x vpp = 16 times, once per (stage, micro-batch, direction), each
    waited for right after it (async_op=False)."""
    layout = _layout()
    program = build_program(TINY, layout)
    m = layout.num_microbatches
    for rank in range(layout.world_size):
        ops = program.ranks[rank]
        colls = _amax(ops)
        assert len(colls) == 2 * m * layout.vpp
        assert len({c.handle for _, c in colls}) == len(colls)
        for i, coll in colls:
            assert coll.kind == "all_reduce"
            assert ops[i + 1] == Wait(handle=coll.handle)


def test_forward_reduction_follows_the_chunks_last_layer_and_precedes_the_head() -> None:
    """Each forward's reduction sits after its last layer compute op and before the next compute op (the final
    norm / head on the last stage); each backward's after the op of the chunk's first layer, before the embedding's
    backward on the first stage."""
    program = build_program(TINY, _layout())
    for rank in (0, 4):  # pp rank 0 and pp rank 1 at dp 0, tp 0
        ops = program.ranks[rank]
        for i, coll in _amax(ops):
            direction = coll.handle.split(":")[3]
            kinds = ("F",) if direction == "F" else ("B", "I")
            before = max(j for j in range(i) if isinstance(ops[j], Compute))
            assert _layer_op(ops[before], kinds)
            stage = ops[before].stage
            assert coll.handle.startswith(f"amax:s{stage}:m{ops[before].microbatch}:")
            nxt = next((ops[j] for j in range(i + 1, len(ops)) if isinstance(ops[j], Compute)), None)
            if nxt is not None and nxt.stage == stage and nxt.kind in kinds and nxt.microbatch == ops[before].microbatch:
                assert not _layer_op(nxt, kinds)  # only the head (forward) or the embedding (backward) may follow
        heads = [j for j, op in enumerate(ops) if isinstance(op, Compute) and op.kind == "F"
                 and op.block_start > LAST_LAYER_BLOCK]
        for j in heads:  # the last stage's head: its forward reduction came just before it
            last_amax = max(i for i, _ in _amax(ops[:j]))
            assert not any(isinstance(op, Compute) for op in ops[last_amax:j])


def test_stage_group_is_the_tensor_data_and_context_parallel_ranks_of_the_pipeline_stage() -> None:
    """Megatron-Core's amax reduction group with context parallelism: every rank of one pipeline rank, nothing else."""
    layout = _layout(cp=2, sequence_parallel=True)
    program = build_program(TINY, layout)
    mesh = Mesh(layout)
    for pp in range(layout.pp):
        members = program.groups[f"amax/pp{pp}"]
        assert sorted(members) == sorted(r for r in range(layout.world_size) if mesh.coords(r).pp == pp)
        assert len(members) == layout.tp * layout.cp * layout.dp
    for rank in range(layout.world_size):
        assert {c.group for _, c in _amax(program.ranks[rank])} == {f"amax/pp{mesh.coords(rank).pp}"}


def test_tp_modes_use_each_ranks_tensor_parallel_group() -> None:
    """Megatron-Core core_v0.7.0.beta (``tp``) and TE 09ba842 with NVTE_DP_AMAX_REDUCE_INTERVAL=0 reduce over the
    rank's own tensor-parallel group; no amax group is added."""
    for mode in ("tp", "tp-async-region"):
        layout = _layout(fp8_amax_reduction=mode)
        program = build_program(TINY, layout)
        mesh = Mesh(layout)
        assert not any(name.startswith("amax/") for name in program.groups)
        for rank in range(layout.world_size):
            groups = {c.group for _, c in _amax(program.ranks[rank])}
            assert groups == {Mesh.tp_group_name(mesh.coords(rank))}


@pytest.mark.parametrize(("attention", "fp8_params", "forward", "backward"), [
    (False, False, [4 * 3 * 4], [4 * 2 * 4]),           # 4 GEMMs x 3 / x 2 fp32 amaxes per layer
    (True, False, [7 * 3 * 4], [7 * 2 * 4]),            # + DotProductAttention's 3 GEMMs, one buffer key
    (True, True, [4 * 3 * 4, 3 * 3 * 4], [4 * 2 * 4, 3 * 2 * 4]),  # fp8 weights: attention under its own key
])
def test_stage_bytes_are_every_fp8_module_of_the_rank_per_buffer_key(
        attention: bool, fp8_params: bool, forward: list[int], backward: list[int]) -> None:
    """TE v1.6+ global buffers hold every layer of the rank (both chunks: 2 layers here), one all-reduce per key."""
    layout = _layout(fp8_attention_amax=attention, fp8_params=fp8_params, zero=1, zero_impl="apex")
    ops = build_program(TINY, layout).ranks[0]
    layers = TINY.num_layers // layout.pp
    per_run: dict[tuple[str, str], list[int]] = {}
    for _, coll in _amax(ops):
        _, stage, mb, direction, _key = coll.handle.split(":")
        per_run.setdefault((f"{stage}:{mb}", direction), []).append(coll.bytes)
    assert per_run
    for (_, direction), sizes in per_run.items():
        assert sizes == [layers * b for b in (forward if direction == "F" else backward)]


def test_each_reduction_folds_its_cat_and_update_kernels_into_the_op_before_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The op before each reduction gains 2 kernels (cat, fused update) and a read and write of the amaxes; the
    09ba842 variant 1 kernel (its split makes views). Every other compute op is unchanged."""
    for mode, kernels in (("stage", 2), ("tp-async-region", 1)):
        layout = _layout(fp8_amax_reduction=mode)
        with_pass = build_program(TINY, layout).ranks[0]
        with monkeypatch.context() as m:
            m.setattr(build, "add_amax_reduction", lambda ctx, role, pp_rank: role)
            plain = build_program(TINY, layout).ranks[0]
        computes = [op for op in with_pass if isinstance(op, Compute)]
        plain_computes = [op for op in plain if isinstance(op, Compute)]
        assert len(computes) == len(plain_computes)
        folded = {max(j for j in range(i) if isinstance(with_pass[j], Compute)): c for i, c in _amax(with_pass)}
        index = {id(op): n for n, op in enumerate(computes)}
        changed = 0
        for pos, coll in folded.items():
            n = index[id(with_pass[pos])]
            assert computes[n].kernels == plain_computes[n].kernels + kernels
            assert computes[n].hbm_bytes == pytest.approx(plain_computes[n].hbm_bytes + 2 * coll.bytes)
            changed += 1
        assert changed == len(_amax(with_pass))
        assert sum(a != b for a, b in zip(computes, plain_computes, strict=True)) == changed


def test_async_region_reduction_is_waited_for_by_the_next_run_of_the_same_direction() -> None:
    """TE 09ba842 with NVTE_ASYNC_AMAX_REDUCTION=1: the chunk's amaxes only (one layer per chunk here), no Wait after
    the all-reduce; the next forward's (backward's) first layer op waits for the previous forward's (backward's)
    handle; the last ones are waited for at the end of the last action."""
    layout = _layout(fp8_amax_reduction="tp-async-region")
    ops = build_program(TINY, layout).ranks[0]
    colls = _amax(ops)
    layers_per_chunk = TINY.num_layers // (layout.pp * layout.vpp)
    waits = {op.handle: i for i, op in enumerate(ops) if isinstance(op, Wait) and op.handle.startswith("amax:")}
    assert set(waits) == {c.handle for _, c in colls}
    for i, coll in colls:
        direction = coll.handle.split(":")[3]
        assert coll.bytes == layers_per_chunk * (48 if direction == "F" else 32)
        assert not isinstance(ops[i + 1], Wait) or ops[i + 1].handle != coll.handle
        kinds = ("F",) if direction == "F" else ("B", "I")
        later = [j for j in range(i + 1, len(ops)) if _layer_op(ops[j], kinds)]
        if later:
            assert waits[coll.handle] < later[0]
            assert not any(_layer_op(ops[j], kinds) for j in range(waits[coll.handle], later[0]))
        else:
            assert not any(isinstance(op, Compute) and op.kind in ("F", "B") for op in ops[waits[coll.handle]:])


@pytest.mark.parametrize("changes", [
    dict(fp8_recipe="none"), dict(fp8_recipe="current"), dict(fp8_amax_reduction="none"),
    dict(dp=1, tp=1, cp=1, sequence_parallel=False), dict(fp8_amax_reduction="tp", tp=1, sequence_parallel=False),
])
def test_no_reduction_without_a_delayed_recipe_reduction_across_ranks(changes: dict[str, object]) -> None:
    """16-bit and current-scaling layouts, reduce_amax off, and groups of one rank (TE skips them) are unchanged."""
    layout = _layout(**changes)
    assert not reduces_amax(layout)
    program = build_program(TINY, layout)
    assert not any(_amax(program.ranks[r]) for r in range(layout.world_size))
    assert not any(name.startswith("amax/") for name in program.groups)


def test_keys_and_layout_errors() -> None:
    """Older TE (09ba842) has no attention amaxes whatever the flag says; a non-default reduction without the delayed
    recipe and an unknown value are one-line layout errors."""
    region = _layout(fp8_amax_reduction="tp-async-region", fp8_attention_amax=True)
    assert [k.label for k in amax_keys(region)] == ["linear"]
    with pytest.raises(LayoutError, match="fp8_amax_reduction = 'tp' is Transformer Engine's delayed recipe's"):
        _layout(fp8_recipe="none", fp8_amax_reduction="tp")
    with pytest.raises(LayoutError, match="fp8_amax_reduction = 'dp' is not one of stage, tp, tp-async-region, none"):
        _layout(fp8_amax_reduction="dp")
    with pytest.raises(LayoutError, match="fp8_attention_amax = 'yes' must be true or false"):
        _layout(fp8_attention_amax="yes")
    assert dataclasses.replace(_layout(), fp8_amax_reduction="none").fp8_amax_reduction == "none"
